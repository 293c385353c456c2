"""An exponential moving average of the parameters (Polyak averaging), kept in the train state.

After optimiser update ``t`` (1, 2, ...) ``ema <- d_t * ema + (1 - d_t) * params`` with
``d_t = min(decay, (1 + t) / (10 + t))``: the ramp of TensorFlow's
``ExponentialMovingAverage(num_updates=t)``, so that early on the average is not dominated by
the initial parameters (with ``decay = 0.999`` a plain average would still hold 55% of the
initialisation after 600 updates). The EMA is float32 whatever the parameters' dtype, lives in
the state as ``ema`` (sharded like the parameters), is checkpointed with it, and is the
parameter set of dev evaluation, best-checkpoint choice and translation when present
(``translate.py --params raw`` takes the raw ones).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

PyTree = Any


def decay_at(decay: float, t: jax.Array) -> jax.Array:
    """The decay applied at update ``t`` (1-based)."""
    t = jnp.asarray(t, jnp.float32)
    return jnp.minimum(jnp.float32(decay), (1.0 + t) / (10.0 + t))


def update(ema: PyTree, params: PyTree, decay: float, t: jax.Array) -> PyTree:
    """The average after update ``t`` whose parameters are ``params``."""
    d = decay_at(decay, t)
    return jax.tree.map(lambda e, p: d * e + (1.0 - d) * p.astype(jnp.float32), ema, params)


def init(params: PyTree) -> PyTree:
    """The average before any update: the parameters themselves (float32)."""
    return jax.tree.map(lambda p: jnp.asarray(p, jnp.float32), params)


def check_decay(decay: float) -> float:
    """``train.ema_decay`` validated: 0 (off) or in (0, 1)."""
    from docnmt_jax.errors import ConfigError

    decay = float(decay)
    if not 0.0 <= decay < 1.0:
        raise ConfigError(f"config.train.ema_decay must be in [0, 1) (0: off), got {decay}")
    return decay
