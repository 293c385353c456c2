"""FINAL (Zheng et al. 2020): the parallel model against a naive sentence-by-sentence reference,
segment attention, fusion gate, cached decoding, document translation, attention export."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import TABLE3_SWITCHES

from docnmt_jax.decoding.beam_search import beam_search
from docnmt_jax.decoding.compiled import compile_translate
from docnmt_jax.decoding.search import (
    SearchConfig,
    encode_in_groups,
    source_length_limits,
)
from docnmt_jax.models import layers
from docnmt_jax.models.final import Final, FinalConfig, FinalModel
from docnmt_jax.models.final_layers import SegmentRelativeAttention
from docnmt_jax.models.xl import empty_memory

V = 23
CFG = FinalConfig(
    vocab_size=V,
    d_model=16,
    num_heads=2,
    ffn_dim=24,
    num_encoder_layers=2,
    num_decoder_layers=2,
    deterministic=True,
    max_relative_distance=1,  # S = 3 sentences: distance 2 is clipped
    max_segments=20,
)


def _batch(seed=0, B=3, S=3, T=5):
    """Row 0: three sentences of mixed lengths; row 1: two; row 2: a one-sentence document."""
    rng = np.random.default_rng(seed)
    src_len = np.array([[5, 3, 4], [2, 5, 0], [4, 0, 0]])[:B, :S]
    tgt_len = np.array([[2, 5, 3], [4, 1, 0], [5, 0, 0]])[:B, :S]
    ar = np.arange(T)
    src_mask = (ar < src_len[..., None]).astype(np.int32)
    tgt_mask = (ar < tgt_len[..., None]).astype(np.int32)
    src = rng.integers(4, V, (B, S, T)).astype(np.int32) * src_mask
    tgt = rng.integers(4, V, (B, S, T)).astype(np.int32) * tgt_mask
    return {"src": src, "src_mask": src_mask, "tgt": tgt, "tgt_mask": tgt_mask}


# The machine running the tests may be loaded: compile without XLA's expensive CPU passes.
FAST = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def _fast(fn, *args):
    """``jax.jit(fn)(*args)`` compiled quickly (arguments are traced, none static)."""
    return jax.jit(fn).lower(*args).compile(compiler_options=FAST)(*args)


def _fast_jit(fn):
    """A jitted ``fn`` compiled quickly on first call (one compilation per signature)."""
    compiled = {}

    def call(*args):
        leaves, treedef = jax.tree.flatten(args)
        key = (treedef, tuple((np.shape(a), np.result_type(a)) for a in leaves))
        if key not in compiled:
            compiled[key] = jax.jit(fn).lower(*args).compile(compiler_options=FAST)
        return compiled[key](*args)

    return call


def _init(cfg, batch, seed=0):
    model = Final(cfg)
    variables = _fast(
        model.init,
        jax.random.PRNGKey(seed),
        batch["src"],
        batch["src_mask"],
        batch["tgt"],
        batch["tgt_mask"],
    )
    return model, nn.meta.unbox(variables)["params"]


@pytest.fixture(scope="module")
def final_model():
    """(model, params, batch) of the FINAL configuration."""
    batch = _batch()
    return _init(CFG, batch) + (batch,)


def _loss(logits, tgt, mask):
    logp = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(logp, tgt[..., None], axis=-1)[..., 0]
    return jnp.sum(nll * mask) / jnp.sum(mask)


# ----------------------------------------------------------------------- naive reference
# Written independently of the model: one example and one sentence at a time, real tokens only
# (no padding, no masks but causality), explicit memory from the previous sentence, dense
# [N, N, H, d] relative keys/values in the global layer.


def _ln(p, x):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / jnp.sqrt(var + 1e-6) * p["scale"] + p["bias"]


def _heads(p, x):
    return jnp.einsum("td,dhk->thk", x, p["kernel"]) + p.get("bias", 0.0)


def _unheads(p, o):
    return jnp.einsum("thk,hkd->td", o, p["kernel"]) + p["bias"]


def _ffn(p, x):
    h = jax.nn.relu(x @ p["wi"]["kernel"] + p["wi"]["bias"])
    return h @ p["wo"]["kernel"] + p["wo"]["bias"]


def _softmax_attend(logits, mask, v):
    logits = jnp.where(mask, logits, -jnp.inf)
    return jnp.einsum("hij,jhk->ihk", jax.nn.softmax(logits, axis=-1), v)


def _mha(p, xq, xkv, mask):
    q, k, v = _heads(p["query"], xq), _heads(p["key"], xkv), _heads(p["value"], xkv)
    logits = jnp.einsum("ihk,jhk->hij", q, k) / np.sqrt(q.shape[-1])
    return _unheads(p["out"], _softmax_attend(logits, mask, v))


def _sinus(pos, d):
    half = d // 2
    inv = np.exp(-np.log(10000.0) * np.arange(half) / half)
    ang = np.asarray(pos, np.float64)[..., None] * inv
    return jnp.asarray(np.concatenate([np.sin(ang), np.cos(ang)], -1), jnp.float32)


def _encoder_layer(p, x, mask):
    x = _ln(p["attention_block"]["norm"], x + _mha(p["self_attention"], x, x, mask))
    return _ln(p["ffn_block"]["norm"], x + _ffn(p["ffn"], x))


def _naive_global(cfg, p, x, sid):
    """Eq. (1) with explicit per-pair keys x W^K + gamma^K_{k-kappa}, then fusion and FFN."""
    pa = p["segment_attention"]
    R = cfg.max_relative_distance
    q, k, v = _heads(pa["query"], x), _heads(pa["key"], x), _heads(pa["value"], x)
    dist = np.clip(sid[:, None] - sid[None, :], -R, R) + R
    keys = k[None] + pa["relative_key"][dist]  # [N, N, H, d]
    values = v[None] + pa["relative_value"][dist]
    logits = jnp.einsum("ihk,ijhk->hij", q, keys) / np.sqrt(q.shape[-1])
    weights = jax.nn.softmax(logits, axis=-1)
    h_global = _unheads(pa["out"], jnp.einsum("hij,ijhk->ihk", weights, values))
    if cfg.context_fusion_gate:
        g = jax.nn.sigmoid(
            jnp.concatenate([x, h_global], -1) @ p["gate"]["kernel"] + p["gate"]["bias"]
        )
        fused = (1 - g) * x + g * h_global
    else:
        fused = x + h_global
    fused = _ln(p["fusion_norm"], fused)
    return _ln(p["ffn_block"]["norm"], fused + _ffn(p["ffn"], fused)), weights


def _naive_encode(cfg, params, src, src_len):
    """Per-sentence encodings (list of [n_k, D]) of one example's real sentences."""
    emb = params["embed"]["embedding"]
    xs, offset = [], 0
    for k, n in enumerate(src_len):
        pos = np.arange(n) + (0 if cfg.reset_word_positions else offset)
        x = emb[src[k, :n]] * np.sqrt(cfg.d_model) + _sinus(pos, cfg.d_model)
        if cfg.segment_embedding:
            x = x + params["segment_embedding"][k]
        xs.append(x)
        offset += n
    num_local = cfg.num_encoder_layers - int(cfg.segment_relative_attention)
    if cfg.doc2sent:
        whole = jnp.concatenate(xs)
        for i in range(num_local):
            whole = _encoder_layer(params[f"encoder_layers_{i}"], whole, True)
        xs = jnp.split(whole, np.cumsum(src_len)[:-1])
    else:
        for i in range(num_local):
            xs = [_encoder_layer(params[f"encoder_layers_{i}"], x, True) for x in xs]
    if cfg.segment_relative_attention and len(xs) > 1:
        sid = np.concatenate([np.full(n, k) for k, n in enumerate(src_len)])
        h, _ = _naive_global(cfg, params["global_layer"], jnp.concatenate(xs), sid)
        xs = jnp.split(h, np.cumsum(src_len)[:-1])
    return list(xs)


