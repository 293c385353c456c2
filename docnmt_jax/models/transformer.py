"""The sentence-level Transformer (Vaswani et al. 2017): SENTNMT of Zheng et al. 2020, Table 1.

Post-LN by default (the papers' equations), pre-LN as an option; sinusoidal positions; one
embedding matrix for source, target and output softmax. ``encode``/``decode`` are separate
methods; incremental decoding uses an explicit cache pytree (:meth:`Transformer.init_cache`,
:meth:`Transformer.decode_step`), so beam search is a pure function over it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from docnmt_jax import flops
from docnmt_jax.data.spec import DataSpec, PackingConfig
from docnmt_jax.data.tokenizer import BOS_ID
from docnmt_jax.decoding.search import (
    SearchConfig,
    search_rows,
    sentence_limits,
    sentence_outputs,
)
from docnmt_jax.models import layers
from docnmt_jax.models.base import BaseModel, BatchLayout, register
from docnmt_jax.sizes import TED

Array = jax.Array
Cache = dict[str, Any]
#: Packed rows (flax ``examples/wmt``): ``{src,tgt}_positions`` (position inside the segment)
#: and ``{src,tgt}_segment_ids`` (1-based segment number in the row, 0 on padding; a source
#: and a target segment with the same id belong together), each ``[B, L]``.
Segments = dict[str, Array]


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Hyper-parameters of the sentence Transformer (defaults: Zheng et al.'s TED setting,
    :data:`docnmt_jax.sizes.TED`)."""

    vocab_size: int = 8000
    d_model: int = TED["d_model"]
    num_heads: int = TED["num_heads"]
    ffn_dim: int = TED["ffn_dim"]
    num_encoder_layers: int = TED["num_encoder_layers"]
    num_decoder_layers: int = TED["num_decoder_layers"]
    dropout_rate: float = 0.1
    attention_dropout_rate: float = 0.0
    relu_dropout_rate: float = 0.0
    pre_ln: bool = False
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32
    deterministic: bool = False

    def sublayer(self, name: str) -> layers.Sublayer:
        return layers.Sublayer(
            self.pre_ln, self.dropout_rate, self.deterministic, self.dtype, name=name
        )

    def attention(self, name: str) -> layers.MultiHeadAttention:
        return layers.MultiHeadAttention(
            self.num_heads,
            self.d_model,
            self.attention_dropout_rate,
            self.deterministic,
            self.dtype,
            name=name,
        )

    def feed_forward(self, name: str) -> layers.FeedForward:
        return layers.FeedForward(
            self.ffn_dim, self.relu_dropout_rate, self.deterministic, self.dtype, name=name
        )


