"""The jitted train and eval steps: gradient, optimiser update, the non-finite guard, gradient
accumulation and the exponential moving average of the parameters.

The train state is ``{step, params, opt_state}``, plus ``ema`` (:mod:`~docnmt_jax.training.ema`)
with ``train.ema_decay > 0`` and ``accum`` with ``train.accumulate_steps = k > 1``.

**Accumulation.** With ``k > 1`` every call of the train step takes one micro-batch: its
gradient, weighted by its loss weight (real target tokens), is added to ``accum.grads`` and
its weight to ``accum.tokens``; the ``k``-th call applies the optimiser to
``accum.grads / accum.tokens`` -- the gradient of the loss of the ``k`` batches taken together,
loss normalised over all their tokens -- and only then advances ``step`` (optimiser updates:
the learning-rate schedule, ``num_steps`` and every ``*_every`` count updates). ``accum.micro``
is the position inside the accumulation, so a checkpoint taken between micro-batches resumes
exactly. Micro-batch ``m`` of update ``s`` draws its dropout from ``fold_in(fold_in(key, s),
m)``. A micro-batch whose loss or gradient is NaN/Inf adds nothing (it counts in
``bad_steps``); an update whose micro-batches all were bad leaves parameters, moments and EMA
as they were. ``k = 1`` is the plain step: one batch, one update, dropout ``fold_in(key, s)``.

**Ahead-of-time compilation.** :func:`compile_for_shapes` compiles the train step for every
batch shape of the data plan before the first step, so no compilation interrupts training.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from docnmt_jax import parallel
from docnmt_jax.data import schema
from docnmt_jax.models import Metric
from docnmt_jax.objectives import Objective
from docnmt_jax.training import ema as ema_lib

PyTree = Any
Step = Callable[[PyTree, PyTree], tuple[PyTree, dict[str, Metric]]]


def global_norm(tree: PyTree) -> jax.Array:
    leaves = jax.tree_util.tree_leaves(tree)
    return jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in leaves))


def init_accumulator(params: PyTree) -> dict[str, Any]:
    """The empty accumulation: zero gradient sums, no tokens, at micro-batch 0."""
    return {
        "grads": jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params),
        "tokens": jnp.zeros((), jnp.float32),
        "micro": jnp.zeros((), jnp.int32),
    }


def _where(flag: jax.Array, new: PyTree, old: PyTree) -> PyTree:
    return jax.tree_util.tree_map(lambda n, o: jnp.where(flag, n, o), new, old)


def _gradient(
    objective: Objective, state: PyTree, batch: PyTree, rng: jax.Array
) -> tuple[PyTree, dict[str, Metric], jax.Array, PyTree]:
    """The objective's gradient on ``batch``, its metrics, whether loss and gradient are
    finite, and the state carried to the next step (``state["carry"]`` read and renewed by a
    model trained on document streams; None without one). A non-finite step leaves the empty
    state, so nothing non-finite is carried on."""
    carry = state.get("carry")

    def loss_fn(params: PyTree) -> tuple[jax.Array, tuple[dict[str, Metric], PyTree]]:
        if carry is None:
            loss, metrics = objective.loss(params, batch, rng, True)
            return loss, (metrics, None)
        loss, metrics, new_carry = objective.loss_with_carry(params, batch, carry, rng, True)
        return loss, (metrics, new_carry)

    (loss, (metrics, new_carry)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"])
    finite = jnp.isfinite(loss) & jnp.isfinite(global_norm(grads))
    if new_carry is not None:
        new_carry = jax.tree.map(lambda x: jnp.where(finite, x, jnp.zeros_like(x)), new_carry)
    return grads, metrics, finite, new_carry


def _apply_update(
    tx: Any, ema_decay: float, state: PyTree, grads: PyTree, ok: jax.Array
) -> tuple[PyTree, jax.Array]:
    """The optimiser update with ``grads`` where ``ok`` (else the state unchanged), the EMA
    moved with it; and the gradient's global norm."""
    updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
    params = jax.tree_util.tree_map(jnp.add, state["params"], updates)
    new = dict(state, params=_where(ok, params, state["params"]))
    new["opt_state"] = _where(ok, opt_state, state["opt_state"])
    if "ema" in state:
        moved = ema_lib.update(state["ema"], new["params"], ema_decay, state["step"] + 1)
        new["ema"] = _where(ok, moved, state["ema"])
    return new, global_norm(grads)


