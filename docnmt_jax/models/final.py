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
* Decoder (Sec. 4.2): Transformer-XL layers; sentence ``k`` attends to
  ``[SG(s^{l-1}_{k-1}); s^{l-1}_k]`` with the relative positions of Dai et al. (2019)
  (``(q+u) k^T + (q+v) (W_R R_{i-j})^T``), cross-attends to ``h_k`` only, and shares the output
  softmax with the embedding. Training computes every sentence of a chunk in one pass per layer
  (the memory of sentence ``k`` is the previous sentence's layer input, shifted along ``S``).

Switches make the rows of Table 3 configurations of this one module (:data:`TABLE3_SWITCHES`).
Decisions beyond the paper: per-head scaling ``1/sqrt(d_model/heads)``; without the fusion
gate ``h = LN(h^L + h^G)``; the memory's relative positions count from its real length (the
last memory token sits right before the current sentence), so memories padded to any length
give the same result; with ``pre_ln`` the global layer and the XL self-attention normalise
their inputs (memory included) and the fusion has no output LayerNorm.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from docnmt_jax.data.tokenizer import BOS_ID, PAD_ID
from docnmt_jax.decoding.beam_search import source_length_limits
from docnmt_jax.models import layers, transformer
from docnmt_jax.models.transformer import TransformerConfig

Array = jax.Array
Cache = dict[str, Any]
Memory = dict[str, Array]  # {"mask": [B, Tm], "layer_i": [B, Tm, D] (input of decoder layer i)}
MemoryKV = dict[str, Any]  # {"mask": [B, Tm], "layer_i": {"key", "value": [B, Tm, H, d]}}
KeyPart = tuple[Array, Array, Array, Array]  # keys, values, boolean mask, distances


@dataclasses.dataclass(frozen=True)
class FinalConfig(TransformerConfig):
    """Transformer hyper-parameters plus the switches of Zheng et al.'s Table 3.

    ``doc2sent``: the lower encoder layers attend over the whole chunk (a document as one
    sequence) instead of each sentence alone. ``reset_word_positions``: source positions restart
    in every sentence (else they continue across the chunk). ``segment_embedding``: add
    ``E^s_k``. ``segment_relative_attention``: the top encoder layer is the global layer
    (else all ``N`` layers are plain). ``context_fusion_gate``: gated fusion (else residual).
    ``xl_decoder``: Transformer-XL decoder (else the sentence decoder with absolute positions).
    """

    reset_word_positions: bool = True
    segment_embedding: bool = True
    segment_relative_attention: bool = True
    context_fusion_gate: bool = True
    xl_decoder: bool = True
    doc2sent: bool = False
    max_relative_distance: int = 20
    max_segments: int = 20

    def __post_init__(self) -> None:
        if self.max_relative_distance < 0:
            raise ValueError(f"max_relative_distance must be >= 0: {self.max_relative_distance}")
        if self.max_segments < 1:
            raise ValueError(f"max_segments must be >= 1: {self.max_segments}")
        if self.num_encoder_layers < 1:
            raise ValueError(f"num_encoder_layers must be >= 1: {self.num_encoder_layers}")


_SWITCHES_OFF = dict(
    doc2sent=False,
    reset_word_positions=False,
    segment_embedding=False,
    segment_relative_attention=False,
    context_fusion_gate=False,
    xl_decoder=False,
)
# Table 3 rows as switch settings. The source-side rows are cumulative; from "+segment relative
# attention" on, the lower layers are local (per sentence), the paper's hierarchical encoder.
# SENTNMT is the sentence Transformer (``transformer.py``); DOCNMT is not covered.
TABLE3_SWITCHES: dict[str, dict[str, bool]] = {
    "doc2sent": dict(_SWITCHES_OFF, doc2sent=True),
    "doc2sent+reset": dict(_SWITCHES_OFF, doc2sent=True, reset_word_positions=True),
    "doc2sent+reset+segment": dict(
        _SWITCHES_OFF, doc2sent=True, reset_word_positions=True, segment_embedding=True
    ),
    "+segment_relative_attention": dict(
        _SWITCHES_OFF,
        reset_word_positions=True,
        segment_embedding=True,
        segment_relative_attention=True,
    ),
    "+context_fusion_gate": dict(
        _SWITCHES_OFF,
        reset_word_positions=True,
        segment_embedding=True,
        segment_relative_attention=True,
        context_fusion_gate=True,
    ),
    "sent2doc_xl": dict(_SWITCHES_OFF, reset_word_positions=True, xl_decoder=True),
    "final": dict(
        reset_word_positions=True,
        segment_embedding=True,
        segment_relative_attention=True,
        context_fusion_gate=True,
        xl_decoder=True,
        doc2sent=False,
    ),
}