class EncoderLayer(nn.Module):
    """Self-attention then FFN, each wrapped in a residual sublayer. ``attention`` replaces
    the layer's own self-attention by a module of another layer (parameters shared with it,
    HM-GDC's document encoder); the layer then has none of its own."""

    config: TransformerConfig
    own_attention: bool = True

    def setup(self) -> None:
        cfg = self.config
        if self.own_attention:
            self.self_attention = cfg.attention("self_attention")
        self.attention_block = cfg.sublayer("attention_block")
        self.ffn = cfg.feed_forward("ffn")
        self.ffn_block = cfg.sublayer("ffn_block")

    def __call__(self, x: Array, mask: Array, attention: nn.Module | None = None) -> Array:
        attend = self.self_attention if attention is None else attention
        x = self.attention_block(x, lambda h: attend(h, h, mask))
        x = self.ffn_block(x, self.ffn)
        return layers.constrain(x, ("batch", "length", "embed"))


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention to the encoder, FFN.

    With ``cache`` (decoding one position at a time) the self-attention keys/values of earlier
    positions come from ``cache['key'|'value']`` (one row per beam) and the cross-attention ones
    from ``cross_kv`` (one row per example, shared by its beams); the updated cache is returned.
    """

    config: TransformerConfig

    def setup(self) -> None:
        cfg = self.config
        self.self_attention = cfg.attention("self_attention")
        self.cross_attention = cfg.attention("cross_attention")
        self.ffn = cfg.feed_forward("ffn")
        self.self_attention_block = cfg.sublayer("self_attention_block")
        self.cross_attention_block = cfg.sublayer("cross_attention_block")
        self.ffn_block = cfg.sublayer("ffn_block")

    def __call__(
        self,
        y: Array,
        self_mask: Array,
        encoded: Array | None,
        cross_mask: Array,
        cache: Cache | None = None,
        index: Array | None = None,
        cross_kv: tuple[Array, Array] | None = None,
    ) -> tuple[Array, Cache | None]:
        y, new_cache = self.self_attention_sublayer(y, self_mask, cache, index)
        y = self.cross_attention_sublayer(y, encoded, cross_mask, cross_kv)
        y = self.ffn_block(y, self.ffn)
        return layers.constrain(y, ("batch", "length", "embed")), new_cache

    def self_attention_sublayer(
        self, y: Array, self_mask: Array, cache: Cache | None, index: Array | None
    ) -> tuple[Array, Cache | None]:
        """The masked self-attention sublayer; with ``cache`` this step's keys/values are
        written at ``index`` and the updated cache is returned (else None)."""
        new_cache = None

        def self_block(h: Array) -> Array:
            nonlocal new_cache
            k, v = self.self_attention.project_kv(h)
            if cache is not None:
                k = layers.write_position(cache["key"], k, index)
                v = layers.write_position(cache["value"], v, index)
                new_cache = dict(cache, key=k, value=v)
            q = self.self_attention.project_q(h)
            return self.self_attention.attend(q, k, v, self_mask, heads_major=cache is not None)

        return self.self_attention_block(y, self_block), new_cache

    def cross_attention_sublayer(
        self,
        y: Array,
        encoded: Array | None,
        cross_mask: Array,
        cross_kv: tuple[Array, Array] | None,
    ) -> Array:
        """The encoder-decoder attention sublayer (:func:`memory_attention`)."""
        return self.cross_attention_block(
            y, lambda h: memory_attention(self.cross_attention, h, encoded, cross_mask, cross_kv)
        )

    def cross_kv(self, encoded: Array) -> tuple[Array, Array]:
        """Cross-attention keys/values ``[B, H, Ts, d]`` (heads-major, the layout
        :meth:`__call__` takes as ``cross_kv``) of the encoder output, once per source."""
        return tuple(layers.heads_major(x) for x in self.cross_attention.project_kv(encoded))


class Transformer(nn.Module):
    """Encoder-decoder Transformer over sentences: ``src [B, Ts]`` -> logits ``[B, Tt, V]``."""

    config: TransformerConfig
    #: Layer classes (a document model that extends the layers and keeps these parameter
    #: names sets its own, e.g. DocT).
    encoder_layer_class: ClassVar[type[nn.Module]] = EncoderLayer
    decoder_layer_class: ClassVar[type[nn.Module]] = DecoderLayer

    def setup(self) -> None:
        cfg = self.config
        self.embed = layers.SharedEmbedding(cfg.vocab_size, cfg.d_model, cfg.dtype, cfg.param_dtype)
        self.encoder_layers = [self.encoder_layer_class(cfg) for _ in range(cfg.num_encoder_layers)]
        self.decoder_layers = [self.decoder_layer_class(cfg) for _ in range(cfg.num_decoder_layers)]
        self.input_dropout = nn.Dropout(cfg.dropout_rate)
        if cfg.pre_ln:
            self.encoder_norm = layers.layer_norm(cfg.dtype)
            self.decoder_norm = layers.layer_norm(cfg.dtype)

    def _embed(self, ids: Array, positions: Array) -> Array:
        x = self.embed(ids) + layers.sinusoidal_encoding(
            positions, self.config.d_model, jnp.float32
        )
        return self.input_dropout(x, deterministic=self.config.deterministic)

    def encode(self, src: Array, src_mask: Array, segments: Segments | None = None) -> Array:
        """``src [B, Ts]`` ids, ``src_mask [B, Ts]`` -> encoder states ``[B, Ts, D]``.

        With ``segments`` (packed rows, :data:`Segments`) every token attends only within its
        segment, at its position inside the segment."""
        if segments is None:
            positions = jnp.broadcast_to(jnp.arange(src.shape[-1]), src.shape)
            mask = layers.padding_mask(src_mask, src_mask)
        else:
            positions = segments["src_positions"]
            mask = layers.segment_mask(segments["src_segment_ids"], segments["src_segment_ids"])
        x = self._embed(src, positions)
        for layer in self.encoder_layers:
            x = layer(x, mask)
        return self.encoder_norm(x) if self.config.pre_ln else x

    def _output(self, y: Array) -> Array:
        if self.config.pre_ln:
            y = self.decoder_norm(y)
        return self.embed.attend(y).astype(jnp.float32)

    def decode(
        self,
        encoded: Array,
        src_mask: Array,
        tgt_in: Array,
        tgt_mask: Array,
        segments: Segments | None = None,
    ) -> Array:
        """Teacher-forced decoder: input ids ``tgt_in [B, Tt]`` (shifted right) -> logits.

        With ``segments`` a target token sees the earlier tokens of its own segment and the
        source tokens of the segment with the same id."""
        causal = layers.causal_mask(tgt_in.shape[-1])
        if segments is None:
            positions = jnp.broadcast_to(jnp.arange(tgt_in.shape[-1]), tgt_in.shape)
            self_mask = causal & layers.padding_mask(tgt_mask, tgt_mask)
            cross_mask = layers.padding_mask(tgt_mask, src_mask)
        else:
            positions, tgt_ids = segments["tgt_positions"], segments["tgt_segment_ids"]
            self_mask = causal & layers.segment_mask(tgt_ids, tgt_ids)
            cross_mask = layers.segment_mask(tgt_ids, segments["src_segment_ids"])
        y = self._embed(tgt_in, positions)
        for layer in self.decoder_layers:
            y, _ = layer(y, self_mask, encoded, cross_mask)
        return self._output(y)

    def __call__(
        self,
        src: Array,
        src_mask: Array,
        tgt: Array,
        tgt_mask: Array,
        segments: Segments | None = None,
    ) -> Array:
        """Logits ``[B, Tt, V]`` for targets ``tgt`` (not yet shifted; EOS-terminated); with
        ``segments``, of every segment of the packed rows on its own."""
        encoded = self.encode(src, src_mask, segments)
        if segments is None:
            tgt_in = layers.shift_right(tgt, BOS_ID)
        else:
            tgt_in = layers.shift_right_segments(tgt, segments["tgt_positions"], BOS_ID)
        return self.decode(encoded, src_mask, tgt_in, tgt_mask, segments)

    def init_cache(self, batch: int, max_len: int) -> Cache:
        """An empty decoding cache: self-attention keys/values for ``max_len`` positions."""
        return empty_self_attention_cache(self.config, batch, max_len)

    def decode_inputs(self, encoded: Array, src_mask: Array) -> dict[str, Any]:
        """Per-example inputs of :meth:`decode_step` (the ``extra`` of ``beam_search``): the
        source mask and every layer's cross-attention keys/values, computed once per source."""
        extra: dict[str, Any] = {"src_mask": src_mask}
        for i, layer in enumerate(self.decoder_layers):
            k, v = layer.cross_kv(encoded)
            extra[f"layer_{i}"] = {"cross_key": k, "cross_value": v}
        return extra

    def decode_step(self, cache: Cache, token: Array, extra: dict[str, Any]) -> tuple[Array, Cache]:
        """One step: ``token [N]`` at position ``cache['index']`` -> logits ``[N, V]``.

        ``cache`` has ``N`` rows (one per beam); ``extra`` (:meth:`decode_inputs`) has one row
        per example, ``N`` a multiple of it with each example's beams contiguous.
        """
        index = cache["index"]
        max_len = cache["layer_0"]["key"].shape[2]
        y = self._embed(token[:, None], jnp.full(token.shape + (1,), index))
        self_mask = (jnp.arange(max_len) <= index)[None, None, None, :]
        cross_mask = (extra["src_mask"] > 0)[:, None, None, :]
        new_cache: Cache = {"index": index + 1}
        for i, layer in enumerate(self.decoder_layers):
            inputs = extra[f"layer_{i}"]
            y, new_cache[f"layer_{i}"] = layer(
                y,
                self_mask,
                None,
                cross_mask,
                cache=cache[f"layer_{i}"],
                index=index,
                cross_kv=(inputs["cross_key"], inputs["cross_value"]),
            )
        return self._output(y)[:, 0], new_cache


