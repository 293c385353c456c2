"""HM-GDC on grouped packed rows (``PackingConfig(unit="grouped")``): the planner keeps every
document whole within one batch (checked sentence by sentence against the corpus), and the
model on packed rows gives the loss and gradients of the ``[B, S, T]`` grid (itself tested
against the naive per-document reference in ``test_hmgdc.py``) for every switch."""

import jax.numpy as jnp
import numpy as np
import pytest
from test_doct import _documents, encode
from test_hmgdc import (
    HM_DOCS,
    SWITCHES,
    _batches,
    _model,
    _params,
    assert_same_values_and_gradients,
)

from docnmt_jax.data import pipeline as P
from docnmt_jax.data import schema
from docnmt_jax.data.grouped_plan import GroupedPackedPlan
from docnmt_jax.data.packed_plan import PackingError
from docnmt_jax.data.spec import PackingConfig, PipelineConfig
from docnmt_jax.data.tokenizer import EOS_ID

GROUPED = PackingConfig(unit="grouped", row_tokens=16, max_row_sentences=3)


def _config(budget=64, whole_documents=True, max_len=16, **overrides):
    return PipelineConfig(
        max_sentences=2,
        max_src_len=max_len,
        max_tgt_len=max_len,
        batch_src_tokens=budget,
        batch_tgt_tokens=budget,
        whole_documents=whole_documents,
        **{"shuffle": True, "packing": GROUPED, **overrides},
    )


def _random_docs(n, seed=0):
    rng = np.random.default_rng(seed)
    sentence = lambda: list(rng.integers(4, 40, rng.integers(1, 9)))  # noqa: E731
    return [[(sentence(), sentence()) for _ in range(rng.integers(1, 12))] for _ in range(n)]


def _check_plan(plan, docs):
    """Naive check of every batch of epoch 0: each document's sentences all in this batch, in
    the rows' token features, under one chunk number; rows within their limits."""
    epoch = plan.epoch(0)
    seen = set()
    for b in range(len(epoch)):
        ids = epoch.ids[epoch.starts[b] :][: epoch.sizes[b]]
        batch = plan.materialize(ids, 0, int(epoch.t[b]))
        schema.check_packed_batch(batch)
        found = {}  # (chunk number, sentence index) -> (src tokens, tgt tokens)
        for r in range(batch["src"].shape[0]):
            segments = batch["src_segment_ids"][r]
            assert segments.max() <= GROUPED.max_row_sentences
            for seg in range(1, segments.max() + 1):
                sides = []
                for side in ("src", "tgt"):
                    at = batch[f"{side}_segment_ids"][r] == seg
                    assert len(set(batch[f"{side}_chunk_ids"][r][at].tolist())) == 1
                    np.testing.assert_array_equal(
                        batch[f"{side}_positions"][r][at], np.arange(at.sum())
                    )
                    sides.append(batch[side][r][at].tolist())
                chunk = int(batch["src_chunk_ids"][r][batch["src_segment_ids"][r] == seg][0])
                index = int(batch["src_sentence_index"][r][batch["src_segment_ids"][r] == seg][0])
                found[chunk, index] = tuple(sides)
        # Each chunk number of the batch is one whole document, in order.
        for chunk in sorted({c for c, _ in found}):
            n = max(i for c, i in found if c == chunk) + 1
            sentences = [found[chunk, i] for i in range(n)]
            matches = [
                d
                for d, doc in enumerate(docs)
                if [(s + [EOS_ID], t + [EOS_ID]) for s, t in doc]
                == [(list(s), list(t)) for s, t in sentences]
            ]
            assert matches, (b, chunk)
            seen.add(matches[0])
    assert seen == set(range(len(docs)))


