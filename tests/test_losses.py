"""Label-smoothed cross-entropy against a float64 NumPy recomputation and hand values."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from docnmt_jax.models import losses
from docnmt_jax.training import optim


def _reference(logits, targets, mask, eps):
    """Naive float64 loop: KL(q || p) with q = 1-eps on gold, eps/(V-1) elsewhere."""
    logits = logits.astype(np.float64)
    vocab = logits.shape[-1]
    total_loss = total_nll = tokens = 0.0
    for idx in np.ndindex(targets.shape):
        if not mask[idx]:
            continue
        row = logits[idx]
        logp = row - (np.log(np.sum(np.exp(row - row.max()))) + row.max())
        kl = 0.0
        for v in range(vocab):
            q = 1 - eps if v == targets[idx] else eps / (vocab - 1)
            if q > 0:
                kl += q * (math.log(q) - logp[v])
        total_loss += kl
        total_nll += -logp[targets[idx]]
        tokens += 1
    return total_loss, total_nll, tokens


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_loss_matches_float64_reference(eps):
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 5, 11)).astype(np.float32) * 3
    targets = rng.integers(0, 11, (3, 5))
    mask = rng.random((3, 5)) > 0.3
    sums = losses.masked_loss_sums(
        jnp.asarray(logits), jnp.asarray(targets), jnp.asarray(mask), eps
    )
    ref_loss, ref_nll, ref_tokens = _reference(logits, targets, mask, eps)
    assert float(sums["tokens"]) == ref_tokens
    assert float(sums["loss"]) == pytest.approx(ref_loss, rel=1e-5)
    assert float(sums["nll"]) == pytest.approx(ref_nll, rel=1e-5)


@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_gradient_matches_float64_reference(eps, dtype):
    """d(a * loss_sum + b * nll_sum)/d logits against softmax(x) - target, in float64."""
    rng = np.random.default_rng(1)
    logits = (rng.normal(size=(2, 4, 9)) * 3).astype(np.float32)
    targets = rng.integers(0, 9, (2, 4))
    mask = rng.random((2, 4)) > 0.3
    a, b = 0.7, 0.3

    def objective(x):
        sums = losses.masked_loss_sums(x, jnp.asarray(targets), jnp.asarray(mask), eps)
        return a * sums["loss"] + b * sums["nll"]

    x = jnp.asarray(logits, dtype)
    grad = np.asarray(jax.grad(objective)(x).astype(jnp.float32), np.float64)
    assert jax.grad(objective)(x).dtype == dtype
    x64 = np.asarray(x.astype(jnp.float32), np.float64)
    probs = np.exp(x64 - x64.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    onehot = np.eye(9)[targets]
    smooth = (1 - eps) * onehot + eps / 8 * (1 - onehot)
    expected = (a * (probs - smooth) + b * (probs - onehot)) * mask[..., None]
    tol = 1e-6 if dtype == jnp.float32 else 2e-2
    np.testing.assert_allclose(grad, expected, atol=tol)


def test_label_smoothing_by_hand():
    # V = 4, eps = 0.1: q = (0.9, 0.1/3, 0.1/3, 0.1/3). Uniform logits give p = 1/4 each, so
    # cross-entropy = log 4 and the entropy of q is -(0.9 ln 0.9 + 0.1 ln(0.1/3)).
    entropy = -(0.9 * math.log(0.9) + 0.1 * math.log(0.1 / 3))
    assert losses.smoothed_target_entropy(4, 0.1) == pytest.approx(entropy)
    loss, nll = losses.token_losses(jnp.zeros((1, 4)), jnp.array([2]), 0.1)
    assert float(nll[0]) == pytest.approx(math.log(4), rel=1e-6)
    assert float(loss[0]) == pytest.approx(math.log(4) - entropy, rel=1e-6)
    # The smoothed target itself scores zero loss.
    q = np.full(4, 0.1 / 3)
    q[2] = 0.9
    loss, _ = losses.token_losses(jnp.log(jnp.asarray(q))[None], jnp.array([2]), 0.1)
    assert float(loss[0]) == pytest.approx(0.0, abs=1e-6)


def test_inverse_sqrt_schedule_values():
    schedule = optim.inverse_sqrt_schedule(d_model=256, warmup_steps=8000)
    for count in (0, 99, 7999, 8000, 40000):
        step = count + 1
        expected = 256**-0.5 * min(step**-0.5, step * 8000**-1.5)
        assert float(schedule(count)) == pytest.approx(expected, rel=1e-5)
