"""Packed sentence rows with every sentence's context window beside them: the packed layout
of a window-context model (DocT, Zhang et al. 2018, Sec. 2.1, Eq. 2-3).

A :class:`WindowPackedPlan` is a :class:`~docnmt_jax.data.packed_plan.PackedPlan` of single
sentences (``PackingConfig(unit="sentence")``, each side contiguous over the row) with
``PipelineConfig.context_sentences`` ``k >= 1``. Besides the packed features of the sentence
rows ``[B, L]``, every row has one *context row* ``[B, k*L]`` holding, one after another in
the row's segment order, the window of each of its sentences: the up to ``k`` source sentences
before it in its document, concatenated, each with its EOS (exactly what the grid's
:func:`~docnmt_jax.models.window.context_windows` gives a sentence, padding dropped). Context
features (:data:`~docnmt_jax.data.schema.PACKED_CONTEXT_FEATURE_AXES`): ``context_src``,
``context_src_mask``, ``context_positions`` (0 .. over the window's real tokens, as the grid
path's context encoder counts them) and ``context_segment_ids`` (the segment id of the
sentence the window belongs to; 0 on padding). A document's first sentence has an empty
window: no context token carries its segment id.

Bound: the context row of a row of ``L_i`` slots has ``k * L_i`` slots. First-fit decreasing
checks room on three sides (source, target, context) and opens a row when one does not fit; a
sentence goes to the shortest row length whose three sides hold it alone, so a window longer
than ``k * L_i`` moves its sentence to a longer row (never truncated). A window is at most
``k`` sentences that each fit the longest row, so it always fits ``k`` times that row; a
sentence that does not fit is the :class:`~docnmt_jax.data.packed_plan.PackingError` of
:class:`PackedPlan`.
"""

from __future__ import annotations

import numpy as np

from docnmt_jax.data import schema
from docnmt_jax.data.epochs import Batch, segments
from docnmt_jax.data.packed_plan import (
    PLACEMENT_COLUMNS,
    ItemLayout,
    PackedPlan,
    PackingError,
    exclusive_cumsum,
)
from docnmt_jax.data.spec import PipelineConfig
from docnmt_jax.data.tokenized import TokenizedCorpus


