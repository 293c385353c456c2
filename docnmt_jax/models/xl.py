"""Transformer-XL decoder pieces (Dai et al. 2019), FINAL's target-side memory (Zheng et al.
2020, Sec. 4.2): relative self-attention over ``[SG(memory); current sentence]`` and the
decoder layer built on it, with the memory helpers.

Every decoder layer used by a document model implements :class:`DecoderLayerInterface`, so
the model picks its layer class once (``Final.setup``) and never branches on it afterwards:
``teacher_forced`` (all positions at once, with the memory states), ``teacher_forced_packed``
(the same over packed rows, banded: :class:`PackedDecoderAttention`), ``memory_kv`` (the
memory's self-attention keys/values for decoding, or ``None``), ``cross_kv`` and ``step``
(one position against the cache, the memory and the cross-attention keys).

Decisions beyond the paper: the memory's relative positions count from its real length (the
last memory token sits right before the current sentence), so memories padded to any length
give the same result; with ``pre_ln`` the XL self-attention normalises its inputs, memory
included; the position term has no bias (``W_R``), the content/position biases ``u``, ``v``
are per head.
"""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple, Protocol

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from docnmt_jax import flops
from docnmt_jax.models import layers
from docnmt_jax.models.transformer import TransformerConfig

Array = jax.Array
Cache = dict[str, Any]
Memory = dict[str, Array]  # {"mask": [B, Tm], "layer_i": [B, Tm, D] (input of decoder layer i)}
MemoryKV = dict[str, Any]  # {"mask": [B, Tm], "layer_i": {"key", "value": [B, H, Tm, d]}}
KeyPart = tuple[Array, Array, Array, Array]  # keys, values, boolean mask, distances


class PackedDecoderAttention(NamedTuple):
    """What a decoder layer attends to in packed rows (``teacher_forced_packed``), per query
    block of the decoder's block rows ``[N = B * blocks, W]``: the bands (windows) of the three
    key sets, their boolean masks ``[N, 1, W, K]`` (chunk-wide cross-attention: ``[B, 1, L,
    L]``) and the relative distances ``[N, W, K]`` of the self-attention parts (query minus
    key, in chunk positions). Built by :func:`packed_decoder_attention`."""

    current: layers.Band  # causal self-attention: the earlier tokens of the query's sentence
    memory: layers.Band  # the previous sentence of the query's chunk (XL memory)
    cross: layers.Band  # the source sentence with the query's segment id (or chunk: dense)
    current_mask: Array
    current_distance: Array
    memory_mask: Array
    memory_distance: Array
    cross_mask: Array
    max_distance: int  # relative distances below it (the sinusoid table's rows)


def packed_decoder_attention(
    segments: dict[str, Array],
    width: int,
    max_sentence_len: int,
    drift: int,
    cross_chunk: bool = False,
) -> PackedDecoderAttention:
    """The decoder's attention over packed rows (docs/design/packing_plan.md §1 and §2.5)
    from the packed features ``segments`` (``{src,tgt}_{positions, chunk_positions,
    segment_ids, chunk_ids, sentence_index}``, ``[B, L]``), with blocks of ``width`` tokens:

    * current part: same segment and ``pos_k <= pos_q`` (within ``M - 1`` tokens back);
    * memory part: same chunk and ``sentence_index_k == sentence_index_q - 1``, the previous
      sentence, which starts at most ``M`` slots before the query's sentence when the rows were
      laid with drift ``<= drift`` (so within ``2M - 1`` tokens back);
    * cross-attention: the source tokens with the query's segment id (within ``M - 1 + drift``
      tokens either way); with ``cross_chunk`` those of the query's chunk, dense over the row
      (``cross`` is ``Band.dense``, ``cross_mask [B, 1, L, L]``: the source rows are not
      blocked and a row's query blocks share them, ``MultiHeadAttention.attend``'s groups);
    * distances of both self-attention parts: ``tgt_chunk_positions`` of the query minus the
      key's, the grid's ``i - j`` and ``i + n_mem - j`` (chunk positions count real tokens).

    ``M = max_sentence_len`` (the longest sentence with EOS on either side)."""
    L = segments["tgt_segment_ids"].shape[-1]
    M = max_sentence_len
    current = layers.Band.covering(L, width, M - 1, 0)
    memory = layers.Band.covering(L, width, 2 * M - 1, 0)

    def query(name: str) -> Array:  # [N, W, 1]
        return current.blocks(segments[name])[:, :, None]

    def key(band: layers.Band, name: str) -> Array:  # [N, 1, K]
        return band.windows(band.blocks(segments[name]))[:, None, :]

    seg_q, chunk_q, cpos_q = (
        query(f"tgt_{n}") for n in ("segment_ids", "chunk_ids", "chunk_positions")
    )
    current_mask = (
        (seg_q == key(current, "tgt_segment_ids"))
        & (seg_q > 0)
        & (key(current, "tgt_positions") <= query("tgt_positions"))
    )
    memory_mask = (
        (chunk_q == key(memory, "tgt_chunk_ids"))
        & (chunk_q > 0)
        & (key(memory, "tgt_sentence_index") == query("tgt_sentence_index") - 1)
    )
    if cross_chunk:  # source rows unblocked, shared by the row's query blocks
        cross = layers.Band.dense(L)
        cross_mask = layers.segment_mask(segments["tgt_chunk_ids"], segments["src_chunk_ids"])
    else:
        cross = layers.Band.covering(L, width, M - 1 + drift, M - 1 + drift)
        cross_mask = ((seg_q == key(cross, "src_segment_ids")) & (seg_q > 0))[:, None]
    return PackedDecoderAttention(
        current=current,
        memory=memory,
        cross=cross,
        current_mask=current_mask[:, None],
        current_distance=cpos_q - key(current, "tgt_chunk_positions"),
        memory_mask=memory_mask[:, None],
        memory_distance=cpos_q - key(memory, "tgt_chunk_positions"),
        cross_mask=cross_mask,
        max_distance=2 * M,
    )