def _heads_dense(config: TransformerConfig, name: str, use_bias: bool = True) -> nn.DenseGeneral:
    """``[..., D] -> [..., H, D/H]`` projection with logical axes."""
    heads = config.num_heads
    if config.d_model % heads:
        raise ValueError(f"model dimension {config.d_model} is not divisible by {heads} heads")
    return nn.DenseGeneral(
        features=(heads, config.d_model // heads),
        axis=-1,
        use_bias=use_bias,
        dtype=config.dtype,
        kernel_init=layers.partitioned(nn.initializers.xavier_uniform(), ("embed", "heads", "kv")),
        bias_init=layers.partitioned(nn.initializers.zeros_init(), ("heads", "kv")),
        name=name,
    )


def _out_dense(config: TransformerConfig, name: str) -> nn.DenseGeneral:
    """``[..., H, D/H] -> [..., D]`` output projection with logical axes."""
    return nn.DenseGeneral(
        features=config.d_model,
        axis=(-2, -1),
        dtype=config.dtype,
        kernel_init=layers.partitioned(nn.initializers.xavier_uniform(), ("heads", "kv", "embed")),
        bias_init=layers.partitioned(nn.initializers.zeros_init(), ("embed",)),
        name=name,
    )


def _relpos_init() -> layers.Initializer:
    return layers.partitioned(nn.initializers.normal(stddev=0.02), ("relpos", "heads", "kv"))


class SegmentRelativeAttention(nn.Module):
    """Multi-head segment-level relative attention, Eq. (1), over the tokens of a chunk.

    ``gamma^K``/``gamma^V`` (``[2R+1, H, D/H]``) are indexed by the clipped sentence distance
    ``k - kappa``. The query-gamma products are computed once per distance and spread over
    sentence pairs with a one-hot ``[S, S, 2R+1]``; the value term is (attention mass per
    distance) @ ``gamma^V``. Nothing of size ``[S*T, S*T, D]`` is built.
    """

    config: FinalConfig

    @nn.compact
    def __call__(self, x: Array, mask: Array, num_sentences: int) -> tuple[Array, Array]:
        """``x [B, S*T, D]``, token ``mask [B, S*T]`` -> (output ``[B, S*T, D]``, weights
        ``[B, H, S*T, S*T]`` before dropout)."""
        cfg = self.config
        batch, length, _ = x.shape
        S, T = num_sentences, length // num_sentences
        H, dh = cfg.num_heads, cfg.d_model // cfg.num_heads
        R = cfg.max_relative_distance
        q = _heads_dense(cfg, "query")(x)
        k = _heads_dense(cfg, "key")(x)
        v = _heads_dense(cfg, "value")(x)
        gamma_k = self.param("relative_key", _relpos_init(), (2 * R + 1, H, dh))
        gamma_v = self.param("relative_value", _relpos_init(), (2 * R + 1, H, dh))
        # Only distances |k - kappa| <= S - 1 occur in a chunk: slice those rows of gamma.
        used = min(R, S - 1)
        gamma_k, gamma_v = gamma_k[R - used : R + used + 1], gamma_v[R - used : R + used + 1]
        sent = jnp.arange(S)
        distance = jnp.clip(sent[:, None] - sent[None, :], -used, used) + used  # [S, S]
        onehot = jax.nn.one_hot(distance, 2 * used + 1, dtype=jnp.float32)

        content = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32)
        q_gamma = jnp.einsum("bqhd,rhd->bhqr", q, gamma_k.astype(q.dtype)).astype(jnp.float32)
        seg = jnp.einsum("bhstr,scr->bhstc", q_gamma.reshape(batch, H, S, T, -1), onehot)
        logits = content.reshape(batch, H, S, T, S, T) + seg[..., None]
        logits = logits.reshape(batch, H, length, length) / np.sqrt(dh)
        logits = jnp.where(mask[:, None, None, :] > 0, logits, layers.NEG_INF)
        weights = jax.nn.softmax(logits, axis=-1)
        dropped = nn.Dropout(cfg.attention_dropout_rate)(weights, deterministic=cfg.deterministic)

        out = jnp.einsum("bhqk,bkhd->bqhd", dropped.astype(cfg.dtype), v)
        mass = dropped.reshape(batch, H, S, T, S, T).sum(-1)  # [B, H, S, T, S]
        mass = jnp.einsum("bhstc,scr->bhstr", mass, onehot)  # attention mass per distance
        rel_v = jnp.einsum("bhstr,rhd->bsthd", mass.astype(cfg.dtype), gamma_v.astype(cfg.dtype))
        out = out + rel_v.reshape(batch, length, H, dh)
        return _out_dense(cfg, "out")(out), weights


