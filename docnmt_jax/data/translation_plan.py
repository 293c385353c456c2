"""Translation batches grouped by length: few shapes, little padding.

The training plan (:class:`~docnmt_jax.data.batch_plan.BatchPlan`) buckets chunks by
``(sentences, tokens)`` over a fixed bucket grid: on the Bible's test books it gives the
Transformer 6 shapes at 33% source padding and FINAL 13 shapes at 67% (2026-11-29). A search
costs the same for a padded slot as for a real one and compiles once per shape, so decoding
wants the opposite trade: :class:`TranslationPlan` keeps at most ``max_shapes`` shapes
``(S, T)`` chosen for the block being translated (``T`` among :func:`length_buckets`), puts
every chunk in the cheapest kept shape that holds it, and fills each batch with chunks of
similar length (sorted), so that the search's early stop ends a batch when its similar
outputs end.

Choosing the shapes: start from every bucket the chunks use (the grid's sentence buckets,
:func:`length_buckets`); while more than
``max_shapes`` remain, drop the one whose removal adds the fewest token slots (its chunks move
to the cheapest kept shape that holds them; the largest bucket is never dropped, so every
chunk has one). The cost of a shape is its batches' slots ``batches * B * S * T``, padding
rows included. ``B`` is at most the token budget's (``PipelineConfig.batch_size``): a
shape's chunks are spread evenly over as few batches as the budget allows, and ``B`` is the
next of :func:`row_counts` (eighths of the budget, powers of two below) that holds them, so a
few sentences do not cost a whole batch, a shape's last batch is not mostly padding, and the
shape count stays ``<= max_shapes``.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from docnmt_jax.data.batch_plan import BatchPlan
from docnmt_jax.data.epochs import EpochPlan
from docnmt_jax.data.spec import PipelineConfig
from docnmt_jax.data.tokenized import TokenizedCorpus

#: Batch shapes of a translation plan (each compiles the model's search programs).
MAX_SHAPES = 4


def row_counts(budget: int, multiple: int) -> list[int]:
    """The row counts a batch may have under a budget of ``budget`` rows: ``k/8`` of it
    (``k = 1..8``) and the powers of two below that, all multiples of ``multiple``. A finite
    set, so blocks reuse shapes; a shape's batches waste at most ``budget/8`` rows."""

    def up(r: int) -> int:
        return max(multiple, -(-r // multiple) * multiple)

    counts = {up(budget * k // 8) for k in range(1, 9)}
    power = 1
    while power < budget // 8:
        counts.add(up(power))
        power *= 2
    return sorted(c for c in counts if c <= budget) or [budget]


def length_buckets(maximum: int) -> np.ndarray:
    """The candidate lengths ``T``: 8, 12, 16, 24, 32, 48, ... (powers of two and 1.5 times
    them) below ``maximum``, and ``maximum``. A finite set, so blocks of a long input mostly
    reuse the shapes (and compiled searches) of earlier blocks."""
    out, base = [], 8
    while base < maximum:
        out += [base, base * 3 // 2]
        base *= 2
    return np.asarray(sorted({b for b in out if b < maximum} | {maximum}))


class TranslationPlan(BatchPlan):
    """One epoch of decoding batches, in at most ``max_shapes`` shapes (module docstring).

    Chunks are cut as the grid plan cuts them (``make_chunks``), so a chunk and its
    ``sentence_offset`` are the same; only their grouping into batches differs. Batches come
    in order of shape (smallest first), each holding chunks sorted by their longest sentence;
    the last batch of a shape is padded with empty rows (``-1``).
    """

    def __init__(
        self, corpus: TokenizedCorpus, config: PipelineConfig, max_shapes: int = MAX_SHAPES
    ):
        if max_shapes < 1:
            raise ValueError(f"max_shapes must be >= 1, got {max_shapes}")
        self.max_shapes = max_shapes
        self._plan: EpochPlan | None = None
        super().__init__(corpus, dataclasses.replace(config, shuffle=False, pad_batch=True))
        plan = self.epoch(0)
        self.batches_per_epoch = len(plan)
        self.stats = dataclasses.replace(
            self.stats, batches_per_epoch=len(plan), padding_fraction=self._padding_fraction()
        )

    @property
    def shapes(self) -> frozenset[tuple[int, int, int]]:
        plan = self.epoch(0)
        return frozenset(zip(plan.sizes.tolist(), plan.s.tolist(), plan.t.tolist(), strict=True))

    def epoch(self, e: int) -> EpochPlan:
        """The decoding batches (the same in every epoch)."""
        if self._plan is None:
            self._plan = self._build()
        return self._plan

    def _rows(self, s: int, t: int, chunks: int) -> int:
        """Rows of a batch of shape ``(s, t)`` holding ``chunks`` chunks in all: as few
        batches as the budget allows, balanced, each rounded up to the next of a few row
        counts (module docstring), so a shape's last batch is not mostly padding."""
        cfg = self.config
        budget = cfg.batch_size(s, t)
        needed = -(-chunks // -(-chunks // budget))  # balanced over ceil(chunks / budget)
        return min(
            r
            for r in row_counts(budget, math.lcm(cfg.process_count, cfg.batch_multiple))
            if r >= needed
        )

    def _assign(self, kept: list[tuple[int, int]]) -> tuple[np.ndarray, int]:
        """Each chunk's kept shape (index into ``kept``, the cheapest that holds it) and the
        slots of all batches."""
        c = self.chunk_table
        area = np.asarray([s * t for s, t in kept])
        fits = (c["count"][:, None] <= np.asarray([s for s, _ in kept])) & (
            c["longest"][:, None] <= np.asarray([t for _, t in kept])
        )
        choice = np.argmin(np.where(fits, area, np.iinfo(np.int64).max), axis=1)
        slots = 0
        for k, (s, t) in enumerate(kept):
            n = int(np.sum(choice == k))
            if n:
                rows = self._rows(s, t, n)
                slots += -(-n // rows) * rows * s * t
        return choice, slots

    def _kept_shapes(self) -> list[tuple[int, int]]:
        """The ``(S, T)`` shapes kept (module docstring), smallest first."""
        c = self.chunk_table
        t_buckets = length_buckets(int(self._t_buckets[-1]))
        s_of = self._s_buckets[np.searchsorted(self._s_buckets, c["count"])]
        t_of = t_buckets[np.searchsorted(t_buckets, c["longest"])]
        kept = sorted({(int(s), int(t)) for s, t in zip(s_of, t_of, strict=True)})
        if not kept:
            return kept
        top = (max(s for s, _ in kept), max(t for _, t in kept))
        if top not in kept:
            kept.append(top)
        while len(kept) > self.max_shapes:
            options = [
                (self._assign(kept[:i] + kept[i + 1 :])[1], i)
                for i in range(len(kept))
                if kept[i] != top
            ]
            kept.pop(min(options)[1])
        return sorted(kept, key=lambda st: (st[0] * st[1], st))

    def _build(self) -> EpochPlan:
        kept = self._kept_shapes()
        choice, _ = self._assign(kept) if kept else (np.zeros(0, np.int64), 0)
        longest = self.chunk_table["longest"]
        ids, sizes, s_list, t_list = [], [], [], []
        for k, (s, t) in enumerate(kept):
            members = np.flatnonzero(choice == k)
            if not members.size:
                continue
            members = members[np.argsort(longest[members], kind="stable")]
            rows = self._rows(s, t, members.size)
            count = -(-members.size // rows)
            padded = np.full(count * rows, -1, np.int64)
            padded[: members.size] = members
            ids.append(padded)
            sizes += [rows] * count
            s_list += [s] * count
            t_list += [t] * count
        return EpochPlan(
            np.concatenate(ids).astype(np.int32) if ids else np.zeros(0, np.int32),
            np.asarray(sizes, np.int32),
            np.asarray(s_list, np.int32),
            np.asarray(t_list, np.int32),
        )