def make_train_step(
    objective: Objective,
    tx: Any,
    schedule: Any,
    seed: int,
    ema_decay: float = 0.0,
    accumulate_steps: int = 1,
) -> Step:
    """``train_step(state, batch) -> (state, metrics)`` (not jitted); see the module docstring.
    Metrics: the objective's, ``lr`` and ``grad_norm`` of the update (the applied mean gradient
    with accumulation), ``bad_steps`` (1 for a NaN/Inf loss or gradient)."""
    base_key = jax.random.PRNGKey(seed)
    k = int(accumulate_steps)
    if k < 1:
        raise ValueError(f"config.train.accumulate_steps must be >= 1, got {k}")

    def gradient(state: PyTree, batch: PyTree, rng: jax.Array) -> tuple:
        return _gradient(objective, state, batch, rng)

    def apply(state: PyTree, grads: PyTree, ok: jax.Array) -> tuple[PyTree, jax.Array]:
        return _apply_update(tx, ema_decay, state, grads, ok)

    def plain_step(state: PyTree, batch: PyTree) -> tuple[PyTree, dict[str, Metric]]:
        rng = jax.random.fold_in(base_key, state["step"])
        grads, metrics, finite, carry = gradient(state, batch, rng)
        new, grad_norm = apply(state, grads, finite)
        one = jnp.ones(())
        new["step"] = state["step"] + 1
        if carry is not None:
            new["carry"] = carry
        return new, dict(
            metrics,
            lr=Metric(schedule(state["step"]), one),
            grad_norm=Metric(grad_norm, one),
            bad_steps=Metric(1.0 - finite.astype(jnp.float32), one, "sum"),
        )

    def accumulating_step(state: PyTree, batch: PyTree) -> tuple[PyTree, dict[str, Metric]]:
        accum = state["accum"]
        rng = jax.random.fold_in(jax.random.fold_in(base_key, state["step"]), accum["micro"])
        grads, metrics, finite, carry = gradient(state, batch, rng)
        if carry is not None:  # every micro-batch is the next chunk of the streams
            state = dict(state, carry=carry)
        weight = jnp.where(finite, metrics["loss"].weight.astype(jnp.float32), 0.0)
        summed = jax.tree.map(
            lambda a, g: a + jnp.where(finite, g.astype(jnp.float32) * weight, 0.0),
            accum["grads"],
            grads,
        )
        tokens = accum["tokens"] + weight
        last = accum["micro"] == k - 1

        def update(_: None) -> tuple[PyTree, jax.Array]:
            mean = jax.tree.map(lambda g: g / jnp.maximum(tokens, 1e-9), summed)
            held = dict(state, accum=init_accumulator(state["params"]))
            new, norm = apply(held, mean, tokens > 0)
            return dict(new, step=state["step"] + 1), norm

        def hold(_: None) -> tuple[PyTree, jax.Array]:
            micro = accum["micro"] + 1
            accumulated = {"grads": summed, "tokens": tokens, "micro": micro}
            return dict(state, accum=accumulated), jnp.zeros((), jnp.float32)

        new, grad_norm = jax.lax.cond(last, update, hold, None)
        updated = last.astype(jnp.float32)
        return new, dict(
            metrics,
            lr=Metric(schedule(state["step"]), jnp.ones(())),
            grad_norm=Metric(jnp.asarray(grad_norm, jnp.float32) * updated, updated),
            bad_steps=Metric(1.0 - finite.astype(jnp.float32), jnp.ones(()), "sum"),
        )

    return plain_step if k == 1 else accumulating_step


