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

Context window (:data:`CONTEXT_FEATURE_AXES`, only with ``PipelineConfig.context_sentences``
``K > 0``): ``context_src``/``context_src_mask`` [B,K,T], the source sentences before the
chunk's first sentence in document order: slot ``K-j`` holds the ``j``-th sentence before it
(slot ``K-1`` the one right before), tokens as stored in the corpus (ending with EOS), all 0
where that would reach before the document's first sentence and on padding rows. Sentence ``s``
of a chunk has as context the ``K`` rows before row ``K+s`` of ``concat([context_src, src],
axis=1)``. A batch has both of these features or neither.

Packed rows (:data:`PACKED_FEATURE_AXES`, docs/design/packing_plan.md §1): sentences
laid one after another in rows ``[B, L]`` (one ``L`` for both sides), every feature int32 and 0
on padding. Per side: ``{side}`` token ids (each sentence ends with EOS), ``{side}_mask``,
``{side}_positions`` (inside the sentence), ``{side}_chunk_positions`` (inside the chunk,
counting that side's real tokens only), ``{side}_segment_ids`` (1-based sentence number in the
row, the same on both sides), ``{side}_chunk_ids`` (1-based chunk number in the row) and
``{side}_sentence_index`` (0-based slot of the sentence in its chunk). :func:`pack_grid` is the
one reference derivation of them from a grid batch.
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
#: The optional context window's features (``K`` context sentences per row).
CONTEXT_FEATURE_AXES: dict[str, str] = {"context_src": "BKT", "context_src_mask": "BKT"}
CONTEXT_FEATURES: tuple[str, ...] = tuple(CONTEXT_FEATURE_AXES)
SIDES: tuple[str, ...] = ("src", "tgt")
#: The per-row [B] features.
ROW_FEATURES: tuple[str, ...] = ("doc_index", "chunk_index", "sentence_offset")


def side_features(side: str) -> tuple[str, str, str, str]:
    """Names of the token ids, mask, positions and segment ids of ``side`` (``src``/``tgt``)."""
    return side, f"{side}_mask", f"{side}_positions", f"{side}_segment_ids"


def check_batch(batch: Mapping[str, np.ndarray]) -> None:
    """Raises ValueError unless ``batch`` has exactly the schema's features, with or without
    the context window's (both or neither), each int32 of its rank, with one ``B``, ``S``,
    ``T`` (and ``K``) shared by all of them."""
    allowed = (set(BATCH_FEATURES), set(BATCH_FEATURES) | set(CONTEXT_FEATURES))
    if set(batch) not in allowed:
        raise ValueError(
            f"batch features {sorted(batch)} != schema {sorted(BATCH_FEATURES)}"
            f" (+ optionally both of {list(CONTEXT_FEATURES)})"
        )
    sizes: dict[str, int] = {}
    for name, axes in {**FEATURE_AXES, **CONTEXT_FEATURE_AXES}.items():
        if name not in batch:
            continue
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


# ---------------------------------------------------------------------------------------------
# Packed rows (docs/design/packing_plan.md §1).

#: Packed feature name -> its axes (``B`` rows, ``L`` row length, the same on both sides).
PACKED_FEATURE_AXES: dict[str, str] = {
    f"{side}{suffix}": "BL"
    for side in SIDES
    for suffix in (
        "",
        "_mask",
        "_positions",
        "_chunk_positions",
        "_segment_ids",
        "_chunk_ids",
        "_sentence_index",
    )
}
PACKED_FEATURES: tuple[str, ...] = tuple(PACKED_FEATURE_AXES)
#: Packed document streams' rows (:mod:`~docnmt_jax.data.packed_stream_plan`): per token the
#: 1-based stream of its chunk (0 on padding); the target side also holds each continuing
#: chunk's carried memory slots (``tgt_sentence_index`` -1, ``tgt_mask`` 0).
PACKED_STREAM_FEATURE_AXES: dict[str, str] = {"src_stream": "BL", "tgt_stream": "BL"}
PACKED_STREAM_FEATURES: tuple[str, ...] = tuple(PACKED_STREAM_FEATURE_AXES)
#: Packed sentence rows' context rows (:mod:`~docnmt_jax.data.window_plan`, a window model
#: with ``K > 0``): ``[B, C]`` with ``C = K * L``, each packed sentence's window of source
#: tokens, positions inside the window and the segment id of its sentence (0 on padding).
PACKED_CONTEXT_FEATURE_AXES: dict[str, str] = {
    "context_src": "BC",
    "context_src_mask": "BC",
    "context_positions": "BC",
    "context_segment_ids": "BC",
}
PACKED_CONTEXT_FEATURES: tuple[str, ...] = tuple(PACKED_CONTEXT_FEATURE_AXES)


def packed_side_features(side: str) -> tuple[str, ...]:
    """Names of the packed features of ``side``, in :data:`PACKED_FEATURES` order."""
    return tuple(k for k in PACKED_FEATURES if k == side or k.startswith(f"{side}_"))


def is_packed(batch: Mapping[str, np.ndarray]) -> bool:
    """Whether ``batch`` holds packed rows (:data:`PACKED_FEATURES`) rather than the grid."""
    return "src_chunk_ids" in batch


