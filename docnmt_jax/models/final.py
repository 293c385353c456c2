"""FINAL: the unified local/global document model of Zheng et al. (2020), Sec. 4.

Documents come as chunks ``[B, S, T]`` (``S`` sentences of ``T`` tokens, PAD after EOS).

* Input (Sec. 4.1): ``x~_{k,i} = E[x_{k,i}] + E^s_k + E^w_i`` -- word positions restart in every
  sentence (sinusoidal, as the Transformer), ``E^s`` is a learned segment table.
* Local encoding: ``N-1`` standard encoder layers run on every sentence on its own.
* Global encoding: one layer of segment-level relative attention over all tokens of the chunk,
  Eq. (1): ``e = (x_{k,i}W^Q)(x_{kappa,j}W^K + g^K_{k-kappa})^T / sqrt(d)``, values
  ``x_{kappa,j}W^V + g^V_{k-kappa}`` (``k-kappa`` clipped to ``+-max_relative_distance``), then
  the gated context fusion ``g = sigmoid(W_g[h^L; h^G])``, ``h = LN((1-g) h^L + g h^G)`` and a
  feed-forward sublayer. Rows whose chunk has a single sentence skip it: ``h = h^L``.
* Decoder (Sec. 4.2): Transformer-XL layers (:mod:`.xl`); sentence ``k`` attends to
  ``[SG(s^{l-1}_{k-1}); s^{l-1}_k]`` with the relative positions of Dai et al. (2019),
  cross-attends to ``h_k`` only (the Doc2Sent variant ``"chunk"``: the whole chunk, below),
  and shares the output softmax with the embedding. Training computes every sentence of a
  chunk in one pass per layer (the memory of sentence ``k`` is the previous sentence's layer
  input, shifted along ``S``). Translation searches the sentences of
  a chunk in order, the memory of sentence ``k`` being the decoder states of the translation
  chosen for ``k-1`` (never the reference): :mod:`docnmt_jax.decoding.search`, slot by slot.

Packed rows (training; docs/design/packing_plan.md §1, §2.3-2.5): with
``segments`` the inputs are rows ``[B, L]`` that hold whole chunks one after another
(:data:`Segments`: per token its sentence and chunk ids, the sentence's slot ``k`` in the chunk,
its position in the sentence and in the chunk), and the module computes, for every real token,
exactly what the grid computes, with masks in place of the grid's axes: local layers attend
within the sentence (``doc2sent``: the chunk), the global layer within the chunk at the clipped
distance of the sentence slots, a chunk with one sentence skips it, the decoder attends
causally within the sentence, its XL memory is the tokens of the same chunk with slot
``k - 1``, cross-attention reads the source tokens of the same sentence (the chunk reading of
the Doc2Sent rows: of the same chunk, dense over the row). Why this is the grid's
computation: the masks select the same key sets (ids are unique in a row and a chunk never
leaves its row); the XL distances are differences of chunk positions, which count real target
tokens only, so ``(C_{k-1} + n_{k-1} + i) - (C_{k-1} + j) = i + n_{k-1} - j`` is the grid's
memory distance and ``i - j`` its current one, whatever gaps the row has; masked keys get weight
exactly 0 and everything else acts per token, so by induction over layers every real token's
states, logits and loss terms are the grid's, and so are the gradients (the stop-gradient sits on
the same memory states). Attention is banded (:class:`~.layers.Band`): blocks of
``W = packed_block`` queries see windows of neighbouring blocks sized from ``M =
max_sentence_len`` and ``D = packed_drift``: ``ceil((M-1)/W)`` blocks either way for the local
layers, ``ceil((M-1)/W)`` back for the causal part, ``ceil((2M-1)/W)`` back for the memory
(sentence ``k - 1`` starts at most ``M`` slots before sentence ``k`` under the drift rule), and
``ceil((M-1+D)/W)`` either way for cross-attention (a sentence's sides start within ``D``
slots); the global layer, ``doc2sent``'s local layers and the chunk-wide cross-attention stay
dense over the row. Windows drop only masked keys, so banded equals dense; their cost per
token does not grow with ``L``. The data must keep every sentence within ``M`` tokens and the
drift within ``D`` (the planner's :meth:`FinalModel.packing`), and at most ``max_segments``
sentences per chunk.

Switches make the rows of Table 3 configurations of this one module (the switch table is in
the config layer, ``configs/final_table3.py``); the decoder layer class is chosen once, in
:meth:`Final.setup` (:class:`~.xl.XLDecoderLayer` or :class:`SentenceDecoderLayer`).
Decisions beyond the paper: per-head scaling ``1/sqrt(d_model/heads)``; without the fusion
gate ``h = LN(h^L + h^G)``; with ``pre_ln`` the global layer normalises its input and the
fusion has no output LayerNorm; the memory readings of :mod:`.xl`; and four readings:

* The global layer ends with a feed-forward sublayer after the fusion
  (:class:`GlobalContextLayer`: ``ffn_block(fused, ffn)``). Sec. 4.1 adds "an additional
  layer on the top of the local context encoding layers" whose equations stop at
  ``h = LayerNorm((1-g) h^L + g h^G)``; we read "layer" as the Transformer layer it replaces
  (the encoder keeps ``N`` layers of attention + FFN, Sec. 5.1's ``N = 4``): the fusion takes
  the place of the attention sublayer's residual + LayerNorm, the FFN sublayer stays, so a
  sentence Transformer's top encoder layer fills it (:meth:`FinalModel.transformer_rules`).
* ``gamma^K``/``gamma^V`` are per head, ``[2R+1, H, D/H]``
  (:class:`SegmentRelativeAttention`: ``relative_key``/``relative_value``). Eq. (1) adds
  ``gamma^K_{k-kappa}``, "a parameter vector", to ``x W^K`` and scales by ``sqrt(d_z)``, with
  ``d_z = 256`` the model dimension (Sec. 5.1): a ``d_z``-vector added before
  ``MultiHead`` splits ``x W^K`` into heads is one slice per head (Shaw et al. 2018 instead
  share one head-sized vector across heads).
* The projections ``W^Q``, ``W^K``, ``W^V`` and the output projection have biases
  (:func:`~.layers.heads_projection`, :func:`~.layers.output_projection`, ``use_bias``
  default). Eq. (1) names "linear projection matrices"; with biases they are the sentence
  Transformer's attention projections (ours have biases), so the Table 4 transfer maps them
  one to one.
* Doc2Sent rows (``doc2sent``): the lower encoder layers read the whole chunk as one
  sequence (Table 3's caption: "using a entire document as a sequence for input"), and each
  target sentence cross-attends to its own slice ``h_k`` of that encoding (Sec. 4.2's
  ``CrossAttn(s, h_k, h_k)``; ``doc2sent_cross_attention = "own_slice"``, the default).
  The other reading, every target sentence cross-attending over the whole chunk's encoding
  (``"chunk"``: :meth:`Final.cross_memory`, :func:`~.xl.packed_decoder_attention` with
  ``cross_chunk``, :meth:`FinalModel.search_inputs`), is a named variant: without the XL
  decoder nothing tells the sentence slots of a chunk apart (the same keys, BOS, positions
  restarting at 0), so every sentence of a chunk gets the same output distribution, and
  Table 3's "+ reset word positions" (10.0 BLEU) and "+ segment embedding" (10.5), both on
  the source side only, could not lift it from near zero (test
  ``test_the_chunk_reading_gives_every_sentence_of_a_chunk_the_same_output``; on the Bible
  it wrote one sentence for 1,440 of 1,443 test verses, BUILD_NOTES.md, One results table).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from docnmt_jax import flops
from docnmt_jax.data import schema
from docnmt_jax.data.tokenized import PackingConfig, PipelineConfig
from docnmt_jax.data.tokenizer import BOS_ID
from docnmt_jax.decoding.beam_search import BeamResult
from docnmt_jax.decoding.search import (
    SearchConfig,
    encode_in_groups,
    pad_empty_sentences,
    search_decoder,
    sentence_limits,
)
from docnmt_jax.models import layers, transformer
from docnmt_jax.models.base import BaseModel, BatchLayout, ModelError, register, require_grid
from docnmt_jax.models.transformer import TransformerConfig
from docnmt_jax.models.xl import (
    Cache,
    Memory,
    MemoryKV,
    PackedDecoderAttention,
    XLDecoderLayer,
    memory_from_states,
    packed_decoder_attention,
)

Array = jax.Array
#: Packed rows (:data:`~docnmt_jax.data.schema.PACKED_FEATURES`): ``{side}_{name}`` ``[B, L]``
#: for ``side`` in src/tgt and ``name`` in :data:`SEGMENT_FEATURES`.
Segments = dict[str, Array]
SEGMENT_FEATURES = ("positions", "chunk_positions", "segment_ids", "chunk_ids", "sentence_index")
#: Readings of the Doc2Sent rows' cross-attention (:attr:`FinalConfig.doc2sent_cross_attention`).
DOC2SENT_CROSS_ATTENTION = ("own_slice", "chunk")


@dataclasses.dataclass(frozen=True)
class FinalConfig(TransformerConfig):
    """Transformer hyper-parameters plus the switches of Zheng et al.'s Table 3.

    ``doc2sent``: the lower encoder layers attend over the whole chunk (a document as one
    sequence) instead of each sentence alone. ``reset_word_positions``: source positions restart
    in every sentence (else they continue across the chunk). ``segment_embedding``: add
    ``E^s_k``. ``segment_relative_attention``: the top encoder layer is the global layer
    (else all ``N`` layers are plain). ``context_fusion_gate``: gated fusion (else residual).
    ``xl_decoder``: Transformer-XL decoder (else the sentence decoder with absolute positions).
    ``doc2sent_cross_attention`` (with ``doc2sent`` only): ``"own_slice"``, every target
    sentence cross-attends over its own sentence's slice ``h_k`` of the chunk's encoding
    (Table 3's Doc2Sent, module docstring); ``"chunk"``, over the encoding of the whole chunk
    (its padding masked; a named variant). Without ``doc2sent`` the decoder reads ``h_k``
    (Sec. 4.2).

    Packed rows (training): ``packed_block`` is the block width ``W`` of banded attention,
    ``packed_drift`` the most the source and target offsets of a sentence may differ in a row
    (the data's placement rule), ``max_sentence_len`` ``M`` the longest sentence with EOS on
    either side; the attention windows are sized from them (module docstring).
    """

    reset_word_positions: bool = True
    segment_embedding: bool = True
    segment_relative_attention: bool = True
    context_fusion_gate: bool = True
    xl_decoder: bool = True
    doc2sent: bool = False
    doc2sent_cross_attention: str = "own_slice"  # DOC2SENT_CROSS_ATTENTION
    max_relative_distance: int = 20
    max_segments: int = 20
    packed_block: int = 64  # Bible, TED size, CPU: 64 beat 16/32/128/256 (BUILD_NOTES)
    packed_drift: int = 16
    max_sentence_len: int = 128

    def __post_init__(self) -> None:
        if self.doc2sent_cross_attention not in DOC2SENT_CROSS_ATTENTION:
            raise ValueError(
                f"doc2sent_cross_attention must be one of {DOC2SENT_CROSS_ATTENTION}: "
                f"{self.doc2sent_cross_attention!r}"
            )
        if self.max_relative_distance < 0:
            raise ValueError(f"max_relative_distance must be >= 0: {self.max_relative_distance}")
        if self.max_segments < 1:
            raise ValueError(f"max_segments must be >= 1: {self.max_segments}")
        if self.num_encoder_layers < 1:
            raise ValueError(f"num_encoder_layers must be >= 1: {self.num_encoder_layers}")
        if self.packed_block < 1:
            raise ValueError(f"packed_block must be >= 1: {self.packed_block}")
        if self.packed_drift < 0:
            raise ValueError(f"packed_drift must be >= 0: {self.packed_drift}")
        if self.max_sentence_len < 1:
            raise ValueError(f"max_sentence_len must be >= 1: {self.max_sentence_len}")

    @property
    def cross_attends_chunk(self) -> bool:
        """Every target sentence cross-attends over the whole chunk (``doc2sent`` rows with
        ``doc2sent_cross_attention = "chunk"``); else over its own sentence."""
        return self.doc2sent and self.doc2sent_cross_attention == "chunk"


def _relpos_init() -> layers.Initializer:
    return layers.partitioned(nn.initializers.normal(stddev=0.02), ("relpos", "heads", "kv"))


class SegmentRelativeAttention(nn.Module):
    """Multi-head segment-level relative attention, Eq. (1), over the tokens of a chunk.

    ``gamma^K``/``gamma^V`` (``[2R+1, H, D/H]``) are indexed by the clipped sentence distance
    ``k - kappa``. The query-gamma products are computed once per distance and spread over
    sentence pairs with a one-hot ``[S, S, 2R+1]``; the value term is (attention mass per
    distance) @ ``gamma^V``. Nothing of size ``[S*T, S*T, D]`` is built. Packed rows (given
    ``sentence_index``) use one-hots per token instead: query token to (sentence, distance)
    ``[L, S, 2R+1]`` and key token to sentence ``[L, S]``.
    """

    config: FinalConfig

    @nn.compact
    def __call__(
        self, x: Array, mask: Array, num_sentences: int, sentence_index: Array | None = None
    ) -> tuple[Array, Array]:
        """``x [B, S*T, D]``, token ``mask [B, S*T]`` -> (output ``[B, S*T, D]``, weights
        ``[B, H, S*T, S*T]`` before dropout). Packed rows (``sentence_index [B, L]``, the slot
        of each token's sentence in its chunk): ``x [B, L, D]``, ``mask`` the boolean
        attention mask ``[B, 1, L, L]`` (same chunk) and ``num_sentences`` the most sentences
        a chunk may have; output ``[B, L, D]``, weights ``[B, H, L, L]``."""
        cfg = self.config
        batch, length, _ = x.shape
        S = num_sentences
        H, dh = cfg.num_heads, cfg.d_model // cfg.num_heads
        R = cfg.max_relative_distance
        q = layers.heads_projection(H, cfg.d_model, cfg.dtype, name="query")(x)
        k = layers.heads_projection(H, cfg.d_model, cfg.dtype, name="key")(x)
        v = layers.heads_projection(H, cfg.d_model, cfg.dtype, name="value")(x)
        gamma_k = self.param("relative_key", _relpos_init(), (2 * R + 1, H, dh))
        gamma_v = self.param("relative_value", _relpos_init(), (2 * R + 1, H, dh))
        # Only distances |k - kappa| <= S - 1 occur in a chunk: slice those rows of gamma.
        used = min(R, S - 1)
        gamma_k, gamma_v = gamma_k[R - used : R + used + 1], gamma_v[R - used : R + used + 1]
        content = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32)
        q_gamma = jnp.einsum("bqhd,rhd->bhqr", q, gamma_k.astype(q.dtype)).astype(jnp.float32)
        if sentence_index is None:
            T = length // S
            sent = jnp.arange(S)
            distance = jnp.clip(sent[:, None] - sent[None, :], -used, used) + used  # [S, S]
            onehot = jax.nn.one_hot(distance, 2 * used + 1, dtype=jnp.float32)
            seg = jnp.einsum("bhstr,scr->bhstc", q_gamma.reshape(batch, H, S, T, -1), onehot)
            logits = content.reshape(batch, H, S, T, S, T) + seg[..., None]
            logits = logits.reshape(batch, H, length, length) / np.sqrt(dh)
            weights = layers.masked_softmax(logits, mask[:, None, None, :] > 0)
        else:
            # to_distance[b, q, c, r]: the key sentence c is at clipped distance r from the
            # query's sentence; key_sentence[b, k, c]: key token k belongs to sentence c.
            sent = jnp.arange(S)
            distance = jnp.clip(sentence_index[..., None] - sent, -used, used) + used
            to_distance = jax.nn.one_hot(distance, 2 * used + 1, dtype=jnp.float32)
            key_sentence = jax.nn.one_hot(sentence_index, S, dtype=jnp.float32)
            per_sentence = jnp.einsum("bhqr,bqcr->bhqc", q_gamma, to_distance)
            seg = jnp.einsum("bhqc,bkc->bhqk", per_sentence, key_sentence)
            weights = layers.masked_softmax((content + seg) / np.sqrt(dh), mask)
        dropped = nn.Dropout(cfg.attention_dropout_rate)(weights, deterministic=cfg.deterministic)

        out = jnp.einsum("bhqk,bkhd->bqhd", dropped.astype(cfg.dtype), v)
        if sentence_index is None:
            mass = dropped.reshape(batch, H, S, T, S, T).sum(-1)  # [B, H, S, T, S]
            mass = jnp.einsum("bhstc,scr->bhstr", mass, onehot)  # attention mass per distance
            rel_v = jnp.einsum(
                "bhstr,rhd->bsthd", mass.astype(cfg.dtype), gamma_v.astype(cfg.dtype)
            )
            out = out + rel_v.reshape(batch, length, H, dh)
        else:
            mass = jnp.einsum("bhqk,bkc->bhqc", dropped, key_sentence)
            mass = jnp.einsum("bhqc,bqcr->bhqr", mass, to_distance)  # mass per distance
            out = out + jnp.einsum(
                "bhqr,rhd->bqhd", mass.astype(cfg.dtype), gamma_v.astype(cfg.dtype)
            )
        return layers.output_projection(cfg.d_model, cfg.dtype, name="out")(out), weights


class GlobalContextLayer(nn.Module):
    """Global context encoding (Sec. 4.1): segment attention, gated fusion, feed-forward."""

    config: FinalConfig

    @nn.compact
    def __call__(
        self, h_local: Array, src_mask: Array, sentence_index: Array | None = None
    ) -> tuple[Array, Array]:
        """``h^L [B, S, T, D]`` -> (``h [B, S, T, D]``, attention weights ``[B,H,S*T,S*T]``).
        Packed rows (``sentence_index [B, L]`` given): ``h^L [B, L, D]`` and ``src_mask`` the
        boolean attention mask ``[B, 1, L, L]`` of the chunks -> ``h [B, L, D]``."""
        cfg = self.config
        if sentence_index is None:
            B, S, T, D = h_local.shape
            x = h_local.reshape(B, S * T, D)
            mask = src_mask.reshape(B, S * T)
        else:
            B, L, D = h_local.shape
            x, mask, S = h_local, src_mask, cfg.max_segments
        z = layers.layer_norm(cfg.dtype, name="input_norm")(x) if cfg.pre_ln else x
        h_global, weights = SegmentRelativeAttention(cfg, name="segment_attention")(
            z, mask, S, sentence_index
        )
        h_global = nn.Dropout(cfg.dropout_rate)(h_global, deterministic=cfg.deterministic)
        self.sow("intermediates", "h_local", x)
        self.sow("intermediates", "h_global", h_global)
        if cfg.context_fusion_gate:
            gate = nn.Dense(
                D,
                dtype=cfg.dtype,
                kernel_init=layers.partitioned(nn.initializers.xavier_uniform(), ("mlp", "embed")),
                bias_init=layers.partitioned(nn.initializers.zeros_init(), ("embed",)),
                name="gate",
            )(jnp.concatenate([z, h_global], axis=-1))
            gate = jax.nn.sigmoid(gate)
            self.sow("intermediates", "gate_values", gate)
            fused = (1.0 - gate) * x + gate * h_global
        else:
            fused = x + h_global
        if not cfg.pre_ln:
            fused = layers.layer_norm(cfg.dtype, name="fusion_norm")(fused)
        self.sow("intermediates", "fused", fused)
        h = cfg.sublayer("ffn_block")(fused, cfg.feed_forward("ffn"))
        return h.reshape(h_local.shape), weights


class LocalEncoderLayer(transformer.EncoderLayer):
    """:class:`~.transformer.EncoderLayer` (the same parameters) that can run on the block
    rows of packed rows: with a ``band`` its queries ``x [B * blocks, W, D]`` attend to the
    keys and values of their windows (:meth:`~.layers.Band.windows`)."""

    def __call__(  # type: ignore[override]
        self, x: Array, mask: Array, band: layers.Band | None = None
    ) -> Array:
        attn = self.self_attention

        def self_attention(h: Array) -> Array:
            k, v = attn.project_kv(h)
            if band is not None:
                k, v = band.windows(k), band.windows(v)
            return attn.attend(attn.project_q(h), k, v, mask)

        x = self.attention_block(x, self_attention)
        x = self.ffn_block(x, self.ffn)
        return layers.constrain(x, ("batch", "length", "embed"))


class SentenceDecoderLayer(transformer.DecoderLayer):
    """The sentence Transformer's decoder layer behind the document decoder-layer interface
    (:class:`~.xl.DecoderLayerInterface`): absolute positions, no memory (Table 3 rows
    without the XL decoder)."""

    uses_memory: ClassVar[bool] = False
    absolute_positions: ClassVar[bool] = True

    def teacher_forced(
        self,
        y: Array,
        tgt_mask: Array,
        memory: Array,
        memory_mask: Array,
        encoded: Array,
        cross_mask: Array,
    ) -> Array:
        self_mask = layers.causal_mask(y.shape[1]) & layers.padding_mask(tgt_mask, tgt_mask)
        return self(y, self_mask, encoded, cross_mask)[0]

    def teacher_forced_packed(
        self, y: Array, encoded: Array, attention: PackedDecoderAttention
    ) -> Array:
        """Packed rows: block rows ``y``, ``encoded`` ``[N, W, D]``; causal self-attention
        within the sentence and cross-attention to its source, each over its band's windows
        (the memory part of ``attention`` is not used)."""
        a = attention

        def self_block(h: Array) -> Array:
            k, v = (a.current.windows(x) for x in self.self_attention.project_kv(h))
            q = self.self_attention.project_q(h)
            return self.self_attention.attend(q, k, v, a.current_mask)

        def cross_block(h: Array) -> Array:
            q = self.cross_attention.project_q(h)
            k, v = (a.cross.windows(x) for x in self.cross_attention.project_kv(encoded))
            return self.cross_attention.attend(q, k, v, a.cross_mask)

        y = self.self_attention_block(y, self_block)
        y = self.cross_attention_block(y, cross_block)
        y = self.ffn_block(y, self.ffn)
        return layers.constrain(y, ("batch", "length", "embed"))

    def memory_kv(self, memory: Array) -> None:
        return None

    def step(
        self,
        y: Array,
        index: Array,
        cache: Cache,
        inputs: dict[str, Array],
        memory_mask: Array,
        cross_mask: Array,
    ) -> tuple[Array, Cache]:
        self_mask = (jnp.arange(cache["key"].shape[2]) <= index)[None, None, None, :]
        cross_kv = (inputs["cross_key"], inputs["cross_value"])
        return self(y, self_mask, None, cross_mask, cache=cache, index=index, cross_kv=cross_kv)


class Final(nn.Module):
    """Document model: ``src [B, S, T]`` -> logits ``[B, S, T, V]`` (see the module docstring)."""

    config: FinalConfig

    def setup(self) -> None:
        cfg = self.config
        self.embed = layers.SharedEmbedding(cfg.vocab_size, cfg.d_model, cfg.dtype, cfg.param_dtype)
        if cfg.segment_embedding:
            self.segment_table = self.param(
                "segment_embedding",
                layers.partitioned(
                    nn.initializers.normal(stddev=cfg.d_model**-0.5), ("segments", "embed")
                ),
                (cfg.max_segments, cfg.d_model),
                cfg.param_dtype,
            )
        num_local = cfg.num_encoder_layers - int(cfg.segment_relative_attention)
        self.encoder_layers = [LocalEncoderLayer(cfg) for _ in range(num_local)]
        if cfg.segment_relative_attention:
            self.global_layer = GlobalContextLayer(cfg)
        layer_class = XLDecoderLayer if cfg.xl_decoder else SentenceDecoderLayer
        self.decoder_layers = [layer_class(cfg) for _ in range(cfg.num_decoder_layers)]
        self.uses_memory = layer_class.uses_memory
        self.target_positions = layer_class.absolute_positions
        self.input_dropout = nn.Dropout(cfg.dropout_rate)
        if cfg.pre_ln:
            self.encoder_norm = layers.layer_norm(cfg.dtype)
            self.decoder_norm = layers.layer_norm(cfg.dtype)

    # ----------------------------------------------------------------------------- encoder

    def _embed_source(self, src: Array, src_mask: Array) -> Array:
        cfg = self.config
        S, T = src.shape[-2:]
        if cfg.reset_word_positions:
            positions = jnp.broadcast_to(jnp.arange(T), src.shape)
        else:  # positions continue across the chunk (the sentences' real lengths)
            lengths = jnp.sum(src_mask > 0, axis=-1)
            offsets = jnp.cumsum(lengths, axis=-1) - lengths
            positions = offsets[..., None] + jnp.arange(T)
        x = self.embed(src) + layers.sinusoidal_encoding(positions, cfg.d_model, cfg.dtype)
        if cfg.segment_embedding:
            if S > cfg.max_segments:
                raise ValueError(f"{S} sentences per chunk > max_segments={cfg.max_segments}")
            x = x + jnp.asarray(self.segment_table[:S], cfg.dtype)[:, None, :]
        return self.input_dropout(x, deterministic=cfg.deterministic)

    def _encode(self, src: Array, src_mask: Array) -> tuple[Array, Array | None]:
        cfg = self.config
        B, S, T = src.shape
        x = self._embed_source(src, src_mask)
        rows = (B, S * T) if cfg.doc2sent else (B * S, T)
        x = x.reshape(rows + (cfg.d_model,))
        row_mask = src_mask.reshape(rows)
        mask = layers.padding_mask(row_mask, row_mask)
        for layer in self.encoder_layers:
            x = layer(x, mask)
        h = x.reshape(B, S, T, cfg.d_model)
        weights = None
        if cfg.segment_relative_attention:
            h_global, weights = self.global_layer(h, src_mask)
            num_sentences = jnp.sum(jnp.any(src_mask > 0, axis=-1), axis=-1)
            h = jnp.where((num_sentences > 1)[:, None, None, None], h_global, h)
        if cfg.pre_ln:
            h = self.encoder_norm(h)
        return h, weights

    def encode(self, src: Array, src_mask: Array) -> Array:
        """``src [B, S, T]`` ids and mask -> fused source encodings ``h [B, S, T, D]``."""
        return self._encode(src, src_mask)[0]

    def encode_packed(self, src: Array, segments: Segments) -> Array:
        """Packed source rows ``src [B, L]`` (:data:`Segments`) -> ``h [B, L, D]``: what
        :meth:`encode` gives every real token of the grid. Local layers attend within the
        sentence (``doc2sent``: the chunk, dense over the row), banded; the global layer within
        the chunk, dense over the row, at clipped sentence-index distances; tokens of chunks
        with one sentence keep ``h^L``."""
        cfg = self.config
        L = src.shape[-1]
        sidx, chunks = segments["src_sentence_index"], segments["src_chunk_ids"]
        positions = segments["src_positions" if cfg.reset_word_positions else "src_chunk_positions"]
        x = self.embed(src) + layers.sinusoidal_encoding(positions, cfg.d_model, cfg.dtype)
        if cfg.segment_embedding:  # slots >= max_segments are the data's to exclude
            x = x + jnp.take(jnp.asarray(self.segment_table, cfg.dtype), sidx, axis=0)
        x = self.input_dropout(x, deterministic=cfg.deterministic)
        if cfg.doc2sent:
            band, ids = layers.Band.dense(L), chunks
        else:
            M = cfg.max_sentence_len
            band = layers.Band.covering(L, cfg.packed_block, M - 1, M - 1)
            ids = segments["src_segment_ids"]
        blocks = band.blocks(ids)
        mask = layers.segment_mask(blocks, band.windows(blocks))
        x = band.blocks(x)
        for layer in self.encoder_layers:
            x = layer(x, mask, band)
        h = band.unblock(x)
        if cfg.segment_relative_attention:
            chunk_mask = layers.segment_mask(chunks, chunks)  # [B, 1, L, L]
            h_global, _ = self.global_layer(h, chunk_mask, sidx)
            other = sidx[:, None, None, :] != sidx[:, None, :, None]
            several = jnp.any(chunk_mask & other, axis=(1, 3))  # the chunk has > 1 sentence
            h = jnp.where(several[..., None], h_global, h)
        if cfg.pre_ln:
            h = self.encoder_norm(h)
        return h

    def sentence_attention(self, src: Array, src_mask: Array) -> Array:
        """Fig. 4: ``alpha^kappa_k = 1/|x_k| sum_i sum_j alpha^{kappa,j}_{k,i}`` averaged over
        heads, ``[B, S, S]``; rows of real sentences sum to 1, padding sentences give 0."""
        if not self.config.segment_relative_attention:
            raise ValueError("sentence_attention needs segment_relative_attention=True")
        B, S, T = src.shape
        weights = self._encode(src, src_mask)[1]
        per_sentence = weights.mean(axis=1).reshape(B, S, T, S, T).sum(-1)  # [B, S, T, S]
        m = (src_mask > 0).astype(jnp.float32)
        total = jnp.einsum("bstc,bst->bsc", per_sentence, m)
        return total / jnp.maximum(m.sum(-1), 1.0)[..., None]

    # ----------------------------------------------------------------------------- decoder

    def _output(self, y: Array) -> Array:
        if self.config.pre_ln:
            y = self.decoder_norm(y)
        return self.embed.attend(y).astype(jnp.float32)

    def _embed_target(self, tgt_in: Array, positions: Array) -> Array:
        cfg = self.config
        y = self.embed(tgt_in)
        if self.target_positions:  # XL uses relative positions only (Dai et al. 2019)
            y = y + layers.sinusoidal_encoding(positions, cfg.d_model, cfg.dtype)
        return self.input_dropout(y, deterministic=cfg.deterministic)

    def _decode_rows(
        self,
        encoded: Array,
        src_mask: Array,
        tgt_in: Array,
        tgt_mask: Array,
        memory_fn: Any,
        num_layers: int,
    ) -> tuple[Array, list[Array]]:
        """Decoder over rows ``[R, T]``; ``memory_fn(layer, states)`` gives the memory of layer
        ``layer`` (``states`` = its input). Returns the last output and every layer's input.
        ``encoded [R', Ts, D]`` (``src_mask [R', Ts]``) is what the rows cross-attend to: one
        row each (``R' = R``), or one per ``G = R / R'`` contiguous rows (the sentences of a
        chunk, :meth:`cross_memory`), which share its keys (``MultiHeadAttention.attend``)."""
        positions = jnp.broadcast_to(jnp.arange(tgt_in.shape[-1]), tgt_in.shape)
        y = self._embed_target(tgt_in, positions)
        groups = tgt_in.shape[0] // encoded.shape[0]
        cross_mask = layers.padding_mask(layers.group_rows(tgt_mask, groups), src_mask)
        inputs = []
        for i, layer in enumerate(self.decoder_layers[:num_layers]):
            inputs.append(y)
            memory, memory_mask = memory_fn(i, y)
            y = layer.teacher_forced(y, tgt_mask, memory, memory_mask, encoded, cross_mask)
        return y, inputs

    def cross_memory(self, encoded: Array, src_mask: Array) -> tuple[Array, Array]:
        """What the sentences of chunks ``encoded [B, S, Ts, D]`` (``src_mask [B, S, Ts]``)
        cross-attend to, as rows: their own slices ``h_k`` (``[B*S, Ts, D]``, ``[B*S, Ts]``),
        or with :attr:`FinalConfig.cross_attends_chunk` the whole chunk, one row per chunk
        shared by its ``S`` sentence rows (``[B, S*Ts, D]``, ``[B, S*Ts]``; keys projected
        once per chunk)."""
        B, S, Ts, D = encoded.shape
        rows = (B, S * Ts) if self.config.cross_attends_chunk else (B * S, Ts)
        return encoded.reshape(rows + (D,)), src_mask.reshape(rows)

    def decode(self, encoded: Array, src_mask: Array, tgt_in: Array, tgt_mask: Array) -> Array:
        """Teacher-forced, all sentences in parallel: ``tgt_in [B, S, T]`` (shifted right) ->
        logits ``[B, S, T, V]``. The memory of sentence ``k`` in layer ``l`` is
        ``SG(s^{l-1}_{k-1})``, the previous sentence's layer input (none for ``k = 0``); the
        cross-attention reads :meth:`cross_memory`."""
        cfg = self.config
        B, S, T = tgt_in.shape

        def shift(x: Array) -> Array:  # sentence k gets row k-1 of ``x [B, S, ...]``
            return jnp.pad(x[:, :-1], [(0, 0), (1, 0)] + [(0, 0)] * (x.ndim - 2))

        memory_mask = shift(tgt_mask).reshape(B * S, T)

        def memory_fn(_: int, states: Array) -> tuple[Array, Array]:
            memory = shift(jax.lax.stop_gradient(states).reshape(B, S, T, cfg.d_model))
            return memory.reshape(B * S, T, cfg.d_model), memory_mask

        y, _ = self._decode_rows(
            *self.cross_memory(encoded, src_mask),
            tgt_in.reshape(B * S, T),
            tgt_mask.reshape(B * S, T),
            memory_fn,
            cfg.num_decoder_layers,
        )
        return self._output(y).reshape(B, S, T, -1)

    def decode_packed(self, encoded: Array, tgt_in: Array, segments: Segments) -> Array:
        """Teacher-forced over packed rows: ``tgt_in [B, L]`` (shifted right within each
        sentence) and ``encoded [B, L, D]`` (:meth:`encode_packed`) -> logits ``[B, L, V]``,
        banded (:func:`~.xl.packed_decoder_attention`); the XL memory of sentence ``k`` is
        ``SG`` of sentence ``k - 1`` of the same chunk, in the same row. Cross-attention reads
        the source sentence with the query's segment id, banded, or with
        :attr:`FinalConfig.cross_attends_chunk` every source token of the query's chunk,
        dense over the row (the row's query blocks grouped against it)."""
        cfg = self.config
        attention = packed_decoder_attention(
            segments,
            cfg.packed_block,
            cfg.max_sentence_len,
            cfg.packed_drift,
            cross_chunk=cfg.cross_attends_chunk,
        )
        band = attention.current  # the self-attention bands have the same blocks
        y = band.blocks(self._embed_target(tgt_in, segments["tgt_positions"]))
        encoded = attention.cross.blocks(encoded)  # own slice: band's blocks; chunk: the rows
        for layer in self.decoder_layers:
            y = layer.teacher_forced_packed(y, encoded, attention)
        return self._output(band.unblock(y))

    def __call__(
        self,
        src: Array,
        src_mask: Array,
        tgt: Array,
        tgt_mask: Array,
        segments: Segments | None = None,
    ) -> Array:
        """Logits ``[B, S, T, V]`` for targets ``tgt [B, S, T]`` (not shifted; EOS-terminated).
        With ``segments`` (packed rows ``[B, L]``, :data:`Segments`): logits ``[B, L, V]``,
        equal to the grid's for every real target token (module docstring)."""
        if segments is not None:
            encoded = self.encode_packed(src, segments)
            tgt_in = layers.shift_right_segments(tgt, segments["tgt_positions"], BOS_ID)
            return self.decode_packed(encoded, tgt_in, segments)
        encoded = self.encode(src, src_mask)
        return self.decode(encoded, src_mask, layers.shift_right(tgt, BOS_ID), tgt_mask)

    def decode_sentence(
        self, encoded: Array, src_mask: Array, tgt: Array, tgt_mask: Array, memory: Memory
    ) -> tuple[Array, Memory]:
        """One sentence per row, teacher-forced on ``tgt [B, T]`` (not shifted) with the previous
        sentence's ``memory``: (logits ``[B, T, V]``, this sentence's memory for the next).
        ``encoded``/``src_mask``: what the sentence cross-attends to, its own ``h_k [B, Ts, D]``
        or with :attr:`FinalConfig.cross_attends_chunk` its chunk's ``[B, S*Ts, D]``."""
        y, inputs = self._decode_rows(
            encoded,
            src_mask,
            layers.shift_right(tgt, BOS_ID),
            tgt_mask,
            lambda i, _: (memory.get(f"layer_{i}"), memory["mask"]),
            self.config.num_decoder_layers,
        )
        return self._output(y), memory_from_states(inputs if self.uses_memory else [], tgt_mask)

    def sentence_memory(
        self, encoded: Array, src_mask: Array, tgt: Array, tgt_mask: Array, memory: Memory
    ) -> Memory:
        """The memory (decoder layer inputs ``s^0..s^{N-1}``) of target sentence ``tgt [B, T]``
        (e.g. the chosen hypothesis), computed teacher-forced with its own ``memory``."""
        if not self.uses_memory:
            return memory_from_states([], tgt_mask)
        # The last layer's output is not part of the memory: N-1 layers give s^0..s^{N-1}.
        last, inputs = self._decode_rows(
            encoded,
            src_mask,
            layers.shift_right(tgt, BOS_ID),
            tgt_mask,
            lambda i, _: (memory[f"layer_{i}"], memory["mask"]),
            self.config.num_decoder_layers - 1,
        )
        return memory_from_states(inputs + [last], tgt_mask)

    def init_cache(self, batch: int, max_len: int) -> Cache:
        """Empty cache for ``max_len`` positions of one sentence (self-attention keys/values)."""
        return transformer.empty_self_attention_cache(self.config, batch, max_len)

    def memory_kv(self, memory: Memory) -> MemoryKV:
        """The memory's self-attention keys/values: ``{"mask", "layer_i": {"key", "value"}}``
        (``[B, H, Tm, d]``, heads-major like the search cache that is the next sentence's
        memory), what the XL layers attend to when decoding."""
        memory_kv: MemoryKV = {"mask": memory["mask"]}
        for i, layer in enumerate(self.decoder_layers):
            kv = layer.memory_kv(memory.get(f"layer_{i}"))
            if kv is not None:
                k, v = (layers.heads_major(x) for x in kv)
                memory_kv[f"layer_{i}"] = {"key": k, "value": v}
        return memory_kv

    def decode_inputs(self, encoded: Array, src_mask: Array, memory: MemoryKV) -> dict[str, Any]:
        """Per-example inputs of :meth:`decode_step` (the ``extra`` of the search, one row per
        example, shared by its beams): the source mask, every layer's cross-attention
        keys/values (computed once) and the previous sentence's memory keys/values.
        ``encoded``/``src_mask``: what the sentence cross-attends to, as in training
        (:meth:`cross_memory`: its ``h_k`` or its chunk's encoding)."""
        extra: dict[str, Any] = {"src_mask": src_mask, "memory_mask": memory["mask"]}
        for i, layer in enumerate(self.decoder_layers):
            k, v = layer.cross_kv(encoded)
            extra[f"layer_{i}"] = {"cross_key": k, "cross_value": v}
            extra[f"layer_{i}"].update(memory.get(f"layer_{i}", {}))
        return extra

    def decode_step(self, cache: Cache, token: Array, extra: dict[str, Any]) -> tuple[Array, Cache]:
        """One step: ``token [N]`` at ``cache['index']`` -> (logits ``[N, V]``, new cache);
        ``cache`` has ``N`` rows (beams), ``extra`` (:meth:`decode_inputs`) one per example."""
        index = cache["index"]
        y = self._embed_target(token[:, None], jnp.full(token.shape + (1,), index))
        cross_mask = (extra["src_mask"] > 0)[:, None, None, :]
        new_cache: Cache = {"index": index + 1}
        for i, layer in enumerate(self.decoder_layers):
            name = f"layer_{i}"
            y, new_cache[name] = layer.step(
                y, index, cache[name], extra[name], extra["memory_mask"], cross_mask
            )
        return self._output(y)[:, 0], new_cache


@register("final", config=FinalConfig, flops=flops.final_terms)
class FinalModel(BaseModel):
    """FINAL and the rows of Table 3 (switches of :class:`FinalConfig`) behind the model
    interface. With the XL decoder the layout is slot by slot (each sentence's memory is the
    translation chosen for the previous one); without it, all sentences of a chunk are
    searched at once."""

    module_class = Final

    def __init__(self, config: FinalConfig, label_smoothing: float = 0.0):
        super().__init__(config, label_smoothing)
        self.layout = BatchLayout.SEQUENTIAL_CHUNKS if config.xl_decoder else BatchLayout.CHUNKS

    def rows(self, batch: dict[str, Array]) -> dict[str, Array]:
        """The grid batch as it is; a packed batch's rows with its :data:`Segments`."""
        rows = {key: batch[key] for key in ("src", "src_mask", "tgt", "tgt_mask")}
        if schema.is_packed(batch):
            rows["segments"] = {
                f"{side}_{name}": batch[f"{side}_{name}"]
                for side in schema.SIDES
                for name in SEGMENT_FEATURES
            }
        return rows

    def packing(self) -> PackingConfig:
        """Whole chunks in rows of 1024 slots, a sentence's source and target offsets within
        ``packed_drift`` (the bound the cross-attention windows rely on)."""
        return PackingConfig(unit="chunk", row_tokens=1024, drift=self.config.packed_drift)

    #: The source side: embeddings, segment table, local layers, global layer (and pre-LN's
    #: final encoder norm).
    source_parameters: ClassVar[str] = r"embed/.*|segment_embedding|encoder.*|global_layer/.*"

    def transformer_rules(self) -> list[tuple[str, str]]:
        """A sentence Transformer with ``N = num_encoder_layers`` fills FINAL: the embedding, the
        local layers from encoder layers ``0..N-2`` (all ``N`` without the global layer), the
        global layer's attention, its norm (post-LN: the fusion norm; pre-LN: the input norm)
        and feed-forward sublayer from encoder layer ``N-1``, the decoder layers from the
        decoder layers (the XL layer's ``self_attention_norm`` from ``self_attention_block/
        norm``). Fresh: the segment table, the relative tables ``gamma^K``/``gamma^V``, the
        fusion gate, the XL ``u``/``v`` biases and relative-position projection ``W_R``."""
        cfg = self.config
        top = f"encoder_layers_{cfg.num_encoder_layers - 1}"
        rules = [(r"(embed/.*)", r"\1"), (r"(encoder_layers_\d+/.*)", r"\1")]
        if cfg.pre_ln:
            rules.append((r"((encoder|decoder)_norm/.*)", r"\1"))
        if cfg.segment_embedding:
            rules.append((r"segment_embedding", "skip"))
        if cfg.segment_relative_attention:
            rules += [
                (r"global_layer/segment_attention/relative_(key|value)", "skip"),
                (r"global_layer/segment_attention/(.*)", rf"{top}/self_attention/\1"),
                (r"global_layer/(fusion_norm|input_norm)/(.*)", rf"{top}/attention_block/norm/\2"),
                (r"global_layer/(ffn|ffn_block)/(.*)", rf"{top}/\1/\2"),
            ]
            if cfg.context_fusion_gate:
                rules.append((r"global_layer/gate/.*", "skip"))
        if cfg.xl_decoder:
            rules += [
                (
                    r"decoder_layers_\d+/self_attention/(content_bias|position_bias|position/.*)",
                    "skip",
                ),
                (
                    r"decoder_layers_(\d+)/self_attention_norm/(.*)",
                    r"decoder_layers_\1/self_attention_block/norm/\2",
                ),
            ]
        rules.append((r"(decoder_layers_\d+/.*)", r"\1"))
        return rules

    def check_data(self, config: PipelineConfig) -> None:
        """Packed rows are banded for sentences of at most ``max_sentence_len`` tokens and
        chunks of at most ``max_segments`` sentences: longer ones would lose keys silently."""
        cfg = self.config
        longest = max(config.max_src_len, config.max_tgt_len)
        if config.packing is not None and longest > cfg.max_sentence_len:
            raise ModelError(
                f"config.data.max_src_len/max_tgt_len ({longest}) > "
                f"config.model.max_sentence_len ({cfg.max_sentence_len}): raise "
                "max_sentence_len (wider attention windows) or lower the data limits"
            )
        if config.sentences_per_chunk > cfg.max_segments:
            raise ModelError(
                f"config.data.max_sentences ({config.sentences_per_chunk}) > "
                f"config.model.max_segments ({cfg.max_segments}): raise max_segments"
            )

    def sentence_attention(self, params: Any, batch: dict[str, Array]) -> Array:
        """Sentence-to-sentence attention of the global layer, ``[B, S, S]`` (Fig. 4): the
        segment-level relative attention (Eq. 1) over the chunk, heads averaged
        (:meth:`Final.sentence_attention`). Rows without the global layer (Table 3's
        ``segment_relative_attention = False``) raise :class:`ModelError`."""
        require_grid(batch, "sentence_attention")
        if not self.config.segment_relative_attention:
            raise ModelError(
                f"model {self.name!r} with segment_relative_attention=False has no global "
                "layer: no sentence-to-sentence attention (Fig. 4)"
            )
        module = self.eval_module
        return module.apply(
            {"params": params}, batch["src"], batch["src_mask"], method=module.sentence_attention
        )

    def search_inputs(
        self, params: Any, batch: dict[str, Array], search: SearchConfig
    ) -> tuple[tuple[Array, Array, Array], MemoryKV]:
        """The chunks encoded once (:func:`~docnmt_jax.decoding.search.encode_in_groups`), per
        sentence slot: (what the sentence cross-attends to ``[S, B, Tk, D]`` and its mask
        ``[S, B, Tk]``, the sentence's source mask ``[S, B, T]``), and the empty memory of
        sentence 0 (the layout of a search cache). The cross-attention inputs are the
        training's (:meth:`Final.cross_memory`): the sentence's own ``h_k`` (``Tk = T``), or
        with :attr:`FinalConfig.cross_attends_chunk` the whole chunk in every slot
        (``Tk = S*T``)."""
        module, variables = self.eval_module, {"params": params}
        src, src_mask = batch["src"], batch["src_mask"]
        encoded = encode_in_groups(module, variables, src, src_mask)
        max_len, _ = sentence_limits(src_mask, search)
        cache = module.apply(variables, src.shape[0], max_len, method=module.init_cache)
        memory = {k: v for k, v in cache.items() if k != "index"}
        memory["mask"] = jnp.zeros((src.shape[0], max_len), jnp.int32)  # sentence 0: none
        B, S, T, D = encoded.shape
        if self.config.cross_attends_chunk:
            cross = jnp.broadcast_to(encoded.reshape(1, B, S * T, D), (S, B, S * T, D))
            cross_mask = jnp.broadcast_to(src_mask.reshape(1, B, S * T), (S, B, S * T))
        else:
            cross, cross_mask = encoded.swapaxes(0, 1), src_mask.swapaxes(0, 1)
        return (cross, cross_mask, src_mask.swapaxes(0, 1)), memory

    def search_slot(
        self,
        params: Any,
        memory: MemoryKV,
        slot: tuple[Array, Array, Array],
        search: SearchConfig,
    ) -> BeamResult:
        """Beam search of one sentence per row, ``slot`` = (cross-attention inputs, their
        mask, the sentence's source mask: its output limit), with the previous sentence's
        ``memory``; keeps the chosen hypothesis's cache."""
        module, variables = self.eval_module, {"params": params}
        encoded, cross_mask, src_mask = slot
        max_len, limits = sentence_limits(src_mask, search)
        extra = module.apply(variables, encoded, cross_mask, memory, method=module.decode_inputs)
        return search_decoder(
            module, variables, extra, search, max_len, limits, keep_best_cache=self.uses_memory
        )

    @property
    def uses_memory(self) -> bool:
        return self.layout.sequential

    def translate(
        self, params: Any, batch: dict[str, Array], search: SearchConfig
    ) -> tuple[Array, dict[str, Array]]:
        """Beam search of every sentence of the chunks: ids ``[B, S, L]`` (EOS, then PAD;
        padding sentences PAD). Slot by slot with the XL decoder (the base class), else every
        sentence of every chunk searched at once, without memory."""
        require_grid(batch, "translate")
        if self.layout.sequential:
            return super().translate(params, batch, search)
        B, S = batch["src"].shape[:2]
        slots, _ = self.search_inputs(params, batch, search)
        rows = jax.tree.map(lambda x: x.reshape((B * S,) + x.shape[2:]), slots)
        result = self.search_slot(params, {"mask": jnp.zeros((B * S, 1), jnp.int32)}, rows, search)
        ids = result.sequences[:, 0].reshape(S, B, -1).swapaxes(0, 1)  # rows slot-major
        return pad_empty_sentences(ids, batch["src_mask"]), {}
