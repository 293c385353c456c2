"""Document streams in packed rows: recurrent FINAL's training batches with the chunks of
several streams in one row (docs/papers/final.md, "Training on document streams";
docs/long_documents.md, "Training speed on the Bible").

A stream is a document read chunk after chunk: its chunks come in consecutive steps under one
stream id, so the state its previous chunk left (kept per stream in the train state, ``carry``
``[N, ...]``) is the memory of the next one. A step holds at most one chunk of every stream.
A batch is ``R`` rows of ``C`` slots: ``C`` the shortest of the packing's row lengths that holds
the largest chunk, ``R = max(p, budget // C)`` a multiple of ``p = lcm(process_count,
batch_multiple)``. Row ``r`` holds the chunks of its ``G`` lanes, the streams ``r*G .. r*G +
G - 1`` (``N = R * G``), end to end in lane order, each laid as the banded packed plan lays a
chunk (:func:`~docnmt_jax.data.packed_plan.item_layout` with the packing's ``drift``); a chunk
that continues its document starts on the target side with the slots of its carried target
memory, the previous chunk's last target sentence (``tgt_sentence_index`` -1, its stream and
positions, ``tgt_chunk_positions`` counting back from -1; ``tgt_mask`` 0: never a loss term).
Features: :data:`~docnmt_jax.data.schema.PACKED_FEATURES` and the 1-based stream of every token
(:data:`~docnmt_jax.data.schema.PACKED_STREAM_FEATURES`); sentence and chunk ids are numbered
along the whole row.

Scheduling (per epoch, deterministic): the documents in order (shuffled with ``(seed, e)`` when
``config.shuffle``), step after step; at step ``n`` each row, while it has a free lane, starts
the document among the first :data:`LOOKAHEAD` waiting ones with the largest first chunk whose
chunks all fit the row beside the documents it is reading at steps ``n, n+1, ...`` (ties: the
earlier one). A started document is read to its end in consecutive steps (its room is
reserved), a lane idles only between documents, every chunk of the epoch is in one step.
Epochs therefore differ a little in length; :meth:`PackedStreamPlan.locate` walks them and
:attr:`~PackedStreamPlan.batches_per_epoch` is epoch 0's.

``config.stream_window = k > 1`` (``bptt_chunks``): batch ``w`` holds steps ``k*w .. k*w + k -
1``, step ``k*w + i`` in the columns ``i*C .. (i+1)*C - 1`` (batches ``[R, k*C]``: a process's
rows hold its streams' ``k`` steps); the epoch's last window is padded with empty steps.
Batches are :class:`~docnmt_jax.data.epochs.EpochPlan`\\ s whose ids are the chunk of every
lane at every step of the window (``[R][G][k]``, -1: none), ``s = 0`` and ``t = k*C``.

``G`` is ``config.stream_rows / R`` (rounded up) when ``stream_rows`` is set, else the chunks
of mean footprint that two rows hold.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from docnmt_jax.data import schema
from docnmt_jax.data.epochs import Batch, EpochIteration, EpochPlan, check_corpus_config, segments
from docnmt_jax.data.packed_plan import PackingError, exclusive_cumsum, item_layout, side_lengths
from docnmt_jax.data.spec import PipelineConfig
from docnmt_jax.data.tokenized import TokenizedCorpus, corpus_stats, make_chunks

#: Waiting documents a row chooses from when it starts one.
LOOKAHEAD = 32


def start_documents(
    waiting: list[int], profiles: list[list[int]], load: list[int], free: int, room: int
) -> list[int]:
    """The documents a row starts now (removed from ``waiting``; ``load`` updated): while one
    of its ``free`` lanes is left, the one among the first :data:`LOOKAHEAD` of ``waiting``
    with the largest first chunk whose ``profiles`` (slots per chunk) fit ``room`` beside
    ``load`` (slots taken at this step and the next ones); none when none fits."""
    started: list[int] = []
    while free > len(started):
        best = -1
        for j, d in enumerate(waiting[:LOOKAHEAD]):
            p = profiles[d]
            if (best < 0 or p[0] > profiles[waiting[best]][0]) and all(
                (load[i] if i < len(load) else 0) + x <= room for i, x in enumerate(p)
            ):
                best = j
        if best < 0:
            break
        d = waiting.pop(best)
        for i, x in enumerate(profiles[d]):
            if i < len(load):
                load[i] += x
            else:
                load.append(x)
        started.append(d)
    return started


class PackedStreamPlan(EpochIteration):
    """Deterministic document streams in packed rows (module docstring); step ``n`` = the
    ``n``-th global batch. The public surface of :class:`~docnmt_jax.data.packed_plan.
    PackedPlan` (``shapes`` are ``(B, L)`` pairs), and: ``stream_rows`` (``N``, the carried
    state's rows), ``rows`` (``R``), ``lanes`` (``G``), ``row_len`` (``C``), ``window``
    (``k``), ``memory`` [chunks] (carried target slots before each chunk), ``need`` [chunks]
    (each chunk's slots), :meth:`streams` (the chunk of every stream at every step)."""

    #: The features :meth:`materialize` returns, in order.
    features: tuple[str, ...] = schema.PACKED_FEATURES + schema.PACKED_STREAM_FEATURES

    def __init__(self, corpus: TokenizedCorpus, config: PipelineConfig):
        packing = config.packing
        if not config.streams or packing is None or packing.unit != "chunk":
            raise ValueError("PackedStreamPlan needs streams and PackingConfig(unit='chunk')")
        if packing.block_tokens is not None:
            raise ValueError("PackedStreamPlan lays banded rows: PackingConfig.block_tokens=None")
        check_corpus_config(corpus, config)
        if config.whole_documents or config.sentence_level or config.context_sentences:
            raise ValueError("document streams read chunks of max_sentences sentences only")
        self.corpus, self.config, self.packing = corpus, config, packing
        self.chunk_table = c = make_chunks(corpus, config)
        previous = corpus.tgt.lengths[np.maximum(c["start"] - 1, 0)].astype(np.int64)
        self.memory = np.where(c["index"] > 0, previous, 0)
        self.layout = item_layout(c, side_lengths(corpus), packing.drift, self.memory)
        self.need = np.maximum(self.layout.need["src"], self.layout.need["tgt"])
        self.row_len = self._row_length()
        p = math.lcm(config.process_count, config.batch_multiple)
        budget = min(config.batch_src_tokens, config.batch_tgt_tokens)
        self.rows = max(p, budget // self.row_len // p * p)
        self.lanes = self._lanes()
        self.stream_rows = self.rows * self.lanes
        self.window = config.stream_window
        per_doc = np.bincount(c["doc"], minlength=corpus.num_documents)
        first = exclusive_cumsum(per_doc)
        self._doc_first, self._doc_chunks = first, per_doc
        spans = zip(first.tolist(), per_doc.tolist(), strict=True)
        self._profiles = [self.need[f : f + n].tolist() for f, n in spans]
        self._lengths: dict[int, int] = {}
        self._cache: tuple[int, np.ndarray, EpochPlan] | None = None
        self.batches_per_epoch = self.epoch_batches(0)
        self.stats = dataclasses.replace(
            corpus_stats(corpus, int(c["doc"].size)),
            batches_per_epoch=self.batches_per_epoch,
            padding_fraction=self._padding_fraction(),
        )

    def _row_length(self) -> int:
        """``C``: the shortest row length of the packing that holds every chunk."""
        lengths = np.asarray(self.packing.row_lengths)
        widest = int(self.need.max(initial=0))
        i = int(np.searchsorted(lengths, widest))
        if i == lengths.size:
            raise PackingError(
                f"a chunk of a document stream needs {widest} slots (with its carried target "
                f"memory), more than the longest row ({int(lengths[-1])}); lower "
                "config.data.max_src_len/max_tgt_len/max_sentences or raise "
                "config.data.packed_row_tokens"
            )
        return int(lengths[i])

    def _lanes(self) -> int:
        """``G``: ``stream_rows / R`` rounded up, or the chunks of mean footprint in two rows."""
        if self.config.stream_rows > 0:
            return -(-self.config.stream_rows // self.rows)
        mean = float(self.need.mean()) if self.need.size else 1.0
        return max(1, math.ceil(2 * self.row_len / max(mean, 1.0)))

    def _padding_fraction(self) -> float:
        """Padding share of epoch 0's slots, both sides (every epoch holds every token)."""
        slots = 2 * self.batches_per_epoch * self.rows * self.window * self.row_len
        real = int(self.corpus.src.lengths.sum()) + int(self.corpus.tgt.lengths.sum())
        return 1.0 - real / slots if slots else 0.0

    # -- geometry -------------------------------------------------------------------------------

    @property
    def shapes(self) -> frozenset[tuple[int, int]]:
        """Global ``(B, L)`` of every batch: ``(R, k*C)``."""
        if self.batches_per_epoch == 0:
            return frozenset()
        return frozenset({(self.rows, self.window * self.row_len)})

    @property
    def local_shapes(self) -> frozenset[tuple[int, int]]:
        """``(R / process_count, k*C)`` of the batches this process materialises."""
        return frozenset((b // self.config.process_count, L) for b, L in self.shapes)

    # -- epochs ---------------------------------------------------------------------------------

    def streams(self, e: int) -> np.ndarray:
        """``[steps, N]`` chunk ids of epoch ``e`` (-1: none), stream ``r*G + g`` in column
        ``r*G + g`` (lane ``g`` of row ``r``)."""
        return self._epoch(e)[0]

    def _schedule(self, order: np.ndarray) -> np.ndarray:
        """The documents ``order`` scheduled (module docstring): ``[steps, N]`` chunk ids."""
        R, G, profiles = self.rows, self.lanes, self._profiles
        waiting = [d for d in order.tolist() if profiles[d]]
        loads: list[list[int]] = [[] for _ in range(R)]
        ends = [[0] * G for _ in range(R)]  # the step after each lane's document
        placed = []  # (document, stream, first step)
        n = 0
        while waiting:
            for r in range(R):
                free = [g for g in range(G) if ends[r][g] <= n]
                started = start_documents(waiting, profiles, loads[r], len(free), self.row_len)
                for d, g in zip(started, free[: len(started)], strict=True):
                    ends[r][g] = n + len(profiles[d])
                    placed.append((d, r * G + g, n))
                loads[r] = loads[r][1:]
            n += 1
        steps = max((s + len(profiles[d]) for d, _, s in placed), default=0)
        grid = np.full((steps, R * G), -1, np.int64)
        for d, stream, s in placed:
            count = int(self._doc_chunks[d])
            grid[s : s + count, stream] = self._doc_first[d] + np.arange(count)
        return grid

    def _epoch(self, e: int) -> tuple[np.ndarray, EpochPlan]:
        """Epoch ``e``'s streams and batches (cached)."""
        if self._cache is not None and self._cache[0] == e:
            return self._cache[1:]
        grid = self._schedule_of(e)
        k, n = self.window, self.stream_rows
        batches = -(-grid.shape[0] // k)
        windows = np.full((batches * k, n), -1, np.int64)
        windows[: grid.shape[0]] = grid
        ids = windows.reshape(batches, k, self.rows, self.lanes).transpose(0, 2, 3, 1)
        plan = EpochPlan(
            ids.reshape(-1).astype(np.int32),
            np.full(batches, n * k, np.int32),
            np.zeros(batches, np.int32),
            np.full(batches, k * self.row_len, np.int32),
        )
        self._lengths[e] = batches
        self._cache = (e, grid, plan)
        return grid, plan

    def _schedule_of(self, e: int) -> np.ndarray:
        """Epoch ``e``'s schedule (the order shuffled with ``(seed, e)`` when shuffling)."""
        cfg, n_docs = self.config, self._doc_chunks.size
        if not cfg.shuffle:
            return self._schedule(np.arange(n_docs))
        return self._schedule(np.random.default_rng((cfg.seed, e)).permutation(n_docs))

    def epoch(self, e: int) -> EpochPlan:
        """The global batches of epoch ``e`` (cached: consecutive calls are free)."""
        return self._epoch(e)[1]

    def epoch_batches(self, e: int) -> int:
        """Batches of epoch ``e`` (remembered; computing it leaves the cached epoch alone)."""
        if e not in self._lengths:
            self._lengths[e] = -(-self._schedule_of(e).shape[0] // self.window)
        return self._lengths[e]

    def locate(self, step: int) -> tuple[int, int]:
        """``(epoch, batch)`` of global step ``step``, walking the epochs' lengths."""
        e = 0
        while step >= self.epoch_batches(e):
            step -= self.epoch_batches(e)
            e += 1
        return e, step

    @property
    def num_batches(self) -> int | None:
        """Total global batches, or None when repeating forever."""
        e = self.config.num_epochs
        return None if e is None else sum(self.epoch_batches(i) for i in range(e))

    # -- materialisation ------------------------------------------------------------------------

    def materialize(self, chunk_ids: np.ndarray, s: int, t: int) -> Batch:
        """The packed batch of the lanes' chunks ``chunk_ids`` (``[rows][G][k]`` flat, -1:
        none; this process's rows) in shape ``[rows, t]`` (NumPy; ``s`` is unused, 0)."""
        del s
        k, G = self.window, self.lanes
        ids = np.asarray(chunk_ids, np.int64).reshape(-1, G, k)
        rows, C = ids.shape[0], t // k
        r, g, i = np.nonzero(ids >= 0)
        order = np.lexsort((g, i, r))  # a row's steps in order, each step's lanes in order
        r, g, i = r[order], g[order], i[order]
        chunk = ids[r, g, i]
        step = r * k + i
        before = exclusive_cumsum(self.need[chunk])
        start = i * C + before - before[np.searchsorted(step, step)]
        if np.any(start + self.need[chunk] > (i + 1) * C):
            raise ValueError(f"the chunks of a step need more than its {C} slots")
        number = np.arange(chunk.size) - np.searchsorted(r, r) + 1  # 1-based in the row
        stream = (self.config.process_index * rows + r) * G + g + 1  # 1-based, global
        out = {name: np.zeros((rows, t), schema.DTYPE) for name in self.features}
        self._place_sentences(out, chunk, r, start, number, stream, t)
        self._place_memory(out, chunk, r, start, number, stream, t)
        return out

    def _place_sentences(
        self,
        out: Batch,
        chunk: np.ndarray,
        row: np.ndarray,
        start: np.ndarray,
        number: np.ndarray,
        stream: np.ndarray,
        t: int,
    ) -> None:
        """Writes the sentences of the placed ``chunk``\\ s (at ``start`` of ``row``, numbered
        ``number``, of ``stream``) into ``out``'s packed features."""
        c, lay = self.chunk_table, self.layout
        counts = c["count"][chunk]
        sentence = segments(np.arange(self.corpus.num_sentences), c["start"][chunk], counts)
        placed = np.repeat(np.arange(chunk.size), counts)
        segment = np.arange(sentence.size) - np.searchsorted(row[placed], row[placed]) + 1
        for side, tokenized in (("src", self.corpus.src), ("tgt", self.corpus.tgt)):
            n = tokenized.lengths[sentence].astype(np.int64)
            which = np.repeat(np.arange(n.size), n)  # placed sentence of every token
            pos = np.arange(int(n.sum())) - exclusive_cumsum(n)[which]
            at = placed[which]
            flat = row[at] * t + start[at] + lay.rel[side][sentence[which]] + pos
            values = {
                side: tokenized.tokens[tokenized.offsets[sentence[which]] + pos],
                f"{side}_mask": 1,
                f"{side}_positions": pos,
                f"{side}_chunk_positions": lay.chunk_offset[side][sentence[which]] + pos,
                f"{side}_segment_ids": segment[which],
                f"{side}_chunk_ids": number[at],
                f"{side}_sentence_index": lay.slot[sentence[which]],
                f"{side}_stream": stream[at],
            }
            for name, value in values.items():
                out[name].reshape(-1)[flat] = value

    def _place_memory(
        self,
        out: Batch,
        chunk: np.ndarray,
        row: np.ndarray,
        start: np.ndarray,
        number: np.ndarray,
        stream: np.ndarray,
        t: int,
    ) -> None:
        """Writes the carried target memory slots of the continuing ``chunk``\\ s: positions
        ``0 .. m-1`` of the previous chunk's last target sentence, right before the chunk's
        first target sentence (chunk positions ``-m .. -1``, sentence index -1)."""
        m = self.memory[chunk]
        at = np.repeat(np.arange(chunk.size), m)
        pos = np.arange(int(m.sum())) - exclusive_cumsum(m)[at]
        flat = row[at] * t + start[at] + pos
        values = {
            "tgt_positions": pos,
            "tgt_chunk_positions": pos - m[at],
            "tgt_chunk_ids": number[at],
            "tgt_sentence_index": -1,
            "tgt_stream": stream[at],
        }
        for name, value in values.items():
            out[name].reshape(-1)[flat] = value
