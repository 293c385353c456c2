"""DocT (Zhang et al. 2018) against independent references: a naive model written here that
builds each sentence's context by hand from its document (loss and gradients), the sentence
Transformer for a document's first sentence, a document edited elsewhere in the batch, chunks
of 3 against chunks of 20, the gate by hand, cached search against the full pass, and
two-step training's frozen ``theta_s`` through ``train_and_evaluate``."""

import dataclasses
import os
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from conftest import ROOT, tiny_config
from etils import epath
from flax import traverse_util
from test_final import _encoder_layer, _fast, _fast_jit, _ffn, _ln, _mha, _sinus
from test_init_from import _flat, _sized, pretrained  # noqa: F401

from docnmt_jax.config_files import load_config
from docnmt_jax.data import pipeline as P
from docnmt_jax.data.context_labels import ContextLabel
from docnmt_jax.data.documents import Document
from docnmt_jax.data.tokenizer import BOS_ID, EOS_ID
from docnmt_jax.decoding.search import SearchConfig
from docnmt_jax.decoding.translator import Translator
from docnmt_jax.evaluation import contrastive
from docnmt_jax.models import build_model, layers
from docnmt_jax.models.doct import (
    DOCUMENT_PARAMETERS,
    ContextSublayer,
    DocTConfig,
)
from docnmt_jax.models.transformer import TransformerConfig, TransformerModel
from docnmt_jax.training import trainer

V = 40
TINY = dict(
    vocab_size=V,
    d_model=16,
    num_heads=2,
    ffn_dim=32,
    num_encoder_layers=2,
    num_decoder_layers=2,
    dropout_rate=0.0,
)
# Documents of word ids (>= 4): 3 sentences (crosses chunks of 2), 1 sentence, 2 sentences.
RNG = np.random.default_rng(0)
DOCS = [
    [
        (list(RNG.integers(4, V, RNG.integers(1, 5))), list(RNG.integers(4, V, RNG.integers(1, 5))))
        for _ in range(n)
    ]
    for n in (3, 1, 2)
]


def _documents(docs):
    words = lambda ids: " ".join(map(str, ids))  # noqa: E731
    return [
        Document(f"d{i}", tuple(words(s) for s, _ in d), tuple(words(t) for _, t in d))
        for i, d in enumerate(docs)
    ]


def encode(texts):
    return [[int(w) for w in t.split()] for t in texts]


def _batches(docs, k, max_sentences=2):
    """The pipeline's batches of ``docs`` in chunks of ``max_sentences``: one shape, three
    rows a batch."""
    config = P.PipelineConfig(
        max_sentences=max_sentences,
        max_src_len=16,
        max_tgt_len=16,
        batch_src_tokens=3 * 16 * max_sentences,
        batch_tgt_tokens=3 * 16 * max_sentences,
        shuffle=False,
        num_epochs=1,
        pad_batch=True,
        context_sentences=k,
        length_buckets=(16,),  # one batch shape: one compilation
        sentence_buckets=(max_sentences,),
    )
    plan = P.plan_batches(_documents(docs), encode, config)
    return [{key: jnp.asarray(v) for key, v in b.items()} for b in P.numpy_batches(plan)]


def _sentence_batches(docs, k):
    """The pipeline's sentence-level batches (one sentence per chunk) with the window."""
    config = P.PipelineConfig(
        max_src_len=16,
        max_tgt_len=16,
        sentence_level=True,
        shuffle=False,
        num_epochs=1,
        pad_batch=True,
        context_sentences=k,
    )
    plan = P.plan_batches(_documents(docs), encode, config)
    return [{key: jnp.asarray(v) for key, v in b.items()} for b in P.numpy_batches(plan)]


def _model(**overrides):
    return build_model(dict(TINY, name="doct", **overrides), V)


def _params(model, batch, seed=0):
    return nn.meta.unbox(_fast(model.init, jax.random.PRNGKey(seed), batch))["params"]


# ----------------------------------------------------------------------- naive reference
# One sentence at a time, real tokens only: the context is the concatenation of the k previous
# source sentences of the document (each with its EOS), read from the document itself.


