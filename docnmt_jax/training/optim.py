"""Adam with the inverse-square-root schedule of Vaswani et al. (2017), Eq. (3), decoupled
weight decay, frozen parameters and training stages.

lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), counted from step 1;
with an absolute peak ``train.learning_rate = p > 0`` the factor ``d_model^-0.5`` becomes
``p * warmup^0.5``, so the curve has the same shape and reaches ``scale * p`` at the end of the
warm-up. ``train.schedule_offset = k`` restarts the curve (warm-up included) at step ``k``.
``train.freeze`` (regular expressions searched in parameter paths such as
``encoder_layers_0/attention_block/norm/scale``) marks parameters that get no update and no
optimiser moments (``optax.multi_transform`` with ``set_to_zero``); gradient clipping then
sees only the trainable parameters' gradients. With ``train.unfreeze_at_step = k`` they are
released at step ``k``: until then their gradients are zeroed before clipping and their own
Adam (:func:`released_at`) stands still with zero moments and count; from ``k`` on it runs as
a fresh Adam (bias correction counted from the release) at the run's learning rate, and
clipping sees every gradient.

``train.weight_decay = wd > 0`` is AdamW's decoupled decay (Loshchilov & Hutter 2019, as
``optax.adamw``): each update also subtracts ``lr_t * wd * p`` from a decayed parameter ``p``,
so with a zero gradient it shrinks by exactly ``1 - lr_t * wd`` per step. Only weights are
decayed: parameters of two or more dimensions whose name does not end in ``bias`` (kernels,
embeddings, relative-position tables); LayerNorm scales and every bias are not, whatever its
shape (attention biases are ``[heads, head_dim]``, FINAL's ``content_bias`` 2-D too):
:func:`decay_mask`. The optimiser state is Adam's whatever the decay
(:func:`adam_with_decay`), so a run may resume with another ``weight_decay``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from docnmt_jax.errors import ConfigError
from docnmt_jax.models.base import ModelError
from docnmt_jax.parallel import key_names

PyTree = Any
TRAINABLE, FROZEN = "trainable", "frozen"


def parameter_path(path: tuple[Any, ...]) -> str:
    """``a/b/c`` of a pytree key path (dict keys, sequence indices, attributes)."""
    return "/".join(key_names(path))


def freeze_labels(params: PyTree, patterns: Sequence[str] | str) -> PyTree:
    """A tree like ``params`` of :data:`FROZEN` (path matches a pattern, ``re.search``) or
    :data:`TRAINABLE`. A pattern that is not a regular expression or matches no parameter is
    an error naming it."""
    if isinstance(patterns, str):
        patterns = [patterns] if patterns else []
    compiled = []
    for pattern in patterns:
        try:
            compiled.append(re.compile(pattern))
        except re.error as e:
            raise ModelError(
                f"config.train.freeze: {pattern!r} is not a regular expression: {e}"
            ) from None
    paths, treedef = jax.tree_util.tree_flatten_with_path(params)
    names = [parameter_path(path) for path, _ in paths]
    for pattern in compiled:
        if not any(pattern.search(name) for name in names):
            raise ModelError(
                f"config.train.freeze: {pattern.pattern!r} matches no parameter (e.g. {names[0]!r})"
            )
    labels = [FROZEN if any(p.search(n) for p in compiled) else TRAINABLE for n in names]
    return jax.tree_util.tree_unflatten(treedef, labels)


def count_by_label(params: PyTree, labels: PyTree) -> dict[str, int]:
    """Parameter elements per label (``{"trainable": n, "frozen": m}``)."""
    counts = {TRAINABLE: 0, FROZEN: 0}
    for x, label in zip(jax.tree.leaves(params), jax.tree.leaves(labels), strict=True):
        counts[label] += int(np.prod(x.shape))
    return counts


def inverse_sqrt_schedule(
    d_model: int,
    warmup_steps: int,
    scale: float = 1.0,
    offset: int = 0,
    peak: float = 0.0,
) -> optax.Schedule:
    """The Transformer schedule; ``scale`` multiplies the whole curve (1.0 = the paper). With
    ``peak > 0`` the curve's peak (at the end of the warm-up) is ``scale * peak`` instead of
    ``scale * (d_model * warmup_steps)^-0.5``. With ``offset > 0`` the curve starts again at
    step ``offset`` (a new stage's warm-up): steps before it follow the curve from 0, steps
    from it on the curve from ``offset``."""
    if warmup_steps < 1:
        raise ConfigError(f"config.train.warmup_steps must be >= 1, got {warmup_steps}")
    if offset < 0:
        raise ModelError(f"config.train.schedule_offset must be >= 0, got {offset}")
    if peak < 0:
        raise ConfigError(
            f"config.train.learning_rate must be >= 0 (0: d_model-scaled), got {peak}"
        )
    factor = peak * warmup_steps**0.5 if peak > 0 else d_model**-0.5

    def schedule(count: jnp.ndarray) -> jnp.ndarray:
        count = jnp.asarray(count, jnp.int32)
        if offset:
            count = jnp.where(count >= offset, count - offset, count)
        step = count.astype(jnp.float32) + 1.0
        return scale * factor * jnp.minimum(step**-0.5, step * warmup_steps**-1.5)

    return schedule


class ReleaseState(NamedTuple):
    """State of :func:`released_at` and :func:`hold_until`: updates seen so far, and the
    wrapped transformation's state (frozen until the release)."""

    count: jax.Array
    inner: Any


def released_at(inner: optax.GradientTransformation, step: int) -> optax.GradientTransformation:
    """``inner`` from the ``step``-th update on; before it the updates are zero and ``inner``'s
    state stays as initialised (Adam: zero moments, count 0), so at ``step`` it starts fresh."""

    def init(params: PyTree) -> ReleaseState:
        return ReleaseState(jnp.zeros((), jnp.int32), inner.init(params))

    def update(
        updates: PyTree, state: ReleaseState, params: PyTree | None = None
    ) -> tuple[PyTree, ReleaseState]:
        active = state.count >= step
        new_updates, new_inner = inner.update(updates, state.inner, params)
        updates = jax.tree.map(lambda u: jnp.where(active, u, jnp.zeros_like(u)), new_updates)
        kept = jax.tree.map(lambda n, o: jnp.where(active, n, o), new_inner, state.inner)
        return updates, ReleaseState(optax.safe_int32_increment(state.count), kept)

    return optax.GradientTransformation(init, update)


def hold_until(mask: PyTree, step: int) -> optax.GradientTransformation:
    """Zeroes the gradients where ``mask`` is True before the ``step``-th update (so that a
    later global-norm clipping sees the trainable parameters' gradients only)."""

    def init(params: PyTree) -> ReleaseState:
        del params
        return ReleaseState(jnp.zeros((), jnp.int32), optax.EmptyState())

    def update(
        updates: PyTree, state: ReleaseState, params: PyTree | None = None
    ) -> tuple[PyTree, ReleaseState]:
        del params
        held = state.count < step
        updates = jax.tree.map(
            lambda u, m: jnp.where(held & m, jnp.zeros_like(u), u) if m else u, updates, mask
        )
        return updates, ReleaseState(optax.safe_int32_increment(state.count), state.inner)

    return optax.GradientTransformation(init, update)


def decay_mask(params: PyTree) -> PyTree:
    """True for the parameters weight decay shrinks: the weights, of two or more dimensions
    and named other than ``*bias`` (not LayerNorm scales and biases, nor any other bias)."""

    def decayed(path: tuple[Any, ...], p: Any) -> bool:
        names = key_names(path)
        return jnp.ndim(p) >= 2 and not (names and names[-1].endswith("bias"))

    return jax.tree_util.tree_map_with_path(decayed, params)


def adam_with_decay(
    schedule: optax.Schedule, b1: float, b2: float, eps: float, weight_decay: float
) -> optax.GradientTransformation:
    """``optax.adamw(schedule, b1, b2, eps, weight_decay, mask=decay_mask)`` with the state
    of ``optax.adam`` (its schedule step carries the decay): update ``-lr_t * (adam_t + wd *
    p)`` on decayed parameters, ``-lr_t * adam_t`` on the others."""
    if weight_decay < 0:
        raise ConfigError(f"config.train.weight_decay must be >= 0, got {weight_decay}")
    if not weight_decay:
        return optax.adam(schedule, b1=b1, b2=b2, eps=eps)

    def init(params: PyTree) -> optax.ScaleByScheduleState:
        del params
        return optax.ScaleByScheduleState(count=jnp.zeros([], jnp.int32))

    def update(
        updates: PyTree, state: optax.ScaleByScheduleState, params: PyTree | None = None
    ) -> tuple[PyTree, optax.ScaleByScheduleState]:
        if params is None:
            raise ValueError("weight decay needs the parameters: tx.update(grads, state, params)")
        lr = schedule(state.count)

        def step(u: jax.Array, p: jax.Array, decayed: bool) -> jax.Array:
            if decayed:
                u = u + weight_decay * p
            return jnp.asarray(-lr, u.dtype) * u

        updates = jax.tree.map(step, updates, params, decay_mask(params))
        return updates, optax.ScaleByScheduleState(count=optax.safe_int32_increment(state.count))

    scaled = optax.GradientTransformation(init, update)
    return optax.chain(optax.scale_by_adam(b1=b1, b2=b2, eps=eps), scaled)


def make_optimizer(
    d_model: int,
    warmup_steps: int = 8000,
    lr_scale: float = 1.0,
    b1: float = 0.9,
    b2: float = 0.98,
    eps: float = 1e-9,
    clip_norm: float | None = None,
    weight_decay: float = 0.0,
    labels: PyTree | None = None,
    unfreeze_at_step: int = 0,
    schedule_offset: int = 0,
    learning_rate: float = 0.0,
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """Adam(0.9, 0.98, 1e-9) under the inverse-sqrt schedule (restarted at
    ``schedule_offset`` when > 0), optional global-norm clipping; with ``labels``
    (:func:`freeze_labels`) only the trainable parameters are updated, until
    ``unfreeze_at_step`` (> 0) from which the frozen ones train too, with fresh moments;
    ``learning_rate`` > 0 is the schedule's absolute peak (:func:`inverse_sqrt_schedule`);
    ``weight_decay`` > 0 decays the weights (AdamW: :func:`adam_with_decay`; LayerNorm scales
    and biases are not decayed: :func:`decay_mask`)."""
    if unfreeze_at_step < 0:
        raise ModelError(f"config.train.unfreeze_at_step must be >= 0, got {unfreeze_at_step}")
    schedule = inverse_sqrt_schedule(
        d_model, warmup_steps, lr_scale, schedule_offset, peak=learning_rate
    )

    def adam(learning_rate: optax.Schedule) -> optax.GradientTransformation:
        return adam_with_decay(learning_rate, b1, b2, eps, float(weight_decay))

    clip = [optax.clip_by_global_norm(clip_norm)] if clip_norm else []
    frozen = labels is not None and FROZEN in jax.tree.leaves(labels)
    if unfreeze_at_step and not frozen:
        raise ModelError(
            "config.train.unfreeze_at_step needs frozen parameters: set config.train.freeze"
        )
    if not frozen:
        return optax.chain(*clip, adam(schedule)), schedule
    if not unfreeze_at_step:
        tx = optax.multi_transform(
            {TRAINABLE: optax.chain(*clip, adam(schedule)), FROZEN: optax.set_to_zero()}, labels
        )
        return tx, schedule

    def released_schedule(count: jnp.ndarray) -> jnp.ndarray:  # its count starts at release
        return schedule(count + unfreeze_at_step)

    mask = jax.tree.map(lambda label: label == FROZEN, labels)
    inner = {
        TRAINABLE: adam(schedule),
        FROZEN: released_at(adam(released_schedule), unfreeze_at_step),
    }
    tx = optax.chain(
        hold_until(mask, unfreeze_at_step), *clip, optax.multi_transform(inner, labels)
    )
    return tx, schedule
