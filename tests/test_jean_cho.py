"""The larger-context Transformer of Jean & Cho (2019, Appendix A) against independent
references: a naive model written here that encodes each sentence and its hand-built context
with the shared encoder (loss and gradients, both gates), the empty context of a document's
first sentence, documents edited elsewhere in the batch, cached search against the full pass,
random contexts, the sentence Transformer's parameters and the FLOP count."""

import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ROOT
from flax import traverse_util
from test_doct import DOCS, V, _batches, assert_nll_and_gradients_equal
from test_final import _encoder_layer, _fast, _fast_jit, _ffn, _ln, _mha, _sinus

from docnmt_jax import flops
from docnmt_jax.config_files import load_config
from docnmt_jax.data import pipeline as P
from docnmt_jax.data.tokenizer import BOS_ID, EOS_ID
from docnmt_jax.decoding.search import SearchConfig
from docnmt_jax.models import build_model, layers
from docnmt_jax.models.base import BatchLayout, ModelError
from docnmt_jax.models.jean_cho import JeanChoConfig, JeanChoModel
from docnmt_jax.models.transformer import TransformerConfig, TransformerModel
from docnmt_jax.training import param_mapping

TINY = dict(
    vocab_size=V,
    d_model=16,
    num_heads=2,
    ffn_dim=32,
    num_encoder_layers=2,
    num_decoder_layers=2,
    dropout_rate=0.0,
)


def _model(**overrides):
    return build_model(dict(TINY, name="jean_cho", **overrides), V)


def _params(model, batch, seed=0):
    return nn.meta.unbox(_fast(model.init, jax.random.PRNGKey(seed), batch))["params"]


def _logits(model, params, batch):
    logits, _, _ = _fast(lambda p, b: model.forward(p, b, None, False), params, batch)
    return np.asarray(logits).reshape(batch["src"].shape[:2] + logits.shape[1:])


# ----------------------------------------------------------------------- naive reference
# One sentence at a time, real tokens only; the context (the k previous source sentences of
# the document, each with its EOS) is read from the document itself.


def _encode(cfg, params, ids):
    """TransformerEnc (post-LN) of one sequence of real tokens, positions 0..len-1."""
    emb = params["embed"]["embedding"]
    x = emb[np.asarray(ids)] * np.sqrt(cfg.d_model) + _sinus(np.arange(len(ids)), cfg.d_model)
    for i in range(cfg.num_encoder_layers):
        x = _encoder_layer(params[f"encoder_layers_{i}"], x, True)
    return x


def naive_source(cfg, params, src, context):
    """x_c of Appendix A: x_hat = Attn(x; c) (0 without context), g = Linear([x; x_hat])
    (sigmoid or not), x_c = LN(h + FFN(h)) for h = g x_hat + (1 - g) x."""
    x = _encode(cfg, params, src)
    if context:
        x_hat = _mha(params["context_attention"], x, _encode(cfg, params, context), True)
    else:
        x_hat = jnp.zeros_like(x)
    gate = params["context_gate"]
    g = jnp.concatenate([x, x_hat], -1) @ gate["kernel"] + gate["bias"]
    if cfg.gate == "sigmoid":
        g = jax.nn.sigmoid(g)
    h = g * x_hat + (1 - g) * x
    return _ln(params["context_ffn_block"]["norm"], h + _ffn(params["context_ffn"], h))


def naive_logits(cfg, params, src, tgt, context):
    x = naive_source(cfg, params, src, context)
    emb = params["embed"]["embedding"]
    inputs = [BOS_ID] + tgt[:-1]
    s = emb[np.asarray(inputs)] * np.sqrt(cfg.d_model) + _sinus(np.arange(len(tgt)), cfg.d_model)
    causal = np.tril(np.ones((len(tgt), len(tgt)), bool))
    for i in range(cfg.num_decoder_layers):
        p = params[f"decoder_layers_{i}"]
        s = _ln(p["self_attention_block"]["norm"], s + _mha(p["self_attention"], s, s, causal))
        s = _ln(p["cross_attention_block"]["norm"], s + _mha(p["cross_attention"], s, x, True))
        s = _ln(p["ffn_block"]["norm"], s + _ffn(p["ffn"], s))
    return s @ emb.T