def make_steps(
    objective: Objective,
    tx: Any,
    schedule: Any,
    seed: int,
    layout: parallel.Layout | None = None,
    shardings: PyTree | None = None,
    ema_decay: float = 0.0,
    accumulate_steps: int = 1,
) -> tuple[Any, Any]:
    """The jitted ``train_step(state, batch) -> (state, metrics)`` (old state donated) and
    ``eval_step(params, batch) -> metrics`` (the objective's metric sums).

    With a ``layout`` and the state's ``shardings`` both are compiled for the mesh: batch rows
    split over ``data x fsdp``, state as ``shardings``, metrics replicated, the models'
    activation constraints active.
    """
    active = layout.activate if layout is not None else contextlib.nullcontext
    step_fn = make_train_step(objective, tx, schedule, seed, ema_decay, accumulate_steps)

    def train_step(state: PyTree, batch: PyTree) -> tuple[PyTree, dict[str, Metric]]:
        with active():
            return step_fn(state, batch)

    def eval_step(params: PyTree, batch: PyTree, carry: PyTree = None) -> Any:
        """The metrics of ``batch``; with a ``carry`` (document streams) also the carry the
        batch leaves: ``(metrics, carry)``."""
        with active():
            if carry is None:
                return objective.loss(params, batch, None, False)[1]
            _, metrics, new_carry = objective.loss_with_carry(params, batch, carry, None, False)
            return metrics, new_carry

    if layout is None:
        return jax.jit(train_step, donate_argnums=(0,)), jax.jit(eval_step)
    rep = layout.replicated
    return (
        jax.jit(
            train_step,
            in_shardings=(shardings, layout.batch),
            out_shardings=(shardings, rep),
            donate_argnums=(0,),
        ),
        _jit_eval(eval_step, shardings, layout),
    )


def _jit_eval(eval_step: Any, shardings: PyTree, layout: parallel.Layout) -> Any:
    """``eval_step`` jitted for the mesh: parameters as in the state, the batch's rows (and a
    carried state's) split like a batch, metrics replicated."""
    rep = layout.replicated
    if "carry" not in shardings:
        return jax.jit(
            eval_step, in_shardings=(shardings["params"], layout.batch), out_shardings=rep
        )
    carry = shardings["carry"]
    return jax.jit(
        eval_step,
        in_shardings=(shardings["params"], layout.batch, carry),
        out_shardings=(rep, carry),
    )


def abstract_batch(
    shape: tuple[int, ...], sharding: Any, context_sentences: int = 0, streams: bool = False
) -> dict[str, jax.ShapeDtypeStruct]:
    """Every feature of a global batch of plan shape ``shape`` (``(B, L)`` packed rows or
    ``(B, S, T)`` grid, with ``context_sentences`` ``K > 0`` its context window, packed: the
    context rows ``[B, K*L]`` of :mod:`~docnmt_jax.data.window_plan`; packed document
    ``streams``: the stream of every token, :mod:`~docnmt_jax.data.packed_stream_plan`) as a
    ``ShapeDtypeStruct`` with the batch ``sharding``."""
    packed = len(shape) == 2
    axes = dict(schema.PACKED_FEATURE_AXES if packed else schema.FEATURE_AXES)
    if context_sentences:
        axes.update(schema.PACKED_CONTEXT_FEATURE_AXES if packed else schema.CONTEXT_FEATURE_AXES)
    if streams and packed:
        axes.update(schema.PACKED_STREAM_FEATURE_AXES)
    sizes = dict(zip("BL" if packed else "BST", shape, strict=True))
    sizes["K"] = context_sentences
    sizes["C"] = context_sentences * shape[-1]  # packed context rows: K * L slots
    return {
        name: jax.ShapeDtypeStruct(tuple(sizes[a] for a in ax), schema.DTYPE, sharding=sharding)
        for name, ax in axes.items()
    }


def compile_for_shapes(
    train_step: Any,
    state: PyTree,
    local_shapes: list[tuple[int, ...]],
    layout: parallel.Layout,
    note: Callable[[str], None],
    context_sentences: int = 0,
    streams: bool = False,
) -> Callable[[PyTree, PyTree], tuple[PyTree, dict[str, Metric]]]:
    """``train_step`` compiled ahead of time for every batch shape of the plan (this process's
    ``local_shapes``; rows times ``process_count`` globally; its features
    :func:`abstract_batch`'s), the compile time of each logged, so that no compilation
    interrupts training; a batch of another shape is compiled then."""
    abstract_state = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state
    )
    compiled: dict[tuple[int, ...], Any] = {}
    times = []
    for shape in local_shapes:
        start = time.perf_counter()
        global_shape = (shape[0] * jax.process_count(), *shape[1:])
        batch = abstract_batch(global_shape, layout.batch, context_sentences, streams)
        compiled[global_shape] = train_step.lower(abstract_state, batch).compile()
        times.append(f"{'x'.join(map(str, global_shape))} {time.perf_counter() - start:.1f} s")
    note(f"compiled the train step for {len(compiled)} batch shapes: {', '.join(times)}")

    def step(state: PyTree, batch: PyTree) -> tuple[PyTree, dict[str, Metric]]:
        executable = compiled.get(batch["src"].shape)
        return (executable or train_step)(state, batch)

    return step
