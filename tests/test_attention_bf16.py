"""Fused attention (``jax.nn.dot_product_attention``) against the unfused path and a float64
loop, under every mask the models build; bfloat16 training against float32 on a fixed batch."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import TINY_TRANSFORMER, tiny_pairs_batch

from docnmt_jax.models import build_model, layers
from docnmt_jax.objectives import build_objective

pytestmark = pytest.mark.accelerator

B, TQ, TK, H, D = 3, 7, 9, 2, 16


def _reference(q, k, v, mask):
    """Attention per example and head in float64 loops (a fully masked row: uniform)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    mask = np.broadcast_to(np.asarray(mask), (q.shape[0], H, q.shape[1], k.shape[1]))
    out = np.zeros(q.shape)
    for b in range(q.shape[0]):
        for h in range(H):
            logits = q[b, :, h] @ k[b, :, h].T / np.sqrt(q.shape[-1])
            logits = np.where(mask[b, h], logits, -1e30)
            w = np.exp(logits - logits.max(-1, keepdims=True))
            out[b, :, h] = (w / w.sum(-1, keepdims=True)) @ v[b, :, h]
    return out


def _masks(rng):
    pad_k = rng.random((B, 1, 1, TK)) > 0.3
    pad_k[:, ..., 0] = True
    causal = np.tril(np.ones((TQ, TK), bool))[None, None]
    segments_q, segments_k = rng.integers(1, 3, (B, TQ)), rng.integers(0, 3, (B, TK))
    segment = layers.segment_mask(jnp.asarray(segments_q), jnp.asarray(segments_k))
    fully_masked = np.ones((B, 1, TQ, TK), bool)
    fully_masked[:, :, 2] = False  # one query row sees nothing
    return {
        "none": None,
        "padding": pad_k,
        "causal": causal,
        "segments": np.asarray(segment),
        "a fully masked row": fully_masked,
    }


@pytest.mark.parametrize("implementation", ["xla", "einsum"])
@pytest.mark.parametrize("name", ["none", "padding", "causal", "segments", "a fully masked row"])
def test_fused_attention_equals_the_float64_loop(name, implementation):
    rng = np.random.default_rng(0)
    q, k, v = (rng.normal(size=(B, t, H, D)).astype(np.float32) for t in (TQ, TK, TK))
    mask = _masks(rng)[name]
    want = _reference(q, k, v, True if mask is None else mask)
    jmask = None if mask is None else jnp.asarray(mask)
    args = (jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), jmask)
    got = layers.fused_attention(*args, implementation=implementation)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("implementation", ["xla", "einsum"])
@pytest.mark.parametrize("groups", [1, 3])
def test_the_attention_module_gives_the_unfused_paths_output(groups, implementation, monkeypatch):
    """``attend`` takes the fused kernel when no weights are asked for; asked for them it runs
    the unfused products: both outputs agree (search beams sharing keys: ``groups`` rows)."""
    monkeypatch.setenv(layers.ATTENTION_ENV, implementation)
    rng = np.random.default_rng(1)
    attention = layers.MultiHeadAttention(num_heads=H, model_dim=H * D)
    x_q = jnp.asarray(rng.normal(size=(B * groups, TQ, H * D)), jnp.float32)
    x_kv = jnp.asarray(rng.normal(size=(B, TK, H * D)), jnp.float32)
    mask = jnp.asarray(rng.random((B, 1, 1, TK)) > 0.4).at[..., 0].set(True)
    params = attention.init(jax.random.PRNGKey(0), x_kv, x_kv, mask)

    def run(module, return_weights):
        q = module.project_q(x_q)
        k, v = module.project_kv(x_kv)
        return module.attend(q, k, v, mask, return_weights=return_weights)

    fused = attention.apply(params, False, method=run)
    unfused, _ = attention.apply(params, True, method=run)
    np.testing.assert_allclose(np.asarray(fused), np.asarray(unfused), rtol=1e-5, atol=1e-5)


def test_the_kernel_is_chosen_by_backend_and_dtype(monkeypatch):
    monkeypatch.delenv(layers.ATTENTION_ENV, raising=False)
    assert layers.attention_implementation(jnp.float32) == "einsum"  # CPU
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert layers.attention_implementation(jnp.bfloat16) == "cudnn"
    assert layers.attention_implementation(jnp.float32) == "xla"
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    assert layers.attention_implementation(jnp.bfloat16) == "xla"
    monkeypatch.setenv(layers.ATTENTION_ENV, "einsum")
    assert layers.attention_implementation(jnp.bfloat16) == "einsum"
    monkeypatch.setenv(layers.ATTENTION_ENV, "flash")
    with pytest.raises(ValueError, match="DOCNMT_ATTENTION='flash'"):
        layers.attention_implementation(jnp.float32)


#: bfloat16 keeps 8 significant bits (relative step 2^-8 ~ 0.4%): the loss of a tiny model
#: within 2%, gradient leaves within 10% in L2 and pointing the same way (cosine > 0.99).
BF16_LOSS_RTOL, BF16_GRAD_RTOL, BF16_GRAD_COSINE = 0.02, 0.10, 0.99


