"""The train state ``{step, params, opt_state}`` (plus ``ema`` with ``train.ema_decay > 0``
and ``accum`` with ``train.accumulate_steps > 1``: :mod:`docnmt_jax.training.steps`; ``carry``
for a model trained on document streams: the state each stream's last chunk left) on a device
mesh.

Its shardings come from the models' logical axis names (``jax.eval_shape`` of the init, so
nothing is computed), and it is initialised directly into them by a jitted init with those
``out_shardings``: no device ever holds the whole state unless the mesh says so.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from docnmt_jax import parallel
from docnmt_jax.data.schema import dummy_batch
from docnmt_jax.models import contract
from docnmt_jax.parallel import Layout
from docnmt_jax.training import ema as ema_lib
from docnmt_jax.training import optim
from docnmt_jax.training.steps import init_accumulator

PyTree = Any


def build_optimizer_state(
    model: Any, config: Any, layout: Layout, note: Any = print, carry_rows: int = 0
) -> tuple[PyTree, PyTree, optax.GradientTransformation, optax.Schedule]:
    """The optimiser of ``config.train`` for ``model`` (``train.freeze``, ``unfreeze_at_step``,
    ``schedule_offset`` and ``weight_decay`` applied, the counts of trainable and frozen
    parameters reported through ``note``), the train state's shardings and its abstract form:
    ``(shardings, abstract, tx, schedule)``. ``carry_rows > 0``: the state also holds the
    ``carry`` of a model trained on document streams, one row per stream."""
    tcfg = config.train
    boxed = jax.eval_shape(model.init, jax.random.PRNGKey(0), dummy_batch())["params"]
    labels = optim.freeze_labels(nn.meta.unbox(boxed), tcfg.get("freeze", ()))
    counts = optim.count_by_label(nn.meta.unbox(boxed), labels)
    unfreeze_at = int(tcfg.get("unfreeze_at_step", 0))
    note(
        f"parameters: {counts[optim.TRAINABLE]:,} trainable, {counts[optim.FROZEN]:,} frozen"
        + (f" (train.freeze={tcfg.freeze!r})" if counts[optim.FROZEN] else "")
        + (
            f", released at step {unfreeze_at} with fresh Adam moments"
            if unfreeze_at and counts[optim.FROZEN]
            else ""
        )
    )
    tx, schedule = optim.make_optimizer(
        config.model.d_model,
        tcfg.warmup_steps,
        tcfg.lr_scale,
        clip_norm=tcfg.clip_norm or None,
        labels=labels,
        unfreeze_at_step=unfreeze_at,
        schedule_offset=int(tcfg.get("schedule_offset", 0)),
        learning_rate=float(tcfg.get("learning_rate", 0.0)),
        weight_decay=float(tcfg.get("weight_decay", 0.0)),
    )
    ema = ema_lib.check_decay(tcfg.get("ema_decay", 0.0)) > 0
    accumulate = int(tcfg.get("accumulate_steps", 1)) > 1
    carry = carry_template(model, carry_rows)
    shardings = state_shardings(model, tx, layout, ema=ema, accumulate=accumulate, carry=carry)
    return shardings, abstract_state(model, tx, shardings, carry), tx, schedule


def carry_template(model: Any, rows: int) -> PyTree | None:
    """The abstract state a model carries across the chunks of ``rows`` document streams
    (``model.initial_carry``), or None when it carries none."""
    if rows <= 0 or not contract.carries_state(model):
        return None
    return jax.eval_shape(lambda: model.initial_carry(rows))


def state_shardings(
    model: Any,
    tx: optax.GradientTransformation,
    layout: Layout,
    ema: bool = False,
    accumulate: bool = False,
    carry: PyTree | None = None,
) -> PyTree:
    """Shardings of the train state: parameters by their logical axes, the optimiser state,
    the EMA and the accumulated gradients like the parameters they mirror, the step and the
    counters replicated, a carried state (``carry``, abstract) split by rows like a batch."""
    boxed = jax.eval_shape(model.init, jax.random.PRNGKey(0), dummy_batch())["params"]
    params = layout.param_shardings(boxed)
    opt_state = jax.eval_shape(tx.init, nn.meta.unbox(boxed))
    shardings = {
        "step": layout.replicated,
        "params": params,
        "opt_state": layout.opt_state_shardings(tx, opt_state, params),
    }
    if ema:
        shardings["ema"] = params
    if accumulate:
        rep = layout.replicated
        shardings["accum"] = {"grads": params, "tokens": rep, "micro": rep}
    if carry is not None:
        shardings["carry"] = jax.tree.map(lambda _: layout.batch, carry)
    return shardings


def abstract_state(
    model: Any, tx: optax.GradientTransformation, shardings: PyTree, carry: PyTree | None = None
) -> PyTree:
    """``jax.ShapeDtypeStruct`` leaves of the train state with ``shardings`` (restore target)."""

    def init() -> PyTree:
        params = nn.meta.unbox(model.init(jax.random.PRNGKey(0), dummy_batch())["params"])
        return _fresh(tx, params, shardings, carry)

    return parallel.abstract(jax.eval_shape(init), shardings)


def _fresh(
    tx: optax.GradientTransformation, params: PyTree, shardings: PyTree, carry: PyTree = None
) -> PyTree:
    """A fresh state for ``params`` with the parts ``shardings`` names (EMA, accumulation, an
    empty carried state shaped like ``carry``)."""
    state = {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": tx.init(params)}
    if "ema" in shardings:
        state["ema"] = ema_lib.init(params)
    if "accum" in shardings:
        state["accum"] = init_accumulator(params)
    if carry is not None:
        state["carry"] = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), carry)
    return state


def init_state(
    model: Any,
    tx: optax.GradientTransformation,
    shardings: PyTree,
    seed: int,
    params: PyTree | None = None,
    carry: PyTree | None = None,
) -> PyTree:
    """The initial train state, computed straight into ``shardings``: fresh parameters from
    ``seed``, or the given host ``params`` (``init_from``) with a fresh optimiser state; an
    empty carried state shaped like the abstract ``carry``."""
    if params is not None:
        params = put(params, shardings["params"])
        fresh = jax.jit(lambda p: _fresh(tx, p, shardings, carry), out_shardings=shardings)
        return fresh(params)

    def init() -> PyTree:  # the parameters do not depend on the batch's values or size
        variables = model.init(jax.random.PRNGKey(seed), dummy_batch())
        return _fresh(tx, nn.meta.unbox(variables["params"]), shardings, carry)

    return jax.jit(init, out_shardings=shardings)()


def put(tree: PyTree, shardings: PyTree) -> PyTree:
    """``tree`` as global arrays with ``shardings``; host arrays must be equal on all processes."""

    def place(x: Any, sharding: jax.sharding.Sharding) -> jax.Array:
        if isinstance(x, jax.Array):
            return jax.device_put(x, sharding)
        x = np.asarray(x)
        return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])

    return jax.tree_util.tree_map(place, tree, shardings)