def _embed(cfg, params, ids):
    emb = params["embed"]["embedding"]
    return emb[np.asarray(ids)] * np.sqrt(cfg.d_model) + _sinus(np.arange(len(ids)), cfg.d_model)


def _context_sublayer(cfg, p, x, c):
    sub = _mha(p["context_attention"], x, c, True)
    block = p["context_block"]
    if cfg.context_gating:
        lam = jax.nn.sigmoid(
            x @ block["gate_input"]["kernel"] + sub @ block["gate_context"]["kernel"]
        )
        return _ln(block["norm"], lam * x + (1 - lam) * sub)
    return _ln(block["norm"], x + sub)


def naive_logits(cfg, params, src, tgt, context):
    c = None
    if context:
        c = _embed(cfg, params, context)
        for i in range(cfg.num_context_layers):
            c = _encoder_layer(params[f"context_layers_{i}"], c, True)
    x = _embed(cfg, params, src)
    for i in range(cfg.num_encoder_layers):
        p = params[f"encoder_layers_{i}"]
        x = _ln(p["attention_block"]["norm"], x + _mha(p["self_attention"], x, x, True))
        if c is not None and cfg.context_in_encoder:
            x = _context_sublayer(cfg, p, x, c)
        x = _ln(p["ffn_block"]["norm"], x + _ffn(p["ffn"], x))
    s = _embed(cfg, params, [BOS_ID] + tgt[:-1])
    causal = np.tril(np.ones((len(tgt), len(tgt)), bool))
    for i in range(cfg.num_decoder_layers):
        p = params[f"decoder_layers_{i}"]
        s = _ln(p["self_attention_block"]["norm"], s + _mha(p["self_attention"], s, s, causal))
        if c is not None and cfg.context_in_decoder:
            s = _context_sublayer(cfg, p, s, c)
        s = _ln(p["cross_attention_block"]["norm"], s + _mha(p["cross_attention"], s, x, True))
        s = _ln(p["ffn_block"]["norm"], s + _ffn(p["ffn"], s))
    return s @ params["embed"]["embedding"].T


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


SWITCHES = {
    "paper": {},
    "residual_decoder_only_k1_nc2": dict(
        context_gating=False, context_in_encoder=False, context_sentences=1, num_context_layers=2
    ),
    "encoder_only_k3": dict(context_in_decoder=False, context_sentences=3),
}


@pytest.mark.parametrize(
    "switches",
    [
        # 54 s (suite time); DocT's first-sentence and boundary tests stay in
        # the default suite.
        pytest.param("paper", marks=pytest.mark.slow),
        # About 40 s each (the naive reference compiles sentence by sentence): `make test-slow`.
        pytest.param("residual_decoder_only_k1_nc2", marks=pytest.mark.slow),
        pytest.param("encoder_only_k3", marks=pytest.mark.slow),
    ],
)
def test_loss_and_gradients_equal_the_naive_reference(switches):
    """The pipeline's chunks of 2 (contexts across chunk boundaries, documents of 3, 1 and 2
    sentences) through the model == sentence by sentence with hand-built contexts."""
    model = _model(**SWITCHES[switches])
    cfg = model.config
    batches = _batches(DOCS, cfg.context_sentences)
    params = _params(model, batches[0])

    grads = assert_nll_and_gradients_equal(
        model, batches, params, lambda p: naive_nll(cfg, p, DOCS)
    )
    # The check can fail: the context side receives gradient.
    assert np.abs(grads["context_layers_0"]["ffn"]["wo"]["kernel"]).max() > 1e-6


def assert_nll_and_gradients_equal(model, batches, params, naive_total):
    """The summed NLL of ``batches`` under ``model`` and its gradients equal ``naive_total``'s
    (a sentence-by-sentence reference) to 1e-5; returns the model's gradients."""

    def model_nll(p):
        return sum(model.loss(p, b, None, False)[1]["nll"].total for b in batches)

    nll, grads = _fast(jax.value_and_grad(model_nll), params)
    ref, ref_grads = _fast(jax.value_and_grad(naive_total), params)
    np.testing.assert_allclose(float(nll), float(ref), rtol=1e-5)
    flat, ref_flat = jax.tree_util.tree_leaves_with_path(grads), jax.tree.leaves(ref_grads)
    for (path, g), r in zip(flat, ref_flat, strict=True):
        np.testing.assert_allclose(g, r, atol=1e-5, rtol=1e-4, err_msg=jax.tree_util.keystr(path))
    return grads