def test_bfloat16_training_matches_float32_on_a_fixed_batch():
    batch, vocab_size = tiny_pairs_batch()
    losses, grads = {}, {}
    params = None
    for dtype in ("float32", "bfloat16"):
        model = build_model({**TINY_TRANSFORMER, "dtype": dtype}, vocab_size=vocab_size)
        if params is None:  # float32 parameters, shared by both
            params = nn.meta.unbox(model.init(jax.random.PRNGKey(0), batch)["params"])
        objective = build_objective(None, model)

        def loss(p, objective=objective):
            return objective.loss(p, batch, None, False)[0]

        losses[dtype], grads[dtype] = jax.value_and_grad(loss)(params)
    assert float(losses["float32"]) > 1.0  # an untrained model: a real loss, not ~0
    assert float(losses["bfloat16"]) != float(losses["float32"])  # bfloat16 did compute
    np.testing.assert_allclose(losses["bfloat16"], losses["float32"], rtol=BF16_LOSS_RTOL)
    leaves32 = jax.tree_util.tree_leaves_with_path(grads["float32"])
    leaves16 = dict(jax.tree_util.tree_leaves_with_path(grads["bfloat16"]))
    checked = 0
    for path, g32 in leaves32:
        g16 = np.asarray(leaves16[path], np.float64).ravel()
        g32 = np.asarray(g32, np.float64).ravel()
        if np.linalg.norm(g32) < 1e-6:
            continue
        assert leaves16[path].dtype == jnp.float32  # gradients of float32 parameters
        rel = np.linalg.norm(g16 - g32) / np.linalg.norm(g32)
        cosine = g16 @ g32 / (np.linalg.norm(g16) * np.linalg.norm(g32))
        name = jax.tree_util.keystr(path)
        assert rel < BF16_GRAD_RTOL and cosine > BF16_GRAD_COSINE, (name, rel, cosine)
        checked += 1
    assert checked >= 10  # embeddings, attention, feed-forward and layer-norm leaves


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="cuDNN fused attention: GPU only")
@pytest.mark.parametrize("name", ["padding", "causal", "segments"])
def test_cudnn_attention_in_bfloat16_is_float64s_to_bfloat16_precision(name):
    """On a GPU, bfloat16 attention runs cuDNN's fused kernel (``attention_implementation``);
    its output is the float64 loop's to bfloat16's precision."""
    assert layers.attention_implementation(jnp.bfloat16) == "cudnn"
    rng = np.random.default_rng(2)
    q, k, v = (rng.normal(size=(B, t, H, D)).astype(np.float32) for t in (TQ, TK, TK))
    mask = _masks(rng)[name]
    want = _reference(q, k, v, mask)
    q16, k16, v16 = (jnp.asarray(x, jnp.bfloat16) for x in (q, k, v))
    got = layers.fused_attention(q16, k16, v16, jnp.asarray(mask))
    np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=0.05, atol=0.05)


#: Every shipped model's config (a document model's residual states, caches and scan carries
#: must all accept the float32 residual stream of a bfloat16 model).
MODEL_CONFIGS = (
    "transformer",
    "doc2doc",
    "doct",
    "final",
    "hmgdc",
    "jean_cho",
    "rnnsearch",
    "rnnsearch_hmgdc",
)


@pytest.mark.slow
@pytest.mark.parametrize("name", MODEL_CONFIGS)
def test_every_model_trains_and_translates_in_bfloat16(name, synthetic_dir, tmp_path):
    """One bfloat16 training step and a greedy bfloat16 translation of each model: finite
    loss, one hypothesis per source sentence, not all of them empty."""
    import os

    from conftest import ROOT, tiny_config

    from docnmt_jax.config_files import load_config
    from docnmt_jax.data import readers
    from docnmt_jax.decoding.search import SearchConfig
    from docnmt_jax.training import budget, restore, trainer

    base = tiny_config(synthetic_dir, num_steps=1)
    config = load_config(os.path.join(ROOT, "configs", f"{name}.py"))
    budget.resize_model(config, budget.TINY_MODEL)
    config.data, config.train = base.data, base.train
    if "max_segments" in config.model:
        config.model.max_segments = max(config.model.max_segments, config.data.max_sentences)
    config.model.dtype = "bfloat16"
    result = trainer.train_and_evaluate(config, str(tmp_path))
    assert np.isfinite(result.dev_metrics["dev_loss"])
    translator, _ = restore.load_translator(
        str(tmp_path), "latest", SearchConfig(beam_size=1, alpha=0.0), dtype="bfloat16"
    )
    documents = readers.read_tsv(os.path.join(synthetic_dir, "test.tsv"))[:2]
    hyps = translator.translate(documents)
    assert [len(h) for h in hyps] == [len(d.src) for d in documents]
    assert any(h for doc in hyps for h in doc)