def _naive_xl_layer(cfg, p, s, mem, enc):
    """Dai et al. (2019) relative self-attention over [SG(mem); s], then cross-attn and FFN."""
    pa = p["self_attention"]
    n, T = mem.shape[0], s.shape[0]
    kv_in = jnp.concatenate([jax.lax.stop_gradient(mem), s])
    q, k, v = _heads(pa["query"], s), _heads(pa["key"], kv_in), _heads(pa["value"], kv_in)
    dist = np.arange(T)[:, None] - np.concatenate([np.arange(n) - n, np.arange(T)])[None, :]
    r = jnp.einsum("ijd,dhk->ijhk", _sinus(dist, cfg.d_model), pa["position"]["kernel"])
    logits = jnp.einsum("ihk,jhk->hij", q + pa["content_bias"], k)
    logits = logits + jnp.einsum("ihk,ijhk->hij", q + pa["position_bias"], r)
    att = _unheads(pa["out"], _softmax_attend(logits / np.sqrt(q.shape[-1]), dist >= 0, v))
    s = _ln(p["self_attention_norm"], s + att)
    s = _ln(p["cross_attention_block"]["norm"], s + _mha(p["cross_attention"], s, enc, True))
    return _ln(p["ffn_block"]["norm"], s + _ffn(p["ffn"], s))


