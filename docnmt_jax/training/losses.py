"""Token-level cross-entropy with label smoothing (Szegedy et al. 2016), padding excluded.

The smoothed target puts ``1 - eps`` on the gold token and ``eps / (V - 1)`` on every other
token. The reported training loss is the KL divergence to that target (cross-entropy minus
the target's own entropy), so a perfect model scores 0; :func:`token_losses` also returns the
plain negative log-likelihood of the gold token, the quantity behind perplexity.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


def smoothed_target_entropy(vocab_size: int, smoothing: float) -> float:
    """Entropy of the smoothed one-hot target, the constant subtracted from the cross-entropy."""
    confidence = 1.0 - smoothing
    low = smoothing / (vocab_size - 1)
    entropy = 0.0
    if confidence > 0:
        entropy -= confidence * np.log(confidence)
    if low > 0:
        entropy -= (vocab_size - 1) * low * np.log(low)
    return float(entropy)


def token_losses(logits: Array, targets: Array, smoothing: float) -> tuple[Array, Array]:
    """Per-token (smoothed KL loss, gold NLL), both shaped like ``targets``.

    ``logits [..., V]`` (any float dtype; computed in float32), ``targets [...]`` int ids.
    """
    vocab_size = logits.shape[-1]
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    gold = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    nll = -gold
    if smoothing == 0.0:
        return nll, nll
    confidence = 1.0 - smoothing
    low = smoothing / (vocab_size - 1)
    # sum_v q_v log p_v with q = low everywhere except confidence at the gold token.
    expected = low * jnp.sum(log_probs, axis=-1) + (confidence - low) * gold
    loss = -expected - smoothed_target_entropy(vocab_size, smoothing)
    return loss, nll


def masked_loss_sums(
    logits: Array, targets: Array, mask: Array, smoothing: float
) -> dict[str, Array]:
    """Sums over real tokens: ``loss``, ``nll`` and ``tokens`` (the normaliser).

    Normalise per target token as ``loss / tokens``; sums (not means) let gradient
    accumulation and multi-device reduction stay exact.
    """
    weights = mask.astype(jnp.float32)
    loss, nll = token_losses(logits, targets, smoothing)
    return {
        "loss": jnp.sum(loss * weights),
        "nll": jnp.sum(nll * weights),
        "tokens": jnp.sum(weights),
    }