def naive_nll(cfg, params, docs):
    """Summed NLL of every target token of ``docs``, sentence by sentence."""
    total = 0.0
    for doc in docs:
        sources = [src + [EOS_ID] for src, _ in doc]
        for k, (_, tgt) in enumerate(doc):
            context = [w for s in sources[max(0, k - cfg.context_sentences) : k] for w in s]
            tgt = tgt + [EOS_ID]
            logp = jax.nn.log_softmax(naive_logits(cfg, params, sources[k], tgt, context))
            total = total - jnp.sum(logp[np.arange(len(tgt)), np.asarray(tgt)])
    return total


@pytest.mark.parametrize(
    "switches",
    [
        # About 50 s each on a busy CPU (the naive reference compiles sentence by sentence):
        # `make test-slow`; the default suite checks their logits (forward only) below.
        pytest.param({}, marks=pytest.mark.slow),
        pytest.param(dict(gate="linear"), marks=pytest.mark.slow),
        pytest.param(dict(context_sentences=2), marks=pytest.mark.slow),
    ],
    ids=["sigmoid_k1", "linear_k1", "sigmoid_k2"],
)
def test_loss_and_gradients_equal_the_naive_reference(switches):
    """The pipeline's chunks of 2 (contexts across chunk boundaries, documents of 3, 1 and 2
    sentences) through the model == sentence by sentence with hand-built contexts."""
    model = _model(**switches)
    cfg = model.config
    docs = DOCS[:2]  # 3 sentences (crosses chunks of 2) and 1: the default suite's budget
    batches = _batches(docs, cfg.context_sentences)
    params = _params(model, batches[0])
    # Non-trivial gate bias and LayerNorm (their initial 0 / 1 would hide a swap).
    rng = np.random.default_rng(1)
    params["context_gate"]["bias"] = jnp.asarray(rng.normal(size=cfg.d_model), jnp.float32)
    norm = params["context_ffn_block"]["norm"]
    norm["scale"] = jnp.asarray(rng.normal(size=cfg.d_model), jnp.float32)

    grads = assert_nll_and_gradients_equal(
        model, batches, params, lambda p: naive_nll(cfg, p, docs)
    )
    # The check can fail: the context side receives gradient.
    assert np.abs(grads["context_attention"]["value"]["kernel"]).max() > 1e-6


@pytest.mark.parametrize(
    "switches",
    [{}, dict(gate="linear"), dict(context_sentences=2)],
    ids=["sigmoid_k1", "linear_k1", "sigmoid_k2"],
)
def test_logits_equal_the_naive_reference(switches):
    """Forward only (fast): the unbounded gate and a context of 2 sentences, on the later
    sentences of the 3-sentence document (contexts of 1 and 2 sentences)."""
    model = _model(**switches)
    cfg = model.config
    (batch,) = _batches(DOCS, cfg.context_sentences, max_sentences=3)
    params = _params(model, batch)
    params["context_gate"]["bias"] = jnp.full((cfg.d_model,), 0.7, jnp.float32)
    logits = _logits(model, params, batch)
    row = int(np.flatnonzero(np.asarray(batch["doc_index"]) == 0)[0])
    sources = [src + [EOS_ID] for src, _ in DOCS[0]]
    for k in (1, 2):
        context = [w for s in sources[max(0, k - cfg.context_sentences) : k] for w in s]
        tgt = DOCS[0][k][1] + [EOS_ID]
        ref = _fast(lambda p, s=sources[k], t=tgt, c=context: naive_logits(cfg, p, s, t, c), params)
        ref = np.asarray(ref)
        np.testing.assert_allclose(logits[row, k, : len(tgt)], ref, atol=1e-5)