def _naive_sentence_layer(cfg, p, s, enc):
    causal = np.tril(np.ones((s.shape[0], s.shape[0]), bool))
    s = _ln(p["self_attention_block"]["norm"], s + _mha(p["self_attention"], s, s, causal))
    s = _ln(p["cross_attention_block"]["norm"], s + _mha(p["cross_attention"], s, enc, True))
    return _ln(p["ffn_block"]["norm"], s + _ffn(p["ffn"], s))


def naive_loss(cfg, params, batch):
    """Mean token NLL, computed example by example and sentence by sentence. Sentence ``k``
    cross-attends to its own encoding, or (Doc2Sent's chunk reading) to every real source
    token of the chunk."""
    emb = params["embed"]["embedding"]
    whole_chunk = cfg.doc2sent and cfg.doc2sent_cross_attention == "chunk"
    total, count = 0.0, 0
    for b in range(batch["src"].shape[0]):
        src_len = [int(n) for n in batch["src_mask"][b].sum(-1) if n > 0]
        encoded = _naive_encode(cfg, params, batch["src"][b], src_len)
        if whole_chunk:
            encoded = [jnp.concatenate(encoded)] * len(encoded)
        prev_states = None
        for k in range(len(src_len)):
            n = int(batch["tgt_mask"][b, k].sum())
            tgt = batch["tgt"][b, k, :n]
            s = emb[np.concatenate([[2], tgt[:-1]])] * np.sqrt(cfg.d_model)
            if not cfg.xl_decoder:
                s = s + _sinus(np.arange(n), cfg.d_model)
            states = []
            for i in range(cfg.num_decoder_layers):
                states.append(s)
                p = params[f"decoder_layers_{i}"]
                if cfg.xl_decoder:
                    mem = prev_states[i] if prev_states is not None else jnp.zeros((0, s.shape[1]))
                    s = _naive_xl_layer(cfg, p, s, mem, encoded[k])
                else:
                    s = _naive_sentence_layer(cfg, p, s, encoded[k])
            prev_states = states
            logp = jax.nn.log_softmax(s @ emb.T, axis=-1)
            total = total - jnp.sum(logp[np.arange(n), tgt])
            count += n
    return total / count


# ----------------------------------------------------------------------------------- tests


def _rows(batch, rows):
    return {key: val[rows] for key, val in batch.items()}


def _check_against_naive(cfg, model, params, batch):
    def model_loss(p):
        logits = model.apply(
            {"params": p}, batch["src"], batch["src_mask"], batch["tgt"], batch["tgt_mask"]
        )
        return _loss(logits, batch["tgt"], batch["tgt_mask"])

    def both(p):  # one compilation
        ref = jax.value_and_grad(lambda p: naive_loss(cfg, p, batch))(p)
        return jax.value_and_grad(model_loss)(p), ref

    (loss, grads), (ref_loss, ref_grads) = _fast(both, params)
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5, atol=1e-5)
    flat, ref_flat = jax.tree_util.tree_leaves_with_path(grads), jax.tree.leaves(ref_grads)
    for (path, g), ref in zip(flat, ref_flat, strict=True):
        np.testing.assert_allclose(g, ref, atol=1e-5, rtol=1e-4, err_msg=jax.tree_util.keystr(path))
    return grads


