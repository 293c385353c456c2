"""Packed rows: the schema's reference derivation (:func:`schema.pack_grid`) on hand-computed
examples, and the packed planner (:mod:`docnmt_jax.data.packed_plan`) against it."""

from __future__ import annotations

import numpy as np
import pytest

from docnmt_jax.data import schema

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
