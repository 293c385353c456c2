"""HM-GDC (Tan et al. 2019) against independent references: a naive model written here that
encodes each document sentence by sentence, sums its summaries and runs the document encoder
by hand (loss and gradients), the sentence Transformer where the context is switched off, a
document edited elsewhere in the batch, whole documents against chunks, sharing checked in the
parameter tree and its gradients, and cached search against the teacher-forced pass."""

import dataclasses
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import test_doct
from flax import traverse_util
from test_doct import DOCS, TINY, V, WordTokenizer, _documents, encode
from test_final import _encoder_layer, _fast, _fast_jit, _ffn, _ln, _mha, _sinus

from docnmt_jax.data import pipeline as P
from docnmt_jax.data.schema import dummy_batch
from docnmt_jax.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from docnmt_jax.decoding.search import SearchConfig
from docnmt_jax.decoding.translator import Translator
from docnmt_jax.models import build_model
from docnmt_jax.models.hmgdc import DOCUMENT_PARAMETERS, FOLDED
from docnmt_jax.models.transformer import TransformerConfig, TransformerModel
from docnmt_jax.training import param_mapping

TINY = dict(TINY, context_dropout_rate=0.0)  # test_doct's tiny sizes, no dropout
# Documents of 3, 1 and 2 sentences (test_doct) and one of 5 (longer than chunks of 2).
RNG = np.random.default_rng(1)
LONG = [
    (list(RNG.integers(4, V, RNG.integers(1, 5))), list(RNG.integers(4, V, RNG.integers(1, 5))))
    for _ in range(5)
]
HM_DOCS = DOCS + [LONG]


def _model(**overrides):
    return build_model(dict(TINY, name="hmgdc", **overrides), V)


def _batches(docs, whole_documents=True, max_sentences=2, rows=2):
    """The pipeline's batches of ``docs``: whole documents (HM-GDC's scope) or chunks of
    ``max_sentences``; one shape per batch size, ``rows`` rows a batch."""
    S = max(len(d) for d in docs) if whole_documents else max_sentences
    config = P.PipelineConfig(
        max_sentences=max_sentences,
        max_src_len=16,
        max_tgt_len=16,
        batch_src_tokens=rows * 16 * S,
        batch_tgt_tokens=rows * 16 * S,
        shuffle=False,
        num_epochs=1,
        pad_batch=True,
        whole_documents=whole_documents,
        length_buckets=(16,),
        sentence_buckets=(max_sentences,),
    )
    plan = P.plan_batches(_documents(docs), encode, config)
    return [{key: jnp.asarray(v) for key, v in b.items()} for b in P.numpy_batches(plan)]


def _params(model, batch, seed=0):
    return nn.meta.unbox(_fast(model.init, jax.random.PRNGKey(seed), batch))["params"]


# ----------------------------------------------------------------------- naive reference
# One document at a time, real tokens only, written from Eq. 1-10 (module docstring readings).


def _embed(cfg, params, ids):
    emb = params["embed"]["embedding"]
    return emb[np.asarray(ids)] * np.sqrt(cfg.d_model) + _sinus(np.arange(len(ids)), cfg.d_model)


def _document_states(cfg, params, words):
    """H_S (Eq. 2-4) of a document's sentence encodings ``words`` (list of [n_i, D])."""
    summaries = jnp.stack([_mha(params["summary_attention"], h, h, True).sum(0) for h in words])
    x = summaries
    for layer in range(cfg.num_document_layers):
        p = dict(params[f"document_layers_{layer}"])
        if cfg.share_self_attention and layer < cfg.num_encoder_layers:
            assert "self_attention" not in p  # one copy, in the sentence encoder
            p["self_attention"] = params[f"encoder_layers_{layer}"]["self_attention"]
        x = _encoder_layer(p, x, True)
    return x