def test_parallel_model_equals_naive_reference_in_loss_and_gradients(final_model):
    """All sentences and layers in one pass == sentence by sentence with explicit memory."""
    model, params, batch = final_model
    grads = _check_against_naive(CFG, model, params, _rows(batch, [0, 2]))
    # The check can fail: the relative tables, the gate and u, v all receive gradient.
    glob = grads["global_layer"]
    for g in (
        glob["segment_attention"]["relative_value"],
        glob["segment_attention"]["relative_key"],
        glob["gate"]["kernel"],
        grads["decoder_layers_1"]["self_attention"]["position_bias"],
    ):
        assert np.abs(g).max() > 1e-6


@pytest.mark.parametrize("reading", ["chunk", "own_slice"])
def test_doc2sent_variant_equals_naive_reference_in_loss(reading):
    """Whole-chunk lower layers, positions across the chunk, sentence decoder (Table 3), its
    cross-attention over the whole chunk or the sentence's own slice."""
    switches = dict(
        TABLE3_SWITCHES["doc2sent+reset+segment"],
        reset_word_positions=False,
        doc2sent_cross_attention=reading,
    )
    cfg = dataclasses.replace(CFG, **switches)
    batch = _rows(_batch(), [0])
    model, params = _init(cfg, batch)
    loss = _fast(
        lambda p: _loss(
            model.apply(
                {"params": p}, batch["src"], batch["src_mask"], batch["tgt"], batch["tgt_mask"]
            ),
            batch["tgt"],
            batch["tgt_mask"],
        ),
        params,
    )
    ref_loss = _fast(lambda p: naive_loss(cfg, p, batch), params)
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5, atol=1e-5)


