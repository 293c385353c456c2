"""Packed rows: the schema's reference derivation (:func:`schema.pack_grid`) on hand-computed
examples, and the packed planner (:mod:`docnmt_jax.data.packed_plan`) against it."""

from __future__ import annotations

import dataclasses
import itertools
import random

import numpy as np
import pytest
from test_pipeline import encode, make_docs

from docnmt_jax.data import schema, synthetic
from docnmt_jax.data.batch_plan import BatchPlan
from docnmt_jax.data.documents import Document
from docnmt_jax.data.packed_plan import PackedPlan, PackingError
from docnmt_jax.data.pipeline import (
    PipelineConfig,
    make_dataset,
    measure_throughput,
    numpy_batches,
    plan_batches,
    tokenize_corpus,
)
from docnmt_jax.data.spec import PackingConfig

# Grid row 0: two sentences (src 3/tgt 1, then src 2/tgt 3); row 1: one sentence and an empty
# slot; row 2: empty.
SRC = np.array(
    [[[5, 6, 1, 0], [7, 1, 0, 0]], [[9, 1, 0, 0], [0, 0, 0, 0]], [[0, 0, 0, 0], [0, 0, 0, 0]]],
    np.int32,
)
TGT = np.array(
    [[[1, 0, 0, 0], [8, 9, 1, 0]], [[10, 11, 1, 0], [0, 0, 0, 0]], [[0, 0, 0, 0], [0, 0, 0, 0]]],
    np.int32,
)
GRID = schema.batch_from_grids(SRC, TGT)
ROWS_OF = [[0, 1], [2]]

# Source side, the same with and without drift (src runs ahead of tgt).
SRC_EXPECTED = {
    "src": [5, 6, 1, 7, 1, 9, 1, 0, 0, 0, 0, 0],
    "src_mask": [1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0],
    "src_positions": [0, 1, 2, 0, 1, 0, 1, 0, 0, 0, 0, 0],
    "src_chunk_positions": [0, 1, 2, 3, 4, 0, 1, 0, 0, 0, 0, 0],
    "src_segment_ids": [1, 1, 1, 2, 2, 3, 3, 0, 0, 0, 0, 0],
    "src_chunk_ids": [1, 1, 1, 1, 1, 2, 2, 0, 0, 0, 0, 0],
    "src_sentence_index": [0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0],
}
# drift=None: each side contiguous over the row (chunk 2's target starts at 4, its source at 5).
TGT_CONTIGUOUS = {
    "tgt": [1, 8, 9, 1, 10, 11, 1, 0, 0, 0, 0, 0],
    "tgt_mask": [1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0],
    "tgt_positions": [0, 0, 1, 2, 0, 1, 2, 0, 0, 0, 0, 0],
    "tgt_chunk_positions": [0, 1, 2, 3, 0, 1, 2, 0, 0, 0, 0, 0],
    "tgt_segment_ids": [1, 2, 2, 2, 3, 3, 3, 0, 0, 0, 0, 0],
    "tgt_chunk_ids": [1, 1, 1, 1, 2, 2, 2, 0, 0, 0, 0, 0],
    "tgt_sentence_index": [0, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0],
}
TGT_INDEX_CONTIGUOUS = [(0, 0, 0), (0, 1, 0), (0, 1, 1), (0, 1, 2)]
TGT_INDEX_CONTIGUOUS += [(1, 0, 0), (1, 0, 1), (1, 0, 2)] + [(-1, -1, -1)] * 5
# drift=1: target sentence 2 of chunk 1 waits until o_t = e_s - 1 = 2 (gap at 1); chunk 2
# starts at 5 on both sides.
TGT_DRIFT_1 = {
    "tgt": [1, 0, 8, 9, 1, 10, 11, 1, 0, 0, 0, 0],
    "tgt_mask": [1, 0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0],
    "tgt_positions": [0, 0, 0, 1, 2, 0, 1, 2, 0, 0, 0, 0],
    "tgt_chunk_positions": [0, 0, 1, 2, 3, 0, 1, 2, 0, 0, 0, 0],
    "tgt_segment_ids": [1, 0, 2, 2, 2, 3, 3, 3, 0, 0, 0, 0],
    "tgt_chunk_ids": [1, 0, 1, 1, 1, 2, 2, 2, 0, 0, 0, 0],
    "tgt_sentence_index": [0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0],
}
TGT_INDEX_DRIFT_1 = [(0, 0, 0), (-1, -1, -1), (0, 1, 0), (0, 1, 1), (0, 1, 2)]
TGT_INDEX_DRIFT_1 += [(1, 0, 0), (1, 0, 1), (1, 0, 2)] + [(-1, -1, -1)] * 4
SRC_INDEX = [(0, 0, 0), (0, 0, 1), (0, 0, 2), (0, 1, 0), (0, 1, 1), (1, 0, 0), (1, 0, 1)]
SRC_INDEX += [(-1, -1, -1)] * 5


