"""Packed rows whose batches keep every chunk whole (``PackingConfig(unit="grouped")``): the
training layout of models whose context is a whole document but whose computation is per
sentence (HM-GDC, Tan et al. 2019).

A :class:`~docnmt_jax.data.packed_plan.PackedPlan` of chunks lays a chunk in one row, so a
whole Bible chapter becomes one long row and every per-sentence attention pays for the row.
Here the items are the sentences, laid into rows of ``row_tokens`` slots like the sentence
Transformer's, and the planner keeps the sentences of one chunk (one whole document with
``PipelineConfig.whole_documents``) inside ONE batch, so a model can gather a document's
sentences across the rows of its batch (the packed ``chunk_ids`` number the chunks of a
batch from 1, the same in every row of the batch; ``sentence_index`` is the sentence's slot in
its chunk; ``segment_ids`` number the sentences of a row).

The plan, built once (deterministic):

1. Groups: chunks by decreasing footprint ``max(source, target tokens)`` (ties by id), each
   into the first group with room (first fit) among groups of ``B`` rows (``B`` = the token
   budget over ``row_tokens``, a multiple of ``lcm(process_count, batch_multiple)``); a chunk
   larger than ``B * row_tokens`` opens a group of ``B * 2**i`` rows, the smallest that holds
   it (``i < max_shapes``, so at most ``max_shapes`` shapes, all ``L = row_tokens``).
2. Rows: each group's sentences by first-fit decreasing into rows (room on both sides, at
   most ``max_row_sentences`` a row). A group that needs more rows than it has gives its
   smallest chunk back (refiled by step 1 after the others); a single chunk that does not fit
   moves to the next size. Nothing is dropped.

Each epoch shuffles the batch order (seeded by ``(seed, epoch)``); a batch's rows are fixed,
padded with empty rows (-1) to its size; batches per epoch are constant, so resuming is
``divmod(step, batches_per_epoch)`` as in the other plans.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from docnmt_jax.data.epochs import EpochPlan, check_corpus_config
from docnmt_jax.data.packed_plan import (
    PLACEMENT_COLUMNS,
    ItemLayout,
    PackedPlan,
    PackingError,
    exclusive_cumsum,
    first_fit_decreasing,
    item_layout,
    side_lengths,
)
from docnmt_jax.data.spec import PipelineConfig
from docnmt_jax.data.tokenized import TokenizedCorpus, corpus_stats, make_chunks


def _group_chunks(
    footprint: np.ndarray, chunks: np.ndarray, capacity: list[int]
) -> list[tuple[list[int], int]]:
    """First fit decreasing of ``chunks`` by ``footprint`` into groups ``(chunk ids, size
    class)``: class 0 groups hold ``capacity[0]`` tokens; a larger chunk gets a group of the
    smallest class that holds it, alone."""
    order = chunks[np.lexsort((chunks, -footprint[chunks]))]
    groups: list[tuple[list[int], int]] = []
    room = np.zeros(order.size, np.int64)  # class-0 groups' room, in opening order
    class0: list[int] = []  # index into ``groups`` of each class-0 group
    for chunk in order.tolist():
        need = int(footprint[chunk])
        if need > capacity[0]:
            size = next((i for i, c in enumerate(capacity) if c >= need), None)
            if size is None:
                raise PackingError(
                    f"a chunk of {need} tokens does not fit the largest grouped batch "
                    f"({capacity[-1]} slots); raise config.data.batch_src_tokens/"
                    "batch_tgt_tokens or config.data.packed_row_tokens"
                )
            groups.append(([chunk], size))
            continue
        n = len(class0)
        fits = np.flatnonzero(room[:n] >= need)
        if fits.size:
            g = int(fits[0])
        else:
            g, room[n] = n, capacity[0]
            class0.append(len(groups))
            groups.append(([], 0))
        groups[class0[g]][0].append(chunk)
        room[g] -= need
    return groups


#: Share of a batch's slots that step 1 fills with chunk footprints; the rest absorbs the
#: rows' fragmentation in step 2 (fuller groups give chunks back, and those fill poorly).
GROUP_FILL = 0.95


class GroupedPackedPlan(PackedPlan):
    """The plan of ``PackingConfig(unit="grouped")`` (module docstring). The surface of
    :class:`PackedPlan` (``shapes`` are ``(B, L)`` pairs, :meth:`materialize` returns
    ``schema.PACKED_FEATURES``); besides ``groups`` (per batch: its chunk ids and its rows)."""

    def __init__(self, corpus: TokenizedCorpus, config: PipelineConfig):
        if config.packing is None or config.packing.unit != "grouped":
            raise ValueError("GroupedPackedPlan needs PackingConfig(unit='grouped')")
        check_corpus_config(corpus, config)
        self.corpus, self.config, self.packing = corpus, config, config.packing
        L = self.packing.row_tokens
        self.chunk_table = c = make_chunks(corpus, config)
        lengths = side_lengths(corpus)
        if corpus.num_sentences and max(lengths["src"].max(), lengths["tgt"].max()) > L:
            raise PackingError(
                f"a sentence of {int(max(lengths['src'].max(), lengths['tgt'].max()))} tokens "
                f"does not fit a packed row of {L} slots; lower config.data.max_src_len/"
                "max_tgt_len or raise config.data.packed_row_tokens"
            )
        layout = item_layout(c, lengths, None)
        p = math.lcm(config.process_count, config.batch_multiple)
        budget = min(config.batch_src_tokens, config.batch_tgt_tokens)
        base = max(p, budget // L // p * p)
        self._class_b = np.array([base * 2**i for i in range(self.packing.max_shapes)])
        self.groups = self._group(np.maximum(layout.need["src"], layout.need["tgt"]), lengths)

        # Rows (group by group) and the placement table (CSR over rows).
        rows = [r for _, group_rows, _ in self.groups for r in group_rows]
        self.num_rows = len(rows)
        self.row_lengths = (L,)
        self.row_len = np.full(self.num_rows, L, np.int64)
        self.item_rows = [np.unique(layout.item_of[r]) for r in rows]
        self._group_size = np.array([g[2] for g in self.groups], np.int64)
        self._group_rows = np.array([len(g[1]) for g in self.groups], np.int64)
        self.batches_per_epoch = len(self.groups)
        self.placement, self.row_ptr = self._grouped_placement(rows, layout, lengths)
        real = int(lengths["src"].sum() + lengths["tgt"].sum())
        slots = 2 * L * int(self._class_b[self._group_size].sum())
        self.padding_fraction = 1.0 - real / slots if slots else 0.0
        self.stats = dataclasses.replace(
            corpus_stats(corpus, int(c["doc"].size)),
            batches_per_epoch=self.batches_per_epoch,
            padding_fraction=self.padding_fraction,
        )
        self._cache = None

    def _group(
        self, footprint: np.ndarray, lengths: dict[str, np.ndarray]
    ) -> list[tuple[np.ndarray, list[np.ndarray], int]]:
        """The batches as ``(chunk ids, rows of sentence ids, size class)`` (module docstring,
        steps 1-2), ordered by first chunk id."""
        c, L = self.chunk_table, self.packing.row_tokens
        capacity = [int(b * L * GROUP_FILL) for b in self._class_b]
        groups: list[tuple[np.ndarray, list[np.ndarray], int]] = []
        pending = np.arange(int(c["doc"].size))
        while pending.size:
            returned: list[int] = []
            for chunks, size in _group_chunks(footprint, pending, capacity):
                chunks = sorted(chunks)
                while True:
                    sentences = np.concatenate(
                        [np.arange(c["start"][k], c["start"][k] + c["count"][k]) for k in chunks]
                    )
                    rows = first_fit_decreasing(
                        lengths["src"], lengths["tgt"], sentences, L, self.packing.max_row_sentences
                    )
                    if len(rows) <= self._class_b[size]:
                        break
                    if len(chunks) > 1:
                        smallest = min(chunks, key=lambda k: (footprint[k], -k))
                        chunks.remove(smallest)
                        returned.append(smallest)
                    elif size + 1 < len(capacity):
                        size += 1
                    else:
                        raise PackingError(
                            f"a chunk needs {len(rows)} packed rows of {L} slots, more than "
                            f"the largest grouped batch ({int(self._class_b[-1])} rows); raise "
                            "config.data.batch_src_tokens/batch_tgt_tokens"
                        )
                groups.append((np.asarray(chunks, np.int64), rows, size))
            pending = np.asarray(sorted(returned), np.int64)
        groups.sort(key=lambda g: int(g[0][0]))  # deterministic, by first chunk id
        return groups

    def _grouped_placement(
        self, rows: list[np.ndarray], layout: ItemLayout, lengths: dict[str, np.ndarray]
    ) -> tuple[np.ndarray, np.ndarray]:
        """The placement table of ``rows`` (sentences end to end in each row; chunks numbered
        from 1 within their batch) and its CSR row pointers."""
        sentence = np.concatenate(rows) if rows else np.zeros(0, np.int64)
        per_row = np.array([r.size for r in rows], np.int64)
        row_ptr = np.concatenate([[0], np.cumsum(per_row)]).astype(np.int64)
        row_of = np.repeat(np.arange(len(rows)), per_row)
        rank = {}  # chunk -> 1-based number in its batch
        for chunks, _, _ in self.groups:
            rank.update({int(k): i + 1 for i, k in enumerate(chunks)})
        chunk_number = np.array(
            [rank[k] for k in range(int(self.chunk_table["doc"].size))], np.int64
        )
        table = {
            "sentence": sentence,
            "segment": np.arange(sentence.size) - row_ptr[row_of] + 1,
            "chunk": chunk_number[layout.item_of[sentence]],
            "sentence_index": layout.slot[sentence],
        }
        for side, n in lengths.items():
            before_in_row = exclusive_cumsum(n[sentence])
            table[f"{side}_offset"] = before_in_row - before_in_row[row_ptr[row_of]]
            table[f"{side}_chunk_offset"] = layout.chunk_offset[side][sentence]
        return np.stack([table[k] for k in PLACEMENT_COLUMNS], axis=1), row_ptr

    @property
    def shapes(self) -> frozenset[tuple[int, int]]:
        """Global ``(B, L)`` of every batch the plan produces (the same in every epoch)."""
        L = self.row_lengths[0]
        return frozenset((int(self._class_b[i]), L) for i in np.unique(self._group_size))

    def epoch(self, e: int) -> EpochPlan:
        """The batches of epoch ``e``: every group once, in an order shuffled by ``(seed, e)``."""
        if self._cache is not None and self._cache[0] == e:
            return self._cache[1]
        order = np.arange(len(self.groups))
        if self.config.shuffle:
            order = np.random.default_rng((self.config.seed, e)).permutation(order)
        first_row = exclusive_cumsum(self._group_rows)
        parts = []
        for g in order.tolist():
            b, n = int(self._class_b[self._group_size[g]]), int(self._group_rows[g])
            parts += [first_row[g] + np.arange(n), np.full(b - n, -1, np.int64)]
        ids = np.concatenate(parts).astype(np.int32) if parts else np.zeros(0, np.int32)
        sizes = self._class_b[self._group_size[order]].astype(np.int32)
        t = np.full(order.size, self.row_lengths[0], np.int32)
        plan = EpochPlan(ids, sizes, np.zeros_like(t), t)
        self._cache = (e, plan)
        return plan