def naive_document_nll(cfg, params, doc):
    """Summed NLL of every target token of one document."""
    words = []
    for src, _ in doc:
        x = _embed(cfg, params, src + [EOS_ID])
        for layer in range(cfg.num_encoder_layers):
            x = _encoder_layer(params[f"encoder_layers_{layer}"], x, True)
        words.append(x)
    states = _document_states(cfg, params, words)
    total = 0.0
    for h, (_, tgt) in zip(words, doc, strict=True):
        if cfg.context_in_encoder:  # Eq. 5-7: every word reads every sentence state
            h = h + _mha(params["context_attention"], h, states, True)
        tgt = tgt + [EOS_ID]
        s = _embed(cfg, params, [BOS_ID] + tgt[:-1])
        causal = np.tril(np.ones((len(tgt), len(tgt)), bool))
        for layer in range(cfg.num_decoder_layers):
            p = params[f"decoder_layers_{layer}"]
            s = _ln(p["self_attention_block"]["norm"], s + _mha(p["self_attention"], s, s, causal))
            both = _mha(p["cross_attention"], s, h, True)  # E
            if cfg.context_in_decoder:  # + G over C = H_S (Eq. 9-10)
                both = both + _mha(p["document_attention"], s, states, True)
            s = _ln(p["cross_attention_block"]["norm"], s + both)
            s = _ln(p["ffn_block"]["norm"], s + _ffn(p["ffn"], s))
        logp = jax.nn.log_softmax(s @ params["embed"]["embedding"].T)
        total = total - jnp.sum(logp[np.arange(len(tgt)), np.asarray(tgt)])
    return total


SWITCHES = {
    "paper": {},
    # N_d = 3 > 2 sentence layers: layers 0-1 shared, layer 2 its own; decoder only.
    "decoder_only_deep": dict(num_document_layers=3, context_in_encoder=False),
    "encoder_only_separate": dict(context_in_decoder=False, share_self_attention=False),
}


@pytest.mark.parametrize(
    "switches",
    [
        # 65 s (suite time); the packed-vs-grid tests of test_hmgdc_packed.py
        # check the same model in the default suite.
        pytest.param("paper", marks=pytest.mark.slow),
        # About 30 s each (the naive reference compiles sentence by sentence): `make test-slow`.
        pytest.param("decoder_only_deep", marks=pytest.mark.slow),
        pytest.param("encoder_only_separate", marks=pytest.mark.slow),
    ],
)
def test_loss_and_gradients_equal_the_naive_reference(switches):
    """Whole documents (3, 1, 2 and 5 sentences, the 5 longer than a chunk of 2) through the
    pipeline and the model == document by document, sentence by sentence, by hand."""
    model = _model(**SWITCHES[switches])
    cfg = model.config
    batches = _batches(HM_DOCS)
    assert all(int(b["chunk_index"].max()) <= 0 for b in batches)  # whole documents
    params = _params(model, batches[0])

    def model_nll(p):
        return sum(model.loss(p, b, None, False)[1]["nll"].total for b in batches)

    naive = lambda p: sum(naive_document_nll(cfg, p, d) for d in HM_DOCS)  # noqa: E731
    assert_same_values_and_gradients(model_nll, naive, params)


def assert_same_values_and_gradients(f, reference, params):
    """``f`` and ``reference`` (scalar functions of ``params``) agree in value (1e-5) and in
    every gradient leaf; the document side must receive gradient (so equality is not 0 = 0)."""

    def both(p):
        return jax.value_and_grad(f)(p), jax.value_and_grad(reference)(p)

    (value, grads), (ref, ref_grads) = _fast(both, params)
    np.testing.assert_allclose(float(value), float(ref), rtol=1e-5)
    flat, ref_flat = jax.tree_util.tree_leaves_with_path(grads), jax.tree.leaves(ref_grads)
    for (path, g), r in zip(flat, ref_flat, strict=True):
        np.testing.assert_allclose(g, r, atol=1e-5, rtol=1e-4, err_msg=jax.tree_util.keystr(path))
    assert np.abs(grads["summary_attention"]["query"]["kernel"]).max() > 1e-6


def _logits(model, params, batch):
    logits, _, _ = _fast(lambda p, b: model.forward(p, b, None, False), params, batch)
    return np.asarray(logits).reshape(batch["src"].shape[:2] + logits.shape[1:])


def _flat(params):
    return traverse_util.flatten_dict(params, sep="/")


