"""RNNSearch and RNNSearch + HM-GDC (Tan et al. 2019, Table 1) against independent references:
a naive float64 model written here (Python loops over chunks, sentences, words and time, real
tokens only: the loss, and every gradient array against its central differences), padding
appended, documents edited elsewhere in the batch, shared against unshared encoder cells,
cached steps against the full pass, beam 1 against a naive greedy loop, the FLOP count by hand
and against the traced matrix multiplies."""

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import traverse_util
from test_final import _fast, _fast_jit

from docnmt_jax import flops
from docnmt_jax.data.schema import dummy_batch
from docnmt_jax.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from docnmt_jax.decoding.search import SearchConfig, sentence_limits
from docnmt_jax.models import ModelError, build_model, layers
from docnmt_jax.models.hmgdc_rnn import DOCUMENT_PARAMETERS
from docnmt_jax.training import param_mapping

V = 24
NAMES = ["rnnsearch", "rnnsearch_hmgdc"]
# embed_dim != d_model: the sentence model's layer-0 input kernels differ from the others.
TINY = dict(vocab_size=V, embed_dim=4, d_model=6, num_layers=2, dropout_rate=0.0)
HM = dict(
    TINY,
    embed_dim=6,  # sharing layer 0 needs embed_dim == d_model
    num_heads=2,
    num_document_layers=2,
    share_encoder=True,
    context_dropout_rate=0.0,
)
# The HM-GDC switches against the naive model: shared cells with DocEnc deeper than SentEnc
# (layers 0-1 shared, layer 2 its own), unshared with one document layer (and embed_dim !=
# d_model, which only unshared allows). Shared at equal depth (HM): the sharing test.
HM_SWITCHES = {
    "shared_deeper": dict(num_document_layers=3),
    "unshared_one": dict(share_encoder=False, num_document_layers=1, embed_dim=4),
}
# Greedy search with short limits (len_a * source tokens + len_b).
SEARCH = SearchConfig(beam_size=1, alpha=0.0, len_a=1.0, len_b=2, max_len=8)
# U(-0.1, 0.1) leaves a tiny model nearly blind to its inputs; tests look at U(-0.5, 0.5).
SCALE = 5.0

# The machine running the tests may be loaded: compile without XLA's expensive CPU passes.


def _batch(seed=0, T=5):
    """Chunk 0: three sentences of mixed lengths; chunk 1: two; chunk 2: one sentence.
    Targets end with EOS."""
    rng = np.random.default_rng(seed)
    src_len = np.array([[5, 3, 4], [2, 5, 0], [4, 0, 0]])
    tgt_len = np.array([[2, 5, 3], [4, 1, 0], [5, 0, 0]])
    ar = np.arange(T)
    src_mask = (ar < src_len[..., None]).astype(np.int32)
    tgt_mask = (ar < tgt_len[..., None]).astype(np.int32)
    src = rng.integers(4, V, (3, 3, T)).astype(np.int32) * src_mask
    tgt = rng.integers(4, V, (3, 3, T)).astype(np.int32) * tgt_mask
    tgt = np.where(ar == tgt_len[..., None] - 1, EOS_ID, tgt).astype(np.int32)
    return {"src": src, "src_mask": src_mask, "tgt": tgt, "tgt_mask": tgt_mask}


def _model(name, **overrides):
    sizes = TINY if name == "rnnsearch" else HM
    return build_model(dict(sizes, name=name, **overrides), V)


def _params(model, batch, seed=0, scale=1.0):
    params = nn.meta.unbox(_fast(model.init, jax.random.PRNGKey(seed), batch))["params"]
    return jax.tree.map(lambda x: x * scale, params)


def _eval_loss(model):
    return lambda p, b: model.loss(p, b, None, False)[0]