def _logits(model, params, batch):
    logits, _, _ = _fast(lambda p, b: model.forward(p, b, None, False), params, batch)
    return np.asarray(logits).reshape(batch["src"].shape[:2] + logits.shape[1:])


def _split(params):
    """(theta_s, theta_d) of DocT parameters, by :data:`DOCUMENT_PARAMETERS`."""
    flat = traverse_util.flatten_dict(params, sep="/")
    is_d = {path: re.fullmatch(DOCUMENT_PARAMETERS, path) is not None for path in flat}
    theta_s = {path: x for path, x in flat.items() if not is_d[path]}
    theta_d = {path: x for path, x in flat.items() if is_d[path]}
    return theta_s, theta_d


def test_first_sentence_equals_the_model_without_context_attention():
    """A document's first sentence has an empty context: masked, no NaN, and its logits are
    the sentence Transformer's with the same theta_s (the context sublayers removed)."""
    model = _model()
    (batch,) = _batches(DOCS, 2, max_sentences=3)
    params = _params(model, batch)
    sentence_config = TransformerConfig(
        **{f.name: getattr(model.config, f.name) for f in dataclasses.fields(TransformerConfig)}
    )
    theta_s, theta_d = _split(params)
    assert theta_d and all(not path.startswith("context") for path in theta_s)
    sentence = TransformerModel(sentence_config)
    doct = _logits(model, params, batch)
    ref = _logits(sentence, traverse_util.unflatten_dict(theta_s, sep="/"), batch)
    assert np.all(np.isfinite(doct))
    grads = _fast(jax.grad(lambda p, b: model.loss(p, b, None, False)[0]), params, batch)
    assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads))
    real = np.asarray(batch["tgt_mask"]) > 0
    first = np.asarray(batch["sentence_offset"]) == 0  # chunks of 3: every row starts a document
    assert first.all()
    np.testing.assert_allclose(doct[:, 0][real[:, 0]], ref[:, 0][real[:, 0]], atol=1e-5)
    # Later sentences have a context and differ (the comparison can fail).
    assert np.abs(doct[:, 1:][real[:, 1:]] - ref[:, 1:][real[:, 1:]]).max() > 1e-3


def test_no_context_crosses_a_document_boundary():
    """Editing the other documents of the batch (and a document's own later sentences)
    changes nothing in a document's earlier sentences: logits and translations."""
    model = _model()
    edited = [DOCS[0][:2] + [([7, 8, 9], [9, 8])], [([5] * 4, [6] * 3)], DOCS[2][::-1]]
    batches = [_batches(docs, 2) for docs in (DOCS, edited)]
    params = _params(model, batches[0][0])
    search = SearchConfig(beam_size=2, max_len=12)
    for original, changed in zip(*batches, strict=True):
        rows = np.asarray(original["doc_index"]) == 0
        first_chunk = rows & (np.asarray(original["chunk_index"]) == 0)
        if not first_chunk.any():
            continue
        a, b = (_logits(model, params, x)[first_chunk] for x in (original, changed))
        np.testing.assert_array_equal(a, b)
        ids = [
            np.asarray(model.translate(params, x, search)[0])[first_chunk]
            for x in (original, changed)
        ]
        np.testing.assert_array_equal(*ids)
    # The other documents did change (the check can fail).
    assert not np.array_equal(batches[0][0]["src"], batches[1][0]["src"])


class WordTokenizer:
    """Word ids as text (the translator needs ``encode_batch`` and ``decode``)."""

    vocab_size = V
    eos_id = EOS_ID

    def encode_batch(self, texts):
        return encode(texts)

    def decode(self, ids):
        out = []
        for i in np.asarray(ids).tolist():
            if i == EOS_ID:
                break
            out.append(str(i))
        return " ".join(out)