def test_segment_relative_attention_equals_dense_reference():
    """Eq. (1) against a float64 NumPy version with explicit [N, N, H, d] relative keys."""
    B, S, T, D = 2, 4, 3, CFG.d_model  # max_relative_distance = 1: distances 2, 3 clipped
    rng = np.random.default_rng(1)
    x = rng.normal(size=(B, S * T, D)).astype(np.float32)
    mask = np.ones((B, S, T), np.int32)
    mask[0, 1, 2:] = 0
    mask[1, 3] = 0
    mask = mask.reshape(B, S * T)
    module = SegmentRelativeAttention(CFG)
    params = nn.meta.unbox(_fast(lambda r: module.init(r, x, mask, S), jax.random.PRNGKey(2)))
    params = jax.tree.map(np.asarray, params["params"])
    # Large relative tables, so that the gamma terms matter.
    params["relative_key"] = params["relative_key"] * 50
    params["relative_value"] = params["relative_value"] * 50
    apply = _fast_jit(lambda p: module.apply({"params": p}, x, mask, S))
    out, weights = apply(params)
    p = jax.tree.map(lambda a: a.astype(np.float64), params)
    sid = np.repeat(np.arange(S), T)
    R = CFG.max_relative_distance
    for b in range(B):
        real = mask[b] > 0
        xr = x[b][real].astype(np.float64)
        q, k, v = (
            np.einsum("td,dhk->thk", xr, p[n]["kernel"]) + p[n]["bias"]
            for n in ("query", "key", "value")
        )
        dist = np.clip(sid[real][:, None] - sid[real][None, :], -R, R) + R
        keys = k[None] + p["relative_key"][dist]  # [N, N, H, d], dense
        values = v[None] + p["relative_value"][dist]
        logits = np.einsum("ihk,ijhk->hij", q, keys) / np.sqrt(q.shape[-1])
        w = np.exp(logits - logits.max(-1, keepdims=True))
        w /= w.sum(-1, keepdims=True)
        z = np.einsum("hij,ijhk->ihk", w, values)
        ref = np.einsum("ihk,hkd->id", z, p["out"]["kernel"]) + p["out"]["bias"]
        np.testing.assert_allclose(np.asarray(out)[b][real], ref, atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(np.asarray(weights)[b][:, real][:, :, real], w, atol=1e-6)
    without = apply(dict(params, relative_value=params["relative_value"] * 0))[0]
    assert np.abs(np.asarray(without - out)).max() > 1e-3


def test_fusion_gate_and_one_sentence_documents(final_model):
    model, params, batch = final_model
    h, state = _fast(
        lambda p, s, m: model.apply(
            {"params": p}, s, m, method=model.encode, mutable=["intermediates"]
        ),
        params,
        batch["src"],
        batch["src_mask"],
    )
    inter = {key: val[0] for key, val in state["intermediates"]["global_layer"].items()}
    p = params["global_layer"]
    x, hg = inter["h_local"], inter["h_global"]
    # g = sigmoid(W_g [h^L; h^G]), h = LN((1 - g) h^L + g h^G), then the FFN sublayer.
    gate = jax.nn.sigmoid(jnp.concatenate([x, hg], -1) @ p["gate"]["kernel"] + p["gate"]["bias"])
    np.testing.assert_allclose(inter["gate_values"], gate, atol=1e-6)
    fused = _ln(p["fusion_norm"], (1 - gate) * x + gate * hg)
    np.testing.assert_allclose(inter["fused"], fused, atol=1e-5)
    out = np.asarray(_ln(p["ffn_block"]["norm"], fused + _ffn(p["ffn"], fused))).reshape(h.shape)
    h = np.asarray(h)
    real = batch["src_mask"] > 0
    np.testing.assert_allclose(h[:2][real[:2]], out[:2][real[:2]], atol=1e-5)
    # Row 2 is a one-sentence document: global encoding off, h = h^L (the local path).
    local = np.asarray(x).reshape(h.shape)
    np.testing.assert_array_equal(h[2], local[2])
    ref = _naive_encode(CFG, params, batch["src"][2], [4])[0]
    np.testing.assert_allclose(h[2, 0, :4], ref, atol=1e-5)
    assert np.abs(out[2, 0, :4] - local[2, 0, :4]).max() > 1e-2  # the switch is real


@pytest.mark.parametrize(
    "overrides", [{}, {"pre_ln": True}, {"xl_decoder": False}], ids=["final", "pre_ln", "no_xl"]
)
def test_cached_decoding_with_memory_equals_teacher_forcing(final_model, overrides):
    """Sentence by sentence (explicit memory, teacher-forced or cached step by step) equals
    the parallel pass over the chunk."""
    batch = _batch(3)
    cfg = dataclasses.replace(CFG, **overrides)
    if overrides:
        model, params = _init(cfg, batch)
    else:
        model, params, _ = final_model
    v = {"params": params}
    B, S, T = batch["tgt"].shape
    full, encoded = _fast(
        lambda v, b: (
            model.apply(v, b["src"], b["src_mask"], b["tgt"], b["tgt_mask"]),
            model.apply(v, b["src"], b["src_mask"], method=model.encode),
        ),
        v,
        batch,
    )
    full = np.asarray(full)

    def sentence(v, enc, src_mask, tgt, tgt_mask, memory, padded):
        logits, new_memory = model.apply(
            v, enc, src_mask, tgt, tgt_mask, memory, method=model.decode_sentence
        )
        next_memory = model.apply(
            v, enc, src_mask, tgt, tgt_mask, memory, method=model.sentence_memory
        )
        cache = model.apply(v, enc.shape[0], T + 2, method=model.init_cache)
        padded_kv = model.apply(v, padded, method=model.memory_kv)
        extra = model.apply(v, enc, src_mask, padded_kv, method=model.decode_inputs)
        return logits, new_memory, next_memory, cache, extra

    sentence = _fast_jit(sentence)
    step_fn = _fast_jit(lambda v, *a: model.apply(v, *a, method=model.decode_step))
    memory = empty_memory(cfg, B, T)
    rng = np.random.default_rng(0)
    for k in range(S):
        enc_k, smask_k = encoded[:, k], batch["src_mask"][:, k]
        tgt_k, tmask_k = batch["tgt"][:, k], batch["tgt_mask"][:, k]
        real = tmask_k > 0
        # Memory padded with garbage to a longer length gives the same logits (its relative
        # positions count from its real length).
        padded = {
            key: jnp.concatenate(
                [
                    val,
                    jnp.asarray(rng.normal(size=val.shape[:1] + (3,) + val.shape[2:]), val.dtype)
                    * (key != "mask"),
                ],
                axis=1,
            )
            for key, val in memory.items()
        }
        logits, new_memory, next_memory, cache, extra = sentence(
            v, enc_k, smask_k, tgt_k, tmask_k, memory, padded
        )
        np.testing.assert_allclose(np.asarray(logits)[real], full[:, k][real], atol=1e-5)
        dec_in = np.asarray(layers.shift_right(jnp.asarray(tgt_k), 2))
        for t in range(T):
            step, cache = step_fn(v, cache, dec_in[:, t], extra)
            np.testing.assert_allclose(
                np.asarray(step)[real[:, t]], full[:, k, t][real[:, t]], atol=1e-5, rtol=1e-5
            )
        for key in next_memory:
            np.testing.assert_allclose(next_memory[key], new_memory[key], atol=1e-6)
        memory = next_memory
    assert len(memory) == 1 + cfg.xl_decoder * cfg.num_decoder_layers


def test_grouped_encoding_equals_one_call(final_model):
    """Encoding the chunks in groups (CPU decoding) gives the one-call encoding."""
    model, params, batch = final_model
    v = {"params": params}
    one = _fast(
        lambda v, s, m: model.apply(v, s, m, method=model.encode),
        v,
        batch["src"],
        batch["src_mask"],
    )
    S, T = batch["src"].shape[1:]
    grouped = _fast(
        lambda v, s, m: encode_in_groups(model, v, s, m, S * T), v, batch["src"], batch["src_mask"]
    )  # one chunk per group
    np.testing.assert_allclose(np.asarray(grouped), np.asarray(one), atol=1e-5, rtol=1e-5)


def test_beams_share_memory_and_cross_inputs(final_model):
    """``G`` cache rows (beams) per example against one row of memory and cross keys/values
    give the logits of the naive layout, the per-example inputs copied to every row."""
    model, params, _ = final_model
    batch = _batch(4)
    v = {"params": params}
    groups, B, T = 3, batch["src"].shape[0], batch["src"].shape[-1]
    encoded = _fast(
        lambda v, s, m: model.apply(v, s, m, method=model.encode),
        v,
        batch["src"],
        batch["src_mask"],
    )
    enc, smask = encoded[:, 1], batch["src_mask"][:, 1]
    memory = _fast(
        lambda v, *a: model.apply(v, *a, method=model.sentence_memory),
        v,
        encoded[:, 0],
        batch["src_mask"][:, 0],
        batch["tgt"][:, 0],
        batch["tgt_mask"][:, 0],
        empty_memory(CFG, B, T),
    )
    assert int(memory["mask"].sum()) > 0
    memory_kv = model.apply(v, memory, method=model.memory_kv)
    extra = model.apply(v, enc, smask, memory_kv, method=model.decode_inputs)
    tiled = jax.tree.map(lambda x: jnp.repeat(x, groups, axis=0), extra)
    step_fn = _fast_jit(lambda v, *a: model.apply(v, *a, method=model.decode_step))
    grouped_cache = tiled_cache = model.apply(v, B * groups, T, method=model.init_cache)
    rng = np.random.default_rng(2)
    for _ in range(T):
        tokens = rng.integers(4, V, B * groups).astype(np.int32)
        got, grouped_cache = step_fn(v, grouped_cache, tokens, extra)
        want, tiled_cache = step_fn(v, tiled_cache, tokens, tiled)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=1e-5)


