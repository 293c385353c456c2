"""The tf.data document pipeline: documents -> chunks -> bucketed, padded int32 batches.

Stages (each usable on its own):

1. :func:`tokenize_corpus` encodes every sentence once (one batched ``encode`` call per side),
   appends EOS and truncates sentences longer than the maximum (``max_len - 1`` tokens + EOS,
   with a counted warning). Tokens are kept flat: one int32 array per side plus per-sentence
   offsets/lengths, so batch materialisation is a pair of vectorised gathers.
2. :func:`plan_batches` cuts documents into consecutive chunks of at most ``S`` sentences
   (sentences ``0..S-1``, ``S..2S-1``, ...; one chunk per sentence in ``sentence_level``
   mode), assigns each chunk a bucket ``(S_bucket, T_bucket)`` (``T`` shared by source and
   target) and builds the deterministic global batch plan of every epoch. The plan is pure
   NumPy, identical on every host, and cheap to evaluate at any step (resume = index
   arithmetic: every epoch has the same number of batches).
3. :func:`make_dataset` turns the plan into a ``tf.data.Dataset`` of batches. Python runs
   once per *epoch*: a generator yields that epoch's chunk ids (flat, with batch sizes), which
   TF splits into one element per batch (ragged ``unbatch``); batches are materialised by a TF
   graph function (parallel ``map``: no Python and no GIL per batch), then prefetched. This
   measured faster than ``from_generator`` over NumPy-materialised batches (about 2x) and than
   ``Dataset.range`` + ``numpy_function`` (about 1.5x). :func:`numpy_batches` is an equivalent
   pure-NumPy iterator without TF (cheapest in CPU time, but it runs in the caller's thread).

Batch features (int32; ``B`` = rows on this host, ``S`` sentences, ``T`` tokens):
``src``/``tgt`` [B,S,T] ids, every sentence ends with EOS, PAD=0 after;
``src_mask``/``tgt_mask`` [B,S,T] 1 on real tokens; ``src_positions``/``tgt_positions``
[B,S,T] position inside its own sentence (0 on padding); ``src_segment_ids``/
``tgt_segment_ids`` [B,S,T] 1-based sentence number within the chunk (0 on padding);
``sentence_mask`` [B,S]; ``doc_index`` [B] index into the input document list;
``chunk_index`` [B] chunk number within its document; ``sentence_offset`` [B] index in its
document of the chunk's first sentence. The three [B] features are -1 on padding rows.

Batch sizes: ``B = max(1, min(batch_src_tokens, batch_tgt_tokens) // (S*T))`` rounded down to
a multiple of ``lcm(process_count, batch_multiple)`` (at least that), so ``B*S*T`` never exceeds
the budget except when that many rows are already larger than it (``batch_multiple``: the
data-parallel device count, so every device gets the same number of rows).
Host sharding: process ``i`` of ``P`` materialises the contiguous rows
``[i*B/P, (i+1)*B/P)`` of every global batch, so all hosts agree on shapes at every step.

Decisions and deviations from the original design:

* Bucket lists are clipped to the maximum and the maximum itself is always a bucket
  (``max_sentences`` for ``S``; ``max(max_src_len, max_tgt_len)`` for ``T``), so every chunk
  has a bucket even when the maximum is not in the configured list.
* Remainder policy (training, ``pad_batch=False``): the incomplete remainder of a bucket is
  *promoted* within the same epoch to the successor bucket (``(S, next T)`` or
  ``(next S, T)``, whichever has fewer cells; it dominates both dimensions so the chunk still
  fits), where it is batched with that bucket's chunks. Only the remainder of the largest
  bucket (fewer than its ``B`` chunks) is dropped, counted in
  ``PipelineStats.dropped_chunks_per_epoch``. Bucket sizes do not depend on the shuffle, so the
  number of batches per epoch and the set of shapes are constant, and which chunks are
  promoted/dropped changes every epoch (with ``shuffle=True``). With ``pad_batch=True`` (eval)
  nothing is promoted or dropped: a bucket's last batch is padded with empty rows.
* ``sentence_offset`` is -1 on padding rows (like ``doc_index``/``chunk_index``).
* Epoch ``e`` uses ``np.random.default_rng((seed, e))`` for the chunk shuffle and then for the
  batch-order shuffle.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from docnmt_jax.data.documents import Document
from docnmt_jax.data.tokenizer import EOS_ID

if TYPE_CHECKING:
    import tensorflow as tf


Encode = Callable[[Sequence[str]], list[list[int]]]
Batch = dict[str, np.ndarray]

logger = logging.getLogger(__name__)

BATCH_FEATURES = (
    "src",
    "tgt",
    "src_mask",
    "tgt_mask",
    "src_positions",
    "tgt_positions",
    "src_segment_ids",
    "tgt_segment_ids",
    "sentence_mask",
    "doc_index",
    "chunk_index",
    "sentence_offset",
)
# [B] features, taken from columns 2.. of the chunk rows table (see BatchPlan.gather_tables).
_ROW_FEATURES = ("doc_index", "chunk_index", "sentence_offset")
_ROW_COLUMNS = ("count", "start", "doc", "index", "offset")

# ---------------------------------------------------------------------------------------------
# Configuration and statistics.


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    """Chunking, bucketing, batching and ordering of the document pipeline."""

    max_sentences: int = 20
    max_src_len: int = 128
    max_tgt_len: int = 128
    batch_src_tokens: int = 2048
    batch_tgt_tokens: int = 2048
    sentence_level: bool = False
    length_buckets: tuple[int, ...] = (8, 16, 32, 64, 128)
    sentence_buckets: tuple[int, ...] = (1, 2, 4, 8, 12, 16, 20)
    shuffle: bool = True
    seed: int = 0
    num_epochs: int | None = None
    process_index: int = 0
    process_count: int = 1
    pad_batch: bool = False
    batch_multiple: int = 1
    # The consumer works on one sentence of every chunk at a time (FINAL's decoding, sentence
    # after sentence): the token budget counts one sentence per chunk, ``B = budget // t``.
    sequential_sentences: bool = False

    def __post_init__(self) -> None:
        for name in (
            "max_sentences",
            "max_src_len",
            "max_tgt_len",
            "process_count",
            "batch_multiple",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"PipelineConfig.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("batch_src_tokens", "batch_tgt_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"PipelineConfig.{name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.process_index < self.process_count:
            raise ValueError(f"process_index {self.process_index} not in [0, {self.process_count})")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
        if self.num_epochs is not None and self.num_epochs < 0:
            raise ValueError(f"num_epochs must be >= 0 or None, got {self.num_epochs}")
        if any(b < 1 for b in self.length_buckets + self.sentence_buckets):
            raise ValueError("bucket boundaries must be >= 1")

    @property
    def sentences_per_chunk(self) -> int:
        """``S`` of the largest chunk: 1 in sentence-level mode."""
        return 1 if self.sentence_level else self.max_sentences

    @property
    def s_buckets(self) -> tuple[int, ...]:
        """Sentence buckets clipped to (and always including) ``sentences_per_chunk``."""
        return _clip_buckets(self.sentence_buckets, self.sentences_per_chunk)

    @property
    def t_buckets(self) -> tuple[int, ...]:
        """Length buckets clipped to (and always including) the larger max length."""
        return _clip_buckets(self.length_buckets, max(self.max_src_len, self.max_tgt_len))

    def batch_size(self, s: int, t: int) -> int:
        """Global rows ``B`` of a batch of bucket ``(s, t)``."""
        slots = t if self.sequential_sentences else s * t
        b = max(1, min(self.batch_src_tokens, self.batch_tgt_tokens) // slots)
        p = math.lcm(self.process_count, self.batch_multiple)
        return max(p, b // p * p)


def _clip_buckets(buckets: Sequence[int], maximum: int) -> tuple[int, ...]:
    return tuple(sorted({min(int(b), maximum) for b in buckets} | {maximum}))


@dataclasses.dataclass(frozen=True)
class PipelineStats:
    """Corpus and plan counts. Token counts include EOS and are after truncation."""

    documents: int
    chunks: int
    sentences: int
    src_tokens: int
    tgt_tokens: int
    src_truncated: int
    tgt_truncated: int
    src_longest: int  # before truncation, including EOS
    tgt_longest: int
    dropped_chunks_per_epoch: int = 0
    promoted_chunks_per_epoch: int = 0
    batches_per_epoch: int = 0


# ---------------------------------------------------------------------------------------------
# Tokenisation.


@dataclasses.dataclass(frozen=True)
class TokenizedSide:
    """All sentences of one side, flat: sentence ``k`` is ``tokens[offsets[k]:][:lengths[k]]``."""

    tokens: np.ndarray  # int32 [total tokens], EOS included
    offsets: np.ndarray  # int64 [sentences]
    lengths: np.ndarray  # int32 [sentences], <= max_len
    max_len: int
    truncated: int
    longest: int  # before truncation, including EOS (0 for an empty corpus)

    def sentence(self, k: int) -> np.ndarray:
        return self.tokens[self.offsets[k] : self.offsets[k] + self.lengths[k]]


@dataclasses.dataclass(frozen=True)
class TokenizedCorpus:
    """Token ids of a document list. Document ``d`` owns global sentences
    ``sentence_starts[d]:sentence_starts[d+1]``."""

    doc_ids: tuple[str, ...]
    sentence_starts: np.ndarray  # int64 [documents + 1]
    src: TokenizedSide
    tgt: TokenizedSide
    config: PipelineConfig

    @property
    def num_documents(self) -> int:
        return len(self.doc_ids)

    @property
    def num_sentences(self) -> int:
        return int(self.sentence_starts[-1])

    def document(self, d: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Source and target token arrays (with EOS) of document ``d``."""
        ks = range(int(self.sentence_starts[d]), int(self.sentence_starts[d + 1]))
        return [self.src.sentence(k) for k in ks], [self.tgt.sentence(k) for k in ks]

    @property
    def stats(self) -> PipelineStats:
        """Counts for this corpus, chunked with :attr:`config`."""
        return _corpus_stats(self, _make_chunks(self, self.config)["doc"].size)