class Setup:
    """A model of ``name`` at the test sizes, its parameters, and its compiled score, loss
    gradient and translation (each compiled once per batch shape, shared by the tests)."""

    def __init__(self, name):
        self.model = _model(name)
        self.params = _params(self.model, _batch(), scale=SCALE)
        self.score = _fast_jit(self.model.score)
        self.grad = _fast_jit(jax.value_and_grad(_eval_loss(self.model)))
        self.translate = _fast_jit(lambda p, b: self.model.translate(p, b, SEARCH))


@pytest.fixture(scope="module")
def setups():
    return {name: Setup(name) for name in NAMES}


@pytest.fixture(scope="module")
def trained(setups):
    """Parameters after 60 Adam steps on ``_batch()``: translations that are not one token
    repeated (as a random RNN's are) and end with an EOS of their own."""
    out, batch = {}, _batch()
    for name, setup in setups.items():
        params, tx = setup.params, optax.adam(0.03)

        @jax.jit
        def update(params, state, grads, tx=tx):
            updates, state = tx.update(grads, state, params)
            return optax.apply_updates(params, updates), state

        state = tx.init(params)
        for _ in range(60):
            params, state = update(params, state, setup.grad(params, batch)[1])
        out[name] = params
    return out


# ----------------------------------------------------------------------- naive reference
# One sentence at a time, real tokens only, every equation written out, float64 NumPy.


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _gru(p, h, x):
    """PyTorch's GRU: gates [r | z | n]."""
    H = h.shape[-1]
    gi = x @ p["input_kernel"] + p["input_bias"]
    gh = h @ p["recurrent_kernel"] + p["recurrent_bias"]
    r = _sigmoid(gi[:H] + gh[:H])
    z = _sigmoid(gi[H : 2 * H] + gh[H : 2 * H])
    n = np.tanh(gi[2 * H :] + r * gh[2 * H :])
    return (1 - z) * n + z * h


def _bigru(p, xs):
    """Forward GRU from the first word, backward GRU from the last, both from h = 0."""
    half = p["forward"]["recurrent_kernel"].shape[0]
    fwd, h = [], np.zeros(half)
    for x in xs:
        h = _gru(p["forward"], h, x)
        fwd.append(h)
    bwd, h = [None] * len(xs), np.zeros(half)
    for j in reversed(range(len(xs))):
        h = _gru(p["backward"], h, xs[j])
        bwd[j] = h
    outs = [np.concatenate([f, b]) for f, b in zip(fwd, bwd, strict=True)]
    return outs, np.concatenate([fwd[-1], bwd[0]])


def _stack(layer_params, xs):
    finals = []
    for p in layer_params:
        xs, final = _bigru(p, xs)
        finals.append(final)
    return xs, finals


def _encode_sentence(params, cfg, src):
    xs = [params["source_embed"]["embedding"][w] for w in src]
    return _stack([params[f"encoder_layers_{i}"] for i in range(cfg.num_layers)], xs)


def _decode(params, memory, initial, tgt):
    """Input-feeding GRU decoder with additive attention: logits of every target token."""
    att, emb = params["attention"], params["target_embed"]["embedding"]
    hidden, feed, prev, out = list(initial), np.zeros(initial[0].shape), BOS_ID, []
    memory = np.stack(memory)
    for y in tgt:
        x = np.concatenate([emb[prev], feed])
        for i in range(len(hidden)):
            hidden[i] = _gru(params[f"decoder_layers_{i}"], hidden[i], x)
            x = hidden[i]
        s = hidden[-1]
        q = s @ att["query"]["kernel"] + att["query"]["bias"]
        scores = [
            (np.tanh(q + m @ att["memory"]["kernel"]) @ att["score"]["kernel"])[0] for m in memory
        ]
        c = _softmax(np.array(scores)) @ memory
        feed = np.tanh(np.concatenate([c, s]) @ att["output"]["kernel"] + att["output"]["bias"])
        out.append(feed @ params["output"]["kernel"] + params["output"]["bias"])
        prev = y
    return np.stack(out)