class DecoderLayerInterface(Protocol):
    """What a document model's decoder layer offers (see the module docstring)."""

    uses_memory: ClassVar[bool]  # attends to the previous sentence's states
    absolute_positions: ClassVar[bool]  # its inputs carry sinusoidal positions

    def teacher_forced(
        self,
        y: Array,
        tgt_mask: Array,
        memory: Array,
        memory_mask: Array,
        encoded: Array,
        cross_mask: Array,
    ) -> Array: ...

    def teacher_forced_packed(
        self,
        y: Array,
        encoded: Array,
        attention: PackedDecoderAttention,
        memory: Array | None = None,
    ) -> Array: ...

    def memory_kv(self, memory: Array) -> tuple[Array, Array] | None: ...

    def cross_kv(self, encoded: Array) -> tuple[Array, Array]: ...

    def step(
        self,
        y: Array,
        index: Array,
        cache: Cache,
        inputs: dict[str, Array],
        memory_mask: Array,
        cross_mask: Array,
    ) -> tuple[Array, Cache]: ...


class RelativeSelfAttention(nn.Module):
    """Multi-head attention with Transformer-XL relative positions (Dai et al. 2019, Sec. 3.3).

    logits = ``[(q+u) k_j + (q+v) W_R R_{i-j}] / sqrt(d)`` with sinusoidal ``R``; the position
    term is computed once per distance and gathered by each key's distance. Keys come in two
    parts, the memory and the current sentence, normalised by one softmax; the two parts are
    never concatenated, and the memory has one row per example (shared by its beams).
    """

    config: TransformerConfig

    def setup(self) -> None:
        cfg = self.config
        H, dh = cfg.num_heads, cfg.d_model // cfg.num_heads
        self.query = layers.heads_projection(H, cfg.d_model, cfg.dtype, name="query")
        self.key = layers.heads_projection(H, cfg.d_model, cfg.dtype, name="key")
        self.value = layers.heads_projection(H, cfg.d_model, cfg.dtype, name="value")
        self.position = layers.heads_projection(  # W_R
            H, cfg.d_model, cfg.dtype, use_bias=False, name="position"
        )
        self.out = layers.output_projection(cfg.d_model, cfg.dtype, name="out")
        bias_init = layers.partitioned(nn.initializers.normal(stddev=0.02), ("heads", "kv"))
        self.content_bias = self.param("content_bias", bias_init, (H, dh))  # u
        self.position_bias = self.param("position_bias", bias_init, (H, dh))  # v
        self.dropout = nn.Dropout(cfg.attention_dropout_rate)

    def project_q(self, x: Array) -> Array:
        return self.query(x)

    def project_kv(self, x: Array) -> tuple[Array, Array]:
        return self.key(x), self.value(x)

    def attend(
        self,
        q: Array,
        current: KeyPart,
        memory: KeyPart,
        heads_major: bool = False,
        max_distance: int | None = None,
    ) -> Array:
        """Attention of ``q [N, Tq, H, d]`` over ``[memory; current]``.

        Each part is (keys, values, mask, distances): ``current`` keys ``[N, Tk, H, d]``,
        ``memory`` keys ``[B, Tm, H, d]`` with ``N = B*G`` (``G`` contiguous query rows per
        memory row: the beams of a search); boolean masks broadcastable to ``[rows, 1, Tq, T]``
        and distances (query position minus key position, >= 0 where attended) to
        ``[rows, Tq, T]``, ``rows`` being that part's row count. With ``heads_major`` the keys
        and values of both parts are ``[rows, H, T, d]`` (decoding caches). The position terms
        cover distances ``0 .. Tm + Tk - 1``, or ``0 .. max_distance - 1`` when given (packed
        rows: no attended distance reaches ``2 * max_sentence_len``).
        """
        cfg = self.config
        N, Tq, H, dh = q.shape
        mem_k, mem_v, mem_mask, mem_dist = memory
        cur_k, cur_v, cur_mask, cur_dist = current
        kv, length_axis = ("bhkd", 2) if heads_major else ("bkhd", 1)
        B, Tm = mem_k.shape[0], mem_k.shape[length_axis]
        Tk = cur_k.shape[length_axis]
        G = N // B
        num_distances = Tm + Tk if max_distance is None else min(max_distance, Tm + Tk)
        rel = layers.sinusoidal_encoding(jnp.arange(num_distances), cfg.d_model, cfg.dtype)
        r = self.position(rel)  # [R, H, d]
        q_content = q + self.content_bias.astype(q.dtype)
        pos_all = jnp.einsum("bqhd,rhd->bhqr", q + self.position_bias.astype(q.dtype), r)

        def rows(x: Array, per_example: bool) -> Array:
            """A memory input ``[B | 1, ...]`` repeated for the ``G`` rows of each example."""
            return jnp.repeat(x, G, axis=0) if per_example and G > 1 and x.shape[0] > 1 else x

        def position_term(distances: Array, width: int, per_example: bool) -> Array:
            index = rows(jnp.clip(distances, 0, num_distances - 1), per_example)
            index = jnp.broadcast_to(index[:, None], (N, H, Tq, width))
            return jnp.take_along_axis(pos_all, index, axis=-1).astype(jnp.float32)

        def full_mask(mask: Array, width: int, per_example: bool) -> Array:
            return jnp.broadcast_to(rows(mask, per_example), (N, 1, Tq, width))

        q_grouped = q_content.reshape(B, G, Tq, H, dh)
        mem_logits = jnp.einsum(f"bgqhd,{kv}->bghqk", q_grouped, mem_k).reshape(N, H, Tq, Tm)
        cur_logits = jnp.einsum(f"bqhd,{kv}->bhqk", q_content, cur_k)
        logits = jnp.concatenate(
            [
                mem_logits.astype(jnp.float32) + position_term(mem_dist, Tm, True),
                cur_logits.astype(jnp.float32) + position_term(cur_dist, Tk, False),
            ],
            axis=-1,
        ) / np.sqrt(dh)
        mask = jnp.concatenate(
            [full_mask(mem_mask, Tm, True), full_mask(cur_mask, Tk, False)], axis=-1
        )
        weights = layers.masked_softmax(logits, mask)
        weights = self.dropout(weights, deterministic=cfg.deterministic).astype(cfg.dtype)
        w_mem = weights[..., :Tm].reshape(B, G, H, Tq, Tm)
        out = jnp.einsum(f"bhqk,{kv}->bqhd", weights[..., Tm:], cur_v)
        if heads_major:  # decoding: the G beams' rows of an example share its memory
            w_mem = jnp.swapaxes(w_mem, 1, 2).reshape(B, H, G * Tq, Tm)
            mem_out = layers.attention_values(w_mem, mem_v)
        else:
            mem_out = jnp.einsum("bghqk,bkhd->bgqhd", w_mem, mem_v)
        out = out + mem_out.reshape(N, Tq, H, dh)
        return self.out(out)