def _corpus_stats(corpus: TokenizedCorpus, chunks: int) -> PipelineStats:
    return PipelineStats(
        documents=corpus.num_documents,
        chunks=chunks,
        sentences=corpus.num_sentences,
        src_tokens=int(corpus.src.lengths.sum()),
        tgt_tokens=int(corpus.tgt.lengths.sum()),
        src_truncated=corpus.src.truncated,
        tgt_truncated=corpus.tgt.truncated,
        src_longest=corpus.src.longest,
        tgt_longest=corpus.tgt.longest,
    )


def _encode_side(texts: list[str], encode: Encode, max_len: int, side: str) -> TokenizedSide:
    ids = encode(texts) if texts else []
    if len(ids) != len(texts):
        raise ValueError(f"encode returned {len(ids)} sequences for {len(texts)} {side} texts")
    raw_len = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    raw = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int64, count=int(raw_len.sum()))
    if raw.size and (raw.min() < 0 or raw.max() > np.iinfo(np.int32).max):
        raise ValueError(f"encode produced {side} ids outside [0, 2**31)")
    full = raw_len + 1  # with EOS
    keep = np.minimum(raw_len, max_len - 1)
    lengths = keep + 1
    offsets = np.zeros(len(ids), dtype=np.int64)
    np.cumsum(lengths[:-1], out=offsets[1:])
    raw_offsets = np.zeros(len(ids), dtype=np.int64)
    np.cumsum(raw_len[:-1], out=raw_offsets[1:])
    tokens = np.empty(int(lengths.sum()), dtype=np.int32)
    sent = np.repeat(np.arange(len(ids)), raw_len)
    pos = np.arange(raw.size) - raw_offsets[sent]
    kept = pos < keep[sent]
    tokens[offsets[sent[kept]] + pos[kept]] = raw[kept]
    tokens[offsets + keep] = EOS_ID
    over = full > max_len
    truncated = int(over.sum())
    longest = int(full.max()) if full.size else 0
    if truncated:
        logger.warning(
            "truncated %d of %d %s sentences longer than %d tokens (longest: %d, EOS included)",
            truncated,
            len(ids),
            side,
            max_len,
            longest,
        )
    return TokenizedSide(tokens, offsets, lengths.astype(np.int32), max_len, truncated, longest)