def _mha(p, queries, keys):
    """Multi-head attention of ``queries [n, D]`` over ``keys [m, D]`` (keys = values)."""
    q = np.einsum("nd,dhk->nhk", queries, p["query"]["kernel"]) + p["query"]["bias"]
    k = np.einsum("md,dhk->mhk", keys, p["key"]["kernel"]) + p["key"]["bias"]
    v = np.einsum("md,dhk->mhk", keys, p["value"]["kernel"]) + p["value"]["bias"]
    a = _softmax(np.einsum("nhk,mhk->hnm", q, k) / np.sqrt(q.shape[-1]))
    o = np.einsum("hnm,mhk->nhk", a, v)
    return np.einsum("nhk,hkd->nd", o, p["out"]["kernel"]) + p["out"]["bias"]


def _sentences(batch, b):
    """The real (source, target) token lists of chunk ``b``."""
    out = []
    for s in range(batch["src"].shape[1]):
        n, m = int(batch["src_mask"][b, s].sum()), int(batch["tgt_mask"][b, s].sum())
        if n:
            out.append((list(batch["src"][b, s, :n]), list(batch["tgt"][b, s, :m])))
    return out


def _chunk_logits(params, cfg, chunk):
    """HM-GDC over one chunk's real sentences (Eq. 1-7), then the RNNSearch decoder."""
    encoded = [_encode_sentence(params, cfg, src) for src, _ in chunk]  # Eq. 1
    summaries = [
        np.sum(_mha(params["sentence_attention"], np.stack(h), np.stack(h)), axis=0)
        for h, _ in encoded
    ]  # Eq. 2-3
    doc_layers = [
        params[
            f"encoder_layers_{i}"
            if cfg.share_encoder and i < cfg.num_layers
            else f"document_layers_{i}"
        ]
        for i in range(cfg.num_document_layers)
    ]
    doc, _ = _stack(doc_layers, summaries)  # Eq. 4
    logits = []
    for (h, finals), (_, tgt) in zip(encoded, chunk, strict=True):
        h = np.stack(h)
        h_ctx = h + _mha(params["context_attention"], h, np.stack(doc))  # Eq. 5-7
        logits.append(_decode(params, list(h_ctx), finals, tgt))
    return logits


def _naive_loss(params, cfg, batch, document):
    """Mean NLL per real target token (the model's loss without label smoothing)."""
    nll, tokens = 0.0, 0
    for b in range(batch["src"].shape[0]):
        chunk = _sentences(batch, b)
        if document:
            all_logits = _chunk_logits(params, cfg, chunk)
        else:
            all_logits = [
                _decode(params, *_encode_sentence(params, cfg, src), tgt) for src, tgt in chunk
            ]
        for logits, (_, tgt) in zip(all_logits, chunk, strict=True):
            z = logits - logits.max(-1, keepdims=True)
            logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
            nll -= logp[np.arange(len(tgt)), tgt].sum()
            tokens += len(tgt)
    return nll / tokens


def _assert_loss_and_grads(model, params, batch, document, grad=None, eps=1e-6):
    """The loss equals the naive model's; the gradient of every parameter array along a
    random direction ``u`` equals the naive loss's central difference along ``u``."""
    grad = grad or _fast_jit(jax.value_and_grad(_eval_loss(model)))
    loss, grads = grad(params, batch)
    params64 = jax.tree.map(lambda x: np.asarray(x, np.float64), params)
    naive = lambda p: _naive_loss(p, model.config, batch, document)  # noqa: E731
    np.testing.assert_allclose(float(loss), naive(params64), rtol=1e-5)
    flat = traverse_util.flatten_dict(params64, sep="/")
    flat_grads = traverse_util.flatten_dict(grads, sep="/")
    rng = np.random.default_rng(0)
    for path, value in flat.items():
        u = rng.standard_normal(value.shape)
        shifted = [
            traverse_util.unflatten_dict({**flat, path: value + sign * eps * u}, sep="/")
            for sign in (1, -1)
        ]
        difference = (naive(shifted[0]) - naive(shifted[1])) / (2 * eps)
        g = np.asarray(flat_grads[path], np.float64)
        scale = np.linalg.norm(g) * np.linalg.norm(u)
        # Every parameter is used; but key biases of an attention add one constant to all
        # of a query's logits: their true gradient is 0 (float32 noise here).
        assert scale > 0 or path.endswith("key/bias"), path
        assert abs(np.sum(g * u) - difference) <= 1e-4 * scale + 1e-6, (path, difference)


