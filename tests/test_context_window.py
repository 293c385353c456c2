"""The source context window of grid batches (``PipelineConfig.context_sentences`` = K, for
DocT-style models): ``context_src``/``context_src_mask`` [B, K, T] hold the K source sentences
before each chunk, checked against a plain loop over the documents."""

from __future__ import annotations

import random

import numpy as np
import pytest
from test_pipeline import DOCS, cfg, encode, naive_ids, tf_batches

from docnmt_jax.data import schema
from docnmt_jax.data.documents import Document
from docnmt_jax.data.pipeline import (
    PackingConfig,
    PipelineConfig,
    numpy_batches,
    plan_batches,
    tokenize_corpus,
)
from docnmt_jax.data.tokenized import make_chunks
from docnmt_jax.data.tokenizer import EOS_ID

Context = tuple[tuple[int, ...], ...]


def naive_context(docs, d: int, k: int, K: int, max_len: int) -> Context:
    """The K source sentences before sentence ``k`` of document ``d`` in document order, as
    token lists (EOS included); ``()`` for slots before the document's first sentence."""
    return tuple(
        tuple(naive_ids(docs[d].src[k - j], max_len)) if k - j >= 0 else () for j in range(K, 0, -1)
    )


def batch_contexts(batch, K: int) -> dict[tuple[int, int], Context]:
    """(doc, sentence index in doc) -> its K-sentence context read from ``batch``: the K rows
    before the sentence's row in ``concat(context_src, src)`` along the sentence axis. Also
    checks the schema, that padding is 0 and that padding rows have an all-zero context."""
    schema.check_batch(batch)
    assert batch["context_src"].shape[1] == K
    tokens = np.concatenate([batch["context_src"], batch["src"]], axis=1)
    mask = np.concatenate([batch["context_src_mask"], batch["src_mask"]], axis=1)
    assert not np.any(tokens * (1 - mask))  # PAD (0) wherever the mask is 0
    out = {}
    for b in range(tokens.shape[0]):
        d, offset = int(batch["doc_index"][b]), int(batch["sentence_offset"][b])
        if d < 0:
            assert not batch["context_src"][b].any() and not batch["context_src_mask"][b].any()
            continue
        for s in np.flatnonzero(batch["sentence_mask"][b]).tolist():
            rows = range(s, s + K)  # the K rows before row K + s
            out[(d, offset + s)] = tuple(
                tuple(tokens[b, r][mask[b, r] == 1].tolist()) for r in rows
            )
    return out


def eval_contexts(docs, config: PipelineConfig) -> dict[tuple[int, int], Context]:
    """Every sentence's context over one padded eval epoch (each sentence seen once)."""
    out: dict[tuple[int, int], Context] = {}
    for batch in numpy_batches(docs, encode, config):
        got = batch_contexts(batch, config.context_sentences)
        assert not set(got) & set(out)
        out.update(got)
    assert len(out) == sum(len(d) for d in docs)
    return out


@pytest.mark.parametrize(
    "K, sentence_level, max_sentences", [(1, False, 5), (3, False, 5), (2, True, 5), (7, False, 3)]
)
def test_context_matches_naive_reference(K, sentence_level, max_sentences):
    config = cfg(
        context_sentences=K,
        sentence_level=sentence_level,
        max_sentences=max_sentences,
        num_epochs=1,
        pad_batch=True,
        seed=4,
    )
    got = eval_contexts(DOCS, config)
    for (d, k), context in got.items():
        assert context == naive_context(DOCS, d, k, K, config.max_src_len), (d, k)
        assert all(not slot or slot[-1] == EOS_ID for slot in context)


