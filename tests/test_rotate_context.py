"""Random contexts: :func:`rotate_context` against a naive loop, :func:`shifted_rows`'
rotations, and every model's ``with_random_context``, the context-margin objective's deranged
batch and the analyses' random-context corpus pinned by SHA-256 fingerprints of their outputs
on fixed inputs and keys (recorded before the four implementations became one)."""

from __future__ import annotations

import hashlib

import jax
import numpy as np
import pytest
from test_pipeline import encode, make_docs

from docnmt_jax.data.pipeline import PipelineConfig, numpy_batches
from docnmt_jax.evaluation.context_marginal import random_context_corpus
from docnmt_jax.models import build_model
from docnmt_jax.models.context_rotation import random_context_batch, rotate_context, shifted_rows
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
    out, valid = jax.device_get(jax.jit(deranged_batch)(window_batch(k), jax.random.PRNGKey(7)))
    assert digest({**out, "valid": valid}) == expected


#: chunks (None: whole documents), window -> fingerprint; before the refactor also (3, 0):
#: "ae62307dd9b35f09" (left out: each draw costs seconds).
@pytest.mark.parametrize(
    "chunks, k, expected", [(None, 0, "1c6f7df3780a36ec"), (3, 2, "bbde76d156ae68f5")]
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


def naive_rotate(batch: dict[str, np.ndarray], origin: np.ndarray) -> dict[str, np.ndarray]:
    """Cell by cell: chunk slot ``s`` of row ``b`` takes every per-sentence feature of slot
    ``s`` of row ``origin[b, K + s]``; window slot ``j`` takes ``context_*`` of slot ``j`` of
    row ``origin[b, j]``."""
    B, S = batch["src"].shape[:2]
    K = batch["context_src"].shape[1] if "context_src" in batch else 0
    out = {key: np.array(value) for key, value in batch.items()}
    sentence_keys = [
        key
        for key, value in batch.items()
        if not key.startswith("context_") and value.ndim >= 2 and value.shape[:2] == (B, S)
    ]
    for b in range(B):
        for s in range(S):
            for key in sentence_keys:
                out[key][b, s] = batch[key][origin[b, K + s], s]
        for j in range(K):
            for key in sentence_keys:
                if f"context_{key}" in batch:
                    out[f"context_{key}"][b, j] = batch[f"context_{key}"][origin[b, j], j]
    out["origin_row"] = origin[:, K:].astype(np.int32)
    return out


@pytest.mark.parametrize("k", [0, 2])
def test_rotate_context_equals_a_naive_loop(k):
    batch = window_batch(k)
    B, S = batch["src"].shape[:2]
    origin = np.random.default_rng(k).integers(0, B, (B, k + S))  # any table, not a permutation
    got = jax.device_get(rotate_context(batch, origin))
    expected = naive_rotate(batch, origin)
    assert set(got) == set(expected)
    for key, value in expected.items():
        np.testing.assert_array_equal(got[key], value, err_msg=key)


@pytest.mark.parametrize("rows, columns", [(11, 5), (3, 5)])
def test_shifted_rows_rotates_every_column(rows, columns):
    origin = np.asarray(shifted_rows(jax.random.PRNGKey(2), rows, columns))
    assert origin.shape == (rows, columns)
    shifts = origin[0]
    for c in range(columns):
        assert origin[:, c].tolist() == [(b + shifts[c]) % rows for b in range(rows)]
    if rows >= columns:  # distinct shifts: the cells of a row come from different rows
        assert len(set(shifts.tolist())) == columns


def test_random_context_batch_rotates_by_shifted_rows():
    batch = window_batch(2)
    B, S = batch["src"].shape[:2]
    rng = jax.random.PRNGKey(9)
    got = jax.device_get(random_context_batch(batch, rng))
    expected = naive_rotate(batch, np.asarray(shifted_rows(rng, B, 2 + S)))
    for key, value in expected.items():
        np.testing.assert_array_equal(got[key], value, err_msg=key)