def test_rnnsearch_loss_and_gradients_match_the_naive_model(setups):
    setup = setups["rnnsearch"]
    _assert_loss_and_grads(setup.model, setup.params, _batch(), False, setup.grad)


@pytest.mark.parametrize("switches", sorted(HM_SWITCHES))
def test_hmgdc_loss_and_gradients_match_the_naive_model(switches):
    model, batch = _model("rnnsearch_hmgdc", **HM_SWITCHES[switches]), _batch()
    _assert_loss_and_grads(model, _params(model, batch, 1, SCALE), batch, document=True)


# ------------------------------------------------------------------- padding and leakage


@pytest.mark.parametrize("name", NAMES)
def test_padding_changes_nothing(setups, name):
    """Appended PAD (source and target) leaves every score and encoder state as it was: the
    backward GRU reads each sentence from its own last real token."""
    setup, batch = setups[name], _batch(2)
    model, params = setup.model, setup.params
    padded = {k: np.pad(v, [(0, 0), (0, 0), (0, 3)]) for k, v in batch.items()}
    np.testing.assert_allclose(
        setup.score(params, padded), setup.score(params, batch), atol=1e-5, rtol=1e-5
    )
    if name == "rnnsearch":  # the encoder states themselves, and the decoder's start
        module = model.eval_module
        src, mask = batch["src"].reshape(-1, 5), batch["src_mask"].reshape(-1, 5)
        pad = [(0, 0), (0, 3)]

        def encode(p):
            variables = {"params": p}
            return [
                module.apply(variables, x, m, method=module.encode)
                for x, m in ((src, mask), (np.pad(src, pad), np.pad(mask, pad)))
            ]

        (states, finals), (states_p, finals_p) = _fast(encode, params)
        real = mask > 0
        np.testing.assert_allclose(
            np.asarray(states_p)[:, :5][real], np.asarray(states)[real], atol=1e-6
        )
        np.testing.assert_allclose(finals_p, finals, atol=1e-6)
        np.testing.assert_array_equal(np.asarray(states)[~real], 0.0)


def _edit(batch, b, s, n):
    """``batch`` with the first ``n`` source tokens of sentence ``(b, s)`` replaced."""
    out = {k: v.copy() for k, v in batch.items()}
    out["src"][b, s, :n] = (out["src"][b, s, :n] + 5) % (V - 4) + 4
    return out


def test_sentences_are_independent_in_rnnsearch(setups):
    setup, batch = setups["rnnsearch"], _batch(3)
    base = np.asarray(setup.score(setup.params, batch))
    out = np.asarray(setup.score(setup.params, _edit(batch, 0, 1, 3)))
    np.testing.assert_allclose(np.delete(out.ravel(), 1), np.delete(base.ravel(), 1), atol=1e-6)
    assert abs(out[0, 1] - base[0, 1]) > 1e-3


