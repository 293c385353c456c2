"""Stage 2 of the document pipeline with packed rows (docs/design/packing_plan.md §2.1):
the deterministic global plan of every epoch when ``PipelineConfig.packing`` is set.

Items are sentences (``unit="sentence"``) or the chunks of :func:`make_chunks` (``"chunk"``).
Sentences are laid into rows with the placement rule of :func:`schema.pack_grid`: with
``drift=None`` each side is contiguous over the row and an item's footprint is its
``(source, target)`` token sums; with an int ``drift`` each item starts at the same offset on
both sides and its footprint is the drift rule's larger end. Row lengths are ``L_i =
row_tokens * 2**i`` (``i < max_shapes``); each item goes to the smallest that holds it, so a
plan has at most ``max_shapes`` shapes, ``(B_i, L_i)`` with ``B_i = max(p, (budget // L_i) //
p * p)``, ``p = lcm(process_count, batch_multiple)`` and ``budget = min(batch_src_tokens,
batch_tgt_tokens)``.

Packing runs once per plan, first-fit decreasing by footprint (ties by item id), checking room
on both sides; a row keeps its items in id order. Epoch ``e`` draws from
``np.random.default_rng((seed, e))``: it shuffles the rows of each length, cuts them into
batches of ``B_i`` rows (the last batch of a length filled with empty rows, -1), and shuffles
the batch order. Nothing is dropped or promoted, the batches per epoch are constant, and resume
is ``divmod(step, batches_per_epoch)`` as in :class:`~docnmt_jax.data.batch_plan.BatchPlan`.
Batches are :class:`~docnmt_jax.data.epochs.EpochPlan`\\ s whose ids are packed row ids, with
``s = 0`` and ``t = L``; :meth:`PackedPlan.materialize` scatters a CSR placement table into the
packed features.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from docnmt_jax.data import schema
from docnmt_jax.data.epochs import Batch, EpochIteration, EpochPlan, check_corpus_config, segments
from docnmt_jax.data.spec import PackingConfig, PipelineConfig
from docnmt_jax.data.tokenized import TokenizedCorpus, corpus_stats, make_chunks
from docnmt_jax.errors import UserError

# Per placed sentence columns of the placement table (rows of PackedPlan.placement).
PLACEMENT_COLUMNS = (
    "sentence",  # global sentence id in the corpus
    "src_offset",  # first slot of its source tokens in the row
    "tgt_offset",
    "segment",  # 1-based sentence number in the row
    "chunk",  # 1-based item number in the row
    "sentence_index",  # 0-based slot of the sentence in its chunk
    "src_chunk_offset",  # source tokens of the earlier sentences of its chunk
    "tgt_chunk_offset",
)


class PackingError(UserError, ValueError):
    """The data does not fit the packing's rows (a user's config mistake: one line, no
    traceback)."""


def exclusive_cumsum(x: np.ndarray) -> np.ndarray:
    return np.cumsum(x) - x


def first_fit_decreasing(
    need_src: np.ndarray,
    need_tgt: np.ndarray,
    items: np.ndarray,
    row_len: int,
    max_items: int | None = None,
) -> list[np.ndarray]:
    """Rows (arrays of item ids, ascending) of first-fit decreasing: ``items`` taken by
    decreasing ``max(need_src, need_tgt)`` (ties by id), each into the first row with room for
    it on both sides (and fewer than ``max_items`` items), else into a new row."""
    size = np.maximum(need_src[items], need_tgt[items])
    order = items[np.lexsort((items, -size))]
    room_src = np.full(order.size, row_len, np.int64)
    room_tgt = np.full(order.size, row_len, np.int64)
    room_items = np.full(order.size, max_items or order.size, np.int64)
    row_of = np.empty(order.size, np.int64)
    smallest_src, smallest_tgt = need_src[items].min(), need_tgt[items].min()
    lo = n_rows = 0  # rows before ``lo`` have no room for any item
    for j, item in enumerate(order.tolist()):
        a, b = need_src[item], need_tgt[item]
        fits = (room_src[lo:n_rows] >= a) & (room_tgt[lo:n_rows] >= b) & (room_items[lo:n_rows] > 0)
        r = lo + int(np.argmax(fits)) if n_rows > lo else n_rows
        if r >= n_rows or not fits[r - lo]:
            r = n_rows
            n_rows += 1
        room_src[r] -= a
        room_tgt[r] -= b
        room_items[r] -= 1
        row_of[j] = r
        while lo < n_rows and (
            room_src[lo] < smallest_src or room_tgt[lo] < smallest_tgt or room_items[lo] == 0
        ):
            lo += 1
    by_row = np.lexsort((order, row_of))
    bounds = np.searchsorted(row_of[by_row], np.arange(n_rows + 1))
    return [order[by_row[bounds[r] : bounds[r + 1]]] for r in range(n_rows)]


SIDES = ("src", "tgt")


def side_lengths(corpus: TokenizedCorpus) -> dict[str, np.ndarray]:
    """Tokens of every sentence (EOS included), int64, per side."""
    return {"src": corpus.src.lengths.astype(np.int64), "tgt": corpus.tgt.lengths.astype(np.int64)}


@dataclasses.dataclass(frozen=True)
class ItemLayout:
    """Where the sentences of the packed items (the chunk table's rows) sit: ``item_of`` and
    ``slot`` (the item of every sentence and its index there), ``chunk_offset`` (per side,
    tokens of the item's earlier sentences), ``rel`` (per side, the sentence's first slot
    relative to its item's start) and ``need`` (per side, each item's footprint)."""

    item_of: np.ndarray
    slot: np.ndarray
    chunk_offset: dict[str, np.ndarray]
    rel: dict[str, np.ndarray]
    need: dict[str, np.ndarray]


def item_layout(
    chunk_table: dict[str, np.ndarray],
    lengths: dict[str, np.ndarray],
    drift: int | None,
    lead: np.ndarray | None = None,
) -> ItemLayout:
    """The :class:`ItemLayout` of the items of ``chunk_table`` (sentence ``lengths`` per side):
    with ``drift`` None each side contiguous (footprints: the token sums); with an int each
    sentence starts at ``max(own side's end, other side's end - drift)`` on each side and both
    sides' footprint is the larger end (module docstring). ``lead`` [items]: target slots kept
    free before each item's first sentence (a carried memory's, :mod:`.packed_stream_plan`)."""
    c = chunk_table
    n_items, n_sent = int(c["doc"].size), int(lengths["src"].size)
    lead = np.zeros(n_items, np.int64) if lead is None else lead.astype(np.int64)
    item_of = np.repeat(np.arange(n_items), c["count"])  # sentences are in chunk order
    slot = np.arange(n_sent) - c["start"][item_of]
    chunk_offset = {}
    for side, n in lengths.items():
        before = exclusive_cumsum(n)
        chunk_offset[side] = before - before[c["start"]][item_of] if n_sent else before
    if drift is None:
        need = {
            side: np.bincount(item_of, n, minlength=n_items).astype(np.int64)
            for side, n in lengths.items()
        }
        need["tgt"] += lead
        rel = dict(chunk_offset, tgt=chunk_offset["tgt"] + lead[item_of])
        return ItemLayout(item_of, slot, chunk_offset, rel, need)
    rel = {side: np.zeros(n_sent, np.int64) for side in lengths}
    end_s, end_t = np.zeros(n_items, np.int64), lead.copy()
    for k in range(int(c["count"].max(initial=0))):
        at = np.flatnonzero(slot == k)
        it = item_of[at]
        o_s = np.maximum(end_s[it], end_t[it] - drift)
        o_t = np.maximum(end_t[it], end_s[it] - drift)
        rel["src"][at], rel["tgt"][at] = o_s, o_t
        end_s[it], end_t[it] = o_s + lengths["src"][at], o_t + lengths["tgt"][at]
    foot = np.maximum(end_s, end_t)
    return ItemLayout(item_of, slot, chunk_offset, rel, {"src": foot, "tgt": foot})


class PackedPlan(EpochIteration):
    """Deterministic global plan of packed batches over epochs; step ``n`` = the ``n``-th
    global batch. The same public surface as :class:`~docnmt_jax.data.batch_plan.BatchPlan`,
    except that :attr:`shapes` and :attr:`local_shapes` are ``(B, L)`` pairs and
    :meth:`materialize` returns :data:`schema.PACKED_FEATURES`. ``pad_batch`` and
    ``sequential_sentences`` do not apply (every epoch pads its last batch per length with
    empty rows).

    Besides: ``chunk_table`` (the items, :func:`make_chunks`), ``item_rows[r]`` (item ids of
    packed row ``r``, ascending), ``num_rows``, ``row_lengths`` (``L_i``), ``row_len`` [rows],
    and the CSR placement table: row ``r`` places the sentences
    ``placement[row_ptr[r]:row_ptr[r + 1]]``, columns :data:`PLACEMENT_COLUMNS`."""

    #: The features :meth:`materialize` returns, in order.
    features: tuple[str, ...] = schema.PACKED_FEATURES

    def __init__(self, corpus: TokenizedCorpus, config: PipelineConfig):
        if config.packing is None:
            raise ValueError("PackedPlan needs PipelineConfig.packing")
        check_corpus_config(corpus, config)
        self.corpus = corpus
        self.config = config
        self.packing: PackingConfig = config.packing
        unit_config = config
        if self.packing.unit == "sentence":
            unit_config = dataclasses.replace(config, sentence_level=True)
        self.chunk_table = make_chunks(corpus, unit_config)
        layout = item_layout(self.chunk_table, side_lengths(corpus), self.packing.drift)
        row_lengths = np.asarray(self.packing.row_lengths, np.int64)
        rows, class_rows = self._pack(layout, row_lengths)
        self.num_rows = len(rows)
        self.row_lengths = tuple(int(x) for x in row_lengths)
        self._class_rows = class_rows
        self._class_first = exclusive_cumsum(class_rows)
        self.row_len = np.repeat(row_lengths, class_rows)  # [rows]
        p = math.lcm(config.process_count, config.batch_multiple)
        budget = min(config.batch_src_tokens, config.batch_tgt_tokens)
        self._class_b = np.array([max(p, budget // L // p * p) for L in self.row_lengths])
        self._class_batches = -(-class_rows // self._class_b)
        self.batches_per_epoch = int(self._class_batches.sum())
        self.placement, self.row_ptr = self._placement(rows, layout)
        self.item_rows = rows
        real = int(corpus.src.lengths.sum()) + int(corpus.tgt.lengths.sum())
        slots = 2 * int((self._class_batches * self._class_b * row_lengths).sum())
        self.padding_fraction = 1.0 - real / slots if slots else 0.0
        self.stats = dataclasses.replace(
            corpus_stats(corpus, int(self.chunk_table["doc"].size)),
            batches_per_epoch=self.batches_per_epoch,
            padding_fraction=self.padding_fraction,
        )
        self._cache: tuple[int, EpochPlan] | None = None

    def _pack(
        self, layout: ItemLayout, row_lengths: np.ndarray
    ) -> tuple[list[np.ndarray], np.ndarray]:
        """Rows of every length class, class by class (row ``r`` holds items ``rows[r]``, in id
        order), and the rows per class: each item in the shortest row length that holds it."""
        need = layout.need
        widest = np.maximum(need["src"], need["tgt"])
        length_class = np.searchsorted(row_lengths, widest)
        if widest.size and length_class.max() >= row_lengths.size:
            worst = int(np.argmax(widest))
            raise PackingError(
                f"a packed {self.packing.unit} needs {int(widest[worst])} slots, more than the "
                f"longest row ({int(row_lengths[-1])} = packing row_tokens "
                f"{self.packing.row_tokens} * 2**{row_lengths.size - 1}); lower "
                "config.data.max_src_len/max_tgt_len/max_sentences or raise "
                "config.data.packed_row_tokens"
            )
        rows: list[np.ndarray] = []
        class_rows = np.zeros(row_lengths.size, np.int64)
        for i, L in enumerate(row_lengths.tolist()):
            items = np.flatnonzero(length_class == i)
            if items.size:
                packed = first_fit_decreasing(need["src"], need["tgt"], items, L)
                rows.extend(packed)
                class_rows[i] = len(packed)
        return rows, class_rows

    def _placement(
        self, rows: list[np.ndarray], layout: ItemLayout
    ) -> tuple[np.ndarray, np.ndarray]:
        """The placement table of ``rows`` (columns :data:`PLACEMENT_COLUMNS`) and its CSR row
        pointers: a row's items end to end in id order, each item's sentences where
        ``layout.rel`` puts them."""
        c, n_sent = self.chunk_table, self.corpus.num_sentences
        items_per_row = np.array([r.size for r in rows], np.int64)
        item_order = np.concatenate(rows) if rows else np.zeros(0, np.int64)
        item_row = np.repeat(np.arange(len(rows)), items_per_row)
        first_item = exclusive_cumsum(items_per_row)
        item_rank = np.arange(item_order.size) - first_item[item_row]  # 0-based in its row
        item_start = {}
        for side in SIDES:
            before = exclusive_cumsum(layout.need[side][item_order])
            item_start[side] = before - before[first_item][item_row] if before.size else before
        counts = c["count"][item_order]
        sentence = segments(np.arange(n_sent), c["start"][item_order], counts)
        placed_item = np.repeat(np.arange(item_order.size), counts)  # index into item_order
        row_of_sentence = item_row[placed_item]
        sentences_per_row = np.bincount(row_of_sentence, minlength=len(rows))
        row_ptr = np.concatenate([[0], np.cumsum(sentences_per_row)]).astype(np.int64)
        table = {
            "sentence": sentence,
            "src_offset": item_start["src"][placed_item] + layout.rel["src"][sentence],
            "tgt_offset": item_start["tgt"][placed_item] + layout.rel["tgt"][sentence],
            "segment": np.arange(sentence.size) - row_ptr[row_of_sentence] + 1,
            "chunk": item_rank[placed_item] + 1,
            "sentence_index": layout.slot[sentence],
            "src_chunk_offset": layout.chunk_offset["src"][sentence],
            "tgt_chunk_offset": layout.chunk_offset["tgt"][sentence],
        }
        return np.stack([table[k] for k in PLACEMENT_COLUMNS], axis=1), row_ptr

    # -- geometry -------------------------------------------------------------------------------

    @property
    def shapes(self) -> frozenset[tuple[int, int]]:
        """Global ``(B, L)`` of every batch the plan produces (the same in every epoch)."""
        return frozenset(
            (int(self._class_b[i]), self.row_lengths[i]) for i in np.flatnonzero(self._class_rows)
        )

    @property
    def local_shapes(self) -> frozenset[tuple[int, int]]:
        """``(B / process_count, L)`` of the batches this process materialises."""
        return frozenset((b // self.config.process_count, L) for b, L in self.shapes)

    def epoch(self, e: int) -> EpochPlan:
        """The global batches of epoch ``e`` (cached: consecutive calls are free)."""
        if self._cache is not None and self._cache[0] == e:
            return self._cache[1]
        cfg = self.config
        rng = np.random.default_rng((cfg.seed, e))
        pools = []
        for i, n in enumerate(self._class_rows.tolist()):
            rows = self._class_first[i] + np.arange(n)
            if cfg.shuffle:
                rows = rng.permutation(rows)
            fill = int(self._class_batches[i] * self._class_b[i]) - n
            pools.append(np.concatenate([rows, np.full(fill, -1, np.int64)]))
        ids = np.concatenate(pools).astype(np.int32) if pools else np.zeros(0, np.int32)
        length_class = np.repeat(np.arange(len(self.row_lengths)), self._class_batches)
        sizes = self._class_b[length_class]
        if cfg.shuffle:
            perm = rng.permutation(length_class.size)
            ids = segments(ids, exclusive_cumsum(sizes)[perm], sizes[perm])
            length_class, sizes = length_class[perm], sizes[perm]
        t = np.asarray(self.row_lengths, np.int32)[length_class]
        plan = EpochPlan(ids, sizes.astype(np.int32), np.zeros_like(t), t)
        self._cache = (e, plan)
        return plan

    # -- materialisation ------------------------------------------------------------------------

    def materialize(self, row_ids: np.ndarray, s: int, t: int) -> Batch:
        """The packed batch of rows ``row_ids`` (-1 = empty row) in shape ``[B, t]`` (NumPy;
        ``s`` is unused, 0 in the epoch plans)."""
        del s
        ids = np.asarray(row_ids, dtype=np.int64)
        real = ids >= 0
        if real.any() and self.row_len[ids[real]].max() > t:
            raise ValueError(f"rows of length {self.row_len[ids[real]].max()} asked in {t} slots")
        first = np.where(real, self.row_ptr[np.maximum(ids, 0)], 0)
        count = np.where(real, self.row_ptr[np.maximum(ids, 0) + 1] - first, 0)
        place = self.placement[segments(np.arange(self.placement.shape[0]), first, count)]
        batch_row = np.repeat(np.arange(ids.size), count)
        cols = dict(zip(PLACEMENT_COLUMNS, place.T, strict=True))
        out: Batch = {}
        for side, tokenized in (("src", self.corpus.src), ("tgt", self.corpus.tgt)):
            n = tokenized.lengths[cols["sentence"]].astype(np.int64)
            which = np.repeat(np.arange(n.size), n)  # placed sentence of every token
            i = np.arange(int(n.sum())) - exclusive_cumsum(n)[which]
            flat = batch_row[which] * t + cols[f"{side}_offset"][which] + i
            values = {
                side: tokenized.tokens[tokenized.offsets[cols["sentence"]][which] + i],
                f"{side}_mask": 1,
                f"{side}_positions": i,
                f"{side}_chunk_positions": cols[f"{side}_chunk_offset"][which] + i,
                f"{side}_segment_ids": cols["segment"][which],
                f"{side}_chunk_ids": cols["chunk"][which],
                f"{side}_sentence_index": cols["sentence_index"][which],
            }
            for name, value in values.items():
                feature = np.zeros(ids.size * t, schema.DTYPE)
                feature[flat] = value
                out[name] = feature.reshape(ids.size, t)
        return {k: out[k] for k in schema.PACKED_FEATURES}