def test_gates_and_config_values():
    """Sigmoid gate values lie in (0, 1); the linear gate leaves them unbounded (its values
    reach outside [0, 1] at random parameters); bad values are one-line errors."""
    (batch,) = _batches(DOCS, 1, max_sentences=3)
    values = {}
    for gate in ("sigmoid", "linear"):
        model = _model(gate=gate)
        params = _params(model, batch)
        rows = model.rows(batch)
        _, state = model.eval_module.apply(
            {"params": params},
            *(rows[k] for k in ("src", "src_mask", "tgt", "tgt_mask")),
            rows["context"],
            rows["context_mask"],
            mutable="intermediates",
        )
        values[gate] = np.asarray(state["intermediates"]["gate_values"][0])
    assert values["sigmoid"].min() > 0 and values["sigmoid"].max() < 1
    assert values["linear"].min() < 0 or values["linear"].max() > 1
    assert JeanChoConfig().gate == "sigmoid" and JeanChoConfig().context_sentences == 1
    with pytest.raises(ModelError, match="gate must be one of"):
        _model(gate="tanh")
    with pytest.raises(ModelError, match="context_sentences must be >= 1"):
        _model(context_sentences=0)


def test_first_sentence_has_an_empty_masked_context():
    """A document's first sentence: its context is all padding, masked, whatever its ids; its
    logits equal the naive model's without context (x_hat_c = 0), finite, with finite
    gradients; later sentences do read their context (the comparison can fail)."""
    model = _model()
    (batch,) = _batches(DOCS, 1, max_sentences=3)
    assert (np.asarray(batch["sentence_offset"]) == 0).all()  # every row starts a document
    params = _params(model, batch)
    module, v = model.eval_module, {"params": params}
    rows = model.rows(batch)
    inputs = [rows[k] for k in ("src", "src_mask", "tgt", "tgt_mask")]
    S = batch["src"].shape[1]
    first = (np.arange(rows["src"].shape[0]) % S == 0) & np.asarray(rows["src_mask"]).any(-1)
    assert not np.asarray(rows["context_mask"])[first].any()
    full = np.asarray(module.apply(v, *inputs, rows["context"], rows["context_mask"]))
    garbage = jnp.full_like(rows["context"], 7)
    masked = np.asarray(module.apply(v, *inputs, garbage, rows["context_mask"]))
    np.testing.assert_array_equal(full[first], masked[first])
    assert np.all(np.isfinite(full))
    grads = _fast(jax.grad(lambda p: model.loss(p, batch, None, False)[0]), params)
    assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads))
    row = int(np.flatnonzero(np.asarray(batch["doc_index"]) == 1)[0])
    src, tgt = (ids + [EOS_ID] for ids in DOCS[1][0])
    ref = np.asarray(naive_logits(model.config, params, src, tgt, []))
    np.testing.assert_allclose(full[row * S, : len(tgt)], ref, atol=1e-5)
    # A later sentence with its context masked out differs from the one with its context.
    later = ~first & np.asarray(rows["src_mask"]).any(-1)
    dropped = np.asarray(
        module.apply(v, *inputs, rows["context"], jnp.zeros_like(rows["context_mask"]))
    )
    assert np.abs(full[later] - dropped[later]).max() > 1e-3


def test_no_context_crosses_a_document_boundary():
    """Editing the other documents of the batch (and a document's own later sentences)
    changes nothing in a document's earlier sentences: logits and translations."""
    model = _model()
    edited = [DOCS[0][:2] + [([7, 8, 9], [9, 8])], [([5] * 4, [6] * 3)], DOCS[2][::-1]]
    batches = [_batches(docs, 1) for docs in (DOCS, edited)]
    params = _params(model, batches[0][0])
    search = SearchConfig(beam_size=2, max_len=12)
    translate = _fast_jit(lambda p, b: model.translate(p, b, search)[0])
    checked = 0
    for original, changed in zip(*batches, strict=True):
        rows = np.asarray(original["doc_index"]) == 0
        first_chunk = rows & (np.asarray(original["chunk_index"]) == 0)
        if not first_chunk.any():
            continue
        a, b = (_logits(model, params, x)[first_chunk] for x in (original, changed))
        np.testing.assert_array_equal(a, b)
        ids = [np.asarray(translate(params, x))[first_chunk] for x in (original, changed)]
        np.testing.assert_array_equal(*ids)
        checked += 1
    assert checked == 1
    # The other documents did change (the check can fail).
    assert not np.array_equal(batches[0][0]["src"], batches[1][0]["src"])