def test_hmgdc_context_is_the_chunk_and_nothing_else(setups):
    """Editing chunk 1 changes only chunk 1's scores; editing sentence 1 of chunk 0 changes
    the scores of its chunk's other sentences (their global context)."""
    setup, batch = setups["rnnsearch_hmgdc"], _batch(4)
    base = np.asarray(setup.score(setup.params, batch))
    out = np.asarray(setup.score(setup.params, _edit(batch, 1, 0, 2)))
    np.testing.assert_allclose(out[[0, 2]], base[[0, 2]], atol=1e-6)
    assert np.abs(out[1, :2] - base[1, :2]).min() > 1e-4
    out = np.asarray(setup.score(setup.params, _edit(batch, 0, 1, 3)))
    np.testing.assert_allclose(out[1:], base[1:], atol=1e-6)
    assert np.abs(out[0, [0, 2]] - base[0, [0, 2]]).min() > 1e-4


def test_single_sentence_and_empty_chunks_are_finite(setups):
    """A chunk without any real sentence and a one-sentence chunk (its own context): finite
    loss and gradients, PAD translations for the empty sentences, for both models."""
    batch = _batch(5)
    for key in batch:
        batch[key][1] = 0  # chunk 1: no sentence
        batch[key][2, 1:] = 0  # chunk 2: one sentence
    for setup in setups.values():
        loss, grads = setup.grad(setup.params, batch)
        assert np.isfinite(float(loss))
        assert all(np.isfinite(g).all() for g in jax.tree.leaves(grads))
        ids, _ = setup.translate(setup.params, batch)
        ids = np.asarray(ids)
        assert (ids[1] == PAD_ID).all() and (ids[2, 1:] == PAD_ID).all()
        assert (ids[[0, 0, 0, 2], [0, 1, 2, 0]] == EOS_ID).any(-1).all()


# ----------------------------------------------------------------------------- sharing


def test_shared_cells_are_one_array_whose_gradient_sums_both_uses(setups):
    """``share_encoder``: DocEnc uses the SentEnc arrays themselves (no copy in the tree), and
    their gradient is the sum of the unshared model's two copies' gradients when the copies
    are equal. Deeper document layers get their own cells."""
    setup, batch = setups["rnnsearch_hmgdc"], _batch(6)
    params = setup.params
    assert not any(k.startswith("document_layers") for k in params)
    deeper = _model("rnnsearch_hmgdc", num_document_layers=3)
    boxed = jax.eval_shape(deeper.init, jax.random.PRNGKey(0), batch)["params"]
    assert sorted(k for k in boxed if k.startswith("document_layers")) == ["document_layers_2"]
    unshared = _model("rnnsearch_hmgdc", share_encoder=False)
    copies = dict(params, **{f"document_layers_{i}": params[f"encoder_layers_{i}"] for i in (0, 1)})
    boxed = jax.eval_shape(unshared.init, jax.random.PRNGKey(0), batch)["params"]
    assert jax.tree.structure(copies) == jax.tree.structure(nn.meta.unbox(boxed))
    loss, g = setup.grad(params, batch)
    loss_u, g_u = _fast(jax.value_and_grad(_eval_loss(unshared)), copies, batch)
    np.testing.assert_allclose(float(loss), float(loss_u), rtol=1e-6)
    for i in (0, 1):
        summed = jax.tree.map(jnp.add, g_u[f"encoder_layers_{i}"], g_u[f"document_layers_{i}"])
        leaves = zip(
            jax.tree.leaves(g[f"encoder_layers_{i}"]), jax.tree.leaves(summed), strict=True
        )
        for a, b in leaves:
            np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-5)
        assert np.abs(jax.tree.leaves(g_u[f"document_layers_{i}"])[0]).max() > 0


def test_config_checks():
    with pytest.raises(ModelError, match="share_encoder needs embed_dim == d_model"):
        _model("rnnsearch_hmgdc", embed_dim=4)
    with pytest.raises(ModelError, match="d_model must be even"):
        _model("rnnsearch", d_model=5)
    with pytest.raises(ModelError, match="num_document_layers must be >= 1"):
        _model("rnnsearch_hmgdc", num_document_layers=0)


