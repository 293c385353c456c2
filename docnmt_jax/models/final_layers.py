"""The layers of FINAL (Zheng et al. 2020, Sec. 4): segment-level relative attention, Eq. (1),
the global context layer with the gated fusion, the local encoder layer, the decoder layer
without XL memory, the Table 4 transfer map (:func:`transformer_rules`), and the
hyper-parameters they read (:class:`FinalConfig`, the switches of Table 3); the model that
assembles them is :mod:`.final`, the search's steps are :class:`.final_decode.FinalSearchSteps`.

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
drift within ``D`` (the planner's :meth:`~.final.FinalModel.packing`), and at most ``max_segments``
sentences per chunk.

Readings of the layers beyond the paper (the fourth, Doc2Sent, is in :mod:`.final`):

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
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from docnmt_jax import flops
from docnmt_jax.models import final_recurrence as recurrence
from docnmt_jax.models import layers, transformer
from docnmt_jax.models.final_two_layout import widened_segment_attention
from docnmt_jax.models.transformer import TransformerConfig
from docnmt_jax.models.xl import (
    Cache,
    PackedDecoderAttention,
)

Array = jax.Array
#: Readings of the Doc2Sent rows' cross-attention (:attr:`FinalConfig.doc2sent_cross_attention`).
DOC2SENT_CROSS_ATTENTION = ("own_slice", "chunk")
PACKED_LAYOUTS = ("banded", "two_layout")  # :attr:`FinalConfig.packed_layout`


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

    ``recurrent``: context crosses the chunk boundary (:mod:`.final_recurrence`; trained on
    document streams, in banded packed rows or on the grid).

    Packed rows (training): ``packed_block`` is the block width ``W`` of banded attention,
    ``packed_drift`` the most the source and target offsets of a sentence may differ in a row
    (the data's placement rule), ``max_sentence_len`` ``M`` the longest sentence with EOS on
    either side; the attention windows are sized from them (module docstring).
    ``packed_layout``: ``"banded"`` (those rows) or ``"two_layout"``, aligned rows read in a
    sentence and a chunk layout (:mod:`.final_two_layout`; ``packed_block``/``drift`` unused;
    ``recurrent`` trains on banded packed streams: ``"banded"`` only). ``packed_chunk_spans``
    (``two_layout``): rows of ``1024 * n`` slots whose global layer reads ``n`` spans of 1024
    (:func:`~.final_two_layout.chunk_layout`): 2 fills the sentence layout better where a batch
    holds 2,048 tokens (``docs/performance.md``).
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
    packed_block: int = 64  # Bible, TED size, CPU: 64 beat 16/32/128/256 (docs/log)
    packed_drift: int = 16
    max_sentence_len: int = 128
    recurrent: bool = False  # context across chunks: final_recurrence.py
    bptt_chunks: int = 1  # recurrent: chunks of a stream back-propagated through together
    packed_layout: str = "banded"  # PACKED_LAYOUTS
    packed_chunk_spans: int = 1  # two_layout: rows of 1024 * n, the global layer per span

    def __post_init__(self) -> None:
        if self.doc2sent_cross_attention not in DOC2SENT_CROSS_ATTENTION:
            raise ValueError(
                f"doc2sent_cross_attention must be one of {DOC2SENT_CROSS_ATTENTION}: "
                f"{self.doc2sent_cross_attention!r}"
            )
        if self.packed_layout not in PACKED_LAYOUTS:
            raise ValueError(
                f"packed_layout must be one of {PACKED_LAYOUTS}: {self.packed_layout!r}"
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
        if self.bptt_chunks < 1 or (self.bptt_chunks > 1 and not self.recurrent):
            raise ValueError(f"bptt_chunks must be 1, or >= 1 with recurrent: {self.bptt_chunks}")
        if self.packed_chunk_spans < 1 or (
            self.packed_chunk_spans > 1 and self.packed_layout != "two_layout"
        ):
            raise ValueError(
                "packed_chunk_spans must be 1, or >= 1 with packed_layout='two_layout': "
                f"{self.packed_chunk_spans}"
            )
        if self.recurrent and self.packed_layout != "banded":
            raise ValueError(
                "recurrent trains on banded packed streams (or the grid): set "
                "packed_layout='banded' (configs/final.py:recurrent does)"
            )
        if self.recurrent and not (
            self.xl_decoder and self.segment_relative_attention and not self.cross_attends_chunk
        ):
            raise ValueError(
                "recurrent needs xl_decoder and segment_relative_attention (the memories it "
                "carries) and not doc2sent_cross_attention='chunk'"
            )

    @property
    def cross_attends_chunk(self) -> bool:
        """Every target sentence cross-attends over the whole chunk (``doc2sent`` rows with
        ``doc2sent_cross_attention = "chunk"``); else over its own sentence."""
        return self.doc2sent and self.doc2sent_cross_attention == "chunk"


#: Packed rows (:data:`~docnmt_jax.data.schema.PACKED_FEATURES`): ``{side}_{name}`` ``[B, L]``
#: for ``side`` in src/tgt and ``name`` in :data:`SEGMENT_FEATURES`.
Segments = dict[str, Array]
SEGMENT_FEATURES = ("positions", "chunk_positions", "segment_ids", "chunk_ids", "sentence_index")


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
        self,
        x: Array,
        mask: Array,
        num_sentences: int,
        sentence_index: Array | None = None,
        memory: tuple[Array, Array] | None = None,
    ) -> tuple[Array, Array]:
        """``x [B, S*T, D]``, token ``mask [B, S*T]`` -> (output ``[B, S*T, D]``, weights
        ``[B, H, S*T, S*T]`` before dropout). Packed rows (``sentence_index [B, L]``, the slot
        of each token's sentence in its chunk): ``x [B, L, D]``, ``mask`` the boolean
        attention mask ``[B, 1, L, L]`` (same chunk) and ``num_sentences`` the most sentences
        a chunk may have; output ``[B, L, D]``, weights ``[B, H, L, L]``. ``memory``: the
        previous chunk's sentence summaries ``[B, M, D]`` and mask ``[B, M]``, extra keys at
        the distances of :mod:`.final_recurrence` (packed: :func:`~.final_recurrence.
        packed_memory_keys`)."""
        cfg = self.config
        batch, length, _ = x.shape
        S = num_sentences
        H, dh = cfg.num_heads, cfg.d_model // cfg.num_heads
        R = cfg.max_relative_distance
        projections = [
            layers.heads_projection(H, cfg.d_model, cfg.dtype, name=name)
            for name in ("query", "key", "value")
        ]
        q, k, v = (project(x) for project in projections)
        gamma_k = self.param("relative_key", _relpos_init(), (2 * R + 1, H, dh))
        gamma_v = self.param("relative_value", _relpos_init(), (2 * R + 1, H, dh))
        # Only distances |k - kappa| <= S - 1 occur in a chunk: slice those rows of gamma.
        used = min(R, S - 1) if memory is None else R
        gamma_k, gamma_v = gamma_k[R - used : R + used + 1], gamma_v[R - used : R + used + 1]
        q_gamma = jnp.einsum("bqhd,rhd->bhqr", q, gamma_k.astype(q.dtype)).astype(jnp.float32)
        drop = nn.Dropout(cfg.attention_dropout_rate)
        if sentence_index is not None:
            qkv, key_index, first = (q, k, v), None, 0
            if memory is not None:  # packed streams: the carried summaries at slots -M .. -1
                qkv, key_index, mask = recurrence.packed_memory_keys(
                    qkv, projections[1:], memory, sentence_index, mask, S
                )
                first = -S
            out, weights = widened_segment_attention(
                qkv,
                q_gamma,
                gamma_v,
                mask,
                sentence_index,
                used,
                S - first,
                lambda w: drop(w, deterministic=cfg.deterministic),
                key_index,
                first,
            )
            return layers.output_projection(cfg.d_model, cfg.dtype, name="out")(out), weights
        content = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32)
        T = length // S
        sent = jnp.arange(S)
        distance = jnp.clip(sent[:, None] - sent[None, :], -used, used) + used  # [S, S]
        onehot = jax.nn.one_hot(distance, 2 * used + 1, dtype=jnp.float32)
        seg = jnp.einsum("bhstr,scr->bhstc", q_gamma.reshape(batch, H, S, T, -1), onehot)
        logits = content.reshape(batch, H, S, T, S, T) + seg[..., None]
        logits = logits.reshape(batch, H, length, length) / np.sqrt(dh)
        key_mask = mask[:, None, None, :] > 0
        if memory is not None:  # extra keys: the previous chunk's summaries
            mem = recurrence.MemoryKeys.project(memory, projections[1:], S, used)
            logits, key_mask = mem.extend(logits, key_mask, q, q_gamma, np.sqrt(dh))
        weights = layers.masked_softmax(logits, key_mask)
        dropped = drop(weights, deterministic=cfg.deterministic)
        memory_out = 0.0
        if memory is not None:  # the memory's share; the chunk's keys as without it
            weights, dropped, memory_out = mem.split(weights, dropped, gamma_v.astype(cfg.dtype))
        out = memory_out + jnp.einsum("bhqk,bkhd->bqhd", dropped.astype(cfg.dtype), v)
        mass = dropped.reshape(batch, H, S, T, S, T).sum(-1)  # [B, H, S, T, S]
        mass = jnp.einsum("bhstc,scr->bhstr", mass, onehot)  # attention mass per distance
        rel_v = jnp.einsum("bhstr,rhd->bsthd", mass.astype(cfg.dtype), gamma_v.astype(cfg.dtype))
        out = out + rel_v.reshape(batch, length, H, dh)
        return layers.output_projection(cfg.d_model, cfg.dtype, name="out")(out), weights


class GlobalContextLayer(nn.Module):
    """Global context encoding (Sec. 4.1): segment attention, gated fusion, feed-forward."""

    config: FinalConfig

    @nn.compact
    def __call__(
        self,
        h_local: Array,
        src_mask: Array,
        sentence_index: Array | None = None,
        memory: tuple[Array, Array] | None = None,
    ) -> tuple[Array, Array]:
        """``h^L [B, S, T, D]`` -> (``h [B, S, T, D]``, attention weights ``[B,H,S*T,S*T]``).
        Packed rows (``sentence_index [B, L]`` given): ``h^L [B, L, D]`` and ``src_mask`` the
        boolean attention mask ``[B, 1, L, L]`` of the chunks -> ``h [B, L, D]``. ``memory``
        (grid): the previous chunk's summaries and mask (:mod:`.final_recurrence`)."""
        cfg = self.config
        if sentence_index is None:
            B, S, T, D = h_local.shape
            x = h_local.reshape(B, S * T, D)
            mask = src_mask.reshape(B, S * T)
        else:
            B, L, D = h_local.shape
            x, mask, S = h_local, src_mask, cfg.max_segments
        norm = layers.layer_norm(cfg.dtype, name="input_norm") if cfg.pre_ln else lambda y: y
        z = norm(x)
        if memory is not None:
            memory = (norm(memory[0]), memory[1])
        h_global, weights = SegmentRelativeAttention(cfg, name="segment_attention")(
            z, mask, S, sentence_index, memory
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
        self,
        y: Array,
        encoded: Array,
        attention: PackedDecoderAttention,
        memory: Array | None = None,
    ) -> Array:
        """Packed rows: block rows ``y``, ``encoded`` ``[N, W, D]``; causal self-attention
        within the sentence and cross-attention to its source, each over its band's windows
        (the memory part of ``attention`` and ``memory`` are not used)."""
        del memory
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


def global_layer_terms(chunks: int, S: int, Ts: int, config: FinalConfig) -> flops.Terms:
    """Forward FLOPs of the global context layer over ``chunks`` of ``L = S·Ts`` tokens, with
    ``R2 = 2·min(max_relative_distance, S-1) + 1`` sentence distances::

      projections  4 · 2·L·D²
      attention    2 · 2·L²·D
      segment rel  2·L·R2·D               q·γ^K per distance
                   + 2·L·R2·D             attention mass per distance · γ^V
                   + 2 · 2·L·S·R2·H       one-hot spread of q·γ^K to sentence pairs, and of
                                          the mass back to distances
      gate         2·L·(2D)·D             W_g [h^L; h^G] (with the fusion gate)
      ffn          2 · 2·L·D·F
    """
    D, F, H = config.d_model, config.ffn_dim, config.num_heads
    L, R2 = S * Ts, 2 * min(config.max_relative_distance, S - 1) + 1
    terms = {
        "projections": chunks * 4 * 2 * L * D * D,
        "attention": chunks * 2 * 2 * L * L * D,
        "segment_relative": chunks * (2 * 2 * L * R2 * D + 2 * 2 * L * S * R2 * H),
        "ffn": chunks * 2 * 2 * L * D * F,
    }
    if config.context_fusion_gate:
        terms["gate"] = chunks * 2 * L * 2 * D * D
    return terms


def transformer_rules(cfg: FinalConfig) -> list[tuple[str, str]]:
    """A sentence Transformer with ``N = num_encoder_layers`` fills FINAL: the embedding, the
    local layers from encoder layers ``0..N-2`` (all ``N`` without the global layer), the
    global layer's attention, its norm (post-LN: the fusion norm; pre-LN: the input norm)
    and feed-forward sublayer from encoder layer ``N-1``, the decoder layers from the
    decoder layers (the XL layer's ``self_attention_norm`` from ``self_attention_block/
    norm``). Fresh: the segment table, the relative tables ``gamma^K``/``gamma^V``, the
    fusion gate, the XL ``u``/``v`` biases and relative-position projection ``W_R``."""
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