class GlobalContextLayer(nn.Module):
    """Global context encoding (Sec. 4.1): segment attention, gated fusion, feed-forward."""

    config: FinalConfig

    @nn.compact
    def __call__(self, h_local: Array, src_mask: Array) -> tuple[Array, Array]:
        """``h^L [B, S, T, D]`` -> (``h [B, S, T, D]``, attention weights ``[B,H,S*T,S*T]``)."""
        cfg = self.config
        B, S, T, D = h_local.shape
        x = h_local.reshape(B, S * T, D)
        z = layers.layer_norm(cfg.dtype, name="input_norm")(x) if cfg.pre_ln else x
        h_global, weights = SegmentRelativeAttention(cfg, name="segment_attention")(
            z, src_mask.reshape(B, S * T), S
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
        return h.reshape(B, S, T, D), weights


class RelativeSelfAttention(nn.Module):
    """Multi-head attention with Transformer-XL relative positions (Dai et al. 2019, Sec. 3.3).

    logits = ``[(q+u) k_j + (q+v) W_R R_{i-j}] / sqrt(d)`` with sinusoidal ``R``; the position
    term is computed once per distance and gathered by each key's distance. Keys come in two
    parts, the memory and the current sentence, normalised by one softmax; the two parts are
    never concatenated, and the memory has one row per example (shared by its beams).
    """

    config: FinalConfig

    def setup(self) -> None:
        cfg = self.config
        H, dh = cfg.num_heads, cfg.d_model // cfg.num_heads
        self.query = _heads_dense(cfg, "query")
        self.key = _heads_dense(cfg, "key")
        self.value = _heads_dense(cfg, "value")
        self.position = _heads_dense(cfg, "position", use_bias=False)  # W_R
        self.out = _out_dense(cfg, "out")
        bias_init = layers.partitioned(nn.initializers.normal(stddev=0.02), ("heads", "kv"))
        self.content_bias = self.param("content_bias", bias_init, (H, dh))  # u
        self.position_bias = self.param("position_bias", bias_init, (H, dh))  # v
        self.dropout = nn.Dropout(cfg.attention_dropout_rate)

    def project_q(self, x: Array) -> Array:
        return self.query(x)

    def project_kv(self, x: Array) -> tuple[Array, Array]:
        return self.key(x), self.value(x)

    def attend(
        self, q: Array, current: KeyPart, memory: KeyPart, heads_major: bool = False
    ) -> Array:
        """Attention of ``q [N, Tq, H, d]`` over ``[memory; current]``.

        Each part is (keys, values, mask, distances): ``current`` keys ``[N, Tk, H, d]``,
        ``memory`` keys ``[B, Tm, H, d]`` with ``N = B*G`` (``G`` contiguous query rows per
        memory row: the beams of a search); boolean masks broadcastable to ``[rows, 1, Tq, T]``
        and distances (query position minus key position, >= 0 where attended) to
        ``[rows, Tq, T]``, ``rows`` being that part's row count. With ``heads_major`` the keys
        and values of both parts are ``[rows, H, T, d]`` (decoding caches).
        """
        cfg = self.config
        N, Tq, H, dh = q.shape
        mem_k, mem_v, mem_mask, mem_dist = memory
        cur_k, cur_v, cur_mask, cur_dist = current
        kv, length_axis = ("bhkd", 2) if heads_major else ("bkhd", 1)
        B, Tm = mem_k.shape[0], mem_k.shape[length_axis]
        Tk = cur_k.shape[length_axis]
        G = N // B
        num_distances = Tm + Tk
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
        weights = jax.nn.softmax(jnp.where(mask, logits, layers.NEG_INF), axis=-1)
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

    config: FinalConfig

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

    def __call__(
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

    def step(
        self,
        y: Array,
        index: Array,
        cache: Cache,
        inputs: dict[str, Array],
        memory_mask: Array,
        cross_mask: Array,
    ) -> tuple[Array, Cache]:
        """One position ``y [N, 1, D]`` at ``index``: ``cache`` (self-attention keys/values)
        has ``N`` rows, ``inputs`` (memory and cross keys/values) and the masks one per
        example. Returns the output and the updated cache."""
        L, Tm = cache["key"].shape[2], memory_mask.shape[1]
        n_mem = jnp.sum(memory_mask > 0, axis=-1)[:, None, None]
        j_mem, j_cur = jnp.arange(Tm)[None, None, :], jnp.arange(L)[None, None, :]
        memory = (
            inputs["key"],
            inputs["value"],
            (memory_mask > 0)[:, None, None, :],
            index + n_mem - j_mem,
        )
        new_cache: Cache = {}

        def attend(h: Array) -> Array:
            k, v = self.self_attention.project_kv(h)
            k = layers.write_position(cache["key"], k, index)
            v = layers.write_position(cache["value"], v, index)
            new_cache.update(cache, key=k, value=v)
            current = (k, v, (j_cur <= index)[:, None], index - j_cur)
            q = self.self_attention.project_q(h)
            return self.self_attention.attend(q, current, memory, heads_major=True)

        y = self._self_block(y, attend)
        cross_kv = (inputs["cross_key"], inputs["cross_value"])
        y = self._rest(y, cross_kv, cross_mask, heads_major=True)
        return y, new_cache


def empty_memory(config: FinalConfig, batch: int, length: int) -> Memory:
    """The (fully masked) memory of a chunk's first sentence."""
    memory: Memory = {"mask": jnp.zeros((batch, length), jnp.int32)}
    if config.xl_decoder:
        for i in range(config.num_decoder_layers):
            memory[f"layer_{i}"] = jnp.zeros((batch, length, config.d_model), config.dtype)
    return memory


def _memory(states: list[Array], mask: Array) -> Memory:
    """A memory from the decoder layer inputs ``s^0..s^{N-1}`` of a sentence (stop-gradient)."""
    memory: Memory = {"mask": mask.astype(jnp.int32)}
    memory.update({f"layer_{i}": jax.lax.stop_gradient(s) for i, s in enumerate(states)})
    return memory


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
        self.encoder_layers = [transformer.EncoderLayer(cfg) for _ in range(num_local)]
        if cfg.segment_relative_attention:
            self.global_layer = GlobalContextLayer(cfg)
        if cfg.xl_decoder:
            self.decoder_layers = [XLDecoderLayer(cfg) for _ in range(cfg.num_decoder_layers)]
        else:
            self.decoder_layers = [
                transformer.DecoderLayer(cfg) for _ in range(cfg.num_decoder_layers)
            ]
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

    def _embed_target(self, tgt_in: Array) -> Array:
        cfg = self.config
        y = self.embed(tgt_in)
        if not cfg.xl_decoder:  # XL uses relative positions only (Dai et al. 2019)
            positions = jnp.broadcast_to(jnp.arange(tgt_in.shape[-1]), tgt_in.shape)
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
        ``layer`` (``states`` = its input). Returns the last output and every layer's input."""
        y = self._embed_target(tgt_in)
        cross_mask = layers.padding_mask(tgt_mask, src_mask)
        inputs = []
        for i, layer in enumerate(self.decoder_layers[:num_layers]):
            inputs.append(y)
            if self.config.xl_decoder:
                memory, memory_mask = memory_fn(i, y)
                y = layer(y, tgt_mask, memory, memory_mask, encoded, cross_mask)
            else:
                self_mask = layers.causal_mask(tgt_in.shape[-1]) & layers.padding_mask(
                    tgt_mask, tgt_mask
                )
                y, _ = layer(y, self_mask, encoded, cross_mask)
        return y, inputs

    def decode(self, encoded: Array, src_mask: Array, tgt_in: Array, tgt_mask: Array) -> Array:
        """Teacher-forced, all sentences in parallel: ``tgt_in [B, S, T]`` (shifted right) ->
        logits ``[B, S, T, V]``. The memory of sentence ``k`` in layer ``l`` is
        ``SG(s^{l-1}_{k-1})``, the previous sentence's layer input (none for ``k = 0``)."""
        cfg = self.config
        B, S, T = tgt_in.shape
        Ts = src_mask.shape[-1]

        def shift(x: Array) -> Array:  # sentence k gets row k-1 of ``x [B, S, ...]``
            return jnp.pad(x[:, :-1], [(0, 0), (1, 0)] + [(0, 0)] * (x.ndim - 2))

        memory_mask = shift(tgt_mask).reshape(B * S, T)

        def memory_fn(_: int, states: Array) -> tuple[Array, Array]:
            memory = shift(jax.lax.stop_gradient(states).reshape(B, S, T, cfg.d_model))
            return memory.reshape(B * S, T, cfg.d_model), memory_mask

        y, _ = self._decode_rows(
            encoded.reshape(B * S, Ts, cfg.d_model),
            src_mask.reshape(B * S, Ts),
            tgt_in.reshape(B * S, T),
            tgt_mask.reshape(B * S, T),
            memory_fn,
            cfg.num_decoder_layers,
        )
        return self._output(y).reshape(B, S, T, -1)

    def __call__(self, src: Array, src_mask: Array, tgt: Array, tgt_mask: Array) -> Array:
        """Logits ``[B, S, T, V]`` for targets ``tgt [B, S, T]`` (not shifted; EOS-terminated)."""
        encoded = self.encode(src, src_mask)
        return self.decode(encoded, src_mask, layers.shift_right(tgt, BOS_ID), tgt_mask)

    def decode_sentence(
        self, encoded: Array, src_mask: Array, tgt: Array, tgt_mask: Array, memory: Memory
    ) -> tuple[Array, Memory]:
        """One sentence per row, teacher-forced on ``tgt [B, T]`` (not shifted) with the previous
        sentence's ``memory``: (logits ``[B, T, V]``, this sentence's memory for the next)."""
        y, inputs = self._decode_rows(
            encoded,
            src_mask,
            layers.shift_right(tgt, BOS_ID),
            tgt_mask,
            lambda i, _: (memory[f"layer_{i}"], memory["mask"]),
            self.config.num_decoder_layers,
        )
        states = inputs if self.config.xl_decoder else []
        return self._output(y), _memory(states, tgt_mask)

    def sentence_memory(
        self, encoded: Array, src_mask: Array, tgt: Array, tgt_mask: Array, memory: Memory
    ) -> Memory:
        """The memory (decoder layer inputs ``s^0..s^{N-1}``) of target sentence ``tgt [B, T]``
        (e.g. the chosen hypothesis), computed teacher-forced with its own ``memory``."""
        cfg = self.config
        if not cfg.xl_decoder:
            return _memory([], tgt_mask)
        # The last layer's output is not part of the memory: N-1 layers give s^0..s^{N-1}.
        last, inputs = self._decode_rows(
            encoded,
            src_mask,
            layers.shift_right(tgt, BOS_ID),
            tgt_mask,
            lambda i, _: (memory[f"layer_{i}"], memory["mask"]),
            cfg.num_decoder_layers - 1,
        )
        return _memory(inputs + [last], tgt_mask)

    def init_cache(self, batch: int, max_len: int) -> Cache:
        """Empty cache for ``max_len`` positions of one sentence (self-attention keys/values)."""
        return transformer.empty_self_attention_cache(self.config, batch, max_len)

    def memory_kv(self, memory: Memory) -> MemoryKV:
        """The memory's self-attention keys/values: ``{"mask", "layer_i": {"key", "value"}}``
        (``[B, H, Tm, d]``, heads-major like the search cache that is the next sentence's
        memory), what the XL layers attend to when decoding."""
        memory_kv: MemoryKV = {"mask": memory["mask"]}
        if self.config.xl_decoder:
            for i, layer in enumerate(self.decoder_layers):
                k, v = layer.memory_kv(memory[f"layer_{i}"])
                memory_kv[f"layer_{i}"] = {
                    "key": layers.heads_major(k),
                    "value": layers.heads_major(v),
                }
        return memory_kv

    def decode_inputs(self, encoded: Array, src_mask: Array, memory: MemoryKV) -> dict[str, Any]:
        """Per-example inputs of :meth:`decode_step` (the ``extra`` of ``beam_search``, one row
        per example, shared by its beams): the source mask, every layer's cross-attention
        keys/values (computed once) and the previous sentence's memory keys/values."""
        extra: dict[str, Any] = {"src_mask": src_mask, "memory_mask": memory["mask"]}
        for i, layer in enumerate(self.decoder_layers):
            k, v = layer.cross_kv(encoded)
            extra[f"layer_{i}"] = {"cross_key": k, "cross_value": v}
            if self.config.xl_decoder:
                extra[f"layer_{i}"].update(memory[f"layer_{i}"])
        return extra

    def decode_step(self, cache: Cache, token: Array, extra: dict[str, Any]) -> tuple[Array, Cache]:
        """One step: ``token [N]`` at ``cache['index']`` -> (logits ``[N, V]``, new cache);
        ``cache`` has ``N`` rows (beams), ``extra`` (:meth:`decode_inputs`) one per example."""
        cfg = self.config
        index = cache["index"]
        max_len = cache["layer_0"]["key"].shape[2]
        y = self.embed(token[:, None])
        if not cfg.xl_decoder:
            positions = jnp.full(token.shape + (1,), index)
            y = y + layers.sinusoidal_encoding(positions, cfg.d_model, cfg.dtype)
        y = self.input_dropout(y, deterministic=cfg.deterministic)
        cross_mask = (extra["src_mask"] > 0)[:, None, None, :]
        new_cache: Cache = {"index": index + 1}
        for i, layer in enumerate(self.decoder_layers):
            name = f"layer_{i}"
            if cfg.xl_decoder:
                y, new_cache[name] = layer.step(
                    y, index, cache[name], extra[name], extra["memory_mask"], cross_mask
                )
            else:
                self_mask = (jnp.arange(max_len) <= index)[None, None, None, :]
                cross_kv = (extra[name]["cross_key"], extra[name]["cross_value"])
                y, new_cache[name] = layer(
                    y,
                    self_mask,
                    None,
                    cross_mask,
                    cache=cache[name],
                    index=index,
                    cross_kv=cross_kv,
                )
        return self._output(y)[:, 0], new_cache


def encode_in_groups(
    module: Final, variables: Any, src: Array, src_mask: Array, max_tokens: int = 2048
) -> Array:
    """:meth:`Final.encode` of ``src [B, S, T]``; on CPU in groups of chunks of at most
    ``max_tokens`` source slots (``lax.map``), whose activations stay in the CPU caches: at
    the batch sizes of sequential decoding this encodes ~1.6x faster (BUILD_NOTES.md,
    Performance). Accelerators encode the whole batch in one call."""
    B, S, T = src.shape
    groups = next((g for g in range(1, B + 1) if B % g == 0 and (B // g) * S * T <= max_tokens), B)
    if groups == 1 or jax.default_backend() != "cpu":
        return module.apply(variables, src, src_mask, method=module.encode)
    shape = (groups, B // groups, S, T)
    encoded = jax.lax.map(
        lambda xs: module.apply(variables, xs[0], xs[1], method=module.encode),
        (src.reshape(shape), src_mask.reshape(shape)),
    )
    return encoded.reshape((B,) + encoded.shape[2:])


class FinalTask:
    """Adapter between the training loop / translator and :class:`Final` (document batches)."""

    sentence_level = False  # batches hold chunks of up to S sentences per row

    def __init__(self, config: FinalConfig):
        self.config = config
        # With the XL decoder, translate_batch searches the sentences of a chunk in order.
        self.sequential_sentences = config.xl_decoder
        self.train_module = Final(dataclasses.replace(config, deterministic=False))
        self.eval_module = Final(dataclasses.replace(config, deterministic=True))

    def init(self, rng: Array, batch: dict[str, Array]) -> Any:
        return self.eval_module.init(
            rng, batch["src"], batch["src_mask"], batch["tgt"], batch["tgt_mask"]
        )

    def logits(
        self, params: Any, batch: dict[str, Array], dropout_rng: Array | None, train: bool
    ) -> tuple[Array, Array, Array]:
        """(logits ``[B*S, T, V]``, targets ``[B*S, T]``, target mask ``[B*S, T]``)."""
        module = self.train_module if train else self.eval_module
        rngs = {"dropout": dropout_rng} if train else {}
        logits = module.apply(
            {"params": params},
            batch["src"],
            batch["src_mask"],
            batch["tgt"],
            batch["tgt_mask"],
            rngs=rngs,
        )
        T = batch["tgt"].shape[-1]
        return (
            logits.reshape((-1, T, logits.shape[-1])),
            batch["tgt"].reshape((-1, T)),
            batch["tgt_mask"].reshape((-1, T)),
        )

    def sentence_attention(self, params: Any, batch: dict[str, Array]) -> Array:
        """Sentence-to-sentence attention of the global layer, ``[B, S, S]`` (Fig. 4)."""
        module = self.eval_module
        return module.apply(
            {"params": params}, batch["src"], batch["src_mask"], method=module.sentence_attention
        )

    def translate_batch(self, params: Any, batch: dict[str, Array], search: Any) -> Array:
        """Beam search of every sentence of the chunks: ids ``[B, S, L]`` (EOS, then PAD).

        The source chunk is encoded once. With the XL decoder the sentences are translated in
        order (``lax.scan`` over ``S``): the memory of sentence ``k`` is the decoder keys/values
        of the translation chosen for ``k-1`` (never the reference), kept by the beam search
        (``keep_best_cache``). Without it every sentence is searched in parallel. Padding
        sentences give PAD rows. Pure and jit-able; :meth:`translate_fn` runs the same
        searches as separate executions.
        """
        cfg = self.config
        B, S, T = batch["src"].shape
        slots, memory = self._search_inputs(params, batch, search)
        if not cfg.xl_decoder:
            rows = B * S
            result = self._search(
                params,
                jax.tree.map(lambda x: x.reshape((rows,) + x.shape[2:]), slots),
                {"mask": jnp.zeros((rows, 1), jnp.int32)},
                search,
            )
            ids = result.sequences[:, 0].reshape(S, B, -1).swapaxes(0, 1)  # rows slot-major
        else:
            _, ids = jax.lax.scan(
                lambda memory, slot: self._search_slot(params, memory, slot, search),
                memory,
                slots,
            )
            ids = ids.swapaxes(0, 1)
        return _pad_empty_sentences(ids, batch["src_mask"])

    def translate_fn(self, search: Any) -> Any:
        """``(params, batch) -> ids``, equal to ``jax.jit(translate_batch)``; with the XL
        decoder a Python loop over the sentence slots of one jitted search each (dispatched
        asynchronously: no host synchronisation between slots). On XLA:CPU the search loop
        nested in the scan over slots ran 7% slower than the same searches as separate
        executions (BUILD_NOTES.md, Performance); three compilations per batch shape instead of
        one, where unrolling the scan would compile every slot's search.
        """
        if not self.config.xl_decoder:
            return jax.jit(functools.partial(self.translate_batch, search=search))
        prepare = jax.jit(functools.partial(self._search_inputs, search=search))

        def slot_fn(params: Any, memory: MemoryKV, slots: Any, k: Array) -> Any:
            slot = jax.tree.map(lambda x: jax.lax.dynamic_index_in_dim(x, k, 0, False), slots)
            return self._search_slot(params, memory, slot, search)

        search_slot = jax.jit(slot_fn, donate_argnums=1)
        finish = jax.jit(lambda ids, src_mask: _pad_empty_sentences(jnp.stack(ids, 1), src_mask))

        def translate(params: Any, batch: dict[str, Array]) -> Array:
            slots, memory = prepare(params, batch)
            ids = []
            for k in range(batch["src"].shape[1]):
                memory, ids_k = search_slot(params, memory, slots, np.int32(k))
                ids.append(ids_k)
            return finish(ids, batch["src_mask"])

        return translate

    def _search_inputs(
        self, params: Any, batch: dict[str, Array], search: Any
    ) -> tuple[tuple[Array, Array, Array], MemoryKV]:
        """The chunks encoded once (:func:`encode_in_groups`), per sentence slot: (encoded
        ``[S, B, T, D]``, source mask ``[S, B, T]``, output limits ``[S, B]``), and the empty
        memory of sentence 0."""
        cfg = self.config
        src, src_mask = batch["src"], batch["src_mask"]
        B, S, T = src.shape
        max_len = search.output_len(T)
        encoded = encode_in_groups(self.eval_module, {"params": params}, src, src_mask)
        limits = source_length_limits(
            src_mask.reshape(B * S, T), search.len_a, search.len_b, max_len
        ).reshape(B, S)
        memory = transformer.empty_self_attention_cache(cfg, B, max_len)
        memory = {k: v for k, v in memory.items() if k != "index"}
        memory["mask"] = jnp.zeros((B, max_len), jnp.int32)  # sentence 0: no memory
        slots = (encoded.swapaxes(0, 1), src_mask.swapaxes(0, 1), limits.swapaxes(0, 1))
        return slots, memory

    def _search(
        self, params: Any, slot: tuple[Array, Array, Array], memory: MemoryKV, search: Any
    ) -> Any:
        """Beam search of one sentence per row: ``slot`` = (encoded, mask, limits)."""
        cfg, module = self.config, self.eval_module
        variables = {"params": params}
        encoded, src_mask, limits = slot
        max_len = search.output_len(encoded.shape[1])
        extra = module.apply(variables, encoded, src_mask, memory, method=module.decode_inputs)
        return transformer.search_decoder(
            module, variables, extra, search, max_len, limits, keep_best_cache=cfg.xl_decoder
        )

    def _search_slot(
        self, params: Any, memory: MemoryKV, slot: tuple[Array, Array, Array], search: Any
    ) -> tuple[MemoryKV, Array]:
        """Searches sentence slot ``k`` of every chunk with the memory of slot ``k-1``: (the
        memory for ``k+1``, ids ``[B, L]``)."""
        result = self._search(params, slot, memory, search)
        # The next memory: the keys/values of the chosen translation, straight from the
        # search's cache (the inputs BOS, y_1 .. y_{n-1} of its n tokens), equal to a
        # teacher-forced pass over it (tests/test_final.py) without recomputing it.
        max_len = result.sequences.shape[-1]
        best_mask = jnp.arange(max_len)[None] < result.lengths[:, :1]
        memory = {"mask": best_mask.astype(jnp.int32)}
        memory.update({k: v for k, v in result.best_cache.items() if k != "index"})
        return memory, result.sequences[:, 0]


def _pad_empty_sentences(ids: Array, src_mask: Array) -> Array:
    """PAD rows for the padding sentences (no source token) of ids ``[B, S, L]``."""
    real = jnp.any(src_mask > 0, axis=-1)[..., None]
    return jnp.where(real, ids, PAD_ID)
