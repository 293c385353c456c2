"""DocT's packed rows (docnmt_jax/data/window_plan.py; Zhang et al. 2018, Eq. 2-3) against
independent references: the planner's sentences, targets and windows against windows built by
hand from the documents; the packed step's per-sentence NLL, summed loss and gradients against
today's padded grid path (chunks of 2, contexts across chunk boundaries, one-sentence
documents and every document's first sentence, k = 1 and 2) run without the fused context
projection; the fused projection against a loop over the layers' own kernels; and (slow) the
packed step against the naive sentence-by-sentence model of ``test_doct``."""

import dataclasses
from collections import Counter

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_doct import naive_nll
from test_final import _fast

from docnmt_jax.data import pipeline as P
from docnmt_jax.data.documents import Document
from docnmt_jax.data.packed_plan import PackedPlan
from docnmt_jax.data.spec import PackingConfig
from docnmt_jax.data.tokenizer import EOS_ID
from docnmt_jax.data.window_plan import WindowPackedPlan
from docnmt_jax.models import build_model
from docnmt_jax.models.doct import DocT
from docnmt_jax.models.window import context_windows
from docnmt_jax.training.steps import abstract_batch

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
RNG = np.random.default_rng(1)
# Documents of word ids (>= 4) of 5, 1, 3, 2 and 1 sentences: first sentences, one-sentence
# documents, windows across chunks of 2.
DOCS = [
    [
        (list(RNG.integers(4, V, RNG.integers(1, 7))), list(RNG.integers(4, V, RNG.integers(1, 7))))
        for _ in range(n)
    ]
    for n in (5, 1, 3, 2, 1)
]


def _documents(docs):
    words = lambda ids: " ".join(map(str, ids))  # noqa: E731
    return [
        Document(f"d{i}", tuple(words(s) for s, _ in d), tuple(words(t) for _, t in d))
        for i, d in enumerate(docs)
    ]


def encode(texts):
    return [[int(w) for w in t.split()] for t in texts]


def _config(k, packing=None, **overrides):
    settings = dict(
        max_sentences=2,
        max_src_len=8,
        max_tgt_len=8,
        batch_src_tokens=64,
        batch_tgt_tokens=64,
        shuffle=False,
        num_epochs=1,
        context_sentences=k,
        packing=packing,
        length_buckets=(8,),
        sentence_buckets=(2,),
    )
    return P.PipelineConfig(**{**settings, **overrides})


def _batches(docs, config):
    plan = P.plan_batches(_documents(docs), encode, config)
    return plan, [{key: jnp.asarray(v) for key, v in b.items()} for b in P.numpy_batches(plan)]


def _packed(docs, k, row_tokens=16):
    return _batches(docs, _config(k, PackingConfig(row_tokens=row_tokens, max_shapes=1)))


def _hand_items(docs, k):
    """(source, target, window) of every sentence, from the documents by hand."""
    items = []
    for doc in docs:
        sources = [src + [EOS_ID] for src, _ in doc]
        for j, (_, tgt) in enumerate(doc):
            window = [w for s in sources[max(0, j - k) : j] for w in s]
            items.append((tuple(sources[j]), tuple(tgt + [EOS_ID]), tuple(window)))
    return items


def _packed_items(batch, values=None):
    """(source, target, window) of every segment of packed rows, with ``values[b, t]``
    summed over the segment's target tokens when given."""
    items = {}
    for b in range(batch["src"].shape[0]):
        for seg in set(np.asarray(batch["src_segment_ids"][b]).tolist()) - {0}:
            src, tgt, ctx = (
                tuple(np.asarray(batch[x][b])[np.asarray(batch[f"{y}segment_ids"][b]) == seg])
                for x, y in (("src", "src_"), ("tgt", "tgt_"), ("context_src", "context_"))
            )
            on_ctx = np.asarray(batch["context_segment_ids"][b]) == seg
            positions = np.asarray(batch["context_positions"][b])[on_ctx]
            assert positions.tolist() == list(range(len(ctx)))  # 0.. over the window
            assert np.all(np.diff(np.flatnonzero(on_ctx)) == 1)  # one contiguous window
            on_tgt = np.asarray(batch["tgt_segment_ids"][b]) == seg
            key = (src, tgt, ctx)
            assert key not in items
            items[key] = float(np.sum(np.asarray(values)[b][on_tgt])) if values is not None else 0
    return items