def window_bounds(corpus: TokenizedCorpus, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``(first, length)`` per sentence: the global id of the first sentence of its window
    (the ``min(k, index in its document)`` sentences before it) and the window's source
    tokens."""
    n = corpus.num_sentences
    ids = np.arange(n, dtype=np.int64)
    doc = np.searchsorted(corpus.sentence_starts, ids, side="right") - 1
    first = np.maximum(ids - k, corpus.sentence_starts[:-1][doc]) if n else ids
    before = np.concatenate([[0], np.cumsum(corpus.src.lengths.astype(np.int64))])
    return first, before[ids] - before[first]


def first_fit_decreasing_sides(
    needs: np.ndarray, caps: np.ndarray, items: np.ndarray, order_by: np.ndarray
) -> list[np.ndarray]:
    """Rows (arrays of item ids, ascending) of first-fit decreasing on several sides:
    ``needs [sides, items]`` against ``caps [sides]``, items taken by decreasing ``order_by``
    (ties by id), each into the first row with room on every side, else a new row."""
    order = items[np.lexsort((items, -order_by[items]))]
    room = np.repeat(caps[:, None].astype(np.int64), order.size, axis=1)
    row_of = np.empty(order.size, np.int64)
    smallest = needs[:, items].min(axis=1) if items.size else caps
    lo = n_rows = 0  # rows before ``lo`` have no room for any item
    for j, item in enumerate(order.tolist()):
        need = needs[:, item]
        fits = np.all(room[:, lo:n_rows] >= need[:, None], axis=0)
        r = lo + int(np.argmax(fits)) if n_rows > lo else n_rows
        if r >= n_rows or not fits[r - lo]:
            r = n_rows
            n_rows += 1
        room[:, r] -= need
        row_of[j] = r
        while lo < n_rows and np.any(room[:, lo] < smallest):
            lo += 1
    by_row = np.lexsort((order, row_of))
    bounds = np.searchsorted(row_of[by_row], np.arange(n_rows + 1))
    return [order[by_row[bounds[r] : bounds[r + 1]]] for r in range(n_rows)]


class WindowPackedPlan(PackedPlan):
    """:class:`PackedPlan` of sentences with their context windows (module docstring);
    ``window_first``/``window_length`` per sentence (:func:`window_bounds`) and
    ``context_padding_fraction`` (of the context rows' slots over an epoch) besides."""

    features = schema.PACKED_FEATURES + schema.PACKED_CONTEXT_FEATURES

    def __init__(self, corpus: TokenizedCorpus, config: PipelineConfig):
        packing, k = config.packing, config.context_sentences
        if packing is None or packing.unit != "sentence" or packing.drift is not None or k < 1:
            raise ValueError(
                "WindowPackedPlan needs PackingConfig(unit='sentence', drift=None) and "
                f"context_sentences >= 1; got {packing}, context_sentences={k}"
            )
        self.k = k
        self.window_first, self.window_length = window_bounds(corpus, k)
        super().__init__(corpus, config)
        slots = int((self._class_batches * self._class_b * np.asarray(self.row_lengths)).sum())
        used = int(self.window_length.sum())
        self.context_padding_fraction = 1.0 - used / (k * slots) if slots else 0.0

    def _pack(
        self, layout: ItemLayout, row_lengths: np.ndarray
    ) -> tuple[list[np.ndarray], np.ndarray]:
        """Rows of every length class (as :meth:`PackedPlan._pack`) with the context side:
        items are sentences; each goes to the shortest ``L_i`` holding its source, target and
        ``window / k`` (ceiling), and rows are filled while all three fit, items taken by
        decreasing largest of the three (on the Bible's train set: 3.9% padding on the
        sentence sides and 9.9% on the context rows, against 9.9% and 15.5% ordered by
        ``max(source, target)`` alone)."""
        need = np.stack([layout.need["src"], layout.need["tgt"], self.window_length])
        widest = np.maximum(np.maximum(need[0], need[1]), -(-need[2] // self.k))
        length_class = np.searchsorted(row_lengths, widest)
        if widest.size and length_class.max() >= row_lengths.size:
            worst = int(np.argmax(widest))
            raise PackingError(
                f"sentence {worst} with its {self.k}-sentence window needs {int(need[0, worst])}"
                f"/{int(need[1, worst])} source/target slots and {int(need[2, worst])} context "
                f"slots, more than the longest row ({int(row_lengths[-1])} slots, context "
                f"{self.k} x {int(row_lengths[-1])}); lower config.data.max_src_len/max_tgt_len "
                "or raise config.data.packed_row_tokens"
            )
        rows: list[np.ndarray] = []
        class_rows = np.zeros(row_lengths.size, np.int64)
        order_by = widest
        for i, L in enumerate(row_lengths.tolist()):
            items = np.flatnonzero(length_class == i)
            if items.size:
                caps = np.array([L, L, self.k * L], np.int64)
                packed = first_fit_decreasing_sides(need, caps, items, order_by)
                rows.extend(packed)
                class_rows[i] = len(packed)
        return rows, class_rows

    def materialize(self, row_ids: np.ndarray, s: int, t: int) -> Batch:
        """The packed batch of rows ``row_ids`` ``[B, t]`` with its context rows ``[B, k*t]``
        (:data:`~docnmt_jax.data.schema.PACKED_CONTEXT_FEATURES`)."""
        out = super().materialize(row_ids, s, t)
        out.update(self.context_rows(row_ids, t))
        return out

    def context_rows(self, row_ids: np.ndarray, t: int) -> Batch:
        """The context features of rows ``row_ids`` (-1: empty), ``[B, k*t]``: each placed
        sentence's window at the end of the previous one's, in placement (segment) order."""
        ids = np.asarray(row_ids, dtype=np.int64)
        real = ids >= 0
        first = np.where(real, self.row_ptr[np.maximum(ids, 0)], 0)
        count = np.where(real, self.row_ptr[np.maximum(ids, 0) + 1] - first, 0)
        place = self.placement[segments(np.arange(self.placement.shape[0]), first, count)]
        cols = dict(zip(PLACEMENT_COLUMNS, place.T, strict=True))
        batch_row = np.repeat(np.arange(ids.size), count)
        w = self.window_length[cols["sentence"]]
        row_start = exclusive_cumsum(np.bincount(batch_row, w, minlength=ids.size).astype(np.int64))
        offset = exclusive_cumsum(w) - row_start[batch_row]
        which = np.repeat(np.arange(w.size), w)  # placed sentence of every context token
        i = np.arange(int(w.sum())) - exclusive_cumsum(w)[which]
        src = self.corpus.src
        before = exclusive_cumsum(src.lengths.astype(np.int64))
        virtual = before[self.window_first[cols["sentence"]][which]] + i
        sentence = np.searchsorted(before, virtual, side="right") - 1
        c = self.k * t
        flat = batch_row[which] * c + offset[which] + i
        values = {
            "context_src": src.tokens[src.offsets[sentence] + virtual - before[sentence]],
            "context_src_mask": 1,
            "context_positions": i,
            "context_segment_ids": cols["segment"][which],
        }
        out: Batch = {}
        for name, value in values.items():
            feature = np.zeros(ids.size * c, schema.DTYPE)
            feature[flat] = value
            out[name] = feature.reshape(ids.size, c)
        return out
