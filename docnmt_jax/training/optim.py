"""Adam with the inverse-square-root schedule of Vaswani et al. (2017), Eq. (3).

lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), counted from step 1.
"""

from __future__ import annotations

import jax.numpy as jnp
import optax


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
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """Adam(0.9, 0.98, 1e-9) under the inverse-sqrt schedule, optional global-norm clipping."""
    schedule = inverse_sqrt_schedule(d_model, warmup_steps, lr_scale)
    parts = []
    if clip_norm:
        parts.append(optax.clip_by_global_norm(clip_norm))
    if weight_decay:
        parts.append(optax.adamw(schedule, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay))
    else:
        parts.append(optax.adam(schedule, b1=b1, b2=b2, eps=eps))
    return optax.chain(*parts), schedule
