"""Sentence Transformer: masking, causality, and cached decoding against the full forward."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from docnmt_jax.models import layers
from docnmt_jax.models.transformer import Transformer, TransformerConfig

CFG = TransformerConfig(
    vocab_size=40,
    d_model=32,
    num_heads=4,
    ffn_dim=48,
    num_encoder_layers=2,
    num_decoder_layers=2,
    deterministic=True,
)


@pytest.fixture(scope="module", params=[False, True], ids=["post_ln", "pre_ln"])
def model_and_params(request):
    cfg = TransformerConfig(**{**CFG.__dict__, "pre_ln": request.param})
    model = Transformer(cfg)
    src = jnp.ones((2, 7), jnp.int32)
    params = model.init(jax.random.PRNGKey(0), src, src, src[:, :5], src[:, :5])
    return model, params


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    src = rng.integers(4, 40, (3, 7)).astype(np.int32)
    src_mask = np.ones((3, 7), np.int32)
    src_mask[1, 4:] = 0
    src_mask[2, 6:] = 0
    tgt = rng.integers(4, 40, (3, 5)).astype(np.int32)
    tgt_mask = np.ones((3, 5), np.int32)
    tgt_mask[0, 3:] = 0
    return src, src_mask, tgt, tgt_mask


def test_source_padding_is_never_attended(model_and_params):
    model, params = model_and_params
    src, src_mask, tgt, tgt_mask = _inputs()
    base = model.apply(params, src, src_mask, tgt, tgt_mask)
    noisy = np.where(src_mask > 0, src, np.random.default_rng(1).integers(4, 40, src.shape))
    out = model.apply(params, noisy.astype(np.int32), src_mask, tgt, tgt_mask)
    real = tgt_mask > 0
    np.testing.assert_allclose(np.asarray(out)[real], np.asarray(base)[real], atol=1e-5)
    # The perturbation must matter where it is not masked (the test can fail).
    unmasked = model.apply(params, noisy.astype(np.int32), np.ones_like(src_mask), tgt, tgt_mask)
    assert np.abs(np.asarray(unmasked)[1] - np.asarray(base)[1]).max() > 1e-3


def test_decoder_never_looks_ahead(model_and_params):
    model, params = model_and_params
    src, src_mask, tgt, tgt_mask = _inputs()
    base = np.asarray(model.apply(params, src, src_mask, tgt, tgt_mask))
    for t in range(tgt.shape[1]):
        changed = tgt.copy()
        # Target token t feeds decoder input t+1 (shift right): logits 0..t must not change.
        changed[:, t] = (changed[:, t] + 7) % 36 + 4
        out = np.asarray(model.apply(params, src, src_mask, changed, tgt_mask))
        seen = tgt_mask[:, : t + 1] > 0  # padded query rows are never read
        np.testing.assert_allclose(out[:, : t + 1][seen], base[:, : t + 1][seen], atol=1e-5)
        if t + 1 < tgt.shape[1]:
            assert np.abs(out[:, t + 1 :] - base[:, t + 1 :]).max() > 1e-4


def test_cached_decoding_equals_teacher_forcing(model_and_params):
    model, params = model_and_params
    src, src_mask, tgt, tgt_mask = _inputs(3)
    full = np.asarray(model.apply(params, src, src_mask, tgt, np.ones_like(tgt_mask)))
    encoded = model.apply(params, src, src_mask, method=model.encode)
    cache = model.apply(params, src.shape[0], 8, method=model.init_cache)
    extra = model.apply(params, encoded, src_mask, method=model.decode_inputs)
    dec_in = np.asarray(layers.shift_right(jnp.asarray(tgt), 2))
    for t in range(tgt.shape[1]):
        logits, cache = model.apply(params, cache, dec_in[:, t], extra, method=model.decode_step)
        np.testing.assert_allclose(np.asarray(logits), full[:, t], atol=1e-5, rtol=1e-5)


def test_beams_share_the_per_example_inputs(model_and_params):
    """``G`` cache rows per example against one row of ``extra`` (grouped cross-attention)
    give the same logits as ``extra`` copied to every row (the naive layout)."""
    model, params = model_and_params
    src, src_mask, tgt, _ = _inputs(3)
    groups = 3
    encoded = model.apply(params, src, src_mask, method=model.encode)
    extra = model.apply(params, encoded, src_mask, method=model.decode_inputs)
    tiled = jax.tree.map(lambda x: np.repeat(np.asarray(x), groups, axis=0), extra)
    rng = np.random.default_rng(5)
    grouped_cache = model.apply(params, 3 * groups, 8, method=model.init_cache)
    tiled_cache = grouped_cache
    for _ in range(4):  # every row its own prefix
        tokens = rng.integers(4, 36, 3 * groups).astype(np.int32)
        got, grouped_cache = model.apply(
            params, grouped_cache, tokens, extra, method=model.decode_step
        )
        want, tiled_cache = model.apply(
            params, tiled_cache, tokens, tiled, method=model.decode_step
        )
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=1e-5)


def test_parameters_carry_logical_axes():
    model = Transformer(CFG)
    src = jnp.ones((1, 3), jnp.int32)
    boxed = model.init(jax.random.PRNGKey(0), src, src, src, src)["params"]
    leaves = jax.tree_util.tree_leaves(
        boxed, is_leaf=lambda x: hasattr(x, "names") and hasattr(x, "value")
    )
    assert leaves and all(hasattr(leaf, "names") for leaf in leaves)
    for leaf in leaves:
        assert len(leaf.names) == leaf.value.ndim
        assert set(leaf.names) <= {"vocab", "embed", "heads", "kv", "mlp"}


def test_sinusoidal_encoding_matches_formula():
    pos = np.array([0, 1, 5, 17])
    enc = np.asarray(layers.sinusoidal_encoding(jnp.asarray(pos), 8))
    for row, p in enumerate(pos):
        for i in range(4):
            angle = p / 10000 ** (i / 4)
            assert enc[row, i] == pytest.approx(np.sin(angle), abs=1e-5)
            assert enc[row, 4 + i] == pytest.approx(np.cos(angle), abs=1e-5)


def test_tied_logits_gradients_match_float64():
    """The custom backward of the tied output projection against the float64 products:
    d x = g E and d E = g^T x, for a loss sum(g * logits) with a fixed random ``g``."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 3, 5)).astype(np.float32)
    table = rng.normal(size=(7, 5)).astype(np.float32)
    g = rng.normal(size=(2, 3, 7)).astype(np.float32)
    dx, dtable = jax.grad(lambda a, b: jnp.sum(layers.tied_logits(a, b) * g), argnums=(0, 1))(
        x, table
    )
    x64, t64, g64 = (np.asarray(a, np.float64) for a in (x, table, g))
    np.testing.assert_allclose(layers.tied_logits(x, table), x64 @ t64.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dx, g64 @ t64, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        dtable, g64.reshape(-1, 7).T @ x64.reshape(-1, 5), rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("rows", [1, 5, 12])
def test_attention_values_matches_a_float64_sum(rows):
    """Both code paths (broadcast multiply-add for 2-8 query rows, product otherwise)."""
    rng = np.random.default_rng(rows)
    weights = rng.random((2, 3, rows, 7)).astype(np.float32)
    values = rng.normal(size=(2, 3, 7, 4)).astype(np.float32)
    got = np.asarray(layers.attention_values(jnp.asarray(weights), jnp.asarray(values)))
    want = np.zeros((2, rows, 3, 4))
    for b, h, q, k in np.ndindex(2, 3, rows, 7):
        want[b, q, h] += float(weights[b, h, q, k]) * values[b, h, k].astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