def test_cached_search_steps_equal_the_full_pass():
    """decode_step fed the reference tokens (two beams per sentence sharing x_c's
    keys/values) gives the teacher-forced logits; translate returns [B, S, L] ids."""
    model = _model()
    (batch,) = _batches(DOCS, 1, max_sentences=3)
    params = _params(model, batch)
    module, v = model.eval_module, {"params": params}
    rows = model.rows(batch)
    full = np.asarray(
        module.apply(
            v,
            *(rows[k] for k in ("src", "src_mask", "tgt", "tgt_mask")),
            rows["context"],
            rows["context_mask"],
        )
    )
    sources = [rows[k] for k in ("src", "src_mask", "context", "context_mask")]
    x_c = module.apply(v, *sources, method=module.encode)
    extra = module.apply(v, x_c, rows["src_mask"], method=module.decode_inputs)
    N, T = rows["tgt"].shape
    cache = module.apply(v, 2 * N, T, method=module.init_cache)
    step = _fast_jit(lambda v, c, t, e: module.apply(v, c, t, e, method=module.decode_step))
    tokens = np.repeat(np.asarray(layers.shift_right(rows["tgt"], BOS_ID)), 2, axis=0)
    real = np.repeat(np.asarray(rows["tgt_mask"]) > 0, 2, axis=0)
    for t in range(T):
        logits, cache = step(v, cache, tokens[:, t], extra)
        ref = np.repeat(full[:, t], 2, axis=0)
        np.testing.assert_allclose(np.asarray(logits)[real[:, t]], ref[real[:, t]], atol=1e-4)
    search = SearchConfig(beam_size=2, max_len=T)
    ids = np.asarray(model.translate(params, batch, search)[0])
    assert ids.shape[:2] == batch["src"].shape[:2]


def test_random_context_is_what_the_model_reads_and_comes_from_other_rows():
    """with_random_context (as DocT's): every sentence keeps its slot, and the context window
    the model builds for it (rows()['context']) holds a sentence of another input row."""
    model = _model()
    B, S, K, T = 8, 3, 1, 4
    # Unique ids: row b, sentence slot j (context slot first), token t.
    joined = 1000 * np.arange(B)[:, None, None] + 10 * np.arange(K + S)[:, None] + np.arange(T)
    joined = (joined + 4).astype(np.int32)
    ctx, src = joined[:, :K], joined[:, K:]
    batch = {key: jnp.asarray(x) for key, x in P.schema.batch_from_grids(src, src).items()}
    batch["context_src"] = jnp.asarray(ctx)
    batch["context_src_mask"] = jnp.ones_like(batch["context_src"])
    out = model.with_random_context(batch, jax.random.PRNGKey(0))
    origin = np.asarray(out["origin_row"])
    np.testing.assert_array_equal(np.asarray(out["src"]), src[origin, np.arange(S)])
    context = np.asarray(model.rows(out)["context"]).reshape(B, S, K * T)
    true_context = np.asarray(model.rows(batch)["context"]).reshape(B, S, K * T)
    for b in range(B):
        for s in range(S):
            context_row = (context[b, s, 0] - 4) // 1000
            assert context_row != origin[b, s], (b, s)
            assert not np.array_equal(context[b, s], true_context[origin[b, s], s])