def test_self_attention_is_shared_once_with_summed_gradients():
    """Shared: the document layer has no self-attention of its own, and the gradient of the
    sentence encoder's attention is the sum of both uses -- the separate model with both copies
    equal gets the same gradient split between its two copies."""
    (batch,) = _batches(HM_DOCS, max_sentences=5, rows=4)
    shared, separate = _model(), _model(share_self_attention=False)
    params = _params(shared, batch)
    assert not any(k.startswith("document_layers_0/self_attention") for k in _flat(params))
    copy = dict(params)
    copy["document_layers_0"] = dict(
        params["document_layers_0"], self_attention=params["encoder_layers_0"]["self_attention"]
    )
    assert set(_flat(copy)) == set(_flat(_params(separate, batch)))
    grad = lambda m, p: jax.grad(lambda p: m.loss(p, batch, None, False)[0])(p)  # noqa: E731
    g_shared = jax.jit(lambda p: grad(shared, p))(params)
    g_separate = jax.jit(lambda p: grad(separate, p))(copy)
    for name in ("query", "key", "value", "out"):
        summed = (
            g_separate["encoder_layers_0"]["self_attention"][name]["kernel"]
            + g_separate["document_layers_0"]["self_attention"][name]["kernel"]
        )
        np.testing.assert_allclose(
            g_shared["encoder_layers_0"]["self_attention"][name]["kernel"], summed, atol=1e-6
        )
    # Both uses contribute (the sum differs from either part: the check can fail).
    doc_part = g_separate["document_layers_0"]["self_attention"]["query"]["kernel"]
    assert np.abs(doc_part).max() > 1e-6


def test_without_context_it_is_the_sentence_transformer_with_the_same_theta_s():
    """``context_in_encoder`` only: the decoder is the Transformer's; with the context
    attention's output projection zeroed (d_ctx = 0, Eq. 7) every logit is the sentence
    Transformer's with the same theta_s. ``context_in_decoder`` adds G (can fail: differs)."""
    (batch,) = _batches(HM_DOCS, max_sentences=5, rows=4)
    model = _model(context_in_decoder=False)
    params = _params(model, batch)
    zeroed = jax.tree.map(jnp.zeros_like, params["context_attention"]["out"])
    params = dict(params, context_attention=dict(params["context_attention"], out=zeroed))
    sentence_config = TransformerConfig(
        **{f.name: getattr(model.config, f.name) for f in dataclasses.fields(TransformerConfig)}
    )
    theta_s = {k: v for k, v in params.items() if k in ("embed",) or "coder_layers_" in k}
    sentence = TransformerModel(sentence_config)
    real = np.asarray(batch["tgt_mask"]) > 0
    ref = _logits(sentence, theta_s, batch)[real]
    np.testing.assert_allclose(_logits(model, params, batch)[real], ref, atol=1e-5)
    both = _model()
    both_params = _params(both, batch)
    assert np.abs(_logits(both, both_params, batch)[real] - ref).max() > 1e-3


def test_no_context_crosses_a_document_boundary():
    """Editing the other documents of the batch changes nothing in a document (logits and
    translations); editing a sentence of its own document changes its other sentences."""
    model = _model()
    edited = [
        HM_DOCS[0],
        [([5] * 4, [6] * 3)],
        HM_DOCS[2][::-1],
        LONG[:2] + [([7, 8, 9], [9, 8])] + LONG[3:],
    ]
    (original,), (changed,) = (_batches(d, max_sentences=5, rows=4) for d in (HM_DOCS, edited))
    params = _params(model, original)
    search = SearchConfig(beam_size=2, max_len=12)
    a, b = (_logits(model, params, x) for x in (original, changed))
    np.testing.assert_array_equal(a[0], b[0])
    ids = [np.asarray(model.translate(params, x, search)[0]) for x in (original, changed)]
    np.testing.assert_array_equal(ids[0][0], ids[1][0])
    # Sentence 0 of the long document sees its edited sentence 2 (global scope, can fail).
    real = np.asarray(original["tgt_mask"][3, 0]) > 0
    assert np.abs(a[3, 0][real] - b[3, 0][real]).max() > 1e-4


