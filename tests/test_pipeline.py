"""Tests of the tf.data document pipeline against naive references written here."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import random

import numpy as np
import pytest

from docnmt_jax.data.documents import Document
from docnmt_jax.data.pipeline import (
    PipelineConfig,
    make_dataset,
    measure_throughput,
    numpy_batches,
    plan_batches,
    tokenize_corpus,
)
from docnmt_jax.data.schema import BATCH_FEATURES
from docnmt_jax.data.tokenizer import EOS_ID

# Small geometry so that every bucket, the promotion chain and padding all occur.
BASE = PipelineConfig(
    max_sentences=5,
    max_src_len=24,
    max_tgt_len=20,
    batch_src_tokens=96,
    batch_tgt_tokens=80,
    length_buckets=(4, 8, 16),
    sentence_buckets=(1, 2, 3, 5),
)


def encode(texts):
    """Word-level test encoder: word ``w<n>`` -> id ``n + 4`` (no EOS)."""
    return [[int(w[1:]) + 4 for w in t.split()] for t in texts]


def naive_ids(text: str, max_len: int) -> list[int]:
    ids = [int(w[1:]) + 4 for w in text.split()]
    return ids[: max_len - 1] + [EOS_ID]


def make_docs(n_docs: int = 40, seed: int = 0, max_words: int = 18) -> list[Document]:
    rng = random.Random(seed)

    def sentence() -> str:
        return " ".join(f"w{rng.randrange(50)}" for _ in range(rng.randint(0, max_words)))

    docs = []
    for d in range(n_docs):
        n = rng.choice([0, 1, 2, 4, 5, 6, 9, 10, 11, 17, 23])
        docs.append(
            Document(
                f"d{d}", tuple(sentence() for _ in range(n)), tuple(sentence() for _ in range(n))
            )
        )
    return docs


DOCS = make_docs()


def naive_chunks(docs, s_max: int) -> dict[tuple[int, int], list[int]]:
    """(doc, chunk) -> sentence indices: consecutive runs of <= s_max from sentence 0."""
    out = {}
    for d, doc in enumerate(docs):
        for c, start in enumerate(range(0, len(doc), s_max)):
            out[(d, c)] = list(range(start, min(start + s_max, len(doc))))
    return out


def naive_batch(docs, batch, config: PipelineConfig) -> dict[str, np.ndarray]:
    """Recomputes every feature of ``batch`` with loops from its doc/chunk indices."""
    B, S, T = batch["src"].shape
    s_max = 1 if config.sentence_level else config.max_sentences
    exp = {k: np.zeros_like(v) for k, v in batch.items()}
    for k in ("doc_index", "chunk_index", "sentence_offset"):
        exp[k][:] = -1
    for b in range(B):
        d, c = int(batch["doc_index"][b]), int(batch["chunk_index"][b])
        if d < 0:
            continue
        exp["doc_index"][b], exp["chunk_index"][b] = d, c
        exp["sentence_offset"][b] = c * s_max
        for j, k in enumerate(range(c * s_max, min((c + 1) * s_max, len(docs[d])))):
            exp["sentence_mask"][b, j] = 1
            for side, text, max_len in (
                ("src", docs[d].src[k], config.max_src_len),
                ("tgt", docs[d].tgt[k], config.max_tgt_len),
            ):
                for t, tok in enumerate(naive_ids(text, max_len)):
                    exp[side][b, j, t] = tok
                    exp[f"{side}_mask"][b, j, t] = 1
                    exp[f"{side}_positions"][b, j, t] = t
                    exp[f"{side}_segment_ids"][b, j, t] = j + 1
    return exp


def tf_batches(data, config, start_step=0, limit=None):
    ds = make_dataset(data, encode, config, start_step=start_step)
    if limit is not None:
        ds = ds.take(limit)
    return list(ds.as_numpy_iterator())


def assert_batches_equal(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert set(x) == set(y) == set(BATCH_FEATURES)
        for k in x:
            assert x[k].dtype == y[k].dtype == np.int32, k
            np.testing.assert_array_equal(x[k], y[k], err_msg=k)


def cfg(**kw) -> PipelineConfig:
    return dataclasses.replace(BASE, **kw)


@pytest.mark.parametrize("sentence_level", [False, True])
def test_eval_epoch_covers_every_chunk_once_with_exact_features(sentence_level):
    config = cfg(num_epochs=1, pad_batch=True, sentence_level=sentence_level, seed=3)
    batches = tf_batches(DOCS, config)
    expected = naive_chunks(DOCS, 1 if sentence_level else config.max_sentences)
    seen = []
    for batch in batches:
        assert batch["src"].shape == batch["tgt"].shape
        if sentence_level:
            assert batch["src"].shape[1] == 1
        assert_batches_equal([batch], [naive_batch(DOCS, batch, config)])
        for b in np.flatnonzero(batch["doc_index"] >= 0):
            d, c = int(batch["doc_index"][b]), int(batch["chunk_index"][b])
            seen.append((d, c))
            # Reconstruct the chunk's text from the batch and compare to the corpus.
            for j, k in enumerate(expected[(d, c)]):
                assert batch["sentence_offset"][b] == expected[(d, c)][0]
                src = batch["src"][b, j][batch["src_mask"][b, j] == 1].tolist()
                assert src == naive_ids(DOCS[d].src[k], config.max_src_len)
                assert src[-1] == EOS_ID
    assert sorted(seen) == sorted(expected)  # every chunk (so every sentence) exactly once
    plan = plan_batches(DOCS, encode, config)
    assert len(batches) == plan.batches_per_epoch == plan.num_batches
    assert plan.stats.dropped_chunks_per_epoch == 0
    assert plan.stats.sentences == sum(len(d) for d in DOCS)
    assert plan.stats.chunks == len(expected)


@pytest.mark.parametrize("sentence_level", [False, True])
def test_grid_padding_fraction_counts_epoch_zero_slots(sentence_level):
    config = cfg(num_epochs=1, sentence_level=sentence_level, seed=2)
    batches = list(numpy_batches(DOCS, encode, config))
    real = sum(int(b["src_mask"].sum() + b["tgt_mask"].sum()) for b in batches)
    slots = sum(b["src_mask"].size + b["tgt_mask"].size for b in batches)
    plan = plan_batches(DOCS, encode, config)
    assert plan.stats.padding_fraction == pytest.approx(1 - real / slots)
    assert 0 < plan.stats.padding_fraction < 1


def test_numpy_iterator_equals_tf_dataset():
    config = cfg(num_epochs=2)
    assert_batches_equal(tf_batches(DOCS, config), list(numpy_batches(DOCS, encode, config)))


def test_shapes_bounded_and_declared_and_chunks_fit():
    config = cfg(num_epochs=4, seed=1)
    plan = plan_batches(DOCS, encode, config)
    batches = tf_batches(plan, None)
    assert len(batches) == 4 * plan.batches_per_epoch
    shapes = {b["src"].shape for b in batches}
    assert shapes == set(plan.shapes) == set(plan.local_shapes)
    s_buckets, t_buckets = config.s_buckets, config.t_buckets
    assert s_buckets == (1, 2, 3, 5) and t_buckets == (4, 8, 16, 24)
    assert len(shapes) <= len(s_buckets) * len(t_buckets)
    budget = min(config.batch_src_tokens, config.batch_tgt_tokens)
    b_of = {}
    for B, S, T in shapes:
        assert S in s_buckets and T in t_buckets
        assert B * S * T <= budget or B == 1
        assert b_of.setdefault((S, T), B) == B
    expected = naive_chunks(DOCS, config.max_sentences)
    n_chunks = len(expected)
    for e in range(4):
        epoch = batches[e * plan.batches_per_epoch : (e + 1) * plan.batches_per_epoch]
        seen = []
        for batch in epoch:
            assert (batch["doc_index"] >= 0).all()  # training batches are full
            assert_batches_equal([batch], [naive_batch(DOCS, batch, config)])
            rows = zip(batch["doc_index"].tolist(), batch["chunk_index"].tolist(), strict=True)
            seen += list(rows)
        assert len(seen) == len(set(seen)) == n_chunks - plan.stats.dropped_chunks_per_epoch
    assert plan.stats.promoted_chunks_per_epoch > 0  # the remainder policy was exercised


def test_deterministic_shuffling():
    config = cfg(num_epochs=2)
    a = tf_batches(DOCS, config)
    assert_batches_equal(a, tf_batches(DOCS, config))
    other = tf_batches(DOCS, cfg(num_epochs=2, seed=7))
    order = [(b["doc_index"].tolist(), b["chunk_index"].tolist()) for b in a]
    assert order != [(b["doc_index"].tolist(), b["chunk_index"].tolist()) for b in other]
    nb = plan_batches(DOCS, encode, config).batches_per_epoch
    assert order[:nb] != order[nb:]  # epochs are shuffled differently
    unshuffled = plan_batches(DOCS, encode, cfg(shuffle=False))
    np.testing.assert_array_equal(unshuffled.epoch(0).ids, unshuffled.epoch(1).ids)


@pytest.mark.parametrize("num_epochs", [None, 3])
def test_resume_across_epoch_boundary(num_epochs):
    config = cfg(num_epochs=num_epochs, seed=5)
    plan = plan_batches(DOCS, encode, config)
    nb = plan.batches_per_epoch
    full = tf_batches(plan, None, limit=3 * nb)
    for start in (nb - 2, nb, 2 * nb + 1):
        resumed = tf_batches(plan, None, start_step=start, limit=3 * nb - start)
        assert_batches_equal(resumed, full[start:])
    if num_epochs is not None:
        assert tf_batches(plan, None, start_step=3 * nb) == []
        assert_batches_equal(list(numpy_batches(plan, start_step=nb + 1)), full[nb + 1 :])


@pytest.mark.parametrize("pad_batch", [False, True])
def test_process_sharding_rows_concatenate_to_global_batch(pad_batch):
    base = cfg(num_epochs=2, process_count=2, pad_batch=pad_batch, seed=2)
    global_plan = plan_batches(DOCS, encode, base)
    hosts = [
        tf_batches(
            DOCS, cfg(num_epochs=2, process_count=2, process_index=i, pad_batch=pad_batch, seed=2)
        )
        for i in range(2)
    ]
    assert len(hosts[0]) == len(hosts[1]) == 2 * global_plan.batches_per_epoch
    step = 0
    for e in range(2):
        epoch = global_plan.epoch(e)
        for g in range(len(epoch)):
            h0, h1 = hosts[0][step], hosts[1][step]
            assert h0["src"].shape == h1["src"].shape
            merged = {k: np.concatenate([h0[k], h1[k]]) for k in h0}
            ids = epoch.batch(g)
            assert merged["src"].shape == (ids.size, epoch.s[g], epoch.t[g])
            assert (ids.size, epoch.s[g], epoch.t[g]) in global_plan.shapes
            assert_batches_equal([merged], [naive_batch(DOCS, merged, base)])
            assert_batches_equal([merged], [global_plan.materialize(ids, epoch.s[g], epoch.t[g])])
            step += 1
    for B, _, _ in global_plan.shapes:
        assert B % 2 == 0


def test_truncation_counted_and_logged(caplog):
    docs = [
        Document("a", ("w1 " * 30, "w2 w3", "w4 " * 7), ("w5", "w6 " * 10, "w7")),
        Document("b", ("w8 " * 8,), ("w9",)),
    ]
    config = cfg(max_src_len=8, max_tgt_len=6, num_epochs=1, pad_batch=True)
    with caplog.at_level(logging.WARNING):
        corpus = tokenize_corpus(docs, encode, config)
    stats = corpus.stats
    assert (stats.src_truncated, stats.tgt_truncated) == (2, 1)
    assert (stats.src_longest, stats.tgt_longest) == (31, 11)
    assert "truncated 2 of 4 source sentences longer than 8 tokens (longest: 31" in caplog.text
    assert "truncated 1 of 4 target sentences longer than 6 tokens (longest: 11" in caplog.text
    src, tgt = corpus.document(0)
    assert src[0].tolist() == [5] * 7 + [EOS_ID]
    assert src[2].tolist() == [8] * 7 + [EOS_ID]  # exactly max_len: kept whole
    assert tgt[1].tolist() == [10] * 5 + [EOS_ID]
    rows = []
    for batch in tf_batches(corpus, config):
        assert batch["src"].shape[2] <= 8
        assert_batches_equal([batch], [naive_batch(docs, batch, config)])
        rows += batch["doc_index"][batch["doc_index"] >= 0].tolist()
    assert sorted(rows) == [0, 1]


def test_validation_and_small_corpus():
    with pytest.raises(ValueError):
        PipelineConfig(process_index=2, process_count=2)
    corpus = tokenize_corpus(DOCS, encode, BASE)
    with pytest.raises(ValueError, match="max lengths"):
        plan_batches(corpus, config=cfg(max_src_len=32))
    tiny = [Document("x", ("w1",), ("w2",))]
    with pytest.raises(ValueError, match="too small"):
        # Training: the largest bucket holds 8 rows, so the one chunk never fills a batch.
        make_dataset(tiny, encode, cfg(batch_src_tokens=1000, batch_tgt_tokens=1000))
    assert len(tf_batches(tiny, cfg(num_epochs=1, pad_batch=True))) == 1
    assert plan_batches([], encode, cfg(num_epochs=1)).batches_per_epoch == 0


def test_measure_throughput():
    config = cfg(num_epochs=1, pad_batch=True)
    plan = plan_batches(DOCS, encode, config)
    result = measure_throughput(make_dataset(plan), num_batches=10_000, warmup=0)
    assert result["batches"] == plan.batches_per_epoch
    chunks = len(naive_chunks(DOCS, config.max_sentences))
    assert result["chunks_per_s"] * result["seconds"] == pytest.approx(chunks)
    assert 0.0 < result["padding_fraction"] < 1.0
    assert result["distinct_shapes"] == len(plan.shapes)
    assert result["src_tokens_per_s"] > 0 and result["padded_tokens_per_s"] > 0


def test_chunk_table_matches_naive():
    plan = plan_batches(DOCS, encode, cfg())
    c = plan.chunk_table
    expected = naive_chunks(DOCS, 5)
    got = {}
    for d, k, off, n in zip(c["doc"], c["index"], c["offset"], c["count"], strict=True):
        got[(int(d), int(k))] = list(range(int(off), int(off + n)))
    assert got == expected
    assert list(itertools.chain(*[got[key] for key in sorted(got) if key[0] == 5])) == list(
        range(len(DOCS[5]))
    )


def test_sequential_sentences_budget_counts_one_sentence_per_chunk():
    parallel = PipelineConfig(batch_src_tokens=4096, batch_tgt_tokens=4096)
    sequential = PipelineConfig(
        batch_src_tokens=4096, batch_tgt_tokens=4096, sequential_sentences=True
    )
    for s, t in ((1, 32), (4, 16), (20, 64), (20, 128)):
        assert parallel.batch_size(s, t) == max(1, 4096 // (s * t))
        assert sequential.batch_size(s, t) == 4096 // t