@pytest.mark.parametrize(
    "drift, tgt_expected, tgt_index",
    [(None, TGT_CONTIGUOUS, TGT_INDEX_CONTIGUOUS), (1, TGT_DRIFT_1, TGT_INDEX_DRIFT_1)],
)
def test_pack_grid_matches_a_hand_computed_row(drift, tgt_expected, tgt_index):
    packed, index = schema.pack_grid(GRID, 12, ROWS_OF, drift=drift)
    schema.check_packed_batch(packed)
    assert tuple(packed) == schema.PACKED_FEATURES
    assert schema.is_packed(packed) and not schema.is_packed(GRID)
    for name, row in {**SRC_EXPECTED, **tgt_expected}.items():
        assert packed[name].tolist() == [row, [0] * 12], name
    assert index.shape == (2, 12, 3) and index.dtype == schema.DTYPE
    assert [tuple(x) for x in index[0].tolist()] == tgt_index
    assert (index[1] == -1).all()
    _, src_index = schema.pack_grid(GRID, 12, ROWS_OF, drift=drift, index_side="src")
    assert [tuple(x) for x in src_index[0].tolist()] == SRC_INDEX


def test_pack_grid_index_points_at_the_same_tokens():
    for drift in (None, 0, 1, 3):
        packed, index = schema.pack_grid(GRID, 12, ROWS_OF, drift=drift)
        real = index[..., 0] >= 0
        b, s, t = index[real].T
        np.testing.assert_array_equal(packed["tgt"][real], TGT[b, s, t])
        np.testing.assert_array_equal(packed["tgt_mask"], real.astype(np.int32))


def test_pack_grid_defaults_to_one_grid_row_per_packed_row():
    packed, _ = schema.pack_grid(GRID, 8)
    assert packed["src"].shape == (3, 8)
    assert packed["src"][0].tolist() == [5, 6, 1, 7, 1, 0, 0, 0]
    assert packed["tgt"][1].tolist() == [10, 11, 1, 0, 0, 0, 0, 0]
    assert not packed["src_mask"][2].any()
    for side in schema.SIDES:  # one chunk per row
        assert set(packed[f"{side}_chunk_ids"].ravel().tolist()) == {0, 1}


def test_pack_grid_sentence_level_chunk_ids_equal_segment_ids():
    grid = schema.batch_from_grids(SRC[:, :1], TGT[:, :1])  # S = 1
    packed, _ = schema.pack_grid(grid, 12, [[0, 1, 2]], drift=None)
    for side in schema.SIDES:
        np.testing.assert_array_equal(
            packed[f"{side}_chunk_ids"], packed[f"{side}_segment_ids"], err_msg=side
        )
        assert not packed[f"{side}_sentence_index"].any()
    assert packed["src_segment_ids"][0, :6].tolist() == [1, 1, 1, 2, 2, 0]