def tokenize_corpus(
    documents: Sequence[Document], encode: Encode, config: PipelineConfig | None = None
) -> TokenizedCorpus:
    """Encodes all sentences (one batched ``encode`` call per side), appends EOS, truncates.

    ``encode`` maps texts to id lists *without* EOS. Sentences longer than ``max_len``
    (EOS included) keep their first ``max_len - 1`` tokens + EOS; this is logged as a
    warning and counted in the stats.
    """
    config = config or PipelineConfig()
    counts = np.fromiter((len(d) for d in documents), dtype=np.int64, count=len(documents))
    starts = np.zeros(len(documents) + 1, dtype=np.int64)
    np.cumsum(counts, out=starts[1:])
    src_texts = [s for d in documents for s in d.src]
    tgt_texts = [t for d in documents for t in d.tgt]
    return TokenizedCorpus(
        doc_ids=tuple(d.doc_id for d in documents),
        sentence_starts=starts,
        src=_encode_side(src_texts, encode, config.max_src_len, "source"),
        tgt=_encode_side(tgt_texts, encode, config.max_tgt_len, "target"),
        config=config,
    )


# ---------------------------------------------------------------------------------------------
# Chunking and the batch plan.


def _make_chunks(corpus: TokenizedCorpus, config: PipelineConfig) -> dict[str, np.ndarray]:
    """Chunk table: consecutive runs of <= S sentences per document, from sentence 0."""
    S = config.sentences_per_chunk
    per_doc = np.diff(corpus.sentence_starts)
    n_chunks = -(-per_doc // S)
    doc = np.repeat(np.arange(per_doc.size, dtype=np.int64), n_chunks)
    first = np.zeros(per_doc.size, dtype=np.int64)
    np.cumsum(n_chunks[:-1], out=first[1:])
    index = np.arange(doc.size, dtype=np.int64) - first[doc]
    offset = index * S
    start = corpus.sentence_starts[:-1][doc] + offset
    count = np.minimum(S, per_doc[doc] - offset)
    sent_len = np.maximum(corpus.src.lengths, corpus.tgt.lengths)
    longest = np.maximum.reduceat(sent_len, start) if doc.size else np.zeros(0, np.int32)
    return {
        "doc": doc,
        "index": index,
        "offset": offset,
        "start": start,
        "count": count,
        "longest": longest.astype(np.int64),
    }


def _segments(flat: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of ``flat[starts[i] : starts[i] + lengths[i]]`` over ``i`` (vectorised)."""
    out_starts = np.cumsum(lengths) - lengths
    return flat[np.repeat(starts - out_starts, lengths) + np.arange(int(lengths.sum()))]


@dataclasses.dataclass(frozen=True)
class EpochPlan:
    """Batches of one epoch in order: batch ``b`` is the chunk ids ``ids[starts[b]:][:sizes[b]]``
    (-1 = padding row) in shape ``[sizes[b], s[b], t[b]]``."""

    ids: np.ndarray  # int32 [sum(sizes)]
    sizes: np.ndarray  # int32 [batches]
    s: np.ndarray  # int32 [batches]
    t: np.ndarray  # int32 [batches]

    def __len__(self) -> int:
        return int(self.sizes.size)

    @property
    def starts(self) -> np.ndarray:
        return np.cumsum(self.sizes, dtype=np.int64) - self.sizes

    def batch(self, b: int) -> np.ndarray:
        start = int(self.starts[b])
        return self.ids[start : start + int(self.sizes[b])]

    def local(self, process_index: int, process_count: int) -> EpochPlan:
        """The rows ``[i*B/P, (i+1)*B/P)`` of every batch, for process ``i`` of ``P``."""
        sizes = self.sizes // process_count
        ids = _segments(self.ids, self.starts + process_index * sizes, sizes)
        return EpochPlan(ids, sizes, self.s, self.t)

    def slice(self, start: int) -> EpochPlan:
        """Batches ``start`` and later."""
        first = int(self.sizes[:start].sum())
        return EpochPlan(self.ids[first:], self.sizes[start:], self.s[start:], self.t[start:])


def _assemble(
    tokens: Any, m: Any, positions: Any, segments: Any, rows: Any, sent_mask: Any
) -> dict[str, Any]:
    """The batch features from side-stacked ``[2, B, S, T]`` arrays (NumPy or TF alike)."""
    out = {"sentence_mask": sent_mask}
    for i, side in enumerate(("src", "tgt")):
        out[side] = tokens[i]
        out[f"{side}_mask"] = m[i]
        out[f"{side}_positions"] = positions[i]
        out[f"{side}_segment_ids"] = segments[i]
    for j, name in enumerate(_ROW_FEATURES, start=2):
        out[name] = rows[:, j]
    return {k: out[k] for k in BATCH_FEATURES}


class BatchPlan:
    """Deterministic global batch plan over epochs; step ``n`` = the ``n``-th global batch."""

    def __init__(self, corpus: TokenizedCorpus, config: PipelineConfig):
        if (corpus.src.max_len, corpus.tgt.max_len) != (config.max_src_len, config.max_tgt_len):
            raise ValueError(
                f"corpus was truncated to max lengths ({corpus.src.max_len}, "
                f"{corpus.tgt.max_len}) but the config asks for ({config.max_src_len}, "
                f"{config.max_tgt_len}); re-run tokenize_corpus with this config"
            )
        self.corpus = corpus
        self.config = config
        self.chunk_table = _make_chunks(corpus, config)
        sb, tb = np.asarray(config.s_buckets), np.asarray(config.t_buckets)
        self._s_buckets, self._t_buckets = sb, tb
        c = self.chunk_table
        self.chunk_bucket = (
            np.searchsorted(sb, c["count"]) * tb.size + np.searchsorted(tb, c["longest"])
        ).astype(np.int64)
        n_buckets = sb.size * tb.size
        self._bucket_shape = [(int(s), int(t)) for s in sb for t in tb]
        self._bucket_b = np.array([config.batch_size(s, t) for s, t in self._bucket_shape])
        self._successor = [self._next_bucket(k) for k in range(n_buckets)]
        counts = np.bincount(self.chunk_bucket, minlength=n_buckets)
        self._batches_per_bucket, promoted, dropped = self._simulate(counts)
        self.batches_per_epoch = int(self._batches_per_bucket.sum())
        self.stats = dataclasses.replace(
            _corpus_stats(corpus, int(c["doc"].size)),
            dropped_chunks_per_epoch=dropped,
            promoted_chunks_per_epoch=promoted,
            batches_per_epoch=self.batches_per_epoch,
        )
        self._cache: tuple[int, EpochPlan] | None = None
        self._tables: dict[str, np.ndarray] | None = None

    # -- bucket geometry ------------------------------------------------------------------------

    def _next_bucket(self, k: int) -> int | None:
        """Where the remainder of bucket ``k`` goes: the dominating neighbour with fewer cells."""
        nt = self._t_buckets.size
        si, ti = divmod(k, nt)
        options = []
        if ti + 1 < nt:
            options.append(k + 1)
        if si + 1 < self._s_buckets.size:
            options.append(k + nt)
        if not options:
            return None
        return min(options, key=lambda j: (self._bucket_shape[j][0] * self._bucket_shape[j][1], -j))

    def _simulate(self, counts: np.ndarray) -> tuple[np.ndarray, int, int]:
        """Batches per bucket, promoted and dropped chunks of one epoch (shuffle-independent)."""
        carry = np.zeros_like(counts)
        batches = np.zeros_like(counts)
        promoted = dropped = 0
        for k in range(counts.size):  # row-major order is a topological order of successors
            pool, b = int(counts[k] + carry[k]), int(self._bucket_b[k])
            if self.config.pad_batch:
                batches[k] = -(-pool // b)
                continue
            batches[k], rest = divmod(pool, b)
            nxt = self._successor[k]
            if nxt is None:
                dropped += rest
            else:
                carry[nxt] += rest
                promoted += rest
        return batches, promoted, dropped

    @property
    def shapes(self) -> frozenset[tuple[int, int, int]]:
        """Global ``(B, S, T)`` of every batch the plan produces (the same in every epoch)."""
        return frozenset(
            (int(self._bucket_b[k]), *self._bucket_shape[k])
            for k in np.flatnonzero(self._batches_per_bucket)
        )

    @property
    def local_shapes(self) -> frozenset[tuple[int, int, int]]:
        """``(B / process_count, S, T)`` of the batches this process materialises."""
        return frozenset((b // self.config.process_count, s, t) for b, s, t in self.shapes)

    @property
    def num_batches(self) -> int | None:
        """Total global batches, or None when repeating forever."""
        e = self.config.num_epochs
        return None if e is None else e * self.batches_per_epoch

    # -- epochs ---------------------------------------------------------------------------------

    def epoch(self, e: int) -> EpochPlan:
        """The global batches of epoch ``e`` (cached: consecutive calls are free)."""
        if self._cache is not None and self._cache[0] == e:
            return self._cache[1]
        cfg = self.config
        n = self.chunk_bucket.size
        rng = np.random.default_rng((cfg.seed, e))
        order = rng.permutation(n) if cfg.shuffle else np.arange(n)
        keys = self.chunk_bucket[order]
        grouped = order[np.argsort(keys, kind="stable")]
        bounds = np.concatenate([[0], np.cumsum(np.bincount(keys, minlength=len(self._bucket_b)))])
        carry: dict[int, list[np.ndarray]] = {}
        pools: list[np.ndarray] = []  # per bucket: its batches' chunk ids, concatenated
        counts = np.zeros(len(self._bucket_b), dtype=np.int64)  # batches per bucket
        for k, b in enumerate(self._bucket_b.tolist()):
            pool = np.concatenate(carry.pop(k, []) + [grouped[bounds[k] : bounds[k + 1]]])
            full = pool.size // b * b
            if cfg.pad_batch and pool.size > full:
                pool = np.concatenate([pool, np.full(full + b - pool.size, -1, pool.dtype)])
                full = pool.size
            pools.append(pool[:full])
            counts[k] = full // b
            if full < pool.size and self._successor[k] is not None:
                carry.setdefault(self._successor[k], []).append(pool[full:])
        assert counts.sum() == self.batches_per_epoch
        ids = np.concatenate(pools).astype(np.int32)
        bucket = np.repeat(np.arange(counts.size), counts)
        sizes = self._bucket_b[bucket]
        if cfg.shuffle:
            perm = rng.permutation(bucket.size)
            ids = _segments(ids, (np.cumsum(sizes) - sizes)[perm], sizes[perm])
            bucket, sizes = bucket[perm], sizes[perm]
        st = np.asarray(self._bucket_shape, dtype=np.int32).reshape(-1, 2)[bucket]
        plan = EpochPlan(ids, sizes.astype(np.int32), st[:, 0].copy(), st[:, 1].copy())
        self._cache = (e, plan)
        return plan

    def epochs_from(self, start_step: int = 0) -> Iterator[EpochPlan]:
        """Global epoch plans from step ``start_step`` on (the first one sliced to start there)."""
        if start_step < 0:
            raise ValueError(f"start_step must be >= 0, got {start_step}")
        nb = self.batches_per_epoch
        if nb == 0:
            if self.config.num_epochs is None:
                raise ValueError("the plan has no batch per epoch: the corpus is too small")
            return
        e, i = divmod(start_step, nb)
        while self.config.num_epochs is None or e < self.config.num_epochs:
            yield self.epoch(e).slice(i)
            e, i = e + 1, 0

    def local_epochs_from(self, start_step: int = 0) -> Iterator[EpochPlan]:
        """Like :meth:`epochs_from`, restricted to this process's rows."""
        cfg = self.config
        for plan in self.epochs_from(start_step):
            yield plan.local(cfg.process_index, cfg.process_count)

    # -- materialisation ------------------------------------------------------------------------

    def gather_tables(self) -> dict[str, np.ndarray]:
        """Flat tables used to materialise batches, both sides stacked on a leading axis.

        ``rows`` [chunks, 5] = (sentence count, first global sentence, doc, chunk index,
        sentence offset); ``tokens`` = source then target tokens; ``offsets``/``lengths``
        [2, sentences] (target offsets shifted past the source tokens). Index dtype is int32
        unless the corpus needs int64.
        """
        if self._tables is None:
            c, src, tgt = self.chunk_table, self.corpus.src, self.corpus.tgt
            big = src.tokens.size + tgt.tokens.size >= np.iinfo(np.int32).max
            itype = np.int64 if big else np.int32
            self._tables = {
                "rows": np.stack([c[k] for k in _ROW_COLUMNS], axis=1).astype(itype),
                "tokens": np.concatenate([src.tokens, tgt.tokens]),
                "offsets": np.stack([src.offsets, tgt.offsets + src.tokens.size]).astype(itype),
                "lengths": np.stack([src.lengths, tgt.lengths]).astype(itype),
            }
        return self._tables

    def materialize(self, chunk_ids: np.ndarray, s: int, t: int) -> Batch:
        """The batch of ``chunk_ids`` (-1 = padding row) in shape ``[B, s, t]`` (NumPy)."""
        tab = self.gather_tables()
        ids = np.asarray(chunk_ids, dtype=np.int64)
        real = ids >= 0
        rows = np.where(real[:, None], tab["rows"][np.maximum(ids, 0)], -1)  # [B, 5]
        srange = np.arange(s)
        sent_mask = srange[None, :] < rows[:, 0:1]  # [B, S]
        sid = np.where(sent_mask, rows[:, 1:2] + srange[None, :], 0)
        length = np.where(sent_mask[None], tab["lengths"][:, sid], 0)  # [2, B, S]
        pos = np.arange(t)
        mask = pos < length[..., None]  # [2, B, S, T]
        idx = np.where(mask, tab["offsets"][:, sid][..., None] + pos, 0)
        tokens = np.where(mask, tab["tokens"][idx], 0).astype(np.int32)
        m = mask.astype(np.int32)
        positions = m * pos.astype(np.int32)
        segments = m * (srange + 1).astype(np.int32)[None, None, :, None]
        return _assemble(
            tokens, m, positions, segments, rows.astype(np.int32), sent_mask.astype(np.int32)
        )


def _as_plan(
    data: Sequence[Document] | TokenizedCorpus | BatchPlan,
    encode: Encode | None,
    config: PipelineConfig | None,
) -> BatchPlan:
    if isinstance(data, BatchPlan):
        if config is not None and config != data.config:
            raise ValueError("a BatchPlan was given with a different config")
        return data
    if isinstance(data, TokenizedCorpus):
        return BatchPlan(data, config or data.config)
    if encode is None:
        raise ValueError("encode is required when raw documents are given")
    config = config or PipelineConfig()
    return BatchPlan(tokenize_corpus(data, encode, config), config)


def plan_batches(
    data: Sequence[Document] | TokenizedCorpus,
    encode: Encode | None = None,
    config: PipelineConfig | None = None,
) -> BatchPlan:
    """The deterministic batch plan of documents (tokenised with ``encode``) or a corpus."""
    return _as_plan(data, encode, config)


PipelineInput = Sequence[Document] | TokenizedCorpus | BatchPlan


# ---------------------------------------------------------------------------------------------
# Iterators.


def numpy_batches(
    data: PipelineInput,
    encode: Encode | None = None,
    config: PipelineConfig | None = None,
    start_step: int = 0,
) -> Iterator[Batch]:
    """This process's batches as NumPy dicts, from ``start_step`` on, without TensorFlow."""
    plan = _as_plan(data, encode, config)
    for ep in plan.local_epochs_from(start_step):
        ends = np.cumsum(ep.sizes)
        for b in range(len(ep)):
            ids = ep.ids[ends[b] - ep.sizes[b] : ends[b]]
            yield plan.materialize(ids, int(ep.s[b]), int(ep.t[b]))


def _tf_materializer(plan: BatchPlan) -> Callable[..., dict[str, tf.Tensor]]:
    """A TF graph function equivalent to :meth:`BatchPlan.materialize` (same stacked layout)."""
    import tensorflow as tf

    tables = plan.gather_tables()
    itype = tf.as_dtype(tables["offsets"].dtype)
    rows_t, tokens_t, offsets_t, lengths_t = (
        tf.constant(tables[k], itype if k != "tokens" else tf.int32)
        for k in ("rows", "tokens", "offsets", "lengths")
    )

    def materialize(element: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        ids = tf.cast(element["ids"], itype)
        real = ids >= 0
        rows = tf.where(real[:, None], tf.gather(rows_t, tf.maximum(ids, 0)), -1)  # [B, 5]
        srange = tf.range(tf.cast(element["s"], itype))
        sent_mask = srange[None, :] < rows[:, 0:1]  # [B, S]
        sid = tf.where(sent_mask, rows[:, 1:2] + srange[None, :], 0)
        length = tf.where(sent_mask[None], tf.gather(lengths_t, sid, axis=1), 0)  # [2, B, S]
        pos = tf.range(tf.cast(element["t"], itype))
        mask = pos < length[..., None]  # [2, B, S, T]
        idx = tf.where(mask, tf.gather(offsets_t, sid, axis=1)[..., None] + pos, 0)
        tokens = tf.where(mask, tf.gather(tokens_t, idx), 0)
        m = tf.cast(mask, tf.int32)
        positions = m * tf.cast(pos, tf.int32)
        segments = m * tf.cast(srange + 1, tf.int32)[None, None, :, None]
        rows = tf.cast(rows, tf.int32)
        return _assemble(tokens, m, positions, segments, rows, tf.cast(sent_mask, tf.int32))

    return materialize


def make_dataset(
    data: PipelineInput,
    encode: Encode | None = None,
    config: PipelineConfig | None = None,
    start_step: int = 0,
) -> tf.data.Dataset:
    """This process's batches as a prefetched ``tf.data.Dataset``, from global step
    ``start_step`` on (resuming costs one epoch plan, not ``start_step`` batches).

    ``data`` is a document list (then ``encode`` is required), a :class:`TokenizedCorpus` or a
    :class:`BatchPlan`. Batch shapes are dynamic (``[None, None, None]``); the set of shapes is
    ``plan_batches(...).local_shapes``.
    """
    import tensorflow as tf

    plan = _as_plan(data, encode, config)
    if start_step < 0:
        raise ValueError(f"start_step must be >= 0, got {start_step}")
    if plan.batches_per_epoch == 0 and plan.config.num_epochs is None:
        raise ValueError("the plan has no batch per epoch: the corpus is too small")

    def generator() -> Iterator[dict[str, np.ndarray]]:
        for ep in plan.local_epochs_from(start_step):
            yield {"ids": ep.ids, "sizes": ep.sizes, "s": ep.s, "t": ep.t}

    def split(epoch: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        ids = tf.RaggedTensor.from_row_lengths(epoch["ids"], tf.cast(epoch["sizes"], tf.int64))
        return {"ids": ids, "s": epoch["s"], "t": epoch["t"]}

    signature = {k: tf.TensorSpec([None], tf.int32) for k in ("ids", "sizes", "s", "t")}
    ds = tf.data.Dataset.from_generator(generator, output_signature=signature)
    ds = ds.map(split).unbatch()  # one element per batch: {"ids": [B], "s": (), "t": ()}
    ds = ds.map(_tf_materializer(plan), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return ds.prefetch(tf.data.AUTOTUNE)


# ---------------------------------------------------------------------------------------------
# Throughput.


def measure_throughput(
    dataset: tf.data.Dataset | Iterator[Batch], num_batches: int, warmup: int = 1
) -> dict[str, float]:
    """Iterates ``warmup + num_batches`` batches (as NumPy) and reports rates over the last
    ``num_batches``: chunks/s (non-padding rows), sentences/s, real and padded tokens/s (both
    sides), and the padding fraction of the token slots."""
    it = dataset.as_numpy_iterator() if hasattr(dataset, "as_numpy_iterator") else iter(dataset)
    for _ in range(warmup):
        if next(it, None) is None:
            break
    totals = dict.fromkeys(("chunks", "sentences", "src_tokens", "tgt_tokens", "slots"), 0)
    n = 0
    shapes: set[tuple[int, ...]] = set()
    t0 = time.perf_counter()
    for batch in itertools.islice(it, num_batches):
        n += 1
        shapes.add(tuple(batch["src"].shape))
        totals["chunks"] += int((batch["doc_index"] >= 0).sum())
        totals["sentences"] += int(batch["sentence_mask"].sum())
        totals["src_tokens"] += int(batch["src_mask"].sum())
        totals["tgt_tokens"] += int(batch["tgt_mask"].sum())
        totals["slots"] += batch["src_mask"].size + batch["tgt_mask"].size
    seconds = max(time.perf_counter() - t0, 1e-9)
    real = totals["src_tokens"] + totals["tgt_tokens"]
    return {
        "batches": n,
        "seconds": seconds,
        "batches_per_s": n / seconds,
        "chunks_per_s": totals["chunks"] / seconds,
        "sentences_per_s": totals["sentences"] / seconds,
        "src_tokens_per_s": totals["src_tokens"] / seconds,
        "tgt_tokens_per_s": totals["tgt_tokens"] / seconds,
        "padded_tokens_per_s": totals["slots"] / seconds,
        "padding_fraction": 1.0 - real / totals["slots"] if totals["slots"] else 0.0,
        "distinct_shapes": len(shapes),
    }