@pytest.mark.parametrize("k", [1, 2])
def test_packed_rows_hold_every_sentence_with_its_window_once(k):
    plan, batches = _packed(DOCS, k)
    assert isinstance(plan, WindowPackedPlan)
    items = {}
    for batch in batches:
        assert set(batch) == set(plan.features)
        B, L = batch["src"].shape
        assert batch["context_src"].shape == (B, k * L)
        assert np.all((batch["context_src_mask"] > 0) == (batch["context_segment_ids"] > 0))
        items.update(_packed_items(batch))
    assert Counter(items) == Counter(dict.fromkeys(_hand_items(DOCS, k), 0))
    # The same sentence rows as the plan without windows where the context never binds.
    plain = PackedPlan(plan.corpus, dataclasses.replace(plan.config, context_sentences=0))
    assert plan.padding_fraction >= plain.padding_fraction
    assert 0.0 < plan.context_padding_fraction < 1.0


def test_a_window_over_k_rows_moves_its_sentence_to_a_longer_row():
    """Sources of 8, 8 and 3 tokens (with EOS), k = 1: the third sentence fits a row of 4
    slots, its window (8) does not fit 1 x 4, so it goes to a row of 8."""
    doc = [([5] * 7, [6]), ([7] * 7, [6]), ([8] * 2, [6])]
    packing = PackingConfig(row_tokens=4, max_shapes=2)
    plan, batches = _batches([doc], _config(1, packing))
    rows_of_8 = [b for b in batches if b["src"].shape[1] == 8]
    placed = [tuple(np.asarray(b["src"][r])) for b in rows_of_8 for r in range(b["src"].shape[0])]
    assert any(src[:3] == (8, 8, EOS_ID) for src in placed)
    assert not any(b["src"].shape[1] == 4 for b in batches)  # the other two need 8 anyway
    items = {}
    for b in batches:
        items.update(_packed_items(b))
    assert Counter(items) == Counter(dict.fromkeys(_hand_items([doc], 1), 0))


def test_the_trainer_compiles_for_the_context_rows():
    """``abstract_batch`` of a packed shape with K > 0 has the context rows ``[B, K*L]``."""
    abstract = abstract_batch((3, 16), None, 2)
    plan, batches = _packed(DOCS, 2)
    assert set(abstract) == set(plan.features) == set(batches[0])
    assert abstract["context_src"].shape == (3, 32) and abstract["src"].shape == (3, 16)
    assert "context_src" not in abstract_batch((3, 16), None, 0)


def _model(**overrides):
    return build_model(dict(TINY, name="doct", **overrides), V)


def _params(model, batch, seed=0):
    return nn.meta.unbox(_fast(model.init, jax.random.PRNGKey(seed), batch))["params"]


def _unfused(model):
    """``model`` with today's per-layer context projections (the reference path)."""
    ref = build_model(dict(TINY, name="doct", **_switches(model)), V)
    ref.eval_module = DocT(ref.eval_module.config, fuse_context_kv=False)
    return ref


def _switches(model):
    cfg = model.config
    names = ("context_sentences", "context_gating", "context_in_encoder", "context_in_decoder")
    return {name: getattr(cfg, name) for name in names + ("num_context_layers", "pre_ln")}


def _grid_items(model, params, batches, k):
    """Per sentence (source, target, window) -> NLL on the grid (the reference path)."""
    items = {}
    for batch in batches:
        scores = np.asarray(_fast(model.score, params, batch))
        ids, mask = context_windows(batch, k)
        B, S, T = batch["src"].shape
        for b in range(B):
            for s in range(S):
                if not batch["sentence_mask"][b, s]:
                    continue
                src = np.asarray(batch["src"][b, s])[np.asarray(batch["src_mask"][b, s]) > 0]
                tgt = np.asarray(batch["tgt"][b, s])[np.asarray(batch["tgt_mask"][b, s]) > 0]
                row = b * S + s
                ctx = np.asarray(ids[row])[np.asarray(mask[row]) > 0]
                items[(tuple(src), tuple(tgt), tuple(ctx))] = -float(scores[b, s])
    return items


def _packed_nll(model, params, batch):
    """Per target token NLL ``[B, L]`` of a packed batch."""
    logits, targets, mask = _fast(lambda p, b: model.forward(p, b, None, False), params, batch)
    logp = jax.nn.log_softmax(logits)
    nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    return np.asarray(nll * mask)