def test_a_sentence_transformer_fills_the_shared_parts():
    """transformer_rules: every parameter named as in the sentence Transformer (embedding,
    shared encoder, decoder) is loaded from the same path, the context attention, gate and FF
    stay fresh, and no Transformer parameter is left unused."""
    model = _model()
    (batch,) = _batches(DOCS, 1, max_sentences=3)
    shapes = jax.eval_shape(lambda: nn.meta.unbox(model.init(jax.random.PRNGKey(0), batch)))
    sentence = TransformerModel(TransformerConfig(**TINY))
    ckpt = jax.eval_shape(lambda: nn.meta.unbox(sentence.init(jax.random.PRNGKey(0), batch)))
    flat = {k: x.shape for k, x in traverse_util.flatten_dict(shapes["params"], sep="/").items()}
    ckpt_flat = {k: x.shape for k, x in traverse_util.flatten_dict(ckpt["params"], sep="/").items()}
    rules = param_mapping.resolve_rules(["all"], model, list(flat), list(ckpt_flat))
    table = param_mapping.plan(flat, ckpt_flat, rules)
    fresh = {row.parameter for row in table if row.status == param_mapping.FRESH}
    loaded = {row.parameter for row in table if row.status == param_mapping.LOADED}
    assert fresh == {p for p in flat if p.startswith("context_")} and fresh
    assert loaded == set(ckpt_flat)
    assert not [row for row in table if row.status == param_mapping.UNUSED]


def test_analytic_flops_equal_the_traced_matrix_multiplies():
    for k in (1, 2):
        model = _model(context_sentences=k)
        (batch,) = _batches(DOCS, k, max_sentences=3)
        params = _params(model, batch)
        forward = lambda p, b, m=model: m.forward(p, b, None, False)[0]  # noqa: E731
        traced = flops.jaxpr_dot_flops(jax.make_jaxpr(forward)(params, batch))
        B, S, T = batch["src"].shape
        shape = flops.BatchShape(B, S, T, batch["tgt"].shape[-1])
        assert flops.forward_flops(model, shape) == traced


def test_config_file_builds_the_model():
    config = load_config(os.path.join(ROOT, "configs", "jean_cho.py"))
    model = build_model(config.model, vocab_size=100)
    assert isinstance(model, JeanChoModel) and model.layout is BatchLayout.CHUNKS
    assert (model.config.context_sentences, model.config.gate) == (1, "sigmoid")
    assert model.context_sentences == 1
    assert (model.config.d_model, model.config.ffn_dim, model.config.num_encoder_layers) == (
        256,
        512,
        4,
    )


def test_sentence_rows_translate_and_score_like_chunks():
    """``sentence_rows`` (each sentence its own row with its window) is a layout, not a
    model: the same translations and the same NLL as chunks of 20 and of 2."""
    from test_doct import WordTokenizer, _documents, _sentence_batches

    from docnmt_jax.decoding.search import SearchConfig
    from docnmt_jax.decoding.translator import Translator

    model = _model()
    rows_model = _model(sentence_rows=True)
    assert rows_model.layout.sentence_level and not model.layout.sentence_level
    (batch,) = _batches(DOCS, 1, max_sentences=5)
    params = _params(model, batch, seed=3)
    params["context_gate"]["bias"] = jnp.full((model.config.d_model,), 0.7, jnp.float32)
    docs = _documents(DOCS)
    search = SearchConfig(beam_size=3, max_len=12)
    out = [
        Translator(m, params, WordTokenizer(), search, max_sentences=s).translate(docs)
        for m, s in ((model, 20), (model, 2), (rows_model, 20))
    ]
    assert out[0] == out[1] == out[2]
    nll = [
        sum(float(m.loss(params, b, None, False)[1]["nll"].total) for b in batches)
        for m, batches in ((model, _batches(DOCS, 1)), (rows_model, _sentence_batches(DOCS, 1)))
    ]
    np.testing.assert_allclose(nll[0], nll[1], rtol=1e-5)
