"""Document streams on the ``[B, S, T]`` grid: every batch row continues the document the same
row held at the previous step, one chunk per step, so a model that carries state across chunks
(recurrent FINAL, :mod:`docnmt_jax.models.final_recurrence`) is trained and decoded on
documents of any length with a state of fixed size.

Epoch ``e`` orders the documents (shuffled with ``(seed, e)`` when ``config.shuffle``) and deals
them out to the ``B`` streams, each document to the stream that holds the fewest chunks so far.
Step ``n`` of the epoch is the ``n``-th chunk of every stream; a stream that has run out holds
a padding row (-1). The row feature ``chunk_index`` tells a row whose chunk continues the
previous step's chunk of the same row (``> 0``) from a document's start (0) or padding (-1).

Every epoch has the same number of steps, ``ceil(C / B) + D - 1`` for ``C`` chunks and a
longest document of ``D`` chunks: the bound of the dealing (the last document is dealt to a
stream that held at most ``(C - d) / B`` chunks), so an epoch's padding is at most ``D - 1``
rows per stream. Without shuffling (evaluation, decoding) every epoch is the same and has
exactly as many steps as its longest stream. ``B`` is ``config.stream_rows``, or, when 0,
the token budget over ``S`` sentences of the corpus's mean padded length.

``config.stream_window = k > 1`` (back-propagation through ``k`` chunks, recurrent FINAL's
``bptt_chunks``): batch ``w`` holds steps ``k*w .. k*w + k - 1`` of every stream, stream ``b``'s
chunk ``i`` at row ``b*k + i`` (a process's rows hold whole streams), ``k * B`` rows, the
buckets those of the window's largest chunk; the epoch's last window is padded with empty steps.

The ``T`` bucket of a step holds every sentence of its chunks and, for a row that continues,
the target of the previous chunk's last sentence (the state a model carries is that long);
``S`` is the bucket of the step's largest chunk (in training always ``max_sentences``: nearly
every step has a full chunk, and one shape less per length compiles sooner).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from docnmt_jax.data.batch_plan import BatchPlan
from docnmt_jax.data.epochs import EpochPlan, check_corpus_config
from docnmt_jax.data.spec import PipelineConfig
from docnmt_jax.data.tokenized import TokenizedCorpus, corpus_stats, make_chunks


def stream_rows(corpus: TokenizedCorpus, config: PipelineConfig) -> int:
    """``B``: ``config.stream_rows``, or the token budget over ``S`` sentences (one sentence
    with ``sequential_sentences``: a search takes one sentence of every row at a time) of the
    mean sentence length (either side, rounded up to a length bucket); a multiple of the
    processes and ``batch_multiple``."""
    p = int(np.lcm(config.process_count, config.batch_multiple))
    if config.stream_rows > 0:
        rows = config.stream_rows
    else:
        lengths = np.maximum(corpus.src.lengths, corpus.tgt.lengths)
        mean = float(lengths.mean()) if lengths.size else 1.0
        buckets = np.asarray(config.t_buckets)
        t = int(buckets[min(np.searchsorted(buckets, mean), buckets.size - 1)])
        budget = min(config.batch_src_tokens, config.batch_tgt_tokens)
        per_row = t if config.sequential_sentences else config.sentences_per_chunk * t
        rows = budget // per_row
    return max(p, rows // p * p)


class StreamPlan(BatchPlan):
    """Deterministic document streams over epochs (module docstring); batches materialise
    like :class:`~docnmt_jax.data.batch_plan.BatchPlan`'s."""

    def __init__(self, corpus: TokenizedCorpus, config: PipelineConfig):
        check_corpus_config(corpus, config)
        if config.whole_documents or config.sentence_level or config.context_sentences:
            raise ValueError("document streams read chunks of max_sentences sentences only")
        self.corpus, self.config = corpus, config
        self.chunk_table = c = make_chunks(corpus, config)
        self.stream_rows = stream_rows(corpus, config)
        self._s_buckets = np.asarray(config.s_buckets)
        self._t_buckets = np.asarray(config.t_buckets)
        per_doc = np.bincount(c["doc"], minlength=corpus.num_documents)
        self._doc_first = np.concatenate([[0], np.cumsum(per_doc)[:-1]]).astype(np.int64)
        self._doc_chunks = per_doc.astype(np.int64)
        # A continuing chunk's T holds the previous chunk's last target sentence.
        last_tgt = corpus.tgt.lengths[np.maximum(c["start"] - 1, 0)]
        self._step_len = np.where(c["index"] > 0, np.maximum(c["longest"], last_tgt), c["longest"])
        total, longest = int(c["doc"].size), int(per_doc.max(initial=0))
        #: chunks of each stream an epoch holds (one a stream step)
        self.stream_steps = -(-total // self.stream_rows) + longest - 1 if total else 0
        if not config.shuffle and total:  # every epoch is the same: no padding steps at its end
            self.stream_steps = int(self._deal(np.arange(per_doc.size))[1].max())
        self.window = config.stream_window
        self.batches_per_epoch = -(-self.stream_steps // self.window)
        self._cache: tuple[int, EpochPlan] | None = None
        self._tables = None
        self.stats = corpus_stats(corpus, total)
        self.stats = dataclasses.replace(
            self.stats,
            batches_per_epoch=self.batches_per_epoch,
            padding_fraction=self._padding_fraction(),
        )

    @property
    def shapes(self) -> frozenset[tuple[int, int, int]]:
        """Global ``(B, S, T)`` of every batch the plan can produce: each step's buckets."""
        if self.batches_per_epoch == 0:
            return frozenset()
        ep = self.epoch(0)
        return frozenset(zip(ep.sizes.tolist(), ep.s.tolist(), ep.t.tolist(), strict=True))

    def streams(self, e: int) -> np.ndarray:
        """``[steps, B]`` chunk ids of epoch ``e`` (-1: padding), stream ``b`` in column ``b``."""
        cfg, n_docs = self.config, self._doc_chunks.size
        rng = np.random.default_rng((cfg.seed, e))
        order = rng.permutation(n_docs) if cfg.shuffle else np.arange(n_docs)
        grid, _ = self._deal(order)
        return grid[: self.stream_steps]

    def _deal(self, order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The documents ``order`` dealt out to the streams: ``[steps, B]`` chunk ids (the
        bound of the module docstring; -1: padding) and each stream's chunk count."""
        total, longest = int(self._doc_chunks.sum()), int(self._doc_chunks.max(initial=0))
        steps = -(-total // self.stream_rows) + longest - 1 if total else 0
        grid = np.full((steps, self.stream_rows), -1, np.int64)
        load = np.zeros(self.stream_rows, np.int64)
        for d in order[self._doc_chunks[order] > 0].tolist():
            b = int(np.argmin(load))  # the first of the least-loaded streams
            n = int(self._doc_chunks[d])
            first = int(self._doc_first[d])
            grid[load[b] : load[b] + n, b] = np.arange(first, first + n)
            load[b] += n
        return grid, load

    def epoch(self, e: int) -> EpochPlan:
        """The global batches of epoch ``e`` (cached): ``window`` consecutive steps of every
        stream each, stream ``b``'s chunks at rows ``b*k .. b*k+k-1`` (``k = window``; the
        epoch's last window padded with empty steps)."""
        if self._cache is not None and self._cache[0] == e:
            return self._cache[1]
        k, rows = self.window, self.stream_rows
        steps = self.streams(e)
        grid = np.full((self.batches_per_epoch * k, rows), -1, np.int64)
        grid[: steps.shape[0]] = steps
        grid = grid.reshape(-1, k, rows).transpose(0, 2, 1).reshape(-1, k * rows)
        real = grid >= 0
        safe = np.maximum(grid, 0)
        count = np.where(real, self.chunk_table["count"][safe], 0).max(axis=1, initial=1)
        longest = np.where(real, self._step_len[safe], 0).max(axis=1, initial=1)
        sb, tb = self._s_buckets, self._t_buckets
        if self.config.shuffle:  # training: S fixed, fewer shapes to compile (rows are full)
            sb = sb[-1:]
        s = sb[np.minimum(np.searchsorted(sb, count), sb.size - 1)]
        t = tb[np.minimum(np.searchsorted(tb, longest), tb.size - 1)]
        sizes = np.full(grid.shape[0], k * rows, np.int32)
        plan = EpochPlan(
            grid.reshape(-1).astype(np.int32), sizes, s.astype(np.int32), t.astype(np.int32)
        )
        self._cache = (e, plan)
        return plan
