"""Random contexts: every model's ``with_random_context``, the context-margin objective's
deranged batch and the analyses' random-context corpus, pinned by SHA-256 fingerprints of
their outputs on fixed inputs and keys."""

from __future__ import annotations

import hashlib

import jax
import numpy as np
import pytest
from test_pipeline import encode, make_docs

from docnmt_jax.data.pipeline import PipelineConfig, numpy_batches
from docnmt_jax.evaluation.context_marginal import random_context_corpus
from docnmt_jax.models import build_model
from docnmt_jax.objectives.context_margin import deranged_batch

SMALL = {"d_model": 8, "num_heads": 2, "ffn_dim": 16}


def window_batch(k: int, rows: int | None = None) -> dict[str, np.ndarray]:
    """The first grid batch of 3 sentence slots of ``make_docs(12)`` in chunks of 3 with a
    ``k``-sentence window (every feature, ``context_src`` when ``k > 0``), its first ``rows``
    rows (None: all)."""
    config = PipelineConfig(
        max_sentences=3,
        max_src_len=12,
        max_tgt_len=12,
        batch_src_tokens=400,
        batch_tgt_tokens=400,
        shuffle=False,
        num_epochs=1,
        pad_batch=True,
        context_sentences=k,
    )
    batches = numpy_batches(make_docs(12), encode, config)
    batch = next(b for b in batches if b["src"].shape[1] == 3)
    return {key: value[:rows] for key, value in batch.items()}


def digest(tree: dict) -> str:
    """First 16 hex digits of a SHA-256 over the keys and int64 values of ``tree``."""
    h = hashlib.sha256()
    for key in sorted(tree):
        h.update(key.encode())
        h.update(np.ascontiguousarray(np.asarray(tree[key]), np.int64).tobytes())
    return h.hexdigest()[:16]


#: model name, its config, window size, batch rows (None: all, more than the window and
#: chunk's slots; 2: fewer) -> fingerprint of ``with_random_context`` (key 5).
MODEL_PINS = [
    ("doct", {"context_sentences": 2}, 2, None, "820bd4f6c2a7fcd0"),
    ("doct", {"context_sentences": 2}, 2, 2, "9c50782a1aa0a3fe"),
    ("jean_cho", {"context_sentences": 1}, 1, None, "1b67da5c28500094"),
    ("jean_cho", {"context_sentences": 1, "sentence_rows": True}, 1, None, "1b67da5c28500094"),
    ("hmgdc", {}, 0, None, "c6067f02e88d3046"),
    ("hmgdc", {}, 0, 2, "f8030c46d0c14055"),
    ("final", {}, 0, None, "c6067f02e88d3046"),
    ("doc2doc", {}, 0, None, "c6067f02e88d3046"),
]


@pytest.mark.parametrize("name, extra, k, rows, expected", MODEL_PINS)
def test_with_random_context_is_pinned(name, extra, k, rows, expected):
    model = build_model({"name": name, **SMALL, **extra}, 300)
    batch = window_batch(k, rows)
    out = jax.device_get(model.with_random_context(batch, jax.random.PRNGKey(5)))
    assert digest(out) == expected


@pytest.mark.parametrize("k, expected", [(0, "2c344d14688025eb"), (2, "66c073f9812b2c41")])
def test_deranged_batch_is_pinned(k, expected):
    out, valid = jax.device_get(deranged_batch(window_batch(k), jax.random.PRNGKey(7)))
    assert digest({**out, "valid": valid}) == expected


@pytest.mark.parametrize(
    "chunks, k, expected",
    [(3, 0, "ae62307dd9b35f09"), (None, 0, "1c6f7df3780a36ec"), (3, 2, "bbde76d156ae68f5")],
)
def test_random_context_corpus_is_pinned(chunks, k, expected):
    documents = [doc for doc in make_docs(12) if len(doc)]
    corpus = random_context_corpus(documents, chunks, k, seed=4)
    flat = {
        "src": [hash_text(s) for d in corpus.documents for s in d.src],
        "where": [(-1, -1) if w is None else w for row in corpus.origin for w in row],
        "foreign": np.concatenate(corpus.foreign),
    }
    assert digest(flat) == expected


def hash_text(text: str) -> int:
    """A stable integer of ``text`` (the first 8 bytes of its SHA-256)."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1