def _search_alone(model, v, encoded_k, mask_k, limits_k, memory_kv, max_len):
    """Beam 2 (alpha 0.6) over one sentence per row with the given memory keys/values, through
    the model's public decoding API."""
    cache = model.apply(v, encoded_k.shape[0], max_len, method=model.init_cache)
    extra = model.apply(v, encoded_k, mask_k, memory_kv, method=model.decode_inputs)
    return beam_search(
        lambda c, t, e: model.apply(v, c, t, e, method=model.decode_step),
        cache,
        extra,
        beam_size=2,
        alpha=0.6,
        max_len=max_len,
        max_lengths=limits_k,
    )


def test_translate_batch_uses_the_chosen_hypothesis_as_memory(final_model):
    _, params, _ = final_model
    batch = _batch(5)
    task = FinalModel(CFG)
    model = task.eval_module
    # A sharper random model (larger embeddings), so that outputs depend on the inputs.
    params = dict(params, embed={"embedding": params["embed"]["embedding"] * 6})
    search = SearchConfig(beam_size=2, alpha=0.6, len_a=1.0, len_b=2, max_len=6)
    L = search.output_len(5)
    translate = _fast_jit(lambda p, b: task.translate(p, b, search)[0])
    ids = np.asarray(translate(params, batch))
    assert ids.shape == (3, 3, L)
    real = batch["src_mask"].any(-1)
    assert (ids[~real] == 0).all() and (ids[real] > 0).any(-1).all()

    def one_sentence(params, encoded_k, mask_k, limits_k, memory):
        v = {"params": params}
        memory_kv = model.apply(v, memory, method=model.memory_kv)
        return _search_alone(model, v, encoded_k, mask_k, limits_k, memory_kv, L)

    search_one = _fast_jit(one_sentence)
    memory_of = _fast_jit(
        lambda p, *a: model.apply({"params": p}, *a, method=model.sentence_memory)
    )
    encoded = _fast(
        lambda p, s, m: model.apply({"params": p}, s, m, method=model.encode),
        params,
        batch["src"],
        batch["src_mask"],
    )
    limits = source_length_limits(batch["src_mask"], 1.0, 2, L)

    def manual(use_reference):
        """Sentence by sentence; memory from the chosen hypothesis or from the reference."""
        memory, out, scores = empty_memory(CFG, 3, L), [], []
        for k in range(3):
            res = search_one(params, encoded[:, k], batch["src_mask"][:, k], limits[:, k], memory)
            out.append(np.asarray(res.sequences[:, 0]))
            scores.append(np.asarray(res.scores[:, 0]))
            if use_reference:
                tgt = np.pad(batch["tgt"][:, k], [(0, 0), (0, L - 5)])
                mask = np.pad(batch["tgt_mask"][:, k], [(0, 0), (0, L - 5)])
            else:
                tgt = res.sequences[:, 0]
                mask = (jnp.arange(L)[None] < res.lengths[:, :1]).astype(jnp.int32)
            memory = memory_of(params, encoded[:, k], batch["src_mask"][:, k], tgt, mask, memory)
        return np.stack(out, 1), np.stack(scores, 1)

    hyp_ids, hyp_scores = manual(False)
    ref_ids, ref_scores = manual(True)
    np.testing.assert_array_equal(ids[real], hyp_ids[real])
    # Sentence 0 has no memory; later sentences depend on which memory is fed.
    np.testing.assert_array_equal(ref_ids[:, 0], hyp_ids[:, 0])
    later = real.copy()
    later[:, 0] = False
    assert not np.array_equal(ref_ids[later], hyp_ids[later])
    assert np.abs(ref_scores - hyp_scores)[later].max() > 1e-4
    # The reference is never read.
    noisy = dict(batch, tgt=(batch["tgt"] + 3) % V, tgt_mask=np.ones_like(batch["tgt_mask"]))
    np.testing.assert_array_equal(np.asarray(translate(params, noisy)), ids)
    # The Translator's driver (one jitted search per sentence slot) gives the same ids.
    compiled = compile_translate(task, search)
    np.testing.assert_array_equal(np.asarray(compiled(params, batch)[0]), ids)


