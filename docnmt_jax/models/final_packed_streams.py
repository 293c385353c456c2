"""Recurrent FINAL on packed document streams (docs/papers/final.md, "Training on document
streams"): the state every stream carries, ``[N, ...]`` in the train state, read into packed
rows and written back from them (rows of :mod:`docnmt_jax.data.packed_stream_plan`).

Row ``r`` of a batch of ``R`` rows holds chunks of the streams ``r*G .. r*G + G - 1`` (``G = N
/ R``), every token knows its 1-based stream (``{side}_stream``), and a chunk that continues its
document starts on the target side with the slots of its carried target memory
(``tgt_sentence_index`` -1, positions ``0 .. m-1``, chunk positions ``-m .. -1``). Against the
grid's :meth:`~.final_recurrence.RecurrentSteps.forward_carried`, token by token:

* source memory (:func:`read_carry`): row ``r``'s extra keys of the global layer are its lanes'
  summaries ``[G*M]``; a token reads those of its own stream when its chunk continues (has
  carried target slots), at slots ``-M .. -1``, the grid's distances ``k + M - j``
  (:func:`~.final_recurrence.packed_memory_keys`);
* target memory: carried slot ``j`` of stream ``s`` holds ``carry["target_layer_i"][s, j]``
  at layer ``i``, read as a memory key by sentence 0 exactly as sentence ``k`` reads sentence
  ``k - 1`` in the banded rows (:func:`~.xl.packed_decoder_attention`: same chunk, sentence
  index one less, distances from chunk positions ``i + m - j``), with its gradient (the grid's
  ``first_memory`` is not stop-gradient either); a slot whose carried mask is 0 is no key;
* the state left (:func:`write_carry`): per stream the mean of ``h`` over each sentence's
  source tokens right-aligned in ``M`` slots, and the decoder layer inputs of the chunk's last
  target sentence at its positions; empty for a stream without a chunk (the grid's padding
  rows).

Reads are integer gathers from the carry, writes scatter-adds into zeroed ``[N*M]`` and
``[N*Tm]`` tables (every slot written at most once), so their gradients, with ``bptt_chunks
> 1``, are the inverse scatter and gather.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from docnmt_jax.data import schema

Array = jax.Array
Carry = dict[str, Any]


def per_chunk_max(values: Array, chunks: Array, where: Array) -> Array:
    """Per token ``[B, L]``: the largest of ``values`` over the tokens ``where`` of its chunk
    (``chunks``: 1-based chunk ids in the row), 0 if none."""
    rows = jnp.arange(chunks.shape[0])[:, None]
    table = jnp.zeros((chunks.shape[0], chunks.shape[1] + 1), values.dtype)
    table = table.at[rows, chunks].max(jnp.where(where, values, 0))
    return jnp.take_along_axis(table, chunks, axis=1)


def target_layers(carry: Carry) -> int:
    """Decoder layers whose inputs the carry holds (``target_layer_0 ..``)."""
    return sum(1 for name in carry if name.startswith("target_layer_"))


def read_carry(
    carry: Carry, segments: dict[str, Array], streams: dict[str, Array], slots: int
) -> tuple[tuple[Array, Array], tuple[list[Array], Array], dict[str, Array]]:
    """What packed rows read of ``carry`` (module docstring): the source memory (summaries
    ``[B, G*M, D]``, mask ``[B, 1, L, G*M]``: query token against key), the carried target
    memory (per layer ``[B, L, D]`` at the carried slots, and those slots ``[B, L]`` where the
    carry's mask is set) and ``segments`` with the other carried slots out of their chunk."""
    src_stream, tgt_stream = streams["src_stream"], streams["tgt_stream"]
    B, L = tgt_stream.shape
    N, Tm = carry["target_mask"].shape
    if N % B:
        raise ValueError(f"{N} carried streams are not {B} rows of lanes")
    G = N // B
    carried = (segments["tgt_sentence_index"] < 0) & (tgt_stream > 0)
    flat = jnp.where(carried, (tgt_stream - 1) * Tm + segments["tgt_positions"], 0)
    valid = carried & (carry["target_mask"].reshape(-1)[flat] > 0)
    states = [
        carry[f"target_layer_{i}"].reshape(N * Tm, -1)[flat] for i in range(target_layers(carry))
    ]
    chunks = segments["tgt_chunk_ids"]
    rows = jnp.arange(B)[:, None]
    continues = jnp.zeros((B, L + 1), jnp.int32).at[rows, chunks].max(carried.astype(jnp.int32))
    src_continues = jnp.take_along_axis(continues, segments["src_chunk_ids"], axis=1) > 0
    lane = jnp.arange(B)[:, None] * G + jnp.arange(G * slots)[None, :] // slots + 1  # [B, G*M]
    key_real = carry["source_mask"].reshape(B, G * slots) > 0
    mask = (src_stream[:, :, None] == lane[:, None, :]) & key_real[:, None, :]
    mask = mask & src_continues[..., None]
    summaries = carry["source"].reshape(B, G * slots, -1)
    read = dict(segments, tgt_chunk_ids=jnp.where(carried & ~valid, 0, chunks))
    return (summaries, mask[:, None]), (states, valid), read


def write_carry(
    h: Array,
    inputs: list[Array],
    masks: tuple[Array, Array],
    segments: dict[str, Array],
    streams: dict[str, Array],
    like: Carry,
) -> Carry:
    """The state the packed rows' chunks leave, shaped like ``like`` (module docstring):
    ``h [B, L, D]`` the encoding, ``inputs`` every decoder layer's input ``[B, L, D]``,
    ``masks`` the source and target token masks."""
    N, M = like["source_mask"].shape
    Tm, D = like["target_mask"].shape[1], h.shape[-1]
    stream, sidx = streams["src_stream"], segments["src_sentence_index"]
    real = (masks[0] > 0) & (stream > 0)
    slot = M - per_chunk_max(sidx + 1, segments["src_chunk_ids"], real) + sidx
    at = jnp.where(real & (slot >= 0), (stream - 1) * M + slot, N * M).reshape(-1)
    weight = real.astype(jnp.float32).reshape(-1)
    sums = jnp.zeros((N * M + 1, D), jnp.float32)
    sums = sums.at[at].add(h.astype(jnp.float32).reshape(-1, D) * weight[:, None])
    tokens = jnp.zeros((N * M + 1,), jnp.float32).at[at].add(weight)[:-1]
    new: Carry = {
        "source": (sums[:-1] / jnp.maximum(tokens, 1.0)[:, None]).reshape(N, M, D).astype(h.dtype),
        "source_mask": (tokens > 0).reshape(N, M).astype(jnp.int32),
    }
    stream, tidx = streams["tgt_stream"], segments["tgt_sentence_index"]
    real = (masks[1] > 0) & (stream > 0)
    last = tidx + 1 == per_chunk_max(tidx + 1, segments["tgt_chunk_ids"], real)
    at = jnp.where(real & last, (stream - 1) * Tm + segments["tgt_positions"], N * Tm)
    at = at.reshape(-1)
    new["target_mask"] = jnp.zeros(N * Tm + 1, jnp.int32).at[at].add(1)[:-1].reshape(N, Tm)
    for i, states in enumerate(inputs):
        table = jnp.zeros((N * Tm + 1, D), states.dtype).at[at].add(states.reshape(-1, D))
        new[f"target_layer_{i}"] = table[:-1].reshape(N, Tm, D)
    return new


def window_steps(batch: dict[str, Array], k: int) -> list[dict[str, Array]]:
    """The ``k`` steps of a packed window batch ``[R, k*C]``: columns ``i*C .. (i+1)*C - 1``."""
    C = batch["src"].shape[1] // k
    return [{key: value[:, i * C : (i + 1) * C] for key, value in batch.items()} for i in range(k)]


def chunk_metrics(
    model: Any,
    params: Any,
    batch: dict[str, Array],
    carry: Carry,
    rng: Array | None,
    train: bool,
    detach: bool,
) -> tuple[Any, Carry]:
    """Token metrics (sums) of one step of packed stream rows read with ``carry``, and the
    state it leaves (stop-gradient with ``detach``)."""
    from docnmt_jax.models.base import token_metrics

    module = model.train_module if train else model.eval_module
    rows = model.rows(batch)
    logits, new_carry = module.apply(
        {"params": params},
        rows["src"],
        rows["src_mask"],
        rows["tgt"],
        rows["tgt_mask"],
        rows["segments"],
        {name: batch[name] for name in schema.PACKED_STREAM_FEATURES},
        carry,
        detach,
        rngs={"dropout": rng} if train else {},
        method=module.forward_packed_carried,
    )
    metrics = token_metrics(logits, rows["tgt"], rows["tgt_mask"], model.label_smoothing)
    return metrics, new_carry