SWITCHES = {
    "paper_k2": dict(context_sentences=2),
    "k1_residual_decoder_only_nc2_pre_ln": dict(
        context_sentences=1,
        context_gating=False,
        context_in_encoder=False,
        num_context_layers=2,
        pre_ln=True,
    ),
    "k2_encoder_only_nc0": dict(
        context_sentences=2, context_in_decoder=False, num_context_layers=0
    ),
}


@pytest.mark.parametrize(
    "switches",
    [
        "k1_residual_decoder_only_nc2_pre_ln",
        "paper_k2",
        pytest.param("k2_encoder_only_nc0", marks=pytest.mark.slow),  # ~15 s: `make test-slow`
    ],
)
def test_packed_loss_and_gradients_equal_the_grid_path(switches):
    """Every sentence's NLL, the summed NLL and its gradients: packed rows (fused context
    projection) == today's grid path (chunks of 2, per-layer projections), float32 to 1e-5."""
    model = _model(**SWITCHES[switches])
    k = model.config.context_sentences
    _, grid = _batches(DOCS, _config(k))
    _, packed = _packed(DOCS, k)
    ref = _unfused(model)
    params = _params(model, packed[0])
    assert jax.tree.structure(params) == jax.tree.structure(_params(ref, grid[0]))

    got = {}
    for batch in packed:
        got.update(_packed_items(batch, _packed_nll(model, params, batch)))
    want = _grid_items(ref, params, grid, k)
    assert set(got) == set(want)
    for key, value in want.items():
        np.testing.assert_allclose(got[key], value, rtol=1e-5, atol=1e-5, err_msg=str(key))

    def total(m, batches):
        return lambda p: sum(m.loss(p, b, None, False)[1]["nll"].total for b in batches)

    nll, grads = _fast(jax.value_and_grad(total(model, packed)), params)
    ref_nll, ref_grads = _fast(jax.value_and_grad(total(ref, grid)), params)
    np.testing.assert_allclose(float(nll), float(ref_nll), rtol=1e-5)
    flat, ref_flat = jax.tree_util.tree_leaves_with_path(grads), jax.tree.leaves(ref_grads)
    for (path, g), r in zip(flat, ref_flat, strict=True):
        np.testing.assert_allclose(g, r, atol=1e-5, rtol=1e-4, err_msg=jax.tree_util.keystr(path))
    # The check can fail: the context side receives gradient.
    layer = "encoder_layers_0" if model.config.context_in_encoder else "decoder_layers_0"
    assert np.abs(grads[layer]["context_attention"]["key"]["kernel"]).max() > 1e-6


def test_fused_context_projection_equals_each_layers_own():
    """:meth:`DocT.context_kv` (one product) == every layer's key/value projection of the
    context states, computed here from its kernel and bias."""
    model = _model()
    _, packed = _packed(DOCS, 2)
    params = _params(model, packed[0])
    states = jax.random.normal(jax.random.PRNGKey(3), (3, 7, TINY["d_model"]))
    module = model.eval_module
    stacks = ("encoder", "decoder")
    kv = _fast(
        lambda p, x: module.apply({"params": p}, x, stacks, method=module.context_kv),
        params,
        states,
    )
    assert len(kv) == TINY["num_encoder_layers"] + TINY["num_decoder_layers"]
    paths = [f"{s}_layers_{i}" for s in stacks for i in range(2)]
    for (k, v), path in zip(kv, paths, strict=True):
        for got, name in ((k, "key"), (v, "value")):
            dense = params[path]["context_attention"][name]
            want = np.einsum("nlD,Dhd->nlhd", states, dense["kernel"]) + dense["bias"]
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=f"{path} {name}")


@pytest.mark.slow
@pytest.mark.parametrize("k", [1, 2])
def test_packed_nll_and_gradients_equal_the_naive_reference(k):
    """Packed rows == ``test_doct``'s sentence-by-sentence model with hand-built contexts
    (about 40 s: the reference compiles sentence by sentence)."""
    from test_doct import DOCS as NAIVE_DOCS
    from test_doct import assert_nll_and_gradients_equal

    model = _model(context_sentences=k)
    _, packed = _packed(NAIVE_DOCS, k)
    params = _params(model, packed[0])
    assert_nll_and_gradients_equal(
        model, packed, params, lambda p: naive_nll(model.config, p, NAIVE_DOCS)
    )