def test_rnnsearch_checkpoint_fills_theta_s():
    """``init_from_rules = "all"`` from an ``rnnsearch`` run: every RNNSearch path loads
    as it is, exactly the document parameters stay fresh; ``source`` loads the source side."""
    batch = dummy_batch(2, 4, rows=1, vocab_size=V)

    def shapes(model):
        boxed = jax.eval_shape(model.init, jax.random.PRNGKey(0), batch)["params"]
        flat = traverse_util.flatten_dict(nn.meta.unbox(boxed), sep="/")
        return {k: v.shape for k, v in flat.items()}

    sentence = shapes(_model("rnnsearch", embed_dim=6))
    for switches in [{}, *HM_SWITCHES.values()]:
        model = _model("rnnsearch_hmgdc", **dict(switches, embed_dim=6))
        document = shapes(model)
        for preset in ("all", "source"):
            entries = param_mapping.parse_rules(preset)
            rules = param_mapping.resolve_rules(entries, model, list(document), list(sentence))
            rows = param_mapping.plan(document, sentence, rules)
            fresh = {r.parameter for r in rows if r.status == param_mapping.FRESH}
            loaded = {r.parameter for r in rows if r.status == param_mapping.LOADED}
            if preset == "all":
                assert loaded == set(sentence) and fresh == set(document) - set(sentence)
                assert all(re.fullmatch(DOCUMENT_PARAMETERS, p) for p in fresh)
            else:
                assert loaded == {p for p in sentence if p.startswith(("source_", "encoder_"))}


# ------------------------------------------------------------------------------ decoding


def _decode_steps(model, params, src, src_mask, dec_in, groups):
    """Logits ``[N, T, V]`` of ``decode_step`` fed ``dec_in [N, T]``; ``extra`` from the
    ``src`` rows, ``groups`` contiguous cache rows per sentence."""
    module, variables = model.eval_module, {"params": params}
    encoded = module.apply(variables, src, src_mask, method=module.encode)
    rows = src_mask.reshape(-1, src_mask.shape[-1])
    extra = module.apply(variables, encoded, rows, method=module.decode_inputs)
    cache = module.apply(variables, dec_in.shape[0], dec_in.shape[1], method=module.init_cache)
    out = []
    for t in range(dec_in.shape[1]):
        logits, cache = module.apply(
            variables, cache, dec_in[:, t], extra, method=module.decode_step
        )
        out.append(logits)
    return jnp.stack(out, 1)


@pytest.mark.parametrize("name", NAMES)
def test_cached_steps_equal_teacher_forcing(setups, name):
    """Every ``decode_step`` logit equals the teacher-forced logit of the same prefix, with
    3 beams per sentence sharing its ``extra`` (the cache rows of a beam search)."""
    setup, batch = setups[name], _batch(7)
    model = setup.model
    rows = model.rows(batch)
    tgt = rows["tgt"].reshape(-1, rows["tgt"].shape[-1])
    dec_in = jnp.repeat(layers.shift_right(jnp.asarray(tgt), BOS_ID), 3, axis=0)

    def both(p):
        full = model.forward(p, batch, None, False)[0]
        return full, _decode_steps(model, p, rows["src"], rows["src_mask"], dec_in, 3)

    full, steps = _fast(both, setup.params)
    np.testing.assert_allclose(steps, np.repeat(full, 3, axis=0), atol=2e-5, rtol=1e-5)


def _naive_greedy(model, params, batch, search):
    """Argmax decoding with the full forward pass re-run every step (PAD and BOS never
    chosen, EOS forced at each sentence's limit)."""
    max_len, limits = sentence_limits(jnp.asarray(batch["src_mask"]), search)
    limits = np.asarray(limits)
    B, S, _ = batch["src"].shape
    out = np.zeros((B, S, max_len), np.int32)
    done = np.zeros((B, S), bool)

    def forward(p, tgt):
        return model.forward(p, dict(batch, tgt=tgt, tgt_mask=jnp.ones_like(tgt)), None, False)[0]

    forward = _fast_jit(forward)
    for t in range(max_len):
        logits = np.array(forward(params, out)).reshape(B, S, max_len, V)[:, :, t]
        logits[..., [PAD_ID, BOS_ID]] = -np.inf
        token = np.where(t + 1 >= limits, EOS_ID, logits.argmax(-1))
        out[:, :, t] = np.where(done, PAD_ID, token)
        done |= token == EOS_ID
    return np.where(batch["src_mask"].any(-1)[..., None], out, PAD_ID)