def test_sentence_attention_export(final_model):
    model, params, batch = final_model
    task = FinalModel(CFG)
    attention = _fast_jit(task.sentence_attention)
    att = np.asarray(attention(params, batch))
    assert att.shape == (3, 3, 3)
    real = batch["src_mask"].any(-1)
    np.testing.assert_allclose(att.sum(-1)[real], 1.0, atol=1e-5)
    assert (att[~real] == 0).all()
    # Brute force from the token-level weights (Fig. 4: mean over i of the sum over j).
    w = np.asarray(
        _fast(
            lambda p, s, m: model.apply(
                {"params": p}, s, m, method=lambda mod, s, m: mod._encode(s, m)[1]
            ),
            params,
            batch["src"],
            batch["src_mask"],
        )
    ).mean(1)
    S, T = 3, 5
    for b in range(3):
        for k in range(S):
            n_k = batch["src_mask"][b, k].sum()
            for kappa in range(S):
                if n_k:
                    block = w[b, k * T : k * T + n_k, kappa * T : (kappa + 1) * T]
                    assert att[b, k, kappa] == pytest.approx(block.sum() / n_k, abs=1e-5)
    # Hand-made case: zero queries -> uniform token attention -> alpha^kappa_k = |x_kappa|/|x|.
    sa = params["global_layer"]["segment_attention"]
    zero_q = jax.tree.map(jnp.zeros_like, sa["query"])
    flat = dict(
        params, global_layer=dict(params["global_layer"], segment_attention=dict(sa, query=zero_q))
    )
    att = np.asarray(attention(flat, batch))
    lengths = batch["src_mask"].sum(-1)
    expected = np.where(real[..., None], lengths[:, None, :] / lengths.sum(-1)[:, None, None], 0)
    np.testing.assert_allclose(att, expected, atol=1e-6)


