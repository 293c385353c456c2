"""Aligned packed rows: one batch in the two layouts of FINAL's two-layout step (Zheng et al.
2020, Sec. 4; docs/design/packed_final_and_beam_cache.md §1).

A row of ``L = n * M`` slots (``M = block_tokens``) is ``n`` blocks of ``M`` slots. Every
sentence lies inside one block, its source and its target in the same block of the source and
target rows, each side contiguous there; a chunk lies whole in one row, its sentences spread
over the row's blocks. So the batch ``[B, L]`` is both layouts at once:

* the **sentence layout** is the reshape ``[B * n, M]``: local encoder layers, the decoder's
  causal self-attention and its cross-attention are the packed sentence Transformer's dense
  segment-masked attention over ``M`` keys;
* the **chunk layout** is the row: the global layer (Eq. 1) is dense over it, masked to the
  chunk.

The XL memory of a sentence (the previous sentence of its chunk, Sec. 4.2) is gathered into
the block's **memory row** of ``M`` slots: the previous sentences of the block's sentences,
one after another. Each block therefore has three rooms of ``M`` slots: source, target and
memory (the target tokens of its sentences' previous sentences). Segment ids number a row's
sentences in chunk order (chunks in id order, then by slot), so the previous sentence of a
sentence with ``sentence_index > 0`` is segment ``s - 1``: the model finds memories by it
(:mod:`docnmt_jax.models.final_two_layout`).

Packing (deterministic): chunks by decreasing footprint (ties by id); a chunk's class is the
shortest row length ``row_tokens * 2**i`` whose empty row holds it; it goes into the fullest
row of its class that holds it (best fit among the first :data:`MAX_TRIES` rows with enough
free slots; its sentences best-fit decreasing into the row's blocks, all three rooms
checked), else into a new row. With ``PackingConfig.chunk_spans = n > 1`` a row's chunks
must also fit, source side, into ``n`` spans of ``L / n`` slots (best fit per chunk): a row
holds its chunks by span, so that the model's next-fit of them into the spans (the chunk
layout of the global layer, :func:`next_fit_spans`) keeps every chunk inside one span; the
sentence layout then has ``n`` times the blocks to fill. :class:`TwoLayoutPlan` is a
:class:`~docnmt_jax.data.packed_plan.PackedPlan` with this placement (the same epochs and
materialisation); :func:`align_grid` is the reference derivation from a grid batch.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from docnmt_jax.data import schema
from docnmt_jax.data.packed_plan import (
    PLACEMENT_COLUMNS,
    ItemLayout,
    PackedPlan,
    PackingError,
    side_lengths,
)

#: Rooms of a block: source, target and memory slots.
ROOMS = 3
#: Rows with enough free slots tried per chunk, fullest first (bounds the planning time).
MAX_TRIES = 1024
#: Free-slot steps of the rows' buckets.
GRAIN = 16


def sentence_needs(src: np.ndarray, tgt: np.ndarray) -> np.ndarray:
    """``[n, 3]``: the slots each sentence of a chunk takes in its block: source, target and
    memory (its previous sentence's target tokens; none for the first)."""
    memory = np.concatenate([[0], tgt[:-1]]) if tgt.size else tgt
    return np.stack([src, tgt, memory], axis=1).astype(np.int64)


Rooms = list[list[int]]  # per block: source, target and memory slots left


def assign_blocks(room: Rooms, need: list[list[int]]) -> list[int] | None:
    """The block of every sentence (``need``: :func:`sentence_needs` as lists) by best-fit
    decreasing into ``room`` (each sentence to the block that it leaves fullest, ties to the
    first), which is updated; None, ``room`` untouched, when a sentence finds no block.
    Python ints: a few blocks a row, faster than NumPy."""
    trial = [list(r) for r in room]
    block = [0] * len(need)
    for k in sorted(range(len(need)), key=lambda k: (-max(need[k]), k)):
        a, b, c = need[k]
        best, best_slack = -1, 0
        for j, (x, y, z) in enumerate(trial):
            if x >= a and y >= b and z >= c and (best < 0 or x + y + z < best_slack):
                best, best_slack = j, x + y + z
        if best < 0:
            return None
        trial[best][0] -= a
        trial[best][1] -= b
        trial[best][2] -= c
        block[k] = best
    room[:] = trial
    return block


class RowPool:
    """The rows of one row length: their rooms (:data:`Rooms`), free slots per room, chunks
    and the source slots left in each of their ``spans`` chunk-layout spans, bucketed by
    usable slots (free on all three rooms of a block, summed over the blocks, in steps of
    :data:`GRAIN`) for best fit."""

    def __init__(self, blocks: int, block_tokens: int, spans: int = 1):
        self.blocks, self.block_tokens, self.spans = blocks, block_tokens, spans
        self.rooms: list[Rooms] = []
        self.free: list[list[int]] = []
        self.widest: list[int] = []  # the most a block can still take on all three rooms
        self.members: list[list[int]] = []
        self.span_free: list[list[int]] = []  # source slots left per span
        self.span_of: list[list[int]] = []  # the span of each member
        self.buckets: dict[int, set[int]] = {}

    def _file(self, r: int, old: int | None, need: list[list[int]]) -> None:
        if old is not None:
            self.buckets[old].discard(r)
        self.free[r] = [f - sum(n[i] for n in need) for i, f in enumerate(self.free[r])]
        self.widest[r] = max(min(room) for room in self.rooms[r])
        usable = sum(min(room) for room in self.rooms[r])  # slots free on all three rooms
        self.buckets.setdefault(usable // GRAIN, set()).add(r)

    def _span(self, r: int, source: int) -> int | None:
        """The fullest span of row ``r`` with ``source`` slots left (best fit), or None."""
        fits = [(free, j) for j, free in enumerate(self.span_free[r]) if free >= source]
        return min(fits)[1] if fits else None

    def _join(self, r: int, item: int, span: int, source: int) -> None:
        self.members[r].append(item)
        self.span_of[r].append(span)
        self.span_free[r][span] -= source

    def add(self, item: int, need: list[list[int]]) -> list[int] | None:
        """Places chunk ``item`` (its sentences' ``need``) in the fullest row that holds it
        (of the first :data:`MAX_TRIES` with enough free slots), else in a new row; returns its
        sentences' blocks, or None when an empty row cannot hold it."""
        empty = [[self.block_tokens] * ROOMS for _ in range(self.blocks)]
        total = [sum(n[i] for n in need) for i in range(ROOMS)]
        span_width = self.blocks * self.block_tokens // self.spans
        fresh = assign_blocks(empty, need) if total[0] <= span_width else None
        if fresh is None:
            return None
        largest = max(max(n) for n in need)
        tried, first_key = 0, -(-max(total) // GRAIN)
        for key in range(first_key, self.blocks * self.block_tokens // GRAIN + 1):
            for r in self.buckets.get(key, ()):  # ints: a deterministic order
                free = self.free[r]
                if tried == MAX_TRIES or self.widest[r] < largest:
                    continue
                if free[0] < total[0] or free[1] < total[1] or free[2] < total[2]:
                    continue
                span = self._span(r, total[0])
                if span is None:
                    continue
                tried += 1
                block = assign_blocks(self.rooms[r], need)
                if block is not None:
                    self._file(r, key, need)
                    self._join(r, item, span, total[0])
                    return block
        self.rooms.append(empty)
        self.free.append([self.blocks * self.block_tokens] * ROOMS)
        self.widest.append(self.block_tokens)
        self.members.append([])
        self.span_of.append([])
        self.span_free.append([span_width] * self.spans)
        self._file(len(self.rooms) - 1, None, need)
        self._join(len(self.rooms) - 1, item, 0, total[0])
        return fresh

    def rows(self) -> list[np.ndarray]:
        """Each row's chunks in chunk order: by span, then by id (so that laying them next-fit
        into the spans, :func:`next_fit_spans`, keeps every chunk inside one span)."""
        return [
            np.asarray([m for _, m in sorted(zip(spans, members, strict=True))], np.int64)
            for spans, members in zip(self.span_of, self.members, strict=True)
        ]


def next_fit_spans(lengths: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Chunks of ``lengths`` source tokens laid in order into spans of ``width`` slots, each
    in the current span while it fits, else at the start of the next: ``(span, offset)`` per
    chunk (the reference of :func:`~docnmt_jax.models.final_two_layout.chunk_layout`)."""
    span, offset = np.zeros(lengths.size, np.int64), np.zeros(lengths.size, np.int64)
    current, used = 0, 0
    for c, n in enumerate(lengths.tolist()):
        if used + n > width:
            current, used = current + 1, 0
        span[c], offset[c] = current, current * width + used
        used += n
    return span, offset


def block_offsets(block: np.ndarray, lengths: np.ndarray, block_tokens: int) -> np.ndarray:
    """Row offsets of sentences (in segment order) placed in blocks ``block``: each block's
    sentences one after another from the block's first slot, in segment order."""
    offsets = np.empty(block.size, np.int64)
    used = {}
    for i, b in enumerate(block.tolist()):
        offsets[i] = b * block_tokens + used.get(b, 0)
        used[b] = used.get(b, 0) + int(lengths[i])
    return offsets


class TwoLayoutPlan(PackedPlan):
    """The plan of ``PackingConfig(unit="chunk", block_tokens=M)`` (module docstring); the
    surface of :class:`~docnmt_jax.data.packed_plan.PackedPlan`, and ``sentence_padding``:
    the padding fraction of the sentence layout's real rows (both sides)."""

    def _pack(
        self, layout: ItemLayout, row_lengths: np.ndarray
    ) -> tuple[list[np.ndarray], np.ndarray]:
        """Rows of every length class (module docstring); the blocks of every sentence are kept
        for :meth:`_placement`."""
        M = int(self.packing.block_tokens)
        c, lengths = self.chunk_table, side_lengths(self.corpus)
        needs = [
            sentence_needs(*(n[s : s + k] for n in (lengths["src"], lengths["tgt"])))
            for s, k in zip(c["start"].tolist(), c["count"].tolist(), strict=True)
        ]
        footprint = np.array([n[:, :2].sum(0).max() if n.size else 0 for n in needs], np.int64)
        order = np.lexsort((np.arange(footprint.size), -footprint))
        pools = [RowPool(int(L) // M, M, self.packing.chunk_spans) for L in row_lengths]
        self._blocks = np.zeros(int(lengths["src"].size), np.int64)
        for item in order.tolist():
            need = needs[item].tolist()
            block = next((b for p in pools if (b := p.add(item, need)) is not None), None)
            if block is None:
                raise PackingError(
                    f"a chunk of {len(needs[item])} sentences ({footprint[item]} tokens on its "
                    f"longer side) does not fit the longest aligned row ({int(row_lengths[-1])} "
                    f"slots in blocks of {M}); raise config.data.packed_row_tokens"
                )
            start = int(c["start"][item])
            self._blocks[start : start + len(block)] = block
        rows = [row for p in pools for row in p.rows()]
        counts = np.array([len(p.rooms) for p in pools], np.int64)
        real = int(lengths["src"].sum() + lengths["tgt"].sum())
        slots = 2 * int((counts * row_lengths).sum())
        self.sentence_padding = 1.0 - real / slots if slots else 0.0
        return rows, counts

    def _placement(
        self, rows: list[np.ndarray], layout: ItemLayout
    ) -> tuple[np.ndarray, np.ndarray]:
        """The placement table of ``rows``: a row's chunks in id order, their sentences in
        slot order numbered 1, 2, ... (segments), each at its block's next free slots per side."""
        c, lengths = self.chunk_table, side_lengths(self.corpus)
        M = int(self.packing.block_tokens)
        tables, row_ptr = [], [0]
        for items in rows:
            counts = c["count"][items]
            sentence = np.concatenate(
                [c["start"][k] + np.arange(n) for k, n in zip(items, counts, strict=True)]
            )
            block = self._blocks[sentence]
            table = {
                "sentence": sentence,
                "segment": np.arange(1, sentence.size + 1),
                "chunk": np.repeat(np.arange(1, items.size + 1), counts),
                "sentence_index": layout.slot[sentence],
            }
            for side in schema.SIDES:
                table[f"{side}_offset"] = block_offsets(block, lengths[side][sentence], M)
                table[f"{side}_chunk_offset"] = layout.chunk_offset[side][sentence]
            tables.append(np.stack([table[k] for k in PLACEMENT_COLUMNS], axis=1))
            row_ptr.append(row_ptr[-1] + sentence.size)
        placement = np.concatenate(tables) if tables else np.zeros((0, len(PLACEMENT_COLUMNS)))
        return placement.astype(np.int64), np.asarray(row_ptr, np.int64)


def align_grid(
    batch: Mapping[str, np.ndarray],
    row_len: int,
    block_tokens: int,
    rows_of: list[list[int]],
    chunk_spans: int = 1,
) -> tuple[schema.Batch, np.ndarray]:
    """The aligned rows (module docstring) of the chunks of a grid ``batch`` ``[B, S, T]``:
    packed row ``r`` holds grid rows ``rows_of[r]``, their sentences with a real source or
    target token. Returns ``(packed, index)`` as :func:`~docnmt_jax.data.schema.pack_grid`
    (``index``: the grid ``(b, s, t)`` of each target slot, -1 on padding). Raises
    :class:`~docnmt_jax.data.packed_plan.PackingError` when a row does not hold its chunks,
    or (``chunk_spans``) when their sources, next-fit in order, need more spans."""
    M, n_blocks = block_tokens, row_len // block_tokens
    lengths = {side: np.asarray(batch[f"{side}_mask"]).sum(-1) for side in schema.SIDES}
    for r, grid_rows in enumerate(rows_of):
        sources = np.array([lengths["src"][b].sum() for b in grid_rows], np.int64)
        span, _ = next_fit_spans(sources, row_len // chunk_spans)
        if span.size and (span.max() >= chunk_spans or sources.max() > row_len // chunk_spans):
            raise PackingError(f"aligned row {r}: its chunks need more than {chunk_spans} spans")
    out = {name: np.zeros((len(rows_of), row_len), schema.DTYPE) for name in schema.PACKED_FEATURES}
    index = np.full((len(rows_of), row_len, 3), -1, schema.DTYPE)
    for r, grid_rows in enumerate(rows_of):
        room = [[M] * ROOMS for _ in range(n_blocks)]
        blocks = {}  # grid row -> (its sentence slots, their blocks)
        footprint = [max(lengths[side][b].sum() for side in schema.SIDES) for b in grid_rows]
        for j in np.lexsort((np.arange(len(grid_rows)), -np.asarray(footprint))).tolist():
            b = grid_rows[j]  # the plan's order: decreasing footprint, ties in row order
            slots = np.flatnonzero((lengths["src"][b] > 0) | (lengths["tgt"][b] > 0))
            blocks[b] = (
                slots,
                assign_blocks(
                    room, sentence_needs(lengths["src"][b, slots], lengths["tgt"][b, slots])
                ),
            )
            if blocks[b][1] is None:
                raise PackingError(f"aligned row {r} does not hold grid row {b}")
        placed = [  # (b, s, block) in segment order
            (b, s, k) for b in grid_rows for s, k in zip(*blocks[b], strict=True)
        ]
        for side in schema.SIDES:
            n = np.array([lengths[side][b, s] for b, s, _ in placed], np.int64)
            offsets = block_offsets(np.array([k for *_, k in placed], np.int64), n, M)
            chunk_pos, chunks = {}, {}
            for seg, ((b, s, _), o, m) in enumerate(zip(placed, offsets, n, strict=True), 1):
                p, i = slice(o, o + m), np.arange(m)
                chunks.setdefault(b, len(chunks) + 1)
                values = {
                    side: np.asarray(batch[side])[b, s, :m],
                    f"{side}_mask": 1,
                    f"{side}_positions": i,
                    f"{side}_chunk_positions": chunk_pos.get(b, 0) + i,
                    f"{side}_segment_ids": seg,
                    f"{side}_chunk_ids": chunks[b],
                    f"{side}_sentence_index": s,
                }
                for name, value in values.items():
                    out[name][r, p] = value
                if side == "tgt":
                    index[r, p] = np.stack([np.full(m, b), np.full(m, s), i], axis=1)
                chunk_pos[b] = chunk_pos.get(b, 0) + m
    return out, index