def test_first_chunk_has_empty_context_and_context_stays_in_its_document():
    # Document d only uses the words w(10d)..w(10d+9), so a token's document is visible.
    rng = random.Random(1)
    docs = []
    for d in range(12):
        n = rng.randint(1, 9)
        text = tuple(
            " ".join(f"w{10 * d + rng.randrange(10)}" for _ in range(rng.randint(0, 6)))
            for _ in range(n)
        )
        docs.append(Document(f"d{d}", text, text))
    config = cfg(context_sentences=4, max_sentences=2, num_epochs=1, pad_batch=True)
    firsts = 0
    for batch in numpy_batches(docs, encode, config):
        for b in np.flatnonzero(batch["doc_index"] >= 0):
            context, offset = batch["context_src"][b], int(batch["sentence_offset"][b])
            if batch["chunk_index"][b] == 0:
                firsts += 1
                assert not context.any() and not batch["context_src_mask"][b].any()
            assert not context[: max(0, 4 - offset)].any()  # nothing before sentence 0
            words = context[(context != 0) & (context != EOS_ID)] - 4
            assert np.all(words // 10 == batch["doc_index"][b])
    assert firsts == len(docs)


def test_chunk_size_does_not_change_a_sentences_context():
    contexts = [
        eval_contexts(DOCS, cfg(context_sentences=4, max_sentences=s, num_epochs=1, pad_batch=True))
        for s in (3, 20)
    ]
    level = cfg(context_sentences=4, sentence_level=True, num_epochs=1, pad_batch=True)
    contexts.append(eval_contexts(DOCS, level))
    assert contexts[0] == contexts[1] == contexts[2]


@pytest.mark.parametrize("pad_batch", [False, True])
def test_numpy_and_tf_batches_are_identical(pad_batch):
    config = cfg(context_sentences=3, num_epochs=2, pad_batch=pad_batch, seed=6)
    plan = plan_batches(DOCS, encode, config)
    ours, theirs = list(numpy_batches(plan)), tf_batches(plan, None)
    assert len(ours) == len(theirs) == 2 * plan.batches_per_epoch
    names = list(schema.BATCH_FEATURES + schema.CONTEXT_FEATURES)
    for x, y in zip(ours, theirs, strict=True):
        assert list(x) == list(y) == names
        B, _, T = x["src"].shape
        assert x["context_src"].shape == (B, 3, T)
        for k in names:
            assert x[k].dtype == y[k].dtype == np.int32, k
            assert x[k].shape == y[k].shape, k
            np.testing.assert_array_equal(x[k], y[k], err_msg=k)


def naive_longest(docs, config: PipelineConfig) -> list[int]:
    """Per chunk (table order): the longest of its sentences (either side) and context sources."""
    S, K = config.sentences_per_chunk, config.context_sentences
    out = []
    for doc in docs:
        src = [len(naive_ids(t, config.max_src_len)) for t in doc.src]
        tgt = [len(naive_ids(t, config.max_tgt_len)) for t in doc.tgt]
        for first in range(0, len(doc), S):
            own = range(first, min(first + S, len(doc)))
            out.append(max([max(src[k], tgt[k]) for k in own] + src[max(0, first - K) : first]))
    return out


@pytest.mark.parametrize("K", [0, 2, 6])
def test_chunk_longest_covers_context_sentences(K):
    config = cfg(context_sentences=K)
    table = make_chunks(tokenize_corpus(DOCS, encode, config), config)
    assert table["longest"].tolist() == naive_longest(DOCS, config)
    if K == 0:  # exactly the table without the option
        default = make_chunks(tokenize_corpus(DOCS, encode, cfg()), cfg())
        for name, column in default.items():
            np.testing.assert_array_equal(table[name], column, err_msg=name)


@pytest.mark.parametrize("K", [1, 2])
def test_t_covers_a_long_context_sentence(K):
    # Chunk 1 (sentences 2, 3) is 2 tokens long; its context holds a 15-token sentence.
    long_at = 2 - K
    src = ["w1 " * 14 if k == long_at else f"w{k + 2}" for k in range(4)]
    docs = [Document("a", tuple(src), ("w5", "w6", "w7", "w8"))]
    config = cfg(context_sentences=K, max_sentences=2, num_epochs=1, pad_batch=True)
    plan = plan_batches(docs, encode, config)
    assert plan.stats.src_truncated == 0
    assert plan.chunk_table["longest"].tolist() == [15, 15]
    assert plan_batches(docs, encode, cfg(max_sentences=2)).chunk_table["longest"].tolist() == [
        15,
        2,
    ]
    batches = list(numpy_batches(plan))
    rows = [(batch, b) for batch in batches for b in np.flatnonzero(batch["chunk_index"] == 1)]
    assert len(rows) == 1
    batch, b = rows[0]
    assert batch["src"].shape[2] == 16  # the T bucket of 15 tokens, not of 2
    slot = K - (2 - long_at)  # the long sentence is 2 - long_at sentences before the chunk
    assert batch["context_src"][b, slot][batch["context_src_mask"][b, slot] == 1].tolist() == (
        naive_ids(src[long_at], config.max_src_len)
    )
    assert eval_contexts(docs, config)[(0, 2)] == naive_context(docs, 0, 2, K, 24)


def test_k_zero_batches_are_unchanged_and_invalid_options_raise():
    config = cfg(num_epochs=1, pad_batch=True)
    for batch in list(numpy_batches(DOCS, encode, config)) + tf_batches(DOCS, config):
        assert tuple(batch) == schema.BATCH_FEATURES
    with pytest.raises(ValueError, match="context_sentences must be >= 0"):
        PipelineConfig(context_sentences=-1)
    with pytest.raises(ValueError, match="context_sentences needs .* packing=None"):
        PipelineConfig(context_sentences=2, packing=PackingConfig(unit="chunk"))
    assert PipelineConfig(context_sentences=0, packing=PackingConfig()).packing is not None
    # Packed sentences carry their windows in context rows (window_plan.py).
    assert PipelineConfig(context_sentences=2, packing=PackingConfig()).packing is not None


def test_check_batch_takes_both_context_features_or_neither():
    batch = next(numpy_batches(DOCS, encode, cfg(context_sentences=2, num_epochs=1)))
    schema.check_batch(batch)
    schema.check_batch({k: batch[k] for k in schema.BATCH_FEATURES})
    ctx, ctx_mask = batch["context_src"], batch["context_src_mask"]
    for broken in (
        {k: v for k, v in batch.items() if k != "context_src_mask"},
        {**batch, "context_src": ctx.astype(np.int64)},
        {**batch, "context_src": ctx[:, 0]},
        {**batch, "context_src_mask": ctx_mask[:, :1]},  # two different K
        {**batch, "context_src": ctx[:-1], "context_src_mask": ctx_mask[:-1]},  # B
        {**batch, "context_src": ctx[..., :-1], "context_src_mask": ctx_mask[..., :-1]},  # T
        {**batch, "context_tgt": ctx},
    ):
        with pytest.raises(ValueError):
            schema.check_batch(broken)
