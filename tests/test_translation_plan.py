"""Translation batches grouped by length (``data/translation_plan.py``): every chunk of the
grid plan exactly once, with the same tokens, in at most ``max_shapes`` shapes; and the
translator's outputs through them identical to those through the grid plan."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_translation_golden import (  # noqa: E402
    SEARCHES,
    _model_and_params,
    _tokenizer,
)

from docnmt_jax.data import pipeline as pipeline_lib  # noqa: E402
from docnmt_jax.data.batch_plan import BatchPlan  # noqa: E402
from docnmt_jax.data.documents import Document  # noqa: E402
from docnmt_jax.data.readers import read_tsv  # noqa: E402
from docnmt_jax.data.spec import PipelineConfig  # noqa: E402
from docnmt_jax.data.tokenized import tokenize_corpus  # noqa: E402
from docnmt_jax.data.translation_plan import (  # noqa: E402
    TranslationPlan,
    length_buckets,
    row_counts,
)
from docnmt_jax.decoding.translator import Translator  # noqa: E402

INPUT = os.path.join(os.path.dirname(__file__), "data", "golden", "input.tsv")


def _documents(seed: int, count: int, longest: int) -> list[Document]:
    """Documents of 1-30 sentences of 1-``longest`` words ``w<i>``."""
    rng = np.random.default_rng(seed)
    docs = []
    for d in range(count):
        sentences = tuple(
            " ".join(f"w{i}" for i in rng.integers(0, 50, rng.integers(1, longest + 1)))
            for _ in range(rng.integers(1, 31))
        )
        docs.append(Document(f"d{d}", sentences, sentences))
    return docs


def _encode(texts: list[str]) -> list[list[int]]:
    return [[4 + int(w[1:]) for w in t.split()] for t in texts]


def _chunks(batches) -> dict[tuple[int, int], list[tuple[int, ...]]]:
    """``(doc, sentence offset) -> source sentences (token tuples)`` of every real row."""
    out = {}
    for batch in batches:
        for row in np.flatnonzero(batch["doc_index"] >= 0):
            key = (int(batch["doc_index"][row]), int(batch["sentence_offset"][row]))
            assert key not in out, f"chunk {key} planned twice"
            src, mask = batch["src"][row], batch["src_mask"][row]
            sentences = np.flatnonzero(batch["sentence_mask"][row])
            out[key] = [tuple(src[k][mask[k] > 0].tolist()) for k in sentences]
    return out


@pytest.mark.parametrize("sequential", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_chunk_once_with_its_tokens_in_few_shapes(seed, sequential):
    config = PipelineConfig(
        max_sentences=8,
        max_src_len=64,
        max_tgt_len=64,
        batch_src_tokens=512,
        batch_tgt_tokens=512,
        shuffle=False,
        num_epochs=1,
        pad_batch=True,
        sentence_level=not sequential,
        sequential_sentences=sequential,
    )
    corpus = tokenize_corpus(_documents(seed, 25, 60), _encode, config)
    grid = list(pipeline_lib.numpy_batches(BatchPlan(corpus, config)))
    plan = TranslationPlan(corpus, config, max_shapes=3)
    batches = list(pipeline_lib.numpy_batches(plan))
    assert _chunks(batches) == _chunks(grid)  # the same chunks, the same tokens, once each
    shapes = {b["src"].shape for b in batches}
    assert len(shapes) <= 3 and len({(b, s, t) for b, s, t in shapes}) == len(plan.shapes)
    if not sequential:
        assert all(s == 1 for _, s, _ in shapes)
    for batch in batches:  # each batch's chunks sorted by their longest sentence
        real = batch["doc_index"] >= 0
        longest = batch["src_mask"].sum(-1).max(-1)[real]
        assert np.all(np.diff(longest) >= 0)


def test_without_a_shape_limit_each_chunk_gets_its_own_bucket():
    """With room for every bucket, no chunk is padded past its own bucket (brute force)."""
    config = PipelineConfig(
        max_src_len=64, max_tgt_len=64, shuffle=False, num_epochs=1, pad_batch=True,
        sentence_level=True,
    )  # fmt: skip
    corpus = tokenize_corpus(_documents(3, 30, 60), _encode, config)
    batches = list(pipeline_lib.numpy_batches(TranslationPlan(corpus, config, max_shapes=99)))
    buckets = length_buckets(64)
    for batch in batches:
        t = batch["src"].shape[-1]
        lengths = batch["src_mask"].sum(-1)[batch["doc_index"] >= 0, 0]
        assert np.all(buckets[np.searchsorted(buckets, lengths)] == t)


def test_a_few_sentences_do_not_cost_a_whole_batch():
    config = PipelineConfig(shuffle=False, num_epochs=1, pad_batch=True, sentence_level=True)
    sentences = ("w1 w2", "w3", "w4 w5 w6")
    docs = [Document("a", sentences, sentences)]
    batches = list(
        pipeline_lib.numpy_batches(TranslationPlan(tokenize_corpus(docs, _encode, config), config))
    )
    assert [b["src"].shape for b in batches] == [(4, 1, 8)]


class _GridTranslator(Translator):
    """The translator on the model's grid plan (bucketed, batches padded to the budget)."""

    def batches(self, sources):
        yield from pipeline_lib.numpy_batches(pipeline_lib.plan_batches(self._tokenize(sources)))


@pytest.mark.parametrize("search", sorted(SEARCHES))
@pytest.mark.parametrize("key", ["transformer", "final", "doct", "hmgdc", "doc2doc"])
def test_translations_equal_the_grid_plans(key, search):
    """Token-for-token the same outputs as through the grid plan, on documents whose
    sentences differ in length (several shapes, batches regrouped)."""
    model, params = _model_and_params(key)
    documents = [Document(d.doc_id, d.src[:12], d.tgt[:12]) for d in read_tsv(INPUT)]
    options = dict(max_sentences=4, batch_tokens=96)
    new = Translator(model, params, _tokenizer(), SEARCHES[search], **options)
    old = _GridTranslator(model, params, _tokenizer(), SEARCHES[search], **options)
    assert new.translate(documents) == old.translate(documents)
    assert new.stats.compilations <= 4


def test_row_counts_known_answers():
    assert row_counts(64, 1) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    assert row_counts(20, 4) == [4, 8, 12, 16, 20]
