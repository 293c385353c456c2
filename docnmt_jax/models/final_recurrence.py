"""Recurrent FINAL: context that crosses the chunk boundary (``FinalConfig.recurrent``).

Zheng et al. (2020) promise a model for "documents containing any number of sentences"; their
encoder's global layer and decoder memory stop at the chunk (20 sentences). With
``recurrent`` a document is read chunk after chunk and two states cross each boundary,
both of fixed size, so memory and time per sentence do not grow with the document:

* **Target memory** (Sec. 4.2's ``SG(s^{l-1}_{k-1})``): sentence 0 of chunk ``c + 1`` attends
  to the decoder states of the last sentence of chunk ``c``, exactly as every other sentence
  attends to its predecessor's. The XL positions count back from the memory's real length, so
  the distances across the boundary are the ones inside a chunk.
* **Source memory** of the global layer (Eq. 1): the keys and values of chunk ``c + 1``'s
  segment-level attention are ``[m_1 .. m_M; x_{1,1} .. x_{S,T}]``, where ``m_j`` is the mean
  over its tokens of the fused output ``h`` of sentence ``j`` of chunk ``c`` (the global layer's
  output, before the encoder's final norm): one summary per sentence, ``M = max_segments``
  slots, the last sentence in slot ``M``. Summary ``j`` (of ``1 .. M``) is at sentence
  distance ``k + M + 1 - j`` from sentence ``k`` (of ``0 .. S-1``) of the new chunk (clipped to
  ``max_relative_distance`` like every distance of Eq. 1) and is projected by the same
  ``W^K``, ``W^V`` as the chunk's tokens (pre-LN: after the layer's input norm).

Why summaries of the *output* ``h`` and not Transformer-XL's cached layer inputs: FINAL has one
global layer, whose input (the local encoding) never saw another sentence, so cached inputs
would reach back one chunk only. ``h`` already read its own chunk's memory, so chunk ``c + 1``
reads chunk ``c``, which read chunk ``c - 1``, and so on: a decision made by the document's
first sentence can reach any later chunk, through a state of ``M`` vectors. Mean pooling per
sentence keeps that state at ``M x D`` whatever the sentence lengths.

Training (truncated back-propagation through one chunk): document streams, each chunk the
next one of its stream's document, on the grid (one stream a row,
:class:`~docnmt_jax.data.stream_plan.StreamPlan`; a chunk continues when ``chunk_index > 0``)
or in packed rows (several streams' chunks a row,
:class:`~docnmt_jax.data.packed_stream_plan.PackedStreamPlan`, :mod:`.final_packed_streams`).
The state a stream's chunk leaves is the memory of its next one; the trainer keeps it in the
train state (``carry``, one row per stream), so a checkpoint resumes exactly. The
state is stop-gradient: the loss of chunk ``c + 1`` trains how it is read, not how it was
written. Decoding carries the chosen translation's decoder states, as between the sentences
of a chunk, and the source summaries (:func:`docnmt_jax.decoding.search.stream_translate`).

No parameter is added: a recurrent FINAL has exactly FINAL's parameters (a chunked run can be
read recurrently and back).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from docnmt_jax.data import schema
from docnmt_jax.data.tokenizer import BOS_ID
from docnmt_jax.models import final_packed_streams as packed_streams
from docnmt_jax.models import layers

Array = jax.Array
Carry = dict[str, Any]


def memory_distances(sentences: int, slots: int, used: int) -> Array:
    """One-hot ``[S, M, 2*used+1]`` of the clipped distance ``k + M - j`` from sentence ``k``
    of the chunk to memory slot ``j`` (0-based: the last sentence of the previous chunk is
    slot ``M - 1``, one sentence before sentence 0)."""
    k = jnp.arange(sentences)[:, None]
    j = jnp.arange(slots)[None, :]
    distance = jnp.clip(k + slots - j, -used, used) + used
    return jax.nn.one_hot(distance, 2 * used + 1, dtype=jnp.float32)


def memory_logits(q: Array, q_gamma: Array, memory_k: Array, onehot: Array) -> Array:
    """Eq. (1)'s logits of the chunk's queries against the memory summaries: ``q [B, S*T, H,
    d]``, ``q_gamma [B, H, S*T, R']`` (query times every ``gamma^K``), ``memory_k [B, M, H, d]``
    -> ``[B, H, S*T, M]`` (unscaled)."""
    B, H, L, _ = q_gamma.shape
    S, M = onehot.shape[:2]
    content = jnp.einsum("bqhd,bkhd->bhqk", q, memory_k).astype(jnp.float32)
    seg = jnp.einsum("bhstr,smr->bhstm", q_gamma.reshape(B, H, S, L // S, -1), onehot)
    return content + seg.reshape(B, H, L, M)


def memory_output(weights: Array, memory_v: Array, gamma_v: Array, onehot: Array) -> Array:
    """What the memory adds to the attention output: ``sum_j a_j (m_j W^V + gamma^V_{k-j})``
    for ``weights [B, H, S*T, M]`` -> ``[B, S*T, H, d]``."""
    B, H, L, M = weights.shape
    S = onehot.shape[0]
    out = jnp.einsum("bhqk,bkhd->bqhd", weights.astype(memory_v.dtype), memory_v)
    mass = jnp.einsum("bhstm,smr->bhstr", weights.reshape(B, H, S, L // S, M), onehot)
    rel = jnp.einsum("bhstr,rhd->bsthd", mass.astype(gamma_v.dtype), gamma_v)
    return out + rel.reshape(B, L, H, -1)


class MemoryKeys(NamedTuple):
    """The summaries as extra keys of Eq. (1) (``SegmentRelativeAttention`` with ``memory``):
    their keys and values ``[B, M, H, d]``, mask ``[B, M]`` and distance one-hot ``[S, M, R']``."""

    keys: Array
    values: Array
    mask: Array
    onehot: Array

    @classmethod
    def project(
        cls, memory: tuple[Array, Array], key_value: Any, sentences: int, used: int
    ) -> MemoryKeys:
        """``memory`` (summaries, mask) through the layer's key and value projections."""
        summaries, mask = memory
        keys, values = (project(summaries) for project in key_value)
        return cls(keys, values, mask, memory_distances(sentences, mask.shape[-1], used))

    def extend(
        self, logits: Array, key_mask: Array, q: Array, q_gamma: Array, scale: float
    ) -> tuple[Array, Array]:
        """The chunk's scaled ``logits [B, H, L, L]`` and ``key_mask`` with the memory's keys
        appended (``[B, H, L, L + M]``)."""
        B, L = logits.shape[0], logits.shape[-1]
        extra = memory_logits(q, q_gamma, self.keys, self.onehot) / scale
        key_mask = jnp.broadcast_to(key_mask, (B, 1, 1, L))
        return (
            jnp.concatenate([logits, extra], axis=-1),
            jnp.concatenate([key_mask, self.mask[:, None, None] > 0], axis=-1),
        )

    def split(self, weights: Array, dropped: Array, gamma_v: Array) -> tuple[Array, Array, Array]:
        """(the chunk's weights, the chunk's dropped-out weights, the memory's output)."""
        L = weights.shape[-1] - self.mask.shape[-1]
        out = memory_output(dropped[..., L:], self.values, gamma_v, self.onehot)
        return weights[..., :L], dropped[..., :L], out


def packed_memory_keys(
    qkv: tuple[Array, Array, Array],
    key_value: Any,
    memory: tuple[Array, Array],
    sentence_index: Array,
    mask: Array,
    slots: int,
) -> tuple[tuple[Array, Array, Array], Array, Array]:
    """Packed rows' keys with the carried summaries appended (:mod:`.final_packed_streams`):
    ``memory`` = (summaries ``[B, K, D]``, ``K = G * slots``, through the layer's key and
    value projections; mask ``[B, 1, L, K]``). Returns the queries, keys and values, the keys'
    sentence slots (the row's ``sentence_index``, then ``j - slots`` for summary ``j`` of a
    lane) and the mask ``[B, 1, L, L + K]``."""
    q, k, v = qkv
    summaries, memory_mask = memory
    memory_k, memory_v = (project(summaries) for project in key_value)
    B, K = summaries.shape[:2]
    index = jnp.broadcast_to(jnp.arange(K) % slots - slots, (B, K))
    return (
        (q, jnp.concatenate([k, memory_k], axis=1), jnp.concatenate([v, memory_v], axis=1)),
        jnp.concatenate([sentence_index, index], axis=1),
        jnp.concatenate([mask, memory_mask], axis=-1),
    )


def sentence_summaries(h: Array, src_mask: Array, slots: int) -> tuple[Array, Array]:
    """The source memory a chunk leaves: ``h [B, S, T, D]`` averaged over each sentence's real
    tokens, right-aligned in ``slots`` slots (the last real sentence in the last slot) ->
    (``[B, M, D]``, mask ``[B, M]``). Rows with more than ``M`` sentences keep the last ``M``."""
    B, S, T, D = h.shape
    real = (src_mask > 0).astype(jnp.float32)
    mean = jnp.einsum("bstd,bst->bsd", h.astype(jnp.float32), real)
    mean = mean / jnp.maximum(real.sum(-1), 1.0)[..., None]
    count = jnp.sum(jnp.any(src_mask > 0, axis=-1), axis=-1)  # sentences per row [B]
    sentence = jnp.arange(slots)[None, :] - slots + count[:, None]  # [B, M]
    valid = sentence >= 0
    picked = jnp.take_along_axis(mean, jnp.clip(sentence, 0, S - 1)[..., None], axis=1)
    return jnp.where(valid[..., None], picked, 0.0).astype(h.dtype), valid.astype(jnp.int32)


def last_sentence(x: Array, sentence_mask: Array) -> Array:
    """``x [B, S, ...]`` at each row's last real sentence (``sentence_mask [B, S]``; row 0's
    sentence for rows without one) -> ``[B, ...]``."""
    count = jnp.sum(sentence_mask > 0, axis=-1)
    index = jnp.maximum(count - 1, 0)
    return jnp.take_along_axis(x, index.reshape((-1,) + (1,) * (x.ndim - 1)), axis=1)[:, 0]


def pad_length(x: Array, length: int, axis: int = 1) -> Array:
    """``x`` zero-padded (or cut: only masked positions may be cut) to ``length`` on ``axis``."""
    size = x.shape[axis]
    if size >= length:
        return jax.lax.slice_in_dim(x, 0, length, axis=axis)
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, length - size)
    return jnp.pad(x, widths)


def empty_carry(rows: int, slots: int, length: int, dim: int, layers: int, dtype: Any) -> Carry:
    """The state before a document's first chunk: empty source and target memories of fixed
    shapes (``slots`` summaries, ``length`` target positions per decoder layer)."""
    carry: Carry = {
        "source": jnp.zeros((rows, slots, dim), dtype),
        "source_mask": jnp.zeros((rows, slots), jnp.int32),
        "target_mask": jnp.zeros((rows, length), jnp.int32),
    }
    for i in range(layers):
        carry[f"target_layer_{i}"] = jnp.zeros((rows, length, dim), dtype)
    return carry


def continued(carry: Carry, continues: Array) -> Carry:
    """``carry`` where a row's chunk continues the document of the previous chunk
    (``continues [B]`` True), the empty state elsewhere (masks zeroed: nothing is read)."""
    keep = continues.astype(jnp.int32)
    out = dict(carry)
    out["source_mask"] = carry["source_mask"] * keep[:, None]
    out["target_mask"] = carry["target_mask"] * keep[:, None]
    return out


class RecurrentSteps(nn.Module):
    """What training a recurrent FINAL calls on :class:`~.final.Final` (which provides
    ``encode``, ``decode_with_states`` and ``config``): one chunk per row with the state its
    previous chunk left."""

    config: Any

    def forward_carried(
        self,
        src: Array,
        src_mask: Array,
        tgt: Array,
        tgt_mask: Array,
        carry: Carry,
        continues: Array,
        detach: bool = True,
    ) -> tuple[Array, Carry]:
        """Logits ``[B, S, T, V]`` of chunks ``[B, S, T]`` read with ``carry`` where
        ``continues [B]``, and the state they leave (the shapes of :func:`empty_carry`): the
        summaries of their encoding and the decoder layer inputs of their last real sentence;
        stop-gradient with ``detach`` (else the next chunk's loss trains how it is written)."""
        cfg = self.config
        carry = continued(carry, continues)
        encoded = self.encode(src, src_mask, (carry["source"], carry["source_mask"]))
        T, length = tgt.shape[-1], carry["target_mask"].shape[-1]
        layer_names = [f"target_layer_{i}" for i in range(cfg.num_decoder_layers)]
        first = (
            [pad_length(carry[n], T) for n in layer_names],
            pad_length(carry["target_mask"], T),
        )
        logits, inputs = self.decode_with_states(
            encoded, src_mask, layers.shift_right(tgt, BOS_ID), tgt_mask, first
        )
        summaries, summary_mask = sentence_summaries(encoded, src_mask, cfg.max_segments)
        sentences = jnp.any(tgt_mask > 0, axis=-1)
        new: Carry = {"source": summaries, "source_mask": summary_mask}
        new["target_mask"] = pad_length(last_sentence(tgt_mask, sentences), length)
        for name, states in zip(layer_names, inputs, strict=True):
            new[name] = pad_length(last_sentence(states, sentences), length)
        return logits, jax.lax.stop_gradient(new) if detach else new

    def forward_packed_carried(
        self,
        src: Array,
        src_mask: Array,
        tgt: Array,
        tgt_mask: Array,
        segments: dict[str, Array],
        streams: dict[str, Array],
        carry: Carry,
        detach: bool = True,
    ) -> tuple[Array, Carry]:
        """:meth:`forward_carried` on packed stream rows ``[B, L]`` (``streams``: the
        ``{side}_stream`` features): logits ``[B, L, V]`` with every stream's ``carry``
        (``[N, ...]``) read where its chunk continues, and the state the chunks leave
        (:mod:`.final_packed_streams`; stop-gradient with ``detach``)."""
        memory, carried, read = packed_streams.read_carry(
            carry, segments, streams, self.config.max_segments
        )
        encoded = self.encode_packed(src, read, memory)
        tgt_in = layers.shift_right_segments(tgt, read["tgt_positions"], BOS_ID)
        logits, inputs = self.decode_packed_with_states(encoded, tgt_in, read, carried)
        masks = (src_mask, tgt_mask)
        new = packed_streams.write_carry(encoded, inputs, masks, read, streams, carry)
        return logits, jax.lax.stop_gradient(new) if detach else new


def initial_carry(config: Any, rows: int) -> Carry:
    """:func:`empty_carry` of a FINAL config: ``max_segments`` summaries, ``max_sentence_len``
    target positions, one state per decoder layer."""
    return empty_carry(
        rows,
        config.max_segments,
        config.max_sentence_len,
        config.d_model,
        config.num_decoder_layers,
        config.dtype,
    )


def carried_loss(
    model: Any, params: Any, batch: dict[str, Array], carry: Carry, rng: Array | None, train: bool
) -> tuple[Array, Any, Carry]:
    """The label-smoothed loss and metrics of a stream batch's chunks read with ``carry``, and
    the state they leave: grid rows (rows whose ``chunk_index > 0`` continue their document) or
    packed stream rows (:mod:`.final_packed_streams`). With ``bptt_chunks = k > 1`` the batch
    holds ``k`` consecutive steps of every stream (the grid's rows ``b*k + i``,
    :class:`~docnmt_jax.data.stream_plan.StreamPlan`; packed: columns ``i*C ..``,
    :class:`~docnmt_jax.data.packed_stream_plan.PackedStreamPlan`): :func:`window_loss`."""
    packed = schema.is_packed(batch)
    metrics_of = packed_streams.chunk_metrics if packed else chunk_metrics
    k = model.config.bptt_chunks
    if k > 1:
        steps = packed_streams.window_steps(batch, k) if packed else grid_steps(batch, k)
        return window_loss(model, params, steps, carry, rng, train, metrics_of)
    metrics, new_carry = metrics_of(model, params, batch, carry, rng, train, detach=True)
    loss = metrics["loss"].total / jnp.maximum(metrics["loss"].weight, 1.0)
    return loss, metrics, new_carry


def grid_steps(batch: dict[str, Array], k: int) -> list[dict[str, Array]]:
    """The ``k`` steps of a grid window batch: stream ``b``'s chunk ``i`` at row ``b*k + i``."""
    rows = batch["src"].shape[0] // k
    return [
        {key: value.reshape(rows, k, *value.shape[1:])[:, i] for key, value in batch.items()}
        for i in range(k)
    ]


def chunk_metrics(
    model: Any,
    params: Any,
    batch: dict[str, Array],
    carry: Carry,
    rng: Array | None,
    train: bool,
    detach: bool,
) -> tuple[Any, Carry]:
    """Token metrics (sums) of one chunk per row read with ``carry``, and the state it leaves
    (stop-gradient with ``detach``)."""
    from docnmt_jax.models.base import token_metrics

    module = model.train_module if train else model.eval_module
    logits, new_carry = module.apply(
        {"params": params},
        batch["src"],
        batch["src_mask"],
        batch["tgt"],
        batch["tgt_mask"],
        carry,
        batch["chunk_index"] > 0,
        detach,
        rngs={"dropout": rng} if train else {},
        method=module.forward_carried,
    )
    T = batch["tgt"].shape[-1]
    metrics = token_metrics(
        logits.reshape(-1, T, logits.shape[-1]),
        batch["tgt"].reshape(-1, T),
        batch["tgt_mask"].reshape(-1, T),
        model.label_smoothing,
    )
    return metrics, new_carry


def window_loss(
    model: Any,
    params: Any,
    steps: list[dict[str, Array]],
    carry: Carry,
    rng: Array | None,
    train: bool,
    metrics_of: Any = chunk_metrics,
) -> tuple[Array, Any, Carry]:
    """Truncated back-propagation through ``k = len(steps)`` chunks of every stream (the
    window's steps, :func:`grid_steps` or :func:`.final_packed_streams.window_steps`, each read
    by ``metrics_of``). Chunk ``i + 1`` reads the state chunk ``i`` left *with* its gradient,
    so its loss trains how the state is written as well as read; ``carry`` (the state before
    the window) is a constant, and the state the window leaves is stop-gradient. Each step is
    rematerialised in the backward pass (``jax.checkpoint``): memory grows with ``k``, not
    with the document. The loss is the token-weighted mean over the window's chunks."""

    def one(params: Any, step: dict[str, Array], carry: Carry, rng: Array | None) -> tuple:
        return metrics_of(model, params, step, carry, rng, train, detach=False)

    run = jax.checkpoint(one)
    total = None
    for i, step in enumerate(steps):
        step_rng = None if rng is None else jax.random.fold_in(rng, i)
        metrics, carry = run(params, step, carry, step_rng)
        total = metrics if total is None else {n: total[n] + metrics[n] for n in total}
    loss = total["loss"].total / jnp.maximum(total["loss"].weight, 1.0)
    return loss, total, jax.lax.stop_gradient(carry)


def empty_decode_carry(config: Any, rows: int) -> Carry:
    """The decoding state before a document: empty summaries and an empty target memory (one
    masked position of the search cache's keys/values ``[B, H, 1, d]`` per decoder layer)."""
    H, d = config.num_heads, config.d_model // config.num_heads
    target: Carry = {"mask": jnp.zeros((rows, 1), jnp.int32)}
    for i in range(config.num_decoder_layers):
        zeros = jnp.zeros((rows, H, 1, d), config.dtype)
        target[f"layer_{i}"] = {"key": zeros, "value": zeros}
    return {
        "source": jnp.zeros((rows, config.max_segments, config.d_model), config.dtype),
        "source_mask": jnp.zeros((rows, config.max_segments), jnp.int32),
        "target": target,
    }


def carried_search_inputs(
    model: Any, params: Any, batch: dict[str, Array], carry: Carry, search: Any
) -> tuple[Any, Carry, tuple[Array, Array]]:
    """The slot search's inputs of stream chunks (as ``FinalModel.search_inputs``) read with
    the decoding ``carry`` where ``batch["chunk_index"] > 0``: the chunks encoded with the
    carried summaries, sentence 0's memory = the carried target memory (the chosen translation
    of the previous chunk's last sentence); and the summaries the chunks leave."""
    module, variables = model.eval_module, {"params": params}
    src, src_mask = batch["src"], batch["src_mask"]
    keep = (batch["chunk_index"] > 0).astype(jnp.int32)
    memory = (carry["source"], carry["source_mask"] * keep[:, None])
    encoded = module.apply(variables, src, src_mask, memory, method=module.encode)
    summaries = sentence_summaries(encoded, src_mask, model.config.max_segments)
    target = dict(carry["target"], mask=carry["target"]["mask"] * keep[:, None])
    return (
        (encoded.swapaxes(0, 1), src_mask.swapaxes(0, 1), src_mask.swapaxes(0, 1)),
        target,
        summaries,
    )