class XLDecoderLayer(nn.Module):
    """Decoder layer of Sec. 4.2: relative self-attention over ``[SG(memory); current]``
    (causal over the current sentence, full over the memory's real tokens), cross-attention to
    the current sentence's encoding, feed-forward; residual sublayers."""

    config: TransformerConfig
    uses_memory: ClassVar[bool] = True
    absolute_positions: ClassVar[bool] = False

    def setup(self) -> None:
        cfg = self.config
        self.self_attention = RelativeSelfAttention(cfg)
        self.self_attention_norm = layers.layer_norm(cfg.dtype)
        self.self_attention_dropout = nn.Dropout(cfg.dropout_rate)
        self.cross_attention = cfg.attention("cross_attention")
        self.ffn = cfg.feed_forward("ffn")
        self.cross_attention_block = cfg.sublayer("cross_attention_block")
        self.ffn_block = cfg.sublayer("ffn_block")

    def memory_kv(self, memory: Array) -> tuple[Array, Array]:
        """Self-attention keys/values ``[B, Tm, H, d]`` of the memory states ``[B, Tm, D]``."""
        if self.config.pre_ln:
            memory = self.self_attention_norm(memory)
        return self.self_attention.project_kv(memory)

    def cross_kv(self, encoded: Array) -> tuple[Array, Array]:
        """Cross-attention keys/values ``[B, H, Ts, d]`` (heads-major) for decoding."""
        return tuple(layers.heads_major(x) for x in self.cross_attention.project_kv(encoded))

    def _self_block(self, y: Array, attend: Any) -> Array:
        cfg = self.config
        h = self.self_attention_norm(y) if cfg.pre_ln else y
        out = y + self.self_attention_dropout(attend(h), deterministic=cfg.deterministic)
        return out if cfg.pre_ln else self.self_attention_norm(out)

    def _rest(
        self, y: Array, cross_kv: tuple[Array, Array], cross_mask: Array, heads_major: bool
    ) -> Array:
        def cross_block(h: Array) -> Array:
            q = self.cross_attention.project_q(h)
            k, v = cross_kv
            return self.cross_attention.attend(q, k, v, cross_mask, heads_major=heads_major)

        y = self.cross_attention_block(y, cross_block)
        y = self.ffn_block(y, self.ffn)
        return layers.constrain(y, ("batch", "length", "embed"))

    def teacher_forced(
        self,
        y: Array,
        tgt_mask: Array,
        memory: Array,
        memory_mask: Array,
        encoded: Array,
        cross_mask: Array,
    ) -> Array:
        """Teacher-forced: ``y [B, T, D]`` with ``memory [B, Tm, D]`` (already stop-gradient)."""
        T, Tm = y.shape[1], memory.shape[1]
        mem_k, mem_v = self.memory_kv(memory)
        n_mem = jnp.sum(memory_mask > 0, axis=-1)[:, None, None]
        i = jnp.arange(T)[None, :, None]
        j_mem, j_cur = jnp.arange(Tm)[None, None, :], jnp.arange(T)[None, None, :]
        mem_mask = (memory_mask > 0)[:, None, None, :]
        cur_mask = ((j_cur <= i) & (tgt_mask[:, None, :] > 0))[:, None]

        def attend(h: Array) -> Array:
            k, v = self.self_attention.project_kv(h)
            return self.self_attention.attend(
                self.self_attention.project_q(h),
                (k, v, cur_mask, i - j_cur),
                (mem_k, mem_v, mem_mask, i + n_mem - j_mem),
            )

        y = self._self_block(y, attend)
        cross_kv = self.cross_attention.project_kv(encoded)
        return self._rest(y, cross_kv, cross_mask, heads_major=False)

    def teacher_forced_packed(
        self,
        y: Array,
        encoded: Array,
        attention: PackedDecoderAttention,
        memory: Array | None = None,
    ) -> Array:
        """Teacher-forced over packed rows: ``y`` and ``encoded`` are block rows ``[N, W, D]``
        of the target and source rows. The memory keys and values are
        ``memory_kv(SG(y))``, or ``memory_kv(memory)`` when given (block rows: states carried
        from another chunk in some slots, recurrent FINAL's), the current ones
        ``project_kv(y)`` (as :meth:`teacher_forced`), each windowed by its band;
        ``attention`` selects which of them a query sees."""
        a = attention
        states = jax.lax.stop_gradient(y) if memory is None else memory
        mem_k, mem_v = (a.memory.windows(x) for x in self.memory_kv(states))

        def attend(h: Array) -> Array:
            k, v = (a.current.windows(x) for x in self.self_attention.project_kv(h))
            return self.self_attention.attend(
                self.self_attention.project_q(h),
                (k, v, a.current_mask, a.current_distance),
                (mem_k, mem_v, a.memory_mask, a.memory_distance),
                max_distance=a.max_distance,
            )

        y = self._self_block(y, attend)
        cross_kv = tuple(a.cross.windows(x) for x in self.cross_attention.project_kv(encoded))
        return self._rest(y, cross_kv, a.cross_mask, heads_major=False)

    def step(
        self,
        y: Array,
        index: Array,
        cache: Cache,
        inputs: dict[str, Array],
        memory_mask: Array,
        cross_mask: Array,
    ) -> tuple[Array, Cache]:
        """One position ``y [N, 1, D]`` at ``index`` (shared, or one per row ``[N]``, the
        beams of an example at the same position): ``cache`` (self-attention keys/values)
        has ``N`` rows, ``inputs`` (memory and cross keys/values) and the masks one per
        example. Returns the output and the updated cache."""
        (B, Tm), L = memory_mask.shape, cache["key"].shape[2]
        n_mem = jnp.sum(memory_mask > 0, axis=-1)[:, None, None]
        j_mem, j_cur = jnp.arange(Tm)[None, None, :], jnp.arange(L)[None, None, :]
        at = jnp.reshape(index, (-1, 1, 1))  # [N | 1, 1, 1]
        at_example = at if at.shape[0] == 1 else at.reshape(B, -1)[:, :1, None]  # [B | 1, 1, 1]
        memory = (
            inputs["key"],
            inputs["value"],
            (memory_mask > 0)[:, None, None, :],
            at_example + n_mem - j_mem,
        )
        new_cache: Cache = {}

        def attend(h: Array) -> Array:
            k, v = self.self_attention.project_kv(h)
            k = layers.write_position(cache["key"], k, index)
            v = layers.write_position(cache["value"], v, index)
            new_cache.update(cache, key=k, value=v)
            current = (k, v, (j_cur <= at)[:, None], at - j_cur)
            q = self.self_attention.project_q(h)
            return self.self_attention.attend(q, current, memory, heads_major=True)

        y = self._self_block(y, attend)
        cross_kv = (inputs["cross_key"], inputs["cross_value"])
        y = self._rest(y, cross_kv, cross_mask, heads_major=True)
        return y, new_cache