# Slow (the default suite passed 20 minutes): `make test-slow`.
@pytest.mark.slow
def test_chunks_of_20_and_of_2_translate_identically():
    """Sentences at a chunk's start get their k predecessors from the previous chunk (the
    chunks of 2 and of 1 sentence translate like whole documents), and so do sentence rows."""
    model = _model(context_sentences=2)
    docs = _documents(DOCS)
    (batch,) = _batches(DOCS, 2, max_sentences=5)
    params = _params(model, batch, seed=3)
    search = SearchConfig(beam_size=3, max_len=12)
    out = [
        Translator(model, params, WordTokenizer(), search, max_sentences=s).translate(docs)
        for s in (20, 2, 1)
    ]
    assert out[0] == out[1] == out[2]
    # Sentence rows (each sentence its own chunk, its context from the window) give the same
    # translations and the same loss.
    rows_model = _model(context_sentences=2, sentence_rows=True)
    assert rows_model.layout.sentence_level
    by_rows = Translator(rows_model, params, WordTokenizer(), search).translate(docs)
    assert by_rows == out[0]
    nll = [
        sum(float(m.loss(params, b, None, False)[1]["nll"].total) for b in batches)
        for m, batches in ((model, _batches(DOCS, 2)), (rows_model, _sentence_batches(DOCS, 2)))
    ]
    np.testing.assert_allclose(nll[0], nll[1], rtol=1e-5)
    # Without the context window the chunks of 3 translate differently (the test can fail).
    no_window = Translator(model, params, WordTokenizer(), search, max_sentences=2)
    no_window.pipeline_config = dataclasses.replace(no_window.pipeline_config, context_sentences=0)
    assert no_window.translate(docs) != out[0]


def test_forced_choice_items_carry_the_context_window_of_the_pipeline():
    """A labelled sentence at a chunk's start is scored with the same context as the
    pipeline gives it (the sentences before its chunk), so forced choice measures DocT's
    window, not the chunking."""
    model = _model()
    docs = _documents(DOCS)
    target = DOCS[0][2][1]
    label = ContextLabel("d0", 2, 0, "pronoun", 1, str(target[0]), (str(target[0] + 1),))
    items = contrastive.make_items(docs, [label], WordTokenizer(), 2, False, 2)
    batch = contrastive.grid_batch(items[:1], 1, 2, 16, 2)
    pipeline = next(b for b in _batches(DOCS, 2) if 0 in np.asarray(b["doc_index"]))
    row = int(
        np.flatnonzero(
            (np.asarray(pipeline["doc_index"]) == 0) & (np.asarray(pipeline["chunk_index"]) == 1)
        )[0]
    )
    for key in ("context_src", "context_src_mask", "src", "tgt"):
        np.testing.assert_array_equal(batch[key][0], np.asarray(pipeline[key])[row], err_msg=key)
    assert np.asarray(batch["context_src_mask"]).sum() > 0
    params = _params(model, pipeline)
    np.testing.assert_allclose(
        np.asarray(model.score(params, {k: jnp.asarray(v) for k, v in batch.items()}))[0],
        np.asarray(model.score(params, pipeline))[row],
        rtol=1e-5,
    )