def check_packed_batch(batch: Mapping[str, np.ndarray]) -> None:
    """Raises ValueError unless ``batch`` has exactly the packed features, each int32 ``[B, L]``
    with one ``B`` and ``L`` shared by all of them."""
    if set(batch) != set(PACKED_FEATURES):
        raise ValueError(f"batch features {sorted(batch)} != packed {sorted(PACKED_FEATURES)}")
    shape = batch["src"].shape
    for name in PACKED_FEATURES:
        value = batch[name]
        if value.dtype != DTYPE or value.ndim != 2:
            raise ValueError(f"{name}: {value.dtype} of rank {value.ndim}, expected int32 BL")
        if value.shape != shape:
            raise ValueError(f"{name}: shape {value.shape}, src has {shape}")


def pack_grid(
    batch: Mapping[str, np.ndarray],
    row_len: int,
    rows_of: list[list[int]] | None = None,
    drift: int | None = None,
    index_side: str = "tgt",
) -> tuple[Batch, np.ndarray]:
    """The packed rows of the chunks (rows ``b``) of a grid ``batch`` ``[B, S, T]``: the NumPy
    reference derivation of :data:`PACKED_FEATURES`.

    Packed row ``r`` holds the grid rows ``rows_of[r]`` (default: one grid row per packed
    row), laid one after another, and in each chunk the sentences with a real source or target
    token, in order. With ``drift=None`` each side is contiguous over the whole row (as in flax
    packing: the sides are independent). With an int ``drift`` each chunk starts at the same
    offset on both sides (the larger end of the previous chunk) and sentence ``k`` of a chunk
    goes to ``o_s = max(e_s, e_t - drift)``, ``o_t = max(e_t, e_s - drift)`` (``e_*``: end of
    sentence ``k - 1`` on that side, the chunk start for the first), so ``|o_s - o_t| <=
    drift`` with gaps only where needed. Segment and chunk ids
    count placed sentences and non-empty chunks of the row from 1; ``sentence_index`` is the
    grid slot ``s``. Returns ``(packed, index)``, ``index`` [B', L, 3] int32 = the grid
    ``(b, s, t)`` of the ``index_side`` token at each packed position (-1 on padding).
    Raises ValueError when a row needs more than ``row_len`` slots.
    """
    if drift is not None and drift < 0:
        raise ValueError(f"drift must be >= 0 or None, got {drift}")
    if index_side not in SIDES:
        raise ValueError(f"index_side must be one of {SIDES}, got {index_side!r}")
    n_grid = batch["src"].shape[0]
    rows_of = [[b] for b in range(n_grid)] if rows_of is None else rows_of
    lengths = {side: np.asarray(batch[f"{side}_mask"]).sum(-1) for side in SIDES}  # [B, S]
    out = {name: np.zeros((len(rows_of), row_len), DTYPE) for name in PACKED_FEATURES}
    index = np.full((len(rows_of), row_len, 3), -1, DTYPE)
    for r, grid_rows in enumerate(rows_of):
        start = dict.fromkeys(SIDES, 0)
        seg = chunk = 0
        for b in grid_rows:
            n_src, n_tgt = lengths["src"][b], lengths["tgt"][b]
            placed = np.flatnonzero((n_src > 0) | (n_tgt > 0))
            if not placed.size:
                continue
            chunk += 1
            end = dict(start) if drift is None else dict.fromkeys(SIDES, max(start.values()))
            chunk_pos = dict.fromkeys(SIDES, 0)
            for s in placed.tolist():
                seg += 1
                if drift is None:
                    off = dict(end)
                else:
                    off = {
                        "src": max(end["src"], end["tgt"] - drift),
                        "tgt": max(end["tgt"], end["src"] - drift),
                    }
                for side in SIDES:
                    n = int(lengths[side][b, s])
                    if off[side] + n > row_len:
                        raise ValueError(
                            f"packed row {r} needs more than row_len={row_len} slots on {side}"
                        )
                    p = slice(off[side], off[side] + n)
                    i = np.arange(n, dtype=DTYPE)
                    out[side][r, p] = np.asarray(batch[side])[b, s, :n]
                    out[f"{side}_mask"][r, p] = 1
                    out[f"{side}_positions"][r, p] = i
                    out[f"{side}_chunk_positions"][r, p] = chunk_pos[side] + i
                    out[f"{side}_segment_ids"][r, p] = seg
                    out[f"{side}_chunk_ids"][r, p] = chunk
                    out[f"{side}_sentence_index"][r, p] = s
                    if side == index_side:
                        index[r, p] = np.stack([np.full(n, b), np.full(n, s), i], axis=1)
                    chunk_pos[side] += n
                    end[side] = off[side] + n
            start = end
    return out, index


def dummy_packed_batch(
    row_len: int = 8, rows: int = 1, sentences_per_row: int = 1, vocab_size: int | None = None
) -> Batch:
    """Packed rows without padding: each row is one chunk of ``sentences_per_row`` sentences of
    near-equal lengths, the same on both sides; token ids 4, or random ids below
    ``vocab_size`` (seeded). For parameter structures and benchmarks."""
    if not 1 <= sentences_per_row <= row_len:
        raise ValueError(f"sentences_per_row must be in [1, {row_len}], got {sentences_per_row}")
    per, extra = divmod(row_len, sentences_per_row)
    lengths = np.full((rows, sentences_per_row), per)
    lengths[:, :extra] += 1
    shape = (rows, sentences_per_row, int(lengths.max()))
    if vocab_size is None:
        src = tgt = np.full(shape, 4, DTYPE)
    else:
        rng = np.random.default_rng(0)
        src, tgt = (rng.integers(4, vocab_size, shape).astype(DTYPE) for _ in range(2))
    grid = batch_from_grids(src, tgt, src_lengths=lengths, tgt_lengths=lengths)
    return pack_grid(grid, row_len)[0]