@pytest.mark.parametrize("name", NAMES)
def test_beam_one_translation_is_the_naive_greedy_path(setups, trained, name):
    setup, params, batch = setups[name], trained[name], _batch()
    ids, aux = setup.translate(params, batch)
    assert aux == {}
    naive = _naive_greedy(setup.model, params, batch, SEARCH)
    np.testing.assert_array_equal(np.asarray(ids), naive)
    assert len(np.unique(naive[naive > EOS_ID])) >= 3  # not one token repeated
    lengths = (naive != PAD_ID).sum(-1)
    limits = batch["src_mask"].sum(-1) + 2
    assert ((lengths < limits) & (lengths > 0)).any()  # an EOS chosen, not forced


def test_random_context(setups):
    """The chunk model takes every sentence's context from other rows (the base class's slot
    rotation); the sentence model has no context to replace."""
    setup, batch = setups["rnnsearch_hmgdc"], _batch(9)
    jbatch = {k: jnp.asarray(v) for k, v in batch.items()}
    shuffled = setup.model.with_random_context(jbatch, jax.random.PRNGKey(1))
    origin = np.asarray(shuffled["origin_row"])
    np.testing.assert_array_equal(np.asarray(shuffled["src"]), batch["src"][origin, np.arange(3)])
    assert (origin != np.arange(3)[:, None]).any()
    scores = np.asarray(setup.score(setup.params, {k: shuffled[k] for k in batch}))
    assert np.isfinite(scores).all()
    with pytest.raises(ModelError, match="no context"):
        setups["rnnsearch"].model.with_random_context(jbatch, jax.random.PRNGKey(0))


def test_dropout_acts_in_training():
    """Each rate draws new masks with every rng in training: ``dropout_rate`` on the loss
    (embeddings, between layers, attentional output); Eq. 7's ``context_dropout_rate`` and
    the attention weights' ``attention_dropout_rate`` on ``h_ctx``. (Evaluation, without
    dropout, is what the naive-model tests check.)"""
    batch = _batch(10)
    keys = jnp.stack([jax.random.PRNGKey(0), jax.random.PRNGKey(1)])
    model = _model("rnnsearch", dropout_rate=0.5)
    loss = jax.vmap(lambda p, r: model.loss(p, batch, r, True)[0], in_axes=(None, 0))
    first, second = _fast(loss, _params(model, batch), keys)
    assert abs(first - second) > 1e-4
    for rate in ("context_dropout_rate", "attention_dropout_rate"):
        model = _model("rnnsearch_hmgdc", **{rate: 0.5})

        def encode(v, r, m=model):
            src, mask = batch["src"], batch["src_mask"]
            return m.train_module.apply(v, src, mask, method="encode", rngs={"dropout": r})[0]

        variables = {"params": _params(model, batch)}
        first, second = _fast(jax.vmap(encode, in_axes=(None, 0)), variables, keys)
        assert np.abs(first - second).max() > 1e-3, rate