def test_the_gate_equals_a_hand_computation():
    """lambda = sigmoid(W_i H + W_s SubLayer(H)), Gating(H) = LN(lambda H + (1-lambda)
    SubLayer(H)) (Eq. 21-22, THUMT's LayerNorm after it); rows without context pass H; the
    residual variant is LN(H + SubLayer(H))."""
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(size=(3, 4, 8)), jnp.float32)
    sub = jnp.asarray(rng.normal(size=(3, 4, 8)), jnp.float32)
    present = jnp.asarray([True, False, True])
    for gating in (True, False):
        cfg = DocTConfig(**dict(TINY, d_model=8), context_gating=gating, deterministic=True)
        block = ContextSublayer(cfg)
        variables = block.init(jax.random.PRNGKey(0), x, lambda h: sub, present)
        p = jax.tree.map(lambda a: np.asarray(a, np.float64), nn.meta.unbox(variables)["params"])
        # LayerNorm scale/bias at their initial 1/0 would hide a swap: set them at random.
        p["norm"] = {"scale": rng.normal(size=8), "bias": rng.normal(size=8)}
        xs, ss = np.asarray(x, np.float64), np.asarray(sub, np.float64)
        if gating:
            lam = 1 / (
                1 + np.exp(-(xs @ p["gate_input"]["kernel"] + ss @ p["gate_context"]["kernel"]))
            )
            mixed = lam * xs + (1 - lam) * ss
        else:
            mixed = xs + ss
        mu, var = mixed.mean(-1, keepdims=True), mixed.var(-1, keepdims=True)
        expected = (mixed - mu) / np.sqrt(var + 1e-6) * p["norm"]["scale"] + p["norm"]["bias"]
        expected[1] = xs[1]
        got = block.apply({"params": jax.tree.map(jnp.float32, p)}, x, lambda h: sub, present)
        np.testing.assert_allclose(np.asarray(got), expected, atol=1e-5)


def test_cached_search_steps_equal_the_full_pass():
    """decode_step fed the reference tokens (two beams per sentence sharing the per-sentence
    context and source keys/values) gives the teacher-forced logits; beam search of width 1
    equals greedy decoding by repeated full passes."""
    model = _model()
    (batch,) = _batches(DOCS, 2, max_sentences=3)[:1]
    params = _params(model, batch)
    module, v = model.eval_module, {"params": params}
    rows = model.rows(batch)
    full_pass = _fast_jit(lambda v, *inputs: module.apply(v, *inputs))
    full = np.asarray(
        full_pass(
            v,
            *(rows[k] for k in ("src", "src_mask", "tgt", "tgt_mask")),
            rows["context"],
            rows["context_mask"],
        )
    )

    def decoder_inputs(v, src, src_mask, context, context_mask):
        encoded, states = module.apply(
            v, src, src_mask, context, context_mask, method=module.encode
        )
        return module.apply(v, encoded, src_mask, states, context_mask, method=module.decode_inputs)

    extra = _fast(
        decoder_inputs, v, *(rows[k] for k in ("src", "src_mask", "context", "context_mask"))
    )
    N, T = rows["tgt"].shape
    cache = _fast(lambda v: module.apply(v, 2 * N, T, method=module.init_cache), v)
    step = _fast_jit(lambda v, c, t, e: module.apply(v, c, t, e, method=module.decode_step))
    tokens = np.repeat(np.asarray(layers.shift_right(rows["tgt"], BOS_ID)), 2, axis=0)
    real = np.repeat(np.asarray(rows["tgt_mask"]) > 0, 2, axis=0)
    for t in range(T):
        logits, cache = step(v, cache, tokens[:, t], extra)
        ref = np.repeat(full[:, t], 2, axis=0)
        np.testing.assert_allclose(np.asarray(logits)[real[:, t]], ref[real[:, t]], atol=1e-4)
    # Greedy by full passes against beam 1.
    search = SearchConfig(beam_size=1, max_len=T, len_a=0.0, len_b=T, alpha=0.0)
    translated = _fast(lambda p, b: model.translate(p, b, search), params, batch)
    ids = np.asarray(translated[0]).reshape(N, -1)
    out = np.zeros((N, T), np.int32)
    for t in range(T):
        logits = full_pass(
            v,
            rows["src"],
            rows["src_mask"],
            jnp.asarray(out),
            jnp.ones_like(out, dtype=rows["tgt_mask"].dtype),
            rows["context"],
            rows["context_mask"],
        )
        out[:, t] = np.argmax(np.asarray(logits)[:, t], -1)
    live = np.asarray(rows["src_mask"]).any(-1)
    for n in np.flatnonzero(live):
        # The search ends every hypothesis with EOS at its last position: compare before it.
        stop = list(out[n]).index(EOS_ID) + 1 if EOS_ID in out[n] else T - 1
        np.testing.assert_array_equal(ids[n, :stop], out[n, :stop])


