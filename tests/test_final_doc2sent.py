"""FINAL's Doc2Sent rows (Zheng et al. 2020, Table 3): the encoder reads the whole chunk, and
each target sentence cross-attends over its own slice of that encoding
(``doc2sent_cross_attention = "own_slice"``) or, the named variant, over the whole chunk
(``"chunk"``); training (grid and packed rows, tests/test_final_packed.py) and decoding read
the same keys."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import TABLE3_CONFIG, TABLE3_SWITCHES
from test_final import CFG, _batch, _fast, _fast_jit, _init, _search_alone

from docnmt_jax.config_files import load_config
from docnmt_jax.decoding.search import SearchConfig, source_length_limits
from docnmt_jax.models import build_model, layers
from docnmt_jax.models.base import ModelError, captured_attention
from docnmt_jax.models.final import Final, FinalConfig, FinalModel
from docnmt_jax.models.xl import empty_memory

BOS = 2


def _cfg(reading, **overrides):
    return dataclasses.replace(
        CFG, **dict(TABLE3_SWITCHES["doc2sent"], doc2sent_cross_attention=reading, **overrides)
    )


def test_the_switch_and_its_rows():
    assert FinalConfig().doc2sent_cross_attention == "own_slice"
    assert _cfg("chunk").cross_attends_chunk and not _cfg("own_slice").cross_attends_chunk
    assert not dataclasses.replace(CFG, doc2sent=False).cross_attends_chunk  # FINAL reads h_k
    with pytest.raises(ValueError, match="doc2sent_cross_attention must be one of"):
        dataclasses.replace(CFG, doc2sent_cross_attention="document")
    readings = {}
    for row in ("doc2sent", "doc2sent+reset", "doc2sent+reset+segment", "doc2sent_chunk"):
        config = load_config(f"{TABLE3_CONFIG}:{row}").model
        readings[row] = build_model(config, vocab_size=100).config.cross_attends_chunk
    assert readings == {
        "doc2sent": False,
        "doc2sent+reset": False,
        "doc2sent+reset+segment": False,
        "doc2sent_chunk": True,
    }
    bad = dict(load_config(TABLE3_CONFIG).model.to_dict(), doc2sent_cross_attention="x")
    with pytest.raises(ModelError, match="config.model: doc2sent_cross_attention"):
        build_model(bad, vocab_size=100)


def test_other_sentences_reach_a_sentence_only_with_the_chunk_reading():
    """Known answer at the decoder: noise on sentence 0's slice of the encoding changes the
    logits of sentences 1 and 2 of that chunk under "chunk" and leaves them bit-identical
    under "own_slice"; noise on padding slots changes nothing under either."""
    batch = _batch()
    chunk_model, params = _init(_cfg("chunk"), batch)
    own_model = Final(_cfg("own_slice"))  # the same parameters: the switch adds none
    src_mask = batch["src_mask"]
    tgt_in = layers.shift_right(jnp.asarray(batch["tgt"]), BOS)
    noise = np.random.default_rng(0).normal(size=src_mask.shape + (CFG.d_model,))
    on_sentence_0 = np.zeros(src_mask.shape + (1,), np.float32)
    on_sentence_0[0, 0] = src_mask[0, 0, :, None]
    on_padding = (src_mask == 0)[..., None].astype(np.float32)

    def logits(p):
        v = {"params": p}
        enc = chunk_model.apply(v, batch["src"], src_mask, method=chunk_model.encode)
        out = {}
        for name, model in (("chunk", chunk_model), ("own", own_model)):
            for what, where in (("clean", 0.0), ("sentence_0", on_sentence_0), ("pad", on_padding)):
                e = enc + jnp.asarray(noise * where, enc.dtype)
                out[name, what] = model.apply(
                    v, e, src_mask, tgt_in, batch["tgt_mask"], method=model.decode
                )
        return out

    out = jax.tree.map(np.asarray, _fast(logits, params))
    real = batch["tgt_mask"] > 0
    for name in ("chunk", "own"):
        clean = out[name, "clean"]
        np.testing.assert_allclose(out[name, "pad"][real], clean[real], atol=1e-6, rtol=0)
        first = real[0, 0]
        assert np.abs(out[name, "sentence_0"][0, 0][first] - clean[0, 0][first]).max() > 1e-2
    others, later = (real[0, 1:], slice(1, None))
    moved = np.abs(
        out["chunk", "sentence_0"][0, later][others] - out["chunk", "clean"][0, later][others]
    )
    assert moved.max() > 1e-2
    np.testing.assert_array_equal(out["own", "sentence_0"][0, later], out["own", "clean"][0, later])
    np.testing.assert_array_equal(out["own", "sentence_0"][1:], out["own", "clean"][1:])


def test_the_chunk_reading_gives_every_sentence_of_a_chunk_the_same_output():
    """Known answer, why "own_slice" is Doc2Sent's reading: without the XL decoder, under
    "chunk" every sentence of a chunk reads the same keys from the same BOS at the same
    positions, so the first-token logits of all its sentences are equal (and a greedy or beam
    search writes one output for all); under "own_slice" each sentence reads its own ``h_k``
    and they differ."""
    batch = _batch()
    chunk_model, params = _init(_cfg("chunk"), batch)
    own_model = Final(_cfg("own_slice"))
    v = {"params": params}
    src, src_mask = batch["src"], batch["src_mask"]
    tgt_in = jnp.full(batch["tgt"].shape, BOS, jnp.int32)  # every sentence: BOS, BOS, ...

    def first_logits(p):
        enc = chunk_model.apply(p, src, src_mask, method=chunk_model.encode)
        return {
            name: model.apply(p, enc, src_mask, tgt_in, batch["tgt_mask"], method=model.decode)[
                :, :, 0
            ]
            for name, model in (("chunk", chunk_model), ("own", own_model))
        }

    out = jax.tree.map(np.asarray, _fast(first_logits, v))
    checked = 0
    for b in range(src.shape[0]):
        real = np.flatnonzero(batch["tgt_mask"][b, :, 0] > 0)
        if len(real) < 2:
            continue
        checked += 1
        chunk, own = out["chunk"][b, real], out["own"][b, real]
        np.testing.assert_allclose(chunk, np.broadcast_to(chunk[0], chunk.shape), atol=1e-5)
        assert np.abs(own - own[0]).max() > 1e-2
    assert checked


def _np_ln(p, x):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-6) * p["scale"] + p["bias"]


def _np_heads(p, x):
    return np.einsum("td,dhk->thk", x, p["kernel"]) + p["bias"]


def _np_softmax(logits, allowed):
    logits = np.where(allowed, logits, -np.inf)
    w = np.exp(logits - logits.max(-1, keepdims=True))
    return w / w.sum(-1, keepdims=True)


def _np_sinus(pos, d):
    half = d // 2
    angle = np.asarray(pos, np.float64)[:, None] * np.exp(-np.log(10000.0) * np.arange(half) / half)
    return np.concatenate([np.sin(angle), np.cos(angle)], -1)


def _reference_cross_weights(params, encoded, batch, b, k, whole_chunk):
    """float64 weights ``[H, n_k, S*T]`` of decoder layer 0's cross-attention for sentence
    ``k`` of chunk ``b``, from the parameters alone: embedding + positions, causal
    self-attention over the sentence's real tokens, post-LN, then queries against the keys
    of every real source token of the chunk (or of sentence ``k`` only)."""
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    layer = p["decoder_layers_0"]
    n = int(batch["tgt_mask"][b, k].sum())
    tokens = np.concatenate([[BOS], batch["tgt"][b, k, : n - 1]])
    D = CFG.d_model
    y = p["embed"]["embedding"][tokens] * np.sqrt(D) + _np_sinus(np.arange(n), D)
    sa = layer["self_attention"]
    q, kk, v = (_np_heads(sa[name], y) for name in ("query", "key", "value"))
    depth = q.shape[-1]
    w = _np_softmax(
        np.einsum("ihd,jhd->hij", q, kk) / np.sqrt(depth), np.tril(np.ones((n, n), bool))
    )
    attended = np.einsum("hij,jhd->ihd", w, v)
    out = np.einsum("ihd,hdD->iD", attended, sa["out"]["kernel"]) + sa["out"]["bias"]
    y = _np_ln(layer["self_attention_block"]["norm"], y + out)
    S, T = batch["src_mask"].shape[1:]
    keys = np.asarray(encoded[b], np.float64).reshape(S * T, D)
    allowed = batch["src_mask"][b].reshape(S * T) > 0
    if not whole_chunk:
        allowed = allowed & (np.repeat(np.arange(S), T) == k)
    ca = layer["cross_attention"]
    q, kk = _np_heads(ca["query"], y), _np_heads(ca["key"], keys)
    return _np_softmax(np.einsum("ihd,jhd->hij", q, kk) / np.sqrt(depth), allowed[None, None])


@pytest.mark.parametrize("reading", ["chunk", "own_slice"])
def test_cross_attention_weights_equal_a_float64_reference(reading):
    """The module's (grouped, masked) cross-attention weights of decoder layer 0, grid path,
    against :func:`_reference_cross_weights` built sentence by sentence; the other sentences
    get weight under "chunk" only, padding keys never."""
    cfg = _cfg(reading)
    batch = _batch(1)
    model, params = _init(cfg, batch)

    def run(p):
        v = {"params": p}
        encoded = model.apply(v, batch["src"], batch["src_mask"], method=model.encode)
        _, weights = captured_attention(
            lambda: model.apply(
                v, batch["src"], batch["src_mask"], batch["tgt"], batch["tgt_mask"]
            ),
            ("decoder_layers_0", "cross_attention"),
        )
        return encoded, weights

    encoded, weights = jax.tree.map(np.asarray, _fast(run, params))
    B, S, T = batch["src"].shape
    H = cfg.num_heads
    if reading == "chunk":  # [B, H, S*T, S*T]: the S sentence rows of a chunk share its keys
        per_sentence = weights.reshape(B, H, S, T, S * T).transpose(0, 2, 1, 3, 4)
    else:  # [B*S, H, T, T] over the sentence's own slice: spread to the chunk's S*T keys
        per_sentence = np.zeros((B, S, H, T, S * T), weights.dtype)
        own = weights.reshape(B, S, H, T, T)
        for k in range(S):
            per_sentence[:, k, :, :, k * T : (k + 1) * T] = own[:, k]
    other_mass = []
    for b in range(B):
        for k in range(S):
            n = int(batch["tgt_mask"][b, k].sum())
            if n == 0:
                continue
            ref = _reference_cross_weights(params, encoded, batch, b, k, reading == "chunk")
            np.testing.assert_allclose(per_sentence[b, k, :, :n], ref, atol=1e-5, rtol=0)
            others = np.repeat(np.arange(S), T) != k
            other_mass.append(per_sentence[b, k, :, :n][..., others].sum(-1).max())
    assert (max(other_mass) > 0.1) == (reading == "chunk")


# The XL decoder with doc2sent is no Table 3 row: make test-slow.
@pytest.mark.parametrize(
    "xl",
    [False, pytest.param(True, marks=pytest.mark.slow)],
    ids=["sentence_decoder", "xl_decoder"],
)
def test_cached_decoding_reads_the_chunk_as_training_does(xl):
    """With the chunk reading, decoding one sentence per row against its chunk's encoding
    (``decode_inputs``, the search's per-example inputs), step by step from the cache and with
    the previous sentence's memory, gives the logits of the parallel teacher-forced pass."""
    cfg = _cfg("chunk", xl_decoder=xl)
    batch = _batch(3)
    model, params = _init(cfg, batch)
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
    chunk = encoded.reshape(B, S * T, cfg.d_model)
    chunk_mask = batch["src_mask"].reshape(B, S * T)

    def sentence(v, tgt, tgt_mask, memory):
        logits, _ = model.apply(
            v, chunk, chunk_mask, tgt, tgt_mask, memory, method=model.decode_sentence
        )
        next_memory = model.apply(
            v, chunk, chunk_mask, tgt, tgt_mask, memory, method=model.sentence_memory
        )
        memory_kv = model.apply(v, memory, method=model.memory_kv)
        extra = model.apply(v, chunk, chunk_mask, memory_kv, method=model.decode_inputs)
        return logits, next_memory, extra

    sentence = _fast_jit(sentence)
    step_fn = _fast_jit(lambda v, *a: model.apply(v, *a, method=model.decode_step))
    memory = empty_memory(cfg, B, T)
    for k in range(S):
        tgt_k, tmask_k = batch["tgt"][:, k], batch["tgt_mask"][:, k]
        real = tmask_k > 0
        logits, next_memory, extra = sentence(v, tgt_k, tmask_k, memory)
        np.testing.assert_allclose(np.asarray(logits)[real], full[:, k][real], atol=1e-5)
        cache = model.apply(v, B, T, method=model.init_cache)
        dec_in = np.asarray(layers.shift_right(jnp.asarray(tgt_k), BOS))
        for t in range(T):
            step, cache = step_fn(v, cache, dec_in[:, t], extra)
            np.testing.assert_allclose(
                np.asarray(step)[real[:, t]], full[:, k, t][real[:, t]], atol=1e-5, rtol=1e-5
            )
        memory = next_memory


# own_slice: the slot inputs of the non-doc2sent rows (test_final.py); make test-slow.
@pytest.mark.parametrize("reading", ["chunk", pytest.param("own_slice", marks=pytest.mark.slow)])
def test_translate_searches_against_the_training_keys(reading):
    """``search_inputs`` hands every slot what training cross-attends to (the whole chunk, or
    the sentence's own slice); ``translate`` (all sentences at once) equals each sentence
    searched alone against those keys."""
    cfg = _cfg(reading)
    batch = _batch(5)
    task = FinalModel(cfg)
    search = SearchConfig(beam_size=2, alpha=0.6, len_a=1.0, len_b=2, max_len=6)
    _, params = _init(cfg, batch)
    params = dict(params, embed={"embedding": params["embed"]["embedding"] * 6})
    model, v = task.eval_module, {"params": params}
    B, S, T = batch["src"].shape
    (cross, cross_mask, own_mask), _ = _fast(
        lambda p, b: task.search_inputs(p, b, search), params, batch
    )
    encoded = _fast(
        lambda v, s, m: model.apply(v, s, m, method=model.encode),
        v,
        batch["src"],
        batch["src_mask"],
    )
    if reading == "chunk":
        want = np.broadcast_to(
            np.asarray(encoded).reshape(1, B, S * T, -1), (S, B, S * T, cfg.d_model)
        )
        want_mask = np.broadcast_to(batch["src_mask"].reshape(1, B, S * T), (S, B, S * T))
    else:
        want, want_mask = np.asarray(encoded).swapaxes(0, 1), batch["src_mask"].swapaxes(0, 1)
    np.testing.assert_allclose(np.asarray(cross), want, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(cross_mask), want_mask)
    np.testing.assert_array_equal(np.asarray(own_mask), batch["src_mask"].swapaxes(0, 1))

    ids = np.asarray(_fast_jit(lambda p, b: task.translate(p, b, search)[0])(params, batch))
    real = batch["src_mask"].any(-1)
    L = search.output_len(T)
    assert ids.shape == (B, S, L) and (ids[~real] == 0).all()
    limits = source_length_limits(batch["src_mask"], 1.0, 2, L)
    no_memory = {"mask": jnp.zeros((B, 1), jnp.int32)}
    alone = _fast_jit(
        lambda p, e, m, lim: _search_alone(model, {"params": p}, e, m, lim, no_memory, L).sequences
    )
    for k in range(S):
        got = np.asarray(alone(params, cross[k], cross_mask[k], limits[:, k]))[:, 0]
        np.testing.assert_array_equal(ids[real[:, k], k], got[real[:, k]])