@pytest.mark.slow  # 33 s (suite time)
def test_whole_documents_reach_beyond_a_chunk_and_the_chunk_scope_does_not():
    """Document scope: the pipeline's chunks are whole documents whatever data.max_sentences
    says, so translations with max_sentences 2 and 20 agree, and no row is a split document.
    Chunk scope: the 5-sentence document is cut into chunks of 2 and its context with it
    (``split_documents`` counts the rows)."""
    docs = _documents(HM_DOCS)
    model = _model()
    assert model.whole_documents
    (batch,) = _batches(HM_DOCS, max_sentences=5, rows=4)
    params = _params(model, batch, seed=3)
    search = SearchConfig(beam_size=3, max_len=12)
    out = [
        Translator(model, params, WordTokenizer(), search, max_sentences=s).translate(docs)
        for s in (20, 2)
    ]
    assert out[0] == out[1]
    assert float(model.loss(params, batch, None, False)[1]["split_documents"].total) == 0
    chunk = _model(document_scope=False)
    assert not chunk.whole_documents
    chunked = Translator(chunk, params, WordTokenizer(), search, max_sentences=2).translate(docs)
    assert chunked[1:3] == out[0][1:3]  # documents of <= 2 sentences: one chunk either way
    assert chunked[3] != out[0][3]  # the long document's context was cut (can fail)
    split = sum(
        float(chunk.loss(params, b, None, False)[1]["split_documents"].total)
        for b in _batches(HM_DOCS, whole_documents=False)
    )
    assert split == 3  # chunks 1 and 2 of the long document, and chunk 1 of the 3-sentence one


@pytest.mark.parametrize("num_heads, folded", [(2, True), (8, False)])
def test_cached_search_equals_the_teacher_forced_pass(num_heads, folded):
    """decode_step with the cache, fed the reference tokens, gives the teacher-forced logits
    at every position (two beams per sentence sharing the document's keys); the search's
    greedy translation is the argmax chain of the full pass. With H * S <= D the DocEnc-Decoder
    projections are folded into the document states (2 heads x 5 sentences <= 16), else the
    plain keys and values are read (8 x 5 > 16)."""
    model = _model(num_heads=num_heads)
    (batch,) = _batches(HM_DOCS, max_sentences=5, rows=4)
    params = _params(model, batch, seed=5)
    module, variables = model.eval_module, {"params": params}
    T = batch["src"].shape[-1]
    src_mask = batch["src_mask"].reshape(-1, T)

    def decoder_inputs(variables, src, src_mask):
        encoded, states, present = module.apply(variables, src, src_mask, method=module.encode)
        flat_mask = src_mask.reshape(-1, T)
        return module.apply(
            variables, encoded, flat_mask, states, present, method=module.decode_inputs
        )

    extra = _fast(decoder_inputs, variables, batch["src"], batch["src_mask"])
    assert (FOLDED[0] in extra["layer_0"]) == folded
    beams = 2
    rows = src_mask.shape[0]
    tgt = np.asarray(batch["tgt"]).reshape(rows, -1)
    cache = _fast(
        lambda v: module.apply(v, rows * beams, tgt.shape[1], method=module.init_cache), variables
    )
    step = jax.jit(lambda c, t: module.apply(variables, c, t, extra, method=module.decode_step))
    token = np.full(rows * beams, BOS_ID, np.int32)
    forward = _fast_jit(lambda p, b: model.forward(p, b, None, False)[0])
    full = np.asarray(forward(params, batch)).reshape(rows, tgt.shape[1], -1)
    real = np.asarray(batch["tgt_mask"]).reshape(rows, -1) > 0
    for t in range(tgt.shape[1]):
        logits, cache = step(cache, jnp.asarray(token))
        logits = np.asarray(logits).reshape(rows, beams, -1)
        for beam in range(beams):
            np.testing.assert_allclose(
                logits[:, beam][real[:, t]], full[:, t][real[:, t]], atol=1e-4
            )
        token = np.repeat(tgt[:, t], beams).astype(np.int32)
    # Greedy search == the argmax chain of the full forward pass, re-run on its own output.
    search = SearchConfig(beam_size=1, max_len=6, len_a=0.0, len_b=6.0)
    ids = np.asarray(_fast(lambda p, b: model.translate(p, b, search)[0], params, batch))
    chain = np.zeros_like(ids)
    for t in range(ids.shape[-1]):
        forced = dict(batch, tgt=jnp.asarray(chain), tgt_mask=jnp.ones_like(chain))
        logits = np.array(forward(params, forced)).reshape(chain.shape + (-1,))[..., t, :]
        logits[..., [PAD_ID, BOS_ID]] = -np.inf  # never searched
        chain[..., t] = logits.argmax(-1)
    present_sentences = np.asarray(batch["sentence_mask"]) > 0
    for b, s in zip(*np.nonzero(present_sentences), strict=True):
        # Up to its EOS; an EOS at the last slot is the length limit's, not the argmax.
        eos = int(np.argmax(ids[b, s] == EOS_ID))
        n = eos + 1 if eos < ids.shape[-1] - 1 else ids.shape[-1] - 1
        np.testing.assert_array_equal(ids[b, s, :n], chain[b, s, :n])


