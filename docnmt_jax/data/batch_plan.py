"""Stage 2 of the document pipeline (:mod:`docnmt_jax.data.pipeline`) on the ``[B, S, T]`` grid:
bucketing of the chunks and the deterministic global batch plan of every epoch
(:class:`BatchPlan`), including the NumPy materialisation of a planned batch. Packed rows have
their own plans (:mod:`~docnmt_jax.data.packed_plan`, :mod:`~docnmt_jax.data.grouped_plan`);
:func:`docnmt_jax.data.builder.plan_batches` picks the plan of a config."""

from __future__ import annotations

import dataclasses

import numpy as np

from docnmt_jax.data import schema
from docnmt_jax.data.epochs import Batch, EpochIteration, EpochPlan, check_corpus_config, segments
from docnmt_jax.data.spec import PipelineConfig
from docnmt_jax.data.tokenized import TokenizedCorpus, corpus_stats, make_chunks

# Columns of the chunk rows table (BatchPlan.gather_tables); 2.. are schema.ROW_FEATURES.
_ROW_COLUMNS = ("count", "start", "doc", "index", "offset")


class BatchPlan(EpochIteration):
    """Deterministic global batch plan over epochs; step ``n`` = the ``n``-th global batch."""

    def __init__(self, corpus: TokenizedCorpus, config: PipelineConfig):
        check_corpus_config(corpus, config)
        self.corpus = corpus
        self.config = config
        self.chunk_table = make_chunks(corpus, config)
        longest_document = int(np.diff(corpus.sentence_starts).max(initial=1))
        sb = np.asarray(config.s_buckets_for(longest_document))
        tb = np.asarray(config.t_buckets)
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
            corpus_stats(corpus, int(c["doc"].size)),
            dropped_chunks_per_epoch=dropped,
            promoted_chunks_per_epoch=promoted,
            batches_per_epoch=self.batches_per_epoch,
        )
        self._cache: tuple[int, EpochPlan] | None = None
        self._tables: dict[str, np.ndarray] | None = None
        self.stats = dataclasses.replace(self.stats, padding_fraction=self._padding_fraction())

    def _padding_fraction(self) -> float:
        """Padding share of epoch 0's token slots, both sides (promotions and padding rows
        included; every epoch has the same batches per bucket, so nearly the same share)."""
        if self.batches_per_epoch == 0:
            return 0.0
        ep = self.epoch(0)
        ids = ep.ids[ep.ids >= 0]
        c, corpus = self.chunk_table, self.corpus
        per_sentence = corpus.src.lengths.astype(np.int64) + corpus.tgt.lengths
        starts = np.concatenate([[0], np.cumsum(per_sentence)])
        real = starts[c["start"][ids] + c["count"][ids]] - starts[c["start"][ids]]
        slots = 2 * np.sum(ep.sizes.astype(np.int64) * ep.s * ep.t)
        return float(1.0 - real.sum() / slots)

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
            ids = segments(ids, (np.cumsum(sizes) - sizes)[perm], sizes[perm])
            bucket, sizes = bucket[perm], sizes[perm]
        st = np.asarray(self._bucket_shape, dtype=np.int32).reshape(-1, 2)[bucket]
        plan = EpochPlan(ids, sizes.astype(np.int32), st[:, 0].copy(), st[:, 1].copy())
        self._cache = (e, plan)
        return plan

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
        """The batch of ``chunk_ids`` (-1 = padding row) in shape ``[B, s, t]`` (NumPy), with
        the context window ``[B, K, t]`` when ``config.context_sentences`` ``K > 0``."""
        tab = self.gather_tables()
        ids = np.asarray(chunk_ids, dtype=np.int64)
        real = ids >= 0
        rows = np.where(real[:, None], tab["rows"][np.maximum(ids, 0)], -1)  # [B, 5]
        srange = np.arange(s)
        sent_mask = srange[None, :] < rows[:, 0:1]  # [B, S]
        sid = np.where(sent_mask, rows[:, 1:2] + srange[None, :], 0)
        tokens, length = _token_grid(
            tab["tokens"], tab["offsets"], tab["lengths"], sid, sent_mask, t
        )
        features = dict(zip(schema.ROW_FEATURES, rows[:, 2:].T.astype(np.int32), strict=True))
        batch = schema.batch_from_grids(
            tokens[0], tokens[1], src_lengths=length[0], tgt_lengths=length[1], **features
        )
        k = self.config.context_sentences
        if k:
            before = k - np.arange(k)  # slot i holds the (K - i)-th sentence before the chunk
            has = rows[:, 4:5] >= before  # [B, K]; padding rows have offset -1
            cid = np.where(has, rows[:, 1:2] - before, 0)
            ctx, ctx_length = _token_grid(
                tab["tokens"], tab["offsets"][0], tab["lengths"][0], cid, has, t
            )
            batch["context_src"] = ctx
            batch["context_src_mask"] = (np.arange(t) < ctx_length[..., None]).astype(np.int32)
        return batch


def _token_grid(
    tokens: np.ndarray,
    offsets: np.ndarray,
    lengths: np.ndarray,
    sid: np.ndarray,
    valid: np.ndarray,
    t: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Token ids ``[..., *sid.shape, t]`` (int32, PAD after each sentence) and lengths
    ``[..., *sid.shape]`` of the global sentences ``sid`` of the flat tables (``offsets`` and
    ``lengths`` [..., sentences]); empty where ``valid`` is False."""
    length = np.where(valid, lengths[..., sid], 0)
    pos = np.arange(t)
    mask = pos < length[..., None]
    idx = np.where(mask, offsets[..., sid][..., None] + pos, 0)
    return np.where(mask, tokens[idx], 0).astype(np.int32), length
