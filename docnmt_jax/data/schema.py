"""The batch format that every batch producer writes and every model reads: feature names,
dtype and axes, and the one derivation of the per-token and per-sentence features from token
grids (:func:`batch_from_grids`).

Features (all int32; ``B`` chunks, ``S`` sentences per chunk, ``T`` tokens per sentence):

* ``src``/``tgt`` [B,S,T]: token ids, each sentence's tokens first (ending with EOS in the
  pipeline), ``PAD_ID`` = 0 after them and in empty sentence slots;
* ``src_mask``/``tgt_mask`` [B,S,T]: 1 on real tokens;
* ``src_positions``/``tgt_positions`` [B,S,T]: position inside its own sentence (0 on padding);
* ``src_segment_ids``/``tgt_segment_ids`` [B,S,T]: 1-based sentence number within the chunk
  (0 on padding);
* ``sentence_mask`` [B,S]: 1 on sentences that have a real source token;
* ``doc_index`` [B]: index of the chunk's document; ``chunk_index`` [B]: chunk number within
  its document; ``sentence_offset`` [B]: index in its document of the chunk's first sentence.
  The pipeline sets these three to -1 on padding rows.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from docnmt_jax.data.tokenizer import PAD_ID

Batch = dict[str, np.ndarray]

#: dtype of every feature.
DTYPE = np.dtype(np.int32)

#: Feature name -> its axes (one letter per axis: ``B`` rows, ``S`` sentences, ``T`` tokens),
#: in the canonical feature order.
FEATURE_AXES: dict[str, str] = {
    "src": "BST",
    "tgt": "BST",
    "src_mask": "BST",
    "tgt_mask": "BST",
    "src_positions": "BST",
    "tgt_positions": "BST",
    "src_segment_ids": "BST",
    "tgt_segment_ids": "BST",
    "sentence_mask": "BS",
    "doc_index": "B",
    "chunk_index": "B",
    "sentence_offset": "B",
}
BATCH_FEATURES: tuple[str, ...] = tuple(FEATURE_AXES)
SIDES: tuple[str, ...] = ("src", "tgt")
#: The per-row [B] features.
ROW_FEATURES: tuple[str, ...] = ("doc_index", "chunk_index", "sentence_offset")


def side_features(side: str) -> tuple[str, str, str, str]:
    """Names of the token ids, mask, positions and segment ids of ``side`` (``src``/``tgt``)."""
    return side, f"{side}_mask", f"{side}_positions", f"{side}_segment_ids"


def check_batch(batch: Mapping[str, np.ndarray]) -> None:
    """Raises ValueError unless ``batch`` has exactly the schema's features, each int32 of its
    rank, with one ``B``, ``S`` and ``T`` shared by all of them."""
    if set(batch) != set(BATCH_FEATURES):
        raise ValueError(f"batch features {sorted(batch)} != schema {sorted(BATCH_FEATURES)}")
    sizes: dict[str, int] = {}
    for name, axes in FEATURE_AXES.items():
        value = batch[name]
        if value.dtype != DTYPE or value.ndim != len(axes):
            raise ValueError(f"{name}: {value.dtype} of rank {value.ndim}, expected int32 {axes}")
        for axis, size in zip(axes, value.shape, strict=True):
            if sizes.setdefault(axis, size) != size:
                raise ValueError(f"{name}: axis {axis} is {size}, elsewhere {sizes[axis]}")


def batch_from_grids(
    src: np.ndarray,
    tgt: np.ndarray,
    *,
    src_lengths: np.ndarray | None = None,
    tgt_lengths: np.ndarray | None = None,
    doc_index: np.ndarray | None = None,
    chunk_index: np.ndarray | None = None,
    sentence_offset: np.ndarray | None = None,
) -> Batch:
    """The whole batch of the token grids ``src`` and ``tgt`` ``[B, S, T]`` (each sentence's
    tokens first, PAD after them).

    A token is real where its position is below its sentence's length (``*_lengths`` [B, S])
    when lengths are given, else where it is not ``PAD_ID``. Positions count the real tokens of
    a sentence from 0, segment ids number the sentences from 1 (both 0 on padding), and a
    sentence is present when its source has a real token. The row features default to
    ``doc_index = arange(B)`` and ``chunk_index = sentence_offset = 0``.
    """
    rows, sentences, _ = src.shape
    out: Batch = {}
    for side, tokens, lengths in ((SIDES[0], src, src_lengths), (SIDES[1], tgt, tgt_lengths)):
        tokens = np.asarray(tokens, DTYPE)
        pos = np.arange(tokens.shape[-1], dtype=DTYPE)
        real = tokens != PAD_ID if lengths is None else pos < np.asarray(lengths)[..., None]
        mask = real.astype(DTYPE)
        segments = np.arange(1, sentences + 1, dtype=DTYPE)[:, None]
        names = side_features(side)
        out.update(zip(names, (tokens, mask, mask * pos, mask * segments), strict=True))
    out["sentence_mask"] = np.any(out["src_mask"] > 0, axis=-1).astype(DTYPE)
    defaults = (np.arange(rows, dtype=DTYPE), np.zeros(rows, DTYPE), np.zeros(rows, DTYPE))
    given = (doc_index, chunk_index, sentence_offset)
    for name, value, default in zip(ROW_FEATURES, given, defaults, strict=True):
        out[name] = default if value is None else np.asarray(value, DTYPE)
    return {k: out[k] for k in BATCH_FEATURES}


def dummy_batch(
    sentences: int = 1, length: int = 4, rows: int = 1, vocab_size: int | None = None
) -> Batch:
    """A batch without padding holding every pipeline feature: token ids 4 everywhere, or
    random ids below ``vocab_size`` (seeded). For parameter structures and benchmarks."""
    shape = (rows, sentences, length)
    if vocab_size is None:
        src = tgt = np.full(shape, 4, DTYPE)
    else:
        rng = np.random.default_rng(0)
        src, tgt = (rng.integers(4, vocab_size, shape).astype(DTYPE) for _ in range(2))
    return batch_from_grids(src, tgt)
