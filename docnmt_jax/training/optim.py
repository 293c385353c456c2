"""Adam with the inverse-square-root schedule of Vaswani et al. (2017), Eq. (3), and frozen
parameters.

lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), counted from step 1.
``train.freeze`` (regular expressions searched in parameter paths such as
``encoder_layers_0/attention_block/norm/scale``) marks parameters that get no update and no
optimiser moments (``optax.multi_transform`` with ``set_to_zero``); gradient clipping then
sees only the trainable parameters' gradients.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

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


def inverse_sqrt_schedule(d_model: int, warmup_steps: int, scale: float = 1.0) -> optax.Schedule:
    """The Transformer schedule; ``scale`` multiplies the whole curve (1.0 = the paper)."""
    if warmup_steps < 1:
        raise ValueError(f"warmup_steps must be >= 1, got {warmup_steps}")

    def schedule(count: jnp.ndarray) -> jnp.ndarray:
        step = jnp.asarray(count, jnp.float32) + 1.0
        return scale * d_model**-0.5 * jnp.minimum(step**-0.5, step * warmup_steps**-1.5)

    return schedule


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
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """Adam(0.9, 0.98, 1e-9) under the inverse-sqrt schedule, optional global-norm clipping;
    with ``labels`` (:func:`freeze_labels`) only the trainable parameters are updated."""
    schedule = inverse_sqrt_schedule(d_model, warmup_steps, lr_scale)
    parts = []
    if clip_norm:
        parts.append(optax.clip_by_global_norm(clip_norm))
    if weight_decay:
        parts.append(optax.adamw(schedule, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay))
    else:
        parts.append(optax.adam(schedule, b1=b1, b2=b2, eps=eps))
    tx = optax.chain(*parts)
    if labels is not None and FROZEN in jax.tree.leaves(labels):
        tx = optax.multi_transform({TRAINABLE: tx, FROZEN: optax.set_to_zero()}, labels)
    return tx, schedule