def empty_memory(config: TransformerConfig, batch: int, length: int) -> Memory:
    """The (fully masked) memory ``[batch, length]`` of a chunk's first sentence, with zero
    states for every decoder layer."""
    memory: Memory = {"mask": jnp.zeros((batch, length), jnp.int32)}
    for i in range(config.num_decoder_layers):
        memory[f"layer_{i}"] = jnp.zeros((batch, length, config.d_model), config.dtype)
    return memory


def memory_from_states(states: list[Array], mask: Array) -> Memory:
    """A memory from the decoder layer inputs ``s^0..s^{N-1}`` of a sentence (stop-gradient)."""
    memory: Memory = {"mask": mask.astype(jnp.int32)}
    memory.update({f"layer_{i}": jax.lax.stop_gradient(s) for i, s in enumerate(states)})
    return memory


def xl_decoder_terms(rows: int, Tt: int, Tm: int, Ts: int, D: int, F: int) -> flops.Terms:
    """Forward FLOPs of an XL decoder layer with a memory of ``Tm`` tokens, per sentence row:
    memory K, V ``2·2·Tm·D²``; self projections ``4·2·Tt·D²``; self attention
    ``3·2·Tt·(Tt+Tm)·D`` ((q+u)·K^T, (q+v)·(W_R R)^T, weights·V); the position projection
    ``2·(Tt+Tm)·D²`` (W_R R, once per layer, not per row); cross-attention and FFN as the
    sentence decoder's (:func:`~docnmt_jax.flops.cross_attention`)."""
    terms = {
        "memory_kv": rows * 2 * 2 * Tm * D * D,
        "self_projections": rows * 4 * 2 * Tt * D * D,
        "self_attention": rows * 3 * 2 * Tt * (Tt + Tm) * D,
        "position": 2 * (Tt + Tm) * D * D,
    }
    return terms | flops.cross_attention(rows, Tt, Ts, D, F)
