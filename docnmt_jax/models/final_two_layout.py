"""FINAL's two-layout train step (Zheng et al. 2020, Sec. 4) on aligned packed rows
(:mod:`docnmt_jax.data.two_layout_plan`, ``FinalConfig.packed_layout = "two_layout"``).

A batch of aligned rows ``[B, L]`` is read in two layouts without moving a token:

* **sentence layout** ``[B * L/M, M]`` (a reshape; ``M = max_sentence_len``): the local encoder
  layers (sentence-masked, dense over ``M`` keys), the decoder's causal self-attention over
  ``[SG(s^{l-1}_{k-1}); s^{l-1}_k]`` with the relative positions of Dai et al. (2019) as
  :mod:`.xl` defines them (one softmax over memory and current keys), its cross-attention to
  ``h_k`` and everything position-wise;
* **chunk layout** (the row): the global layer, Eq. (1), dense over the row and masked to the
  chunk, its segment term one widened product (:class:`~.final_layers.SegmentRelativeAttention`);
  ``doc2sent``'s local layers and the chunk-wide cross-attention likewise. With
  ``packed_chunk_spans = n > 1`` the global layer reads the row's chunks gathered into ``n``
  spans of ``L / n`` slots (:func:`chunk_layout`, each chunk contiguous inside one span, laid
  next-fit in chunk order as the planner guarantees), dense over a span: rows ``n`` times
  longer give the sentence layout more blocks to fill at the global layer's cost per token.

The XL memory of a block is gathered by index (:func:`memory_rows`): the stop-gradient layer
inputs of the previous sentences of the block's sentences, laid one after another in a memory
row of ``M`` slots (the planner leaves room for them). The index is built on the device from
the packed features: integer scatters, once per step. Memory distances are differences of
target chunk positions, ``i + n_{k-1} - j`` (up to ``2M - 1``), current ones ``i - j``, so every
real token's logits, loss term and gradient equal the grid's and the banded packed step's
(``tests/test_final_two_layout.py``, float64).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from docnmt_jax.models import layers
from docnmt_jax.models.xl import PackedDecoderAttention, packed_decoder_attention

Array = jax.Array
Segments = dict[str, Array]


class MemoryRows(NamedTuple):
    """Where each block's memory row reads, per row ``[B, L]``: ``index`` (the target slot of
    the row each memory slot holds; ``L``: empty, read as zeros), its inverse (each target
    token's memory slot in the row; ``L``: none), and the self-attention's memory part for the
    block's queries: ``mask [N, 1, M, M]``, ``distance [N, M, M]``."""

    index: Array
    inverse: Array
    mask: Array
    distance: Array


def blocks(x: Array, width: int) -> Array:
    """Rows ``[B, L, ...]`` -> sentence layout ``[B * L/width, width, ...]``."""
    return x.reshape((-1, width) + x.shape[2:])


def _by_segment(values: Array, segment: Array, where: Array, size: int) -> Array:
    """Per row, ``table[b, s] = values`` at the tokens ``where`` holds (one per segment ``s``),
    0 elsewhere: ``[B, size]``."""
    rows = jnp.arange(segment.shape[0])[:, None]
    column = jnp.where(where, segment, size)  # out of range: dropped
    table = jnp.zeros((segment.shape[0], size), values.dtype)
    return table.at[rows, column].set(values, mode="drop")


def _read(rows: Array, index: Array, fill: float | int = 0) -> Array:
    """``rows [B, L, ...]`` at ``index [B, L]`` per row (``L``: ``fill``)."""
    pad = jnp.full((rows.shape[0], 1) + rows.shape[2:], fill, rows.dtype)
    return jax.vmap(lambda r, i: r[i])(jnp.concatenate([rows, pad], axis=1), index)


def memory_rows(segments: Segments, width: int) -> MemoryRows:
    """The memory rows of aligned target rows (module docstring). Segment ``s`` with
    ``sentence_index > 0`` has segment ``s - 1`` as its previous sentence (the planner's
    numbering); its tokens go to the block of ``s``, after the memories of the block's earlier
    sentences, in order (a memory beyond the block's ``width`` slots, which the planner never
    lays, is dropped rather than written over another). Integer scatters within each row."""
    seg, chunk, sidx, pos, cpos = (
        segments[f"tgt_{name}"]
        for name in ("segment_ids", "chunk_ids", "sentence_index", "positions", "chunk_positions")
    )
    B, L = seg.shape
    size = L + 2  # segment ids 0..L, and s + 1
    real, rows, slot = seg > 0, jnp.arange(B)[:, None], jnp.arange(L)[None, :]
    start = real & (pos == 0)
    length = jnp.zeros((B, size), jnp.int32).at[rows, seg].add(real.astype(jnp.int32))
    has_prev = start & (sidx > 0)
    prev_len = jnp.where(has_prev, jnp.take_along_axis(length, jnp.maximum(seg - 1, 0), 1), 0)
    offset = blocks(prev_len, width)
    offset = (jnp.cumsum(offset, axis=1) - offset).reshape(B, L)  # within the block
    first_of, offset_of = (
        _by_segment(x, seg, has_prev, size) for x in ((slot // width) * width + offset, offset)
    )
    chunk_of, sidx_of = (_by_segment(x, seg, start, size) for x in (chunk, sidx))
    nxt = jnp.minimum(seg + 1, size - 1)
    take = lambda table: jnp.take_along_axis(table, nxt, axis=1)  # noqa: E731
    is_memory = real & (take(chunk_of) == chunk) & (take(sidx_of) == sidx + 1)
    inverse = jnp.where(is_memory & (take(offset_of) + pos < width), take(first_of) + pos, L)
    index = invert(inverse)
    q = lambda x: blocks(x, width)[:, :, None]  # noqa: E731
    mem_seg, mem_chunk, mem_cpos = (
        blocks(_read(x, index, -1), width)[:, None] for x in (seg, chunk, cpos)
    )
    mask = (mem_seg == q(seg) - 1) & (mem_chunk == q(chunk)) & (q(sidx) > 0) & (q(seg) > 0)
    return MemoryRows(index, inverse.astype(jnp.int32), mask[:, None], q(cpos) - mem_cpos)


def invert(inverse: Array) -> Array:
    """The gather ``index [B, L]`` of an injective placement ``inverse [B, L]`` (each slot's
    place in the output, ``L`` where it is not placed): ``index[b, inverse[b, s]] = s``, ``L``
    at the places no slot takes."""
    B, L = inverse.shape
    slots = jnp.broadcast_to(jnp.arange(L, dtype=jnp.int32), (B, L))
    rows = jnp.arange(B)[:, None]
    return jnp.full((B, L), L, jnp.int32).at[rows, inverse].set(slots, mode="drop")


@jax.custom_vjp
def permute(x: Array, index: Array, inverse: Array) -> Array:
    """Sentence-layout ``x [N, M, ...]`` read within each row ``[B, L]`` at ``index [B, L]``
    (``L``: zeros): an injective gather whose backward is the gather by ``inverse`` (each
    slot's place in the output, ``L`` where it is not read), a permutation's transpose, no
    scatter-add; rows stay apart (a batch sharded by rows gathers locally)."""
    rows = x.reshape(index.shape + x.shape[2:])
    return _read(rows, index).reshape(x.shape)


def _permute_fwd(x: Array, index: Array, inverse: Array) -> tuple[Array, tuple[Array, Array]]:
    return permute(x, index, inverse), (index, inverse)


def _permute_bwd(residuals: tuple[Array, Array], g: Array) -> tuple[Array, None, None]:
    index, inverse = residuals
    return permute(g, inverse, index), None, None


permute.defvjp(_permute_fwd, _permute_bwd)


def chunk_layout(segments: Segments, spans: int) -> tuple[Array, Array]:
    """Where the global layer's chunk layout reads the source rows ``[B, L]``: ``(index,
    inverse)`` as :func:`permute` takes them. The row's chunks (ids ``1..n`` in order) are laid
    next-fit into ``spans`` spans of ``W = L / spans`` slots (a chunk stays in the current
    span while it fits, else starts the next; :func:`~docnmt_jax.data.two_layout_plan.
    next_fit_spans` is the reference), each chunk's tokens at their chunk positions. A chunk
    that finds no span (which the planner never lays) is left out rather than overlaid."""
    chunk, cpos = segments["src_chunk_ids"], segments["src_chunk_positions"]
    B, L = chunk.shape
    width, rows = L // spans, jnp.arange(B)[:, None]
    real = chunk > 0
    length = jnp.zeros((B, L + 1), jnp.int32).at[rows, chunk].add(real.astype(jnp.int32))
    end = jnp.cumsum(length, axis=1)  # the end of chunk c with the chunks laid end to end
    start, base = end - length, jnp.zeros((B, 1), jnp.int32)
    offset, placed = jnp.full((B, L + 1), L, jnp.int32), jnp.zeros((B, L + 1), bool)
    for span in range(spans):  # next fit: unplaced chunks are a suffix, ``end`` is sorted
        fits = ~placed & (end - base <= width)
        offset = jnp.where(fits, span * width + start - base, offset)
        placed = placed | fits
        base = jnp.max(jnp.where(placed, end, 0), axis=1, keepdims=True)
    slot = jnp.take_along_axis(offset, chunk, axis=1) + cpos
    inverse = jnp.where(real & (slot < L), slot, L).astype(jnp.int32)
    return invert(inverse), inverse


def global_context(
    layer: Callable[..., tuple[Array, Array]],
    h: Array,
    segments: Segments,
    spans: int = 1,
    memory: tuple[Array, Array] | None = None,
) -> Array:
    """The global layer (Eq. 1) over packed source rows ``h [B, L, D]``: dense over the row
    masked to the chunk (``spans = 1``), or over the spans of :func:`chunk_layout`; tokens of
    chunks with one sentence (and no ``memory`` to read) keep ``h^L``."""
    chunks, sidx = segments["src_chunk_ids"], segments["src_sentence_index"]
    B, L, D = h.shape
    if spans > 1:
        index, inverse = chunk_layout(segments, spans)
        chunks, sidx = (_read(x, index).reshape(B * spans, -1) for x in (chunks, sidx))
        x = permute(h, index, inverse).reshape(B * spans, L // spans, D)
    else:
        x = h
    chunk_mask = layers.segment_mask(chunks, chunks)  # [B', 1, W, W]
    h_global, _ = layer(x, chunk_mask, sidx, memory)
    other = sidx[:, None, None, :] != sidx[:, None, :, None]
    several = jnp.any(chunk_mask & other, axis=(1, 3))  # the chunk has > 1 sentence
    if memory is not None:  # or a memory to read
        several = several | jnp.any(memory[1], axis=(1, 3))
    if spans > 1:
        h_global = permute(h_global.reshape(B, L, D), inverse, index)
        several = _read(several.reshape(B, L), inverse, False)
    return jnp.where(several[..., None], h_global, h)


class GatheredBand(layers.Band):
    """A :class:`~.layers.Band` of single blocks of ``M`` whose windows are each block's
    memory row (:func:`memory_rows`), read by :func:`permute`."""

    def __init__(self, length: int, width: int, memory: MemoryRows):
        super().__init__(length, width)
        self.memory = memory

    def windows(self, x: Array) -> Array:
        return permute(x, self.memory.index, self.memory.inverse)


def local_band(cfg: Any, length: int) -> layers.Band:
    """The local encoder layers' band over packed rows of ``length``: with ``two_layout``
    single blocks of ``M = max_sentence_len`` (the sentence layout: every sentence inside its
    block), else the banded rows' windows of ``M - 1`` slots either way."""
    M = cfg.max_sentence_len
    if cfg.packed_layout == "two_layout":
        return layers.Band(length, M)
    return layers.Band.covering(length, cfg.packed_block, M - 1, M - 1)


def decoder_attention(cfg: Any, segments: Segments) -> PackedDecoderAttention:
    """What the decoder layers attend to in packed rows: with ``two_layout`` the sentence
    layout (:func:`sentence_attention`), else the bands of :func:`~.xl.packed_decoder_attention`."""
    if cfg.packed_layout == "two_layout":
        return sentence_attention(segments, cfg.max_sentence_len, cfg.cross_attends_chunk)
    return packed_decoder_attention(
        segments,
        cfg.packed_block,
        cfg.max_sentence_len,
        cfg.packed_drift,
        cross_chunk=cfg.cross_attends_chunk,
    )


def sentence_attention(
    segments: Segments, width: int, cross_chunk: bool = False
) -> PackedDecoderAttention:
    """The decoder's attention over aligned rows in the sentence layout: single blocks of
    ``width`` for the causal part and the cross-attention (``cross_chunk``: the row, dense,
    masked to the chunk), the memory rows of :func:`memory_rows` for the XL memory; distances
    are differences of target chunk positions (:func:`~.xl.packed_decoder_attention`)."""
    L = segments["tgt_segment_ids"].shape[-1]
    band = layers.Band(L, width)
    q = lambda name: blocks(segments[name], width)[:, :, None]  # noqa: E731
    k = lambda name: blocks(segments[name], width)[:, None, :]  # noqa: E731
    seg_q = q("tgt_segment_ids")
    current = (
        (seg_q == k("tgt_segment_ids")) & (seg_q > 0) & (k("tgt_positions") <= q("tgt_positions"))
    )
    if cross_chunk:
        cross = layers.Band.dense(L)
        cross_mask = layers.segment_mask(segments["tgt_chunk_ids"], segments["src_chunk_ids"])
    else:
        cross = band
        cross_mask = ((seg_q == k("src_segment_ids")) & (seg_q > 0))[:, None]
    memory = memory_rows(segments, width)
    return PackedDecoderAttention(
        current=band,
        memory=GatheredBand(L, width, memory),
        cross=cross,
        current_mask=current[:, None],
        current_distance=q("tgt_chunk_positions") - k("tgt_chunk_positions"),
        memory_mask=memory.mask,
        memory_distance=memory.distance,
        cross_mask=cross_mask,
        max_distance=2 * width,
    )


def widened_segment_attention(
    qkv: tuple[Array, Array, Array],
    q_gamma: Array,
    gamma_v: Array,
    mask: Array,
    sentence_index: Array,
    used: int,
    S: int,
    drop: Callable[[Array], Array],
    key_index: Array | None = None,
    first: int = 0,
) -> tuple[Array, Array]:
    """Eq. (1) over packed rows as one widened product each way: queries ``[q; sum_r (q
    gamma^K_r) [r = k_q - c]]`` (their gamma score per key sentence ``c``) against keys ``[k;
    onehot(c_k)]``; weights against values ``[v; onehot(c_k)]``, whose last ``S`` columns are
    the attention mass per key sentence, spread to distances for ``gamma^V``. Returns the
    heads ``[B, L, H, d]`` and the weights ``[B, H, L, K]``. The keys' sentence slots are
    ``key_index [B, K]`` (default: ``sentence_index``, the keys are the queries' tokens), in
    ``first .. first + S - 1`` (recurrent FINAL's carried summaries sit at ``-M .. -1``)."""
    q, k, v = qkv
    dh = q.shape[-1]
    key_index = sentence_index if key_index is None else key_index
    slots = first + jnp.arange(S)
    distance = jnp.clip(sentence_index[..., None] - slots, -used, used) + used
    to_distance = jax.nn.one_hot(distance, 2 * used + 1, dtype=jnp.float32)  # [B, L, S, R]
    per_sentence = jnp.einsum("bhqr,bqcr->bqhc", q_gamma, to_distance).astype(q.dtype)
    key_sentence = jax.nn.one_hot(key_index - first, S, dtype=q.dtype)[:, :, None]
    key_sentence = jnp.broadcast_to(key_sentence, k.shape[:3] + (S,))
    logits = jnp.einsum(
        "bqhd,bkhd->bhqk",
        jnp.concatenate([q, per_sentence], -1),
        jnp.concatenate([k, key_sentence], -1),
        preferred_element_type=jnp.float32,
    )
    weights = layers.masked_softmax(logits / np.sqrt(dh), mask)
    dropped = drop(weights).astype(v.dtype)
    wide = jnp.einsum("bhqk,bkhd->bqhd", dropped, jnp.concatenate([v, key_sentence], -1))
    mass = jnp.einsum("bqhc,bqcr->bqhr", wide[..., dh:], to_distance.astype(v.dtype))
    return wide[..., :dh] + jnp.einsum("bqhr,rhd->bqhd", mass, gamma_v.astype(v.dtype)), weights