def test_random_context_comes_from_other_rows():
    """with_random_context: every sentence keeps its slot; its k context sentences (in the
    chunk or before it) come from other rows than its own."""
    model = _model()
    B, S, K, T = 8, 3, 2, 4
    # Unique ids: row b, sentence slot j (context slots first), token t.
    joined = 1000 * np.arange(B)[:, None, None] + 10 * np.arange(K + S)[:, None] + np.arange(T)
    joined = (joined + 4).astype(np.int32)
    ctx, src = joined[:, :K], joined[:, K:]
    batch = {key: jnp.asarray(x) for key, x in P.schema.batch_from_grids(src, src).items()}
    batch["context_src"] = jnp.asarray(ctx)
    batch["context_src_mask"] = jnp.ones_like(batch["context_src"])
    out = model.with_random_context(batch, jax.random.PRNGKey(0))
    origin = np.asarray(out["origin_row"])
    np.testing.assert_array_equal(np.asarray(out["src"]), src[origin, np.arange(S)])
    np.testing.assert_array_equal(np.asarray(out["tgt"]), src[origin, np.arange(S)])
    # Where each sentence came from: rotated with distinct shifts for all K + S slots.
    got = np.concatenate([np.asarray(out["context_src"]), np.asarray(out["src"])], 1)
    came_from = np.array(
        [
            [
                next(r for r in range(B) if np.array_equal(joined[r, j], got[b, j]))
                for j in range(K + S)
            ]
            for b in range(B)
        ]
    )
    for b in range(B):
        for s in range(S):
            own = came_from[b, K + s]
            assert all(came_from[b, K + s - j] != own for j in range(1, K + 1)), (b, s)


def test_frozen_theta_s_is_restored_bitwise_and_holds_no_moments(
    synthetic_dir,
    pretrained,  # noqa: F811 (the fixture of test_init_from)
    tmp_path,
):
    """configs/doct.py:two_step with init_from a sentence Transformer: after training steps
    theta_s equals the Transformer's parameters bit for bit, theta_d trained, and the
    optimiser state holds Adam moments for theta_d only."""
    config = _sized(tiny_config(synthetic_dir, num_steps=3))
    doct = load_config(os.path.join(ROOT, "configs", "doct.py:two_step"))
    config.model.update(
        {k: v for k, v in doct.model.items() if k not in config.model or k == "name"}
    )
    config.init_from = pretrained
    config.init_from_rules = doct.init_from_rules
    config.train.freeze = doct.train.freeze
    config.data.max_sentences = 4
    workdir = str(tmp_path / "doct")
    trainer.train_and_evaluate(config, workdir)
    state = _read_state(os.path.join(workdir, "checkpoints", "3"))
    source = _read_state(os.path.join(pretrained, "checkpoints", "2"))["params"]
    params = _flat(state["params"])
    theta_s, theta_d = _split(traverse_util.unflatten_dict(params, sep="/"))
    assert set(theta_s) == set(_flat(source))
    for path, x in theta_s.items():
        assert np.array_equal(x, _flat(source)[path]), path
    moments = [
        (jax.tree_util.keystr(path), np.asarray(x))
        for path, x in jax.tree_util.tree_leaves_with_path(state["opt_state"])
        if np.ndim(x) > 0
    ]
    size_d = sum(x.size for x in theta_d.values())
    assert sum(x.size for _, x in moments) == 2 * size_d  # mu and nu of theta_d, nothing else
    assert all(re.search(r"context", path) for path, _ in moments)
    assert all(np.abs(x).max() > 0 for _, x in moments)  # theta_d trained


def _read_state(step_dir):
    """The whole saved train state of ``step_dir`` as numpy (orbax directly)."""
    state_dir = epath.Path(step_dir) / "state"
    tree = ocp.PyTreeCheckpointHandler().metadata(state_dir).tree
    args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
    restore = ocp.args.PyTreeRestore(restore_args=args)
    return ocp.PyTreeCheckpointer().restore(state_dir, args=restore)