def test_parameters_carry_logical_axes():
    model = _model("rnnsearch_hmgdc", num_document_layers=3)
    boxed = jax.eval_shape(model.init, jax.random.PRNGKey(0), dummy_batch(2, 3))["params"]
    leaves = jax.tree.leaves(boxed, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
    assert leaves and all(isinstance(x, nn.LogicallyPartitioned) for x in leaves)
    assert all(len(x.names) == x.value.ndim for x in leaves)


# --------------------------------------------------------------------------------- FLOPs


def test_rnnsearch_flops_match_hand_count():
    # E=4, D=6 (3 per encoder direction), V=10, one layer; 2 rows of 3 source, 3 target tokens.
    encoder = (
        2 * 2 * (2 * 3 * 4 * 9)  # input gates: 2 rows x 2 directions x 2*Ts*E*3h
        + 2 * 2 * (2 * 3 * 3 * 9)  # recurrent gates: 2*Ts*h*3h
    )
    decoder = (
        2 * (2 * 3 * 10 * 18)  # input gates of [emb; feed]: 2*Tt*(E+D)*3D
        + 2 * (2 * 3 * 6 * 18)  # recurrent gates
    )
    attention = (
        2 * (2 * 3 * 6 * 6)  # W_m h (source)
        + 2 * (2 * 3 * 6 * 6)  # W_q s_t
        + 2 * 2 * (2 * 3 * 3 * 6)  # v . tanh(...) and weights . h over 3x3
        + 2 * (2 * 3 * 12 * 6)  # W_c [c; s]
    )
    output = 2 * (2 * 3 * 6 * 10)
    assert (encoder, decoder, attention, output) == (1512, 3456, 2160, 720)
    model = build_model(dict(name="rnnsearch", embed_dim=4, d_model=6, num_layers=1), 10)
    shape = flops.BatchShape(chunks=1, sentences=2, src_len=3, tgt_len=3)
    assert flops.forward_flops(model, shape) == encoder + decoder + attention + output


def test_hmgdc_flops_add_the_hand_counted_document_terms():
    # D=E=6, 2 heads, one layer each side, 1 chunk of 2 sentences of 3 tokens (L = 6 words).
    sentence = 2 * 4 * (2 * 3 * 6 * 6) + 2 * 2 * (2 * 3 * 3 * 6)  # Eq. 2 on 2 rows
    document = 2 * (2 * 2 * 6 * 9) + 2 * (2 * 2 * 3 * 9)  # one bi-GRU layer over 2 summaries
    context = 2 * (2 * 6 * 6 * 6) + 2 * (2 * 2 * 6 * 6) + 2 * (2 * 6 * 2 * 6)  # Eq. 5-6
    assert (sentence, document, context) == (2160, 648, 1440)
    sizes = dict(embed_dim=6, d_model=6, num_layers=1, num_heads=2, num_document_layers=1)
    model = build_model(dict(sizes, name="rnnsearch_hmgdc"), 10)
    base = build_model(dict(name="rnnsearch", embed_dim=6, d_model=6, num_layers=1), 10)
    shape = flops.BatchShape(chunks=1, sentences=2, src_len=3, tgt_len=3)
    extra = flops.forward_flops(model, shape) - flops.forward_flops(base, shape)
    assert extra == sentence + document + context


@pytest.mark.parametrize("variant", ["rnnsearch", "shared", *HM_SWITCHES])
def test_analytic_count_equals_the_traced_matrix_multiplies(variant):
    if variant == "rnnsearch":
        model = build_model(dict(TINY, name="rnnsearch", d_model=8, num_layers=3), 32)
    else:
        sizes = dict(HM, embed_dim=8, d_model=8, num_layers=3)
        sizes.update(HM_SWITCHES.get(variant, {}))
        model = build_model(dict(sizes, name="rnnsearch_hmgdc"), 32)
    batch = dummy_batch(3, 5, rows=2, vocab_size=32)
    params = nn.meta.unbox(jax.eval_shape(model.init, jax.random.PRNGKey(0), batch)["params"])
    forward = lambda p, b: model.forward(p, b, None, False)[0]  # noqa: E731
    traced = flops.jaxpr_dot_flops(jax.make_jaxpr(forward)(params, batch))
    assert flops.forward_flops(model, flops.BatchShape(2, 3, 5, 5)) == traced
