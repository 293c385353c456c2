"""Token-level cross-entropy with label smoothing (Szegedy et al. 2016), padding excluded.

The smoothed target puts ``1 - eps`` on the gold token and ``eps / (V - 1)`` on every other
token. The reported training loss is the KL divergence to that target (cross-entropy minus
the target's own entropy), so a perfect model scores 0; :func:`token_losses` also returns the
plain negative log-likelihood of the gold token, the quantity behind perplexity.

It lives with the models, which own their loss (:meth:`~docnmt_jax.models.base.BaseModel.loss`);
objectives build on it from the layer above.
"""

from __future__ import annotations

import functools

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
    With ``lse = logsumexp(x)`` and ``q = low + (confidence - low) * onehot(gold)``:
    ``nll = lse - x_gold`` and ``loss = -sum_v q_v log p_v - H(q)
    = lse - low * sum(x) - (confidence - low) * x_gold - H(q)`` (``sum_v q_v = 1``), so the
    forward pass only reduces the logits and keeps no ``[tokens, V]`` log-probabilities; its
    own backward (:func:`_fused_losses`) writes the gradient ``softmax(x) - q`` in one
    elementwise pass. Same speed as autodiff of ``log_softmax``, 125 MiB (16%) less compiled
    memory per train step at Zheng's TED size (docs/performance.md).
    """
    vocab_size = logits.shape[-1]
    low = smoothing / (vocab_size - 1) if smoothing else 0.0
    entropy = smoothed_target_entropy(vocab_size, smoothing) if smoothing else 0.0
    return _fused_losses(logits, targets, 1.0 - smoothing, low, entropy)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def _fused_losses(
    logits: Array, targets: Array, confidence: float, low: float, entropy: float
) -> tuple[Array, Array]:
    return _fused_losses_fwd(logits, targets, confidence, low, entropy)[0]


def _fused_losses_fwd(
    logits: Array, targets: Array, confidence: float, low: float, entropy: float
) -> tuple[tuple[Array, Array], tuple[Array, Array, Array]]:
    x = logits.astype(jnp.float32)
    row_max = jax.lax.stop_gradient(jnp.max(x, axis=-1))
    lse = row_max + jnp.log(jnp.sum(jnp.exp(x - row_max[..., None]), axis=-1))
    gold = jnp.take_along_axis(x, targets[..., None], axis=-1)[..., 0]
    nll = lse - gold
    loss = lse - (confidence - low) * gold - entropy
    if low:
        loss = loss - low * jnp.sum(x, axis=-1)
    return (loss, nll), (logits, targets, lse)


def _fused_losses_bwd(
    confidence: float,
    low: float,
    entropy: float,
    residuals: tuple[Array, Array, Array],
    cotangents: tuple[Array, Array],
) -> tuple[Array, None]:
    """d loss / dx = p - q, d nll / dx = p - onehot(gold), weighted by their cotangents."""
    logits, targets, lse = residuals
    d_loss, d_nll = cotangents
    probs = jnp.exp(logits.astype(jnp.float32) - lse[..., None])
    is_gold = jnp.arange(logits.shape[-1]) == targets[..., None]
    gold_weight = (confidence - low) * d_loss + d_nll
    grad = (
        probs * (d_loss + d_nll)[..., None]
        - (low * d_loss)[..., None]
        - jnp.where(is_gold, gold_weight[..., None], 0.0)
    )
    return grad.astype(logits.dtype), None


_fused_losses.defvjp(_fused_losses_fwd, _fused_losses_bwd)


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