def test_table3_rows_initialise_and_train():
    """Every Table 3 row (and pre-LN FINAL) is a setting of the same model: finite loss."""
    batch = _rows(_batch(), [0, 2])
    small = dict(num_encoder_layers=1, num_decoder_layers=1, deterministic=False)
    settings = [dict(s, **small) for s in TABLE3_SWITCHES.values()]
    settings.append(dict(TABLE3_SWITCHES["final"], **small, pre_ln=True))
    tasks = [FinalModel(dataclasses.replace(CFG, **switches)) for switches in settings]

    def losses(rng, batch):  # one compilation for all settings
        out = []
        for task in tasks:
            params = nn.meta.unbox(task.init(rng, batch))["params"]
            logits, targets, mask = task.forward(params, batch, rng, True)
            assert logits.shape == (6, 5, V)
            out.append(_loss(logits, targets, mask))
        return jnp.stack(out)

    values = np.asarray(_fast(losses, jax.random.PRNGKey(0), batch))
    assert np.isfinite(values).all() and len(np.unique(values)) == len(settings), values


def test_parameters_carry_logical_axes():
    allowed = {"vocab", "embed", "heads", "kv", "mlp", "relpos", "segments"}
    batch = _batch()
    for switches in TABLE3_SWITCHES.values():
        model = Final(dataclasses.replace(CFG, **switches))
        boxed = jax.eval_shape(
            model.init,
            jax.random.PRNGKey(0),
            batch["src"],
            batch["src_mask"],
            batch["tgt"],
            batch["tgt_mask"],
        )["params"]
        leaves = jax.tree.leaves(boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned))
        assert leaves and all(isinstance(leaf, nn.Partitioned) for leaf in leaves)
        for leaf in leaves:
            assert len(leaf.names) == len(leaf.value.shape) and set(leaf.names) <= allowed


def test_sentence_decoder_variant_translates():
    """Without the XL decoder all sentences are searched at once; padding sentences -> PAD."""
    cfg = dataclasses.replace(CFG, **TABLE3_SWITCHES["+context_fusion_gate"])
    batch = _batch(5)
    task = FinalModel(cfg)
    search = SearchConfig(beam_size=2, alpha=0.6, len_a=1.0, len_b=2, max_len=6)

    params = nn.meta.unbox(task.init(jax.random.PRNGKey(0), batch))["params"]
    params = dict(params, embed={"embedding": params["embed"]["embedding"] * 6})
    ids = np.asarray(_fast_jit(lambda p, b: task.translate(p, b, search)[0])(params, batch))
    real = batch["src_mask"].any(-1)
    L = search.output_len(5)
    assert ids.shape == (3, 3, L)
    assert (ids[~real] == 0).all() and ((ids[real] == 1).sum(-1) == 1).all()
    compiled = compile_translate(task, search)
    np.testing.assert_array_equal(np.asarray(compiled(params, batch)[0]), ids)

    # Every sentence as its own search (no memory) gives its row of ids.
    model, v = task.eval_module, {"params": params}
    encoded = model.apply(v, batch["src"], batch["src_mask"], method=model.encode)
    limits = source_length_limits(batch["src_mask"], 1.0, 2, L)
    no_memory = {"mask": jnp.zeros((3, 1), jnp.int32)}
    for k in range(3):
        mask_k = batch["src_mask"][:, k]
        alone = _search_alone(model, v, encoded[:, k], mask_k, limits[:, k], no_memory, L)
        want = np.asarray(alone.sequences[:, 0])
        np.testing.assert_array_equal(ids[real[:, k], k], want[real[:, k]])
