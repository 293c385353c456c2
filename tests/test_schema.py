"""The batch schema: every batch producer writes it, and the derived features match a naive loop."""

from __future__ import annotations

import numpy as np
import pytest

from docnmt_jax.data import schema
from docnmt_jax.data.documents import Document
from docnmt_jax.data.pipeline import PipelineConfig, make_dataset, numpy_batches, plan_batches
from docnmt_jax.evaluation.contrastive import ContrastiveItem, grid_batch

DOCS = [
    Document("a", ("w1 w2 w3", "w4", "w5 w6", "w7 w8 w9 w10"), ("w2 w1", "w3 w3 w3", "", "w9")),
    Document("b", ("w11",), ("w12 w13",)),
    Document("c", ("w1 w1", "w2"), ("w3", "w4 w4 w4 w4 w4 w4 w4")),
]
CONFIG = PipelineConfig(
    max_sentences=2,
    max_src_len=8,
    max_tgt_len=8,
    batch_src_tokens=32,
    batch_tgt_tokens=32,
    length_buckets=(4, 8),
    sentence_buckets=(1, 2),
    num_epochs=1,
    pad_batch=True,
    shuffle=False,
)


def encode(texts):
    return [[int(w[1:]) + 4 for w in t.split()] for t in texts]


def assert_follows_schema(batch) -> None:
    assert tuple(batch) == schema.BATCH_FEATURES
    for name, axes in schema.FEATURE_AXES.items():
        assert batch[name].dtype == schema.DTYPE, name
        assert batch[name].ndim == len(axes), name
    schema.check_batch(batch)


def producers():
    plan = plan_batches(DOCS, encode, CONFIG)
    items = [
        ContrastiveItem(0, 0, ([5, 6, 1], [7, 1]), ([8, 1], [9, 10, 11, 1]), 1),
        ContrastiveItem(0, 1, ([5, 1],), ([8, 9, 1],), 0),
    ]
    yield "numpy_batches", list(numpy_batches(plan))
    yield "make_dataset", list(make_dataset(plan).as_numpy_iterator())
    yield "dummy_batch", [schema.dummy_batch(), schema.dummy_batch(3, 5, rows=2, vocab_size=50)]
    yield "grid_batch", [grid_batch(items, 3, 2, 6)]


def test_every_producer_follows_the_schema():
    for name, batches in producers():
        assert batches, name
        for batch in batches:
            assert_follows_schema(batch)


def test_pipeline_iterators_agree_on_key_order_and_values():
    plan = plan_batches(DOCS, encode, CONFIG)
    for x, y in zip(numpy_batches(plan), make_dataset(plan).as_numpy_iterator(), strict=True):
        assert list(x) == list(y)
        for k in x:
            np.testing.assert_array_equal(x[k], y[k], err_msg=k)


def naive_features(src, tgt, src_lengths=None, tgt_lengths=None):
    """Masks, positions, segment ids and sentence_mask, one cell at a time."""
    B, S, T = src.shape
    out = {}
    for side, grid, lengths in (("src", src, src_lengths), ("tgt", tgt, tgt_lengths)):
        mask = np.zeros((B, S, T), np.int32)
        positions = np.zeros((B, S, T), np.int32)
        segments = np.zeros((B, S, T), np.int32)
        for b in range(B):
            for s in range(S):
                for t in range(T):
                    real = grid[b, s, t] != 0 if lengths is None else t < lengths[b][s]
                    if real:
                        mask[b, s, t] = 1
                        positions[b, s, t] = t
                        segments[b, s, t] = s + 1
        out.update({side: grid, f"{side}_mask": mask})
        out.update({f"{side}_positions": positions, f"{side}_segment_ids": segments})
    sentence_mask = np.zeros((B, S), np.int32)
    for b in range(B):
        for s in range(S):
            sentence_mask[b, s] = int(any(out["src_mask"][b, s]))
    out["sentence_mask"] = sentence_mask
    return out


SRC = np.array(
    [[[5, 6, 1, 0], [7, 1, 0, 0], [0, 0, 0, 0]], [[8, 9, 10, 1], [0, 0, 0, 0], [0, 0, 0, 0]]],
    np.int32,
)
TGT = np.array(
    [[[4, 1, 0, 0], [9, 9, 9, 1], [0, 0, 0, 0]], [[1, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]],
    np.int32,
)


@pytest.mark.parametrize("with_lengths", [False, True])
def test_derived_features_match_a_naive_loop(with_lengths):
    lengths = {}
    if with_lengths:
        lengths = dict(src_lengths=np.array([[3, 2, 0], [4, 0, 0]]))
        lengths["tgt_lengths"] = np.array([[2, 4, 0], [1, 0, 0]])
    batch = schema.batch_from_grids(SRC, TGT, **lengths)
    assert_follows_schema(batch)
    expected = naive_features(SRC, TGT, **lengths)
    for k, v in expected.items():
        np.testing.assert_array_equal(batch[k], v, err_msg=k)
    np.testing.assert_array_equal(batch["doc_index"], [0, 1])
    np.testing.assert_array_equal(batch["chunk_index"], [0, 0])
    np.testing.assert_array_equal(batch["sentence_offset"], [0, 0])


def test_lengths_decide_the_mask_and_row_features_pass_through():
    src = np.array([[[5, 0, 6, 1]]], np.int32)  # a PAD id inside the sentence: still real
    batch = schema.batch_from_grids(
        src,
        src,
        src_lengths=np.array([[4]]),
        tgt_lengths=np.array([[2]]),
        doc_index=np.array([-1]),
        chunk_index=np.array([3]),
        sentence_offset=np.array([7]),
    )
    assert batch["src_mask"].tolist() == [[[1, 1, 1, 1]]]
    assert batch["tgt_mask"].tolist() == [[[1, 1, 0, 0]]]
    assert batch["tgt_positions"].tolist() == [[[0, 1, 0, 0]]]
    assert [int(batch[k][0]) for k in schema.ROW_FEATURES] == [-1, 3, 7]


def test_check_batch_rejects_what_breaks_the_schema():
    good = schema.dummy_batch(2, 3, rows=2)
    schema.check_batch(good)
    for broken in (
        {k: v for k, v in good.items() if k != "sentence_offset"},
        {**good, "src": good["src"].astype(np.int64)},
        {**good, "sentence_mask": good["src_mask"]},
        {**good, "doc_index": np.zeros(3, np.int32)},
    ):
        with pytest.raises(ValueError):
            schema.check_batch(broken)
