"""The tf.data document pipeline: documents -> chunks -> bucketed, padded int32 batches.

Stages (each usable on its own; this module re-exports the entry points of the first two):

1. :func:`tokenize_corpus` (:mod:`docnmt_jax.data.tokenized`) encodes every sentence once (one
   batched ``encode`` call per side) and appends EOS; a sentence longer than the maximum is an
   error naming it, its pair skipped or truncated (``max_len - 1`` tokens + EOS), as
   ``PipelineConfig.on_long`` says (counted in the stats). Tokens are kept flat: one int32 array
   per side plus per-sentence offsets/lengths, so batch materialisation is a pair of vectorised
   gathers.
2. :func:`plan_batches` (:mod:`docnmt_jax.data.builder`, the grid's
   :mod:`~docnmt_jax.data.batch_plan`) cuts documents into consecutive
   chunks of at most ``S`` sentences (sentences ``0..S-1``, ``S..2S-1``, ...; one chunk per
   sentence in ``sentence_level`` mode), assigns each chunk a bucket ``(S_bucket, T_bucket)``
   (``T`` shared by source and target) and builds the deterministic global batch plan of every
   epoch. The plan is pure NumPy, identical on every host, and cheap to evaluate at any step
   (resume = index arithmetic: every epoch has the same number of batches).
3. :func:`make_dataset` turns the plan into a ``tf.data.Dataset`` of batches. Python runs
   once per *epoch*: a generator yields that epoch's chunk ids (flat, with batch sizes), which
   TF splits into one element per batch (ragged ``unbatch``); batches are materialised by a TF
   graph function (parallel ``map``: no Python and no GIL per batch), then prefetched. This
   measured faster than ``from_generator`` over NumPy-materialised batches (about 2x) and than
   ``Dataset.range`` + ``numpy_function`` (about 1.5x). :func:`numpy_batches` is an equivalent
   pure-NumPy iterator without TF (cheapest in CPU time, but it runs in the caller's thread).

Packed rows (``PipelineConfig.packing``; docs/design/packing_plan.md §2.1):
:func:`plan_batches` returns a :class:`PackedPlan` (:mod:`docnmt_jax.data.packed_plan`:
sentences or chunks packed once per plan into rows of at most ``max_shapes`` lengths, batches
``[B, L]`` of :data:`~docnmt_jax.data.schema.PACKED_FEATURES`, shapes ``(B, L)``).
:func:`numpy_batches` serves both plans; :func:`make_dataset` of a packed plan is
``from_generator`` over :func:`numpy_batches`, prefetched; :func:`measure_throughput` counts
packed chunks and sentences as distinct ids per row.

Batch features (:mod:`docnmt_jax.data.schema`; int32, ``B`` = rows on this host): ``src``/
``tgt`` and their masks, positions and segment ids [B,S,T], ``sentence_mask`` [B,S],
``doc_index``/``chunk_index``/``sentence_offset`` [B], the last three -1 on padding rows.
Every sentence ends with EOS, PAD=0 after. With ``context_sentences`` ``K > 0`` (grid only) also
``context_src``/``context_src_mask`` [B,K,T]: the ``K`` source sentences before the chunk's
first sentence in document order (slot ``K-1`` the one right before; all 0 before the
document's start and on padding rows), built by the same gathers; ``T`` covers them.

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

import itertools
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import numpy as np

from docnmt_jax.data import schema
from docnmt_jax.data.batch_plan import BatchPlan
from docnmt_jax.data.builder import PipelineInput, plan_batches
from docnmt_jax.data.epochs import Batch, EpochPlan
from docnmt_jax.data.packed_plan import PackedPlan
from docnmt_jax.data.packed_stream_plan import PackedStreamPlan
from docnmt_jax.data.spec import PackingConfig, PipelineConfig
from docnmt_jax.data.tokenized import Encode, PipelineStats, TokenizedCorpus, tokenize_corpus
from docnmt_jax.errors import ConfigError

if TYPE_CHECKING:
    import tensorflow as tf

__all__ = [
    "Batch",
    "BatchPlan",
    "Encode",
    "EpochPlan",
    "PackedPlan",
    "PackingConfig",
    "PipelineConfig",
    "PipelineInput",
    "PipelineStats",
    "TokenizedCorpus",
    "make_dataset",
    "measure_throughput",
    "numpy_batches",
    "plan_batches",
    "tokenize_corpus",
]

# ---------------------------------------------------------------------------------------------
# Iterators.


def numpy_batches(
    data: PipelineInput,
    encode: Encode | None = None,
    config: PipelineConfig | None = None,
    start_step: int = 0,
) -> Iterator[Batch]:
    """This process's batches as NumPy dicts, from ``start_step`` on, without TensorFlow."""
    plan = plan_batches(data, encode, config)
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
    k = plan.config.context_sentences
    names = schema.BATCH_FEATURES + (schema.CONTEXT_FEATURES if k else ())

    def token_grid(
        offsets: tf.Tensor, lengths: tf.Tensor, sid: tf.Tensor, valid: tf.Tensor, pos: tf.Tensor
    ) -> tuple[tf.Tensor, tf.Tensor]:
        """Token ids ``[..., T]`` and int32 mask of the global sentences ``sid``, empty where
        not ``valid`` (as ``batch_plan._token_grid``)."""
        length = tf.where(valid, tf.gather(lengths, sid, axis=-1), 0)
        mask = pos < length[..., None]
        idx = tf.where(mask, tf.gather(offsets, sid, axis=-1)[..., None] + pos, 0)
        return tf.where(mask, tf.gather(tokens_t, idx), 0), tf.cast(mask, tf.int32)

    def materialize(element: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        ids = tf.cast(element["ids"], itype)
        real = ids >= 0
        rows = tf.where(real[:, None], tf.gather(rows_t, tf.maximum(ids, 0)), -1)  # [B, 5]
        srange = tf.range(tf.cast(element["s"], itype))
        sent_mask = srange[None, :] < rows[:, 0:1]  # [B, S]
        sid = tf.where(sent_mask, rows[:, 1:2] + srange[None, :], 0)
        pos = tf.range(tf.cast(element["t"], itype))
        tokens, m = token_grid(offsets_t, lengths_t, sid, sent_mask[None], pos)  # [2, B, S, T]
        positions = m * tf.cast(pos, tf.int32)
        segments = m * tf.cast(srange + 1, tf.int32)[None, None, :, None]
        out = {"sentence_mask": tf.cast(sent_mask, tf.int32)}
        for i, side in enumerate(schema.SIDES):
            values = (tokens[i], m[i], positions[i], segments[i])
            out.update(zip(schema.side_features(side), values, strict=True))
        row_features = tf.cast(rows, tf.int32)
        out.update((name, row_features[:, j]) for j, name in enumerate(schema.ROW_FEATURES, 2))
        if k:
            before = tf.constant(k - np.arange(k), itype)  # slot i: (K - i)-th sentence before
            has = rows[:, 4:5] >= before  # [B, K]; padding rows have offset -1
            cid = tf.where(has, rows[:, 1:2] - before, 0)
            context = token_grid(offsets_t[0], lengths_t[0], cid, has, pos)
            out.update(zip(schema.CONTEXT_FEATURES, context, strict=True))
        return {name: out[name] for name in names}

    return materialize


def make_dataset(
    data: PipelineInput,
    encode: Encode | None = None,
    config: PipelineConfig | None = None,
    start_step: int = 0,
) -> tf.data.Dataset:
    """This process's batches as a prefetched ``tf.data.Dataset``, from global step
    ``start_step`` on (resuming costs one epoch plan, not ``start_step`` batches).

    ``data`` is a document list (then ``encode`` is required), a :class:`TokenizedCorpus`, a
    :class:`BatchPlan` or a :class:`PackedPlan`. Batch shapes are dynamic (``[None, None,
    None]``, packed: ``[None, None]``); the set of shapes is ``plan_batches(...).local_shapes``.
    """
    import tensorflow as tf

    plan = plan_batches(data, encode, config)
    if start_step < 0:
        raise ValueError(f"start_step must be >= 0, got {start_step}")
    if plan.batches_per_epoch == 0 and plan.config.num_epochs is None:
        raise ConfigError("the plan has no batch per epoch: the corpus is too small")
    if isinstance(plan, PackedPlan | PackedStreamPlan):
        signature = {k: tf.TensorSpec([None, None], tf.int32) for k in plan.features}
        packed = tf.data.Dataset.from_generator(
            lambda: numpy_batches(plan, start_step=start_step), output_signature=signature
        )
        return packed.prefetch(tf.data.AUTOTUNE)

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


def _distinct_per_row(src_ids: np.ndarray, tgt_ids: np.ndarray) -> int:
    """Distinct nonzero ids per row of ``[B, L]`` id arrays (both sides), summed over rows."""
    ids = np.concatenate([src_ids, tgt_ids], axis=1).astype(np.int64)
    keys = np.unique(ids * ids.shape[0] + np.arange(ids.shape[0])[:, None])
    return int(np.count_nonzero(keys >= ids.shape[0]))


def measure_throughput(
    dataset: tf.data.Dataset | Iterator[Batch], num_batches: int, warmup: int = 1
) -> dict[str, float]:
    """Iterates ``warmup + num_batches`` batches (as NumPy) and reports rates over the last
    ``num_batches``: chunks/s (non-padding rows; packed: distinct chunk ids per row),
    sentences/s (packed: distinct segment ids per row), real and padded tokens/s (both sides),
    and the padding fraction of the token slots."""
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
        if schema.is_packed(batch):
            totals["chunks"] += _distinct_per_row(batch["src_chunk_ids"], batch["tgt_chunk_ids"])
            totals["sentences"] += _distinct_per_row(
                batch["src_segment_ids"], batch["tgt_segment_ids"]
            )
        else:
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