def memory_attention(
    attention: layers.MultiHeadAttention,
    h: Array,
    memory: Array | None,
    mask: Array,
    kv: tuple[Array, Array] | None,
) -> Array:
    """``attention`` of queries ``h`` over a memory (encoder states, context states): over
    ``kv`` (heads-major keys/values projected once per example, shared by a search's beams)
    when given, else over ``memory`` projected here."""
    q = attention.project_q(h)
    if kv is not None:
        return attention.attend(q, *kv, mask, heads_major=True)
    k, v = attention.project_kv(memory)
    return attention.attend(q, k, v, mask)


def empty_self_attention_cache(config: TransformerConfig, batch: int, max_len: int) -> Cache:
    """``{"index": 0, "layer_i": {"key", "value": zeros [batch, H, max_len, D/H]}}``
    (heads-major, :func:`layers.heads_major`)."""
    heads = config.num_heads
    zeros = jnp.zeros((batch, heads, max_len, config.d_model // heads), config.dtype)
    cache: Cache = {"index": jnp.zeros((), jnp.int32)}
    for i in range(config.num_decoder_layers):
        cache[f"layer_{i}"] = {"key": zeros, "value": zeros}
    return cache


def sentence_rows(batch: dict[str, Array]) -> dict[str, Array]:
    """Flattens a document batch ``[B, S, T]`` into sentence rows ``[B*S, T]``.

    The sentence model sees every sentence on its own; padding sentences become all-padding
    rows that carry no loss. A packed batch (rows of several sentences, ``schema.is_packed``)
    keeps its rows and adds the :data:`Segments` that keep its sentences apart.
    """
    if "src_chunk_ids" in batch:
        return packed_rows(batch, unit="segment")
    return {
        key: batch[key].reshape((-1, batch[key].shape[-1]))
        for key in ("src", "src_mask", "tgt", "tgt_mask")
    }


def packed_rows(batch: dict[str, Array], unit: str) -> dict[str, Array]:
    """The module inputs of a packed batch ``[B, L]``: the rows as they are, with
    :data:`Segments` made of the sentences (``unit="segment"``: segment ids, positions inside
    the sentence) or of the chunks (``unit="chunk"``: chunk ids, positions inside the chunk)."""
    ids, positions = (
        ("segment_ids", "positions")
        if unit == "segment"
        else (
            "chunk_ids",
            "chunk_positions",
        )
    )
    rows = {key: batch[key] for key in ("src", "src_mask", "tgt", "tgt_mask")}
    rows["segments"] = {
        f"{side}_{name}": batch[f"{side}_{feature}"]
        for side in ("src", "tgt")
        for name, feature in (("positions", positions), ("segment_ids", ids))
    }
    return rows


def transformer_terms(config: TransformerConfig, shape: flops.BatchShape) -> flops.Terms:
    """Forward FLOPs of the sentence Transformer on the ``N`` sentences of ``shape``: its
    encoder and decoder layers (:func:`~docnmt_jax.flops.encoder_layer`,
    :func:`~docnmt_jax.flops.decoder_layer`) and the tied output softmax ``2·Tt·D·V`` per
    sentence row (notation of :mod:`docnmt_jax.flops`)."""
    D, F, N = config.d_model, config.ffn_dim, shape.rows
    Ts, Tt = shape.src_len, shape.tgt_len
    total: flops.Terms = {}
    flops.add_terms(total, "encoder", flops.encoder_layer(N, Ts, D, F), config.num_encoder_layers)
    layer = flops.decoder_layer(N, Tt, Ts, D, F)
    flops.add_terms(total, "decoder", layer, config.num_decoder_layers)
    total["output"] = N * 2 * Tt * D * config.vocab_size
    return total


@register("transformer", config=TransformerConfig, flops=transformer_terms)
class TransformerModel(BaseModel):
    """SENTNMT: every sentence translated on its own (one sentence per batch row)."""

    module_class = Transformer
    layout = BatchLayout.SENTENCES

    def rows(self, batch: dict[str, Array]) -> dict[str, Array]:
        return sentence_rows(batch)

    def data_spec(self) -> DataSpec:
        """Sentences alone (as :attr:`layout` says); packed: several whole sentences per row of
        128 slots (flax ``examples/wmt``)."""
        packing = PackingConfig(unit="sentence", row_tokens=128)
        return dataclasses.replace(super().data_spec(), packing=packing)

    def translate(
        self, params: Any, batch: dict[str, Array], search: SearchConfig
    ) -> tuple[Array, dict[str, Array]]:
        """Beam search over every sentence of ``batch``: ids ``[B, S, L]`` (EOS, then PAD);
        the encoder runs once (:func:`~docnmt_jax.decoding.search.search_rows`)."""
        rows = sentence_rows(batch)
        max_len, limits = sentence_limits(rows["src_mask"], search)
        result = search_rows(
            self.eval_module, params, rows["src"], rows["src_mask"], search, max_len, limits
        )
        return sentence_outputs(result, batch["src"].shape[:2], search)