def test_random_context_and_empty_rows():
    """``with_random_context`` gives every sentence a context of other documents; padding
    rows (no real sentence) and one-sentence documents produce finite losses."""
    model = _model()
    (batch,) = _batches(HM_DOCS, max_sentences=5, rows=5)  # one padding row
    assert int(batch["doc_index"].min()) == -1
    params = _params(model, batch)
    shuffled = model.with_random_context(batch, jax.random.PRNGKey(0))
    origin = np.asarray(shuffled["origin_row"])
    assert (origin != np.arange(origin.shape[0])[:, None]).any()
    for b in (batch, shuffled):
        loss, _ = model.loss(params, b, None, False)
        assert np.isfinite(float(loss))
    grads = jax.grad(lambda p: model.loss(p, batch, None, False)[0])(params)
    assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads))


def test_pipeline_whole_documents_buckets_and_errors():
    """Whole documents: one chunk per document, sentence buckets continued up to the longest
    document; the grid only."""
    config = P.PipelineConfig(max_sentences=2, whole_documents=True, sentence_buckets=(1, 2))
    assert config.s_buckets_for(5) == (1, 2, 4, 5)
    assert config.s_buckets_for(40) == (1, 2, 4, 8, 12, 20, 32, 40)
    plan = P.plan_batches(_documents(HM_DOCS), encode, config)
    assert plan.chunk_table["count"].tolist() == [3, 1, 2, 5]
    with pytest.raises(ValueError, match="whole_documents"):
        P.PipelineConfig(whole_documents=True, sentence_level=True)
    with pytest.raises(ValueError, match="whole_documents"):
        P.PipelineConfig(whole_documents=True, packing=P.PackingConfig())


def test_transformer_checkpoint_fills_theta_s_for_every_switch():
    """``init_from_rules = "all"`` (``configs/hmgdc.py:finetune``) from a sentence Transformer
    of the same sizes: every Transformer path loads as it is, exactly the document parameters
    (:data:`DOCUMENT_PARAMETERS`) stay fresh, for every switch set."""
    batch = dummy_batch(2, 4, rows=1, vocab_size=V)

    def shapes(model):
        boxed = jax.eval_shape(model.init, jax.random.PRNGKey(0), batch)["params"]
        return {k: v.shape for k, v in _flat(nn.meta.unbox(boxed)).items()}

    for switches in [{}, *SWITCHES.values(), {"pre_ln": True}]:
        pre_ln = switches.get("pre_ln", False)
        sentence = shapes(build_model(dict(test_doct.TINY, name="transformer", pre_ln=pre_ln), V))
        model = _model(**switches)
        document = shapes(model)
        entries = param_mapping.parse_rules("all")
        rules = param_mapping.resolve_rules(entries, model, list(document), list(sentence))
        rows = param_mapping.plan(document, sentence, rules)
        fresh = {r.parameter for r in rows if r.status == param_mapping.FRESH}
        loaded = {r.parameter for r in rows if r.status == param_mapping.LOADED}
        assert loaded == set(sentence) and fresh == set(document) - set(sentence), switches
        assert all(re.fullmatch(DOCUMENT_PARAMETERS, p) for p in fresh)