def test_pack_grid_rejects_an_overflowing_row():
    with pytest.raises(ValueError, match="row_len=6"):
        schema.pack_grid(GRID, 6, ROWS_OF)  # the source ends at 7
    schema.pack_grid(GRID, 7, ROWS_OF)
    with pytest.raises(ValueError, match="row_len=8"):
        schema.pack_grid(GRID, 8, ROWS_OF, drift=0)  # chunk 2 starts at 6, its target ends at 9
    schema.pack_grid(GRID, 9, ROWS_OF, drift=0)
    with pytest.raises(ValueError, match="drift"):
        schema.pack_grid(GRID, 8, ROWS_OF, drift=-1)


def test_dummy_packed_batch_has_no_padding():
    for kwargs in ({}, dict(row_len=10, rows=2, sentences_per_row=3, vocab_size=50)):
        batch = schema.dummy_packed_batch(**kwargs)
        schema.check_packed_batch(batch)
        assert batch["src_mask"].all() and batch["tgt_mask"].all()
    assert batch["src_segment_ids"][0].tolist() == [1, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert batch["tgt_sentence_index"][1].tolist() == [0, 0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert batch["src_chunk_positions"][0].tolist() == list(range(10))
    assert (batch["src"] >= 4).all() and (batch["src"] < 50).all()


def test_check_packed_batch_rejects_what_breaks_the_schema():
    good = schema.dummy_packed_batch(8, rows=2)
    for broken in (
        {k: v for k, v in good.items() if k != "tgt_sentence_index"},
        {**good, "src": good["src"].astype(np.int64)},
        {**good, "tgt_mask": good["tgt_mask"][:, :4]},
        {**good, "src_chunk_ids": good["src_chunk_ids"][None]},
    ):
        with pytest.raises(ValueError):
            schema.check_packed_batch(broken)


# ---------------------------------------------------------------------------------------------
# The packed planner.


DOCS = make_docs(60)
BASE = PipelineConfig(
    max_sentences=5,
    max_src_len=24,
    max_tgt_len=20,
    batch_src_tokens=96,
    batch_tgt_tokens=80,
)
SENTENCES = PackingConfig("sentence", row_tokens=16)
CHUNKS = PackingConfig("chunk", row_tokens=16, drift=2)


def cfg(packing: PackingConfig = CHUNKS, **kw) -> PipelineConfig:
    return dataclasses.replace(BASE, packing=packing, **kw)


def grid_plan(plan: PackedPlan) -> BatchPlan:
    """The grid plan over the same items (its chunk table equals the packed plan's)."""
    sentence_level = plan.config.sentence_level or plan.packing.unit == "sentence"
    config = dataclasses.replace(plan.config, packing=None, sentence_level=sentence_level)
    grid = BatchPlan(plan.corpus, config)
    for k, v in plan.chunk_table.items():
        np.testing.assert_array_equal(grid.chunk_table[k], v, err_msg=k)
    return grid


def assert_materialize_equals_pack_grid(plan: PackedPlan, rows: np.ndarray, row_len: int):
    """``plan.materialize(rows)`` equals :func:`schema.pack_grid` of the grid batch of the same
    items with the same row assignment (exact ints)."""
    packed = plan.materialize(rows, 0, row_len)
    schema.check_packed_batch(packed)
    items, rows_of = [], []
    for r in rows.tolist():
        row_items = plan.item_rows[r] if r >= 0 else np.zeros(0, np.int64)
        rows_of.append(list(range(len(items), len(items) + row_items.size)))
        items.extend(row_items.tolist())
    grid = grid_plan(plan)
    s = plan.config.sentences_per_chunk if plan.packing.unit == "chunk" else 1
    t = max(plan.config.max_src_len, plan.config.max_tgt_len)
    grid_batch = grid.materialize(np.asarray(items, np.int64), s, t)
    expected, _ = schema.pack_grid(grid_batch, row_len, rows_of, drift=plan.packing.drift)
    assert tuple(packed) == tuple(expected)
    for k in expected:
        np.testing.assert_array_equal(packed[k], expected[k], err_msg=k)


def all_batches(plan: PackedPlan, e: int):
    ep = plan.epoch(e)
    for b in range(len(ep)):
        yield ep.batch(b), int(ep.t[b])


@pytest.mark.parametrize(
    "packing",
    [SENTENCES, PackingConfig("sentence", 8, drift=0), CHUNKS, PackingConfig("chunk", 32)],
)
def test_materialize_equals_pack_grid(packing):
    plan = plan_batches(DOCS, encode, cfg(packing))
    for ids, t in all_batches(plan, 0):
        assert_materialize_equals_pack_grid(plan, ids, t)


def test_materialize_equals_pack_grid_on_the_synthetic_corpus():
    docs, _ = synthetic.generate(synthetic.SyntheticConfig(num_documents=30, seed=3))
    vocab: dict[str, int] = {}

    def word_encode(texts):
        return [[vocab.setdefault(w, len(vocab) + 4) for w in t.split()] for t in texts]

    for packing in (PackingConfig("sentence", 32), PackingConfig("chunk", 128, drift=4)):
        config = PipelineConfig(max_sentences=20, packing=packing, num_epochs=1)
        plan = plan_batches(docs, word_encode, config)
        assert plan.batches_per_epoch > 1
        for ids, t in all_batches(plan, 0):
            assert_materialize_equals_pack_grid(plan, ids, t)


def test_materialize_equals_pack_grid_when_src_is_much_longer_and_drift_is_1():
    rng = random.Random(1)
    docs = [
        Document(
            f"d{d}",
            tuple(" ".join(["w1"] * rng.randint(5, 14)) for _ in range(n)),
            tuple(" ".join(["w2"] * rng.randint(0, 2)) for _ in range(n)),
        )
        for d, n in enumerate([1, 3, 5, 7, 2, 4])
    ]
    config = cfg(PackingConfig("chunk", 32, drift=1), max_sentences=4, max_src_len=16)
    plan = plan_batches(docs, encode, config)
    gaps = 0
    for ids, t in all_batches(plan, 0):
        assert_materialize_equals_pack_grid(plan, ids, t)
        batch = plan.materialize(ids, 0, t)
        for row in range(ids.size):  # the target has holes inside its chunks: forced gaps
            chunk = batch["tgt_chunk_ids"][row]
            inside = (chunk == 0) & (np.maximum.accumulate(chunk) > 0)
            gaps += int(inside[: np.flatnonzero(chunk)[-1]].sum()) if chunk.any() else 0
    assert gaps > 0


@pytest.mark.parametrize("packing", [SENTENCES, CHUNKS, PackingConfig("chunk", 16)])
def test_every_item_once_per_epoch_in_few_shapes(packing):
    config = cfg(packing, batch_multiple=2)
    plan = plan_batches(DOCS, encode, config)
    table = plan.chunk_table
    assert 1 <= len(plan.shapes) <= packing.max_shapes
    assert plan.local_shapes == plan.shapes
    budget = min(config.batch_src_tokens, config.batch_tgt_tokens)
    for B, L in plan.shapes:
        assert L in packing.row_lengths
        assert B % 2 == 0 and (B * L <= budget or B == 2)
    # Every item in exactly one row, every sentence placed once.
    items = np.sort(np.concatenate(plan.item_rows))
    np.testing.assert_array_equal(items, np.arange(table["doc"].size))
    placed = np.sort(plan.placement[:, 0])
    np.testing.assert_array_equal(placed, np.arange(plan.corpus.num_sentences))
    for e in range(3):
        assert len(plan.epoch(e)) == plan.batches_per_epoch
        rows, chunks, sentences = [], 0, 0
        for ids, t in all_batches(plan, e):
            assert (ids.size, t) in plan.shapes
            batch = plan.materialize(ids, 0, t)
            for row in range(ids.size):
                if ids[row] < 0:
                    assert not any(batch[k][row].any() for k in batch)
                    continue
                rows.append(int(ids[row]))
                chunks += len(set(batch["src_chunk_ids"][row].tolist()) - {0})
                sentences += len(set(batch["src_segment_ids"][row].tolist()) - {0})
        assert sorted(rows) == list(range(plan.num_rows))  # every row once per epoch
        assert (chunks, sentences) == (table["doc"].size, plan.corpus.num_sentences)


def test_packing_invariants():
    """Chunks are never split, their sentences are contiguous runs in order, and a sentence's
    source and target start within ``drift`` slots of each other."""
    plan = plan_batches(DOCS, encode, cfg(CHUNKS, max_sentences=7))
    drift = CHUNKS.drift
    for ids, t in all_batches(plan, 0):
        batch = plan.materialize(ids, 0, t)
        for row in range(ids.size):
            get = {k: v[row] for k, v in batch.items()}
            for c in range(1, int(get["src_chunk_ids"].max(initial=0)) + 1):
                spans = [np.flatnonzero(get[f"{side}_chunk_ids"] == c) for side in schema.SIDES]
                lo, hi = min(x[0] for x in spans), max(x[-1] for x in spans)
                for side in schema.SIDES:  # nothing else inside the chunk's slots
                    assert set(get[f"{side}_chunk_ids"][lo : hi + 1].tolist()) <= {0, c}
                starts = {}
                for side in schema.SIDES:
                    seg = get[f"{side}_segment_ids"]
                    order = []
                    for s_id in np.unique(seg[get[f"{side}_chunk_ids"] == c]).tolist():
                        run = np.flatnonzero(seg == s_id)
                        assert run[-1] - run[0] + 1 == run.size  # contiguous
                        np.testing.assert_array_equal(
                            get[f"{side}_positions"][run], np.arange(run.size)
                        )
                        order.append((run[0], int(get[f"{side}_sentence_index"][run[0]])))
                        starts.setdefault(s_id, []).append(int(run[0]))
                    assert order == sorted(order) and [k for _, k in order] == list(
                        range(len(order))
                    )  # in order: slots 0, 1, ... at increasing offsets
                for s_id, (o_s, o_t) in starts.items():
                    assert abs(o_s - o_t) <= drift, s_id


def test_batches_per_epoch_and_shuffle_are_deterministic():
    config = cfg(num_epochs=3, seed=4)
    a, b = plan_batches(DOCS, encode, config), plan_batches(DOCS, encode, config)
    for e in range(3):
        np.testing.assert_array_equal(a.epoch(e).ids, b.epoch(e).ids)
        assert len(a.epoch(e)) == a.batches_per_epoch
    assert a.epoch(0).ids.tolist() != a.epoch(1).ids.tolist()
    other = plan_batches(DOCS, encode, cfg(num_epochs=3, seed=5))
    assert other.epoch(0).ids.tolist() != a.epoch(0).ids.tolist()
    assert other.batches_per_epoch == a.batches_per_epoch
    unshuffled = plan_batches(DOCS, encode, cfg(shuffle=False))
    np.testing.assert_array_equal(unshuffled.epoch(0).ids, unshuffled.epoch(1).ids)


def assert_batches_equal(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert list(x) == list(y)
        for k in x:
            np.testing.assert_array_equal(x[k], y[k], err_msg=k)


@pytest.mark.parametrize("num_epochs", [None, 3])
def test_resume_across_epoch_boundary(num_epochs):
    plan = plan_batches(DOCS, encode, cfg(num_epochs=num_epochs, seed=5))
    nb = plan.batches_per_epoch
    full = list(itertools.islice(numpy_batches(plan), 3 * nb))
    for start in (nb - 2, nb, 2 * nb + 1):
        resumed = list(itertools.islice(numpy_batches(plan, start_step=start), 3 * nb - start))
        assert_batches_equal(resumed, full[start:])
    if num_epochs is not None:
        assert list(numpy_batches(plan, start_step=3 * nb)) == []
        assert plan.num_batches == 3 * nb


def test_process_rows_concatenate_to_the_global_batch():
    base = cfg(num_epochs=2, process_count=2, seed=2)
    global_plan = plan_batches(DOCS, encode, base)
    hosts = [
        list(numpy_batches(DOCS, encode, dataclasses.replace(base, process_index=i)))
        for i in range(2)
    ]
    assert len(hosts[0]) == len(hosts[1]) == 2 * global_plan.batches_per_epoch
    local_shapes = {b["src"].shape for h in hosts for b in h}
    assert local_shapes == set(global_plan.local_shapes)
    assert {(2 * B, L) for B, L in local_shapes} == set(global_plan.shapes)
    step = 0
    for e in range(2):
        for ids, t in all_batches(global_plan, e):
            merged = {
                k: np.concatenate([hosts[0][step][k], hosts[1][step][k]]) for k in hosts[0][step]
            }
            assert_batches_equal([merged], [global_plan.materialize(ids, 0, t)])
            step += 1


def test_oversize_item_is_a_one_line_error():
    with pytest.raises(PackingError, match="max_src_len/max_tgt_len/max_sentences") as err:
        plan_batches(DOCS, encode, cfg(PackingConfig("chunk", 4, max_shapes=2)))
    assert "\n" not in str(err.value) and "8" in str(err.value)
    with pytest.raises(ValueError, match="row_tokens"):
        PackingConfig("sentence", 0)
    with pytest.raises(ValueError, match="unit"):
        PackingConfig("document")
    with pytest.raises(ValueError, match="drift"):
        PackingConfig(drift=-1)
    with pytest.raises(ValueError, match="max_shapes"):
        PackingConfig(max_shapes=0)


@pytest.mark.parametrize("packing", [SENTENCES, CHUNKS])
def test_padding_fraction_matches_a_brute_force_count(packing):
    plan = plan_batches(DOCS, encode, cfg(packing))
    real = slots = 0
    for ids, t in all_batches(plan, 1):
        batch = plan.materialize(ids, 0, t)
        for side in schema.SIDES:
            real += int(batch[f"{side}_mask"].sum())
            slots += batch[f"{side}_mask"].size
    assert plan.stats.padding_fraction == pytest.approx(1 - real / slots)
    assert plan.stats.batches_per_epoch == plan.batches_per_epoch
    assert 0 < plan.stats.padding_fraction < 1
    result = measure_throughput(numpy_batches(plan), plan.batches_per_epoch, warmup=0)
    assert result["padding_fraction"] == pytest.approx(1 - real / slots)
    assert result["chunks_per_s"] * result["seconds"] == pytest.approx(plan.stats.chunks)
    assert result["sentences_per_s"] * result["seconds"] == pytest.approx(plan.stats.sentences)


def test_make_dataset_yields_the_numpy_batches():
    plan = plan_batches(DOCS, encode, cfg(num_epochs=1))
    got = list(make_dataset(plan, start_step=1).as_numpy_iterator())
    assert_batches_equal(got, list(numpy_batches(plan, start_step=1)))
    assert {b["src"].shape for b in got} <= set(plan.local_shapes)


def test_plan_batches_dispatches_on_packing():
    corpus = tokenize_corpus(DOCS, encode, BASE)
    assert isinstance(plan_batches(corpus), BatchPlan)
    plan = plan_batches(corpus, config=cfg())
    assert isinstance(plan, PackedPlan) and plan_batches(plan) is plan
    with pytest.raises(ValueError, match="different config"):
        plan_batches(plan, config=cfg(seed=9))


def test_empty_corpus_has_no_batches():
    plan = plan_batches([], encode, cfg(num_epochs=1))
    assert plan.batches_per_epoch == 0 and plan.shapes == frozenset()
    assert list(numpy_batches(plan)) == []
    with pytest.raises(ValueError, match="too small"):
        next(plan_batches([], encode, cfg()).epochs_from(0))