def test_every_document_is_whole_in_one_batch_and_every_sentence_placed_once():
    docs = _random_docs(40)
    plan = P.plan_batches(_documents(docs), encode, _config())
    assert isinstance(plan, GroupedPackedPlan)
    _check_plan(plan, docs)
    # Every sentence exactly once; batches per epoch constant, order shuffled per epoch.
    placed = np.sort(plan.placement[:, 0])
    np.testing.assert_array_equal(placed, np.arange(sum(len(d) for d in docs)))
    e0, e1 = plan.epoch(0), plan.epoch(1)
    assert len(e0) == len(e1) == plan.batches_per_epoch
    assert not np.array_equal(e0.ids, e1.ids)
    assert sorted(map(tuple, np.split(e0.ids, e0.starts[1:]))) == sorted(
        map(tuple, np.split(e1.ids, e1.starts[1:]))
    )
    # A document longer than a batch (64 slots = 4 rows of 16) gets a batch of 8 or 16 rows.
    assert {b for b, _ in plan.shapes} >= {4}
    big = [[(list(range(4, 14)), list(range(4, 14))) for _ in range(9)]]  # 9 x 11 tokens
    plan = P.plan_batches(_documents(docs + big), encode, _config())
    assert max(b for b, _ in plan.shapes) >= 8
    _check_plan(plan, docs + big)
    real = sum(len(s) + len(t) + 2 for d in docs + big for s, t in d)
    slots = 2 * 16 * int(sum(plan.epoch(0).sizes))
    assert abs(plan.padding_fraction - (1 - real / slots)) < 1e-9


def test_chunk_scope_groups_chunks_and_user_limits_are_one_line_errors():
    docs = _random_docs(20, seed=1)
    plan = P.plan_batches(_documents(docs), encode, _config(whole_documents=False))
    chunks = plan.chunk_table
    assert chunks["count"].max() <= 2 and len(chunks["doc"]) > len(docs)
    too_long = [[(list(range(4, 30)), [5])]]  # 27 source tokens > rows of 16
    with pytest.raises(PackingError, match="does not fit a packed row of 16"):
        P.plan_batches(_documents(too_long), encode, _config(max_len=32))
    huge = [[(list(range(4, 14)), [5]) for _ in range(40)]]  # 440 > 16 x 16 slots
    with pytest.raises(PackingError, match="largest grouped batch"):
        P.plan_batches(_documents(huge), encode, _config(budget=32))
    with pytest.raises(ValueError, match="drift=None"):
        PackingConfig(unit="grouped", drift=2)


def _packed_batches(docs, whole_documents=True):
    config = _config(budget=512, whole_documents=whole_documents, shuffle=False, num_epochs=1)
    plan = P.plan_batches(_documents(docs), encode, config)
    return [{k: jnp.asarray(v) for k, v in b.items()} for b in P.numpy_batches(plan)]


@pytest.mark.parametrize(
    "switches", ["paper", "decoder_only_deep", "encoder_only_separate", "pre_ln"]
)
def test_packed_rows_give_the_grids_loss_and_gradients(switches):
    """All documents of ``HM_DOCS`` (3, 1, 2, 5 sentences) in one packed batch of rows of 16
    (3 sentences a row at most, so documents span rows) == the whole-document grid."""
    overrides = dict(pre_ln=True) if switches == "pre_ln" else SWITCHES[switches]
    model = _model(**overrides, packed_row_sentences=GROUPED.max_row_sentences)
    grid = _batches(HM_DOCS)
    packed = _packed_batches(HM_DOCS)
    assert len(packed) == 1 and packed[0]["src"].shape[0] > 1
    assert int(packed[0]["src_chunk_ids"].max()) == len(HM_DOCS)
    params = _params(model, grid[0])

    def nll(p, batches):
        return sum(model.loss(p, b, None, False)[1]["nll"].total for b in batches)

    assert_same_values_and_gradients(lambda p: nll(p, packed), lambda p: nll(p, grid), params)


def test_the_chunk_scope_on_packed_rows_equals_its_grid():
    model = _model(document_scope=False, packed_row_sentences=GROUPED.max_row_sentences)
    grid = _batches(HM_DOCS, whole_documents=False)
    packed = _packed_batches(HM_DOCS, whole_documents=False)
    params = _params(model, grid[0])
    value = sum(model.loss(params, b, None, False)[1]["nll"].total for b in packed)
    ref = sum(model.loss(params, b, None, False)[1]["nll"].total for b in grid)
    np.testing.assert_allclose(float(value), float(ref), rtol=1e-5)
    assert model.packing().unit == "grouped"
