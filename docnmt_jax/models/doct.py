"""DocT: the Transformer with document-level context of Zhang et al. (2018), Sec. 2.

Paper -> code (``../shared/papers/001_*``; the authors' THUMT code settles what the text
leaves open, each reading below is tested in ``tests/test_doct.py``):

* Context ``X_<k`` (Sec. 2.1, Eq. 2-3): the ``context_sentences`` (``k``) source sentences
  before sentence ``k`` in its document, concatenated (each with its EOS, which separates them).
  The pipeline gives every chunk the ``k`` sentences before its first one
  (``context_src``, :mod:`docnmt_jax.data.schema`), so a chunk's first sentences get their
  predecessors from the previous chunk: :func:`~.window.context_windows` builds every
  sentence's window from ``[context_src; src]`` with ``k`` static slices. The context never
  crosses a document boundary (the pipeline stops at the document's first sentence).
* Context encoder (Eq. 4-9): ``num_context_layers`` (``N_c``) Transformer encoder layers
  (:class:`~.transformer.EncoderLayer`: self-attention, FFN, residual and LayerNorm) over
  ``X_c`` = source embedding (shared with the encoder and decoder) + sinusoidal positions that
  run over the concatenation's real tokens ``0..M-1`` (THUMT's timing signal on the
  concatenated context). As in THUMT the context input gets no dropout. ``N_c = 0`` is THUMT's
  ``context_representation = "embedding"``.
* Encoder layer (Eq. 11-13): self-attention, context attention over ``C^(N_c)``, FFN.
  Decoder layer (Eq. 14-18): self-attention, context attention, encoder-decoder attention, FFN.
  Output softmax (Eq. 19): the tied embedding, as our sentence Transformer.
* Context gating (Eq. 20-22), in place of the residual after every context attention:
  ``lambda = sigmoid(W_i H + W_s SubLayer(H))`` (two ``D x D`` matrices without bias, one gate
  per feature), ``Gating(H) = lambda H + (1 - lambda) SubLayer(H)``, then the sublayer's
  LayerNorm (post-LN; THUMT: the gate output is layer-normalised, no dropout on
  ``SubLayer(H)``). Pre-LN: ``SubLayer`` reads ``LN(H)`` and the gate mixes the stream ``H``.
  ``context_gating = False``: the residual ``LN(H + Dropout(SubLayer(H)))`` (Table 9).
* First sentence of a document (empty context, not specified by the paper): the context
  sublayers of that sentence are skipped, so it is computed exactly as by the model without
  context attention (no attention over an empty key set, no NaN).
* Two-step training (Sec. 2.4, Eq. 23-25): ``theta_s`` are the parameters named as in the
  sentence Transformer (embedding, self-/cross-attention, FFN and their LayerNorms), restored
  with :meth:`DocTModel.transformer_rules` (identical paths; ``theta_d`` fresh) and frozen with
  :data:`SENTENCE_PARAMETERS` (``configs/doct.py:two_step``). ``theta_d`` are
  :data:`DOCUMENT_PARAMETERS`: the context encoder, every context attention and its gate and
  LayerNorm (THUMT trains the LayerNorm after the context attention with ``theta_d``).
* Decoding: the context is source-only, so every sentence of a chunk is searched at once
  (layout ``CHUNKS``; with ``sentence_rows`` the rows are sentences, layout ``SENTENCES``,
  each with its window from the pipeline's ``context_src``); the context states are encoded
  once and each decoder layer's context keys/values are projected once per sentence and
  shared by its beams, like cross-attention.
* Sentence-to-sentence attention (Zheng et al. 2020's Fig. 4, :meth:`DocTModel.
  sentence_attention`): the last encoder layer's context attention, per window slot; the
  matrix covers the window only (a sentence attends to its ``k`` predecessors, never to
  itself or later sentences).
* Ablations (Tables 1, 2, 7, 8, 9) are config switches of this one module:
  ``context_sentences``, ``num_context_layers``, two-step vs joint (``configs/doct.py`` vs
  ``configs/doct.py:two_step``), ``context_in_encoder``/``context_in_decoder`` and
  ``context_gating`` (``configs/doct_ablations.py``).
* Packed training (``config.data.packed``, the default): sentences in rows of 128 slots as
  the sentence Transformer's, each row's windows in a context row of ``k x 128`` slots
  (:mod:`~docnmt_jax.data.window_plan`); the context encoder's self-attention and every
  context attention are masked by segment equality (a window carries its sentence's segment
  id), positions run over each window's real tokens, and a token whose segment has no window
  skips its context sublayers, as a document's first sentence on the grid
  (``tests/test_doct_packed.py``: the same NLL and gradients as the grid path).
* The keys/values ``C W^K_i``, ``C W^V_i`` of every context attention (Eq. 12, 16) are one
  product of ``C^(N_c)`` with the layers' kernels concatenated (:meth:`DocT.context_kv`); the
  parameters stay per layer, so checkpoints are unchanged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from docnmt_jax import flops
from docnmt_jax.data.schema import is_packed
from docnmt_jax.data.spec import DataSpec, PackingConfig
from docnmt_jax.data.tokenizer import BOS_ID
from docnmt_jax.decoding.search import (
    SearchConfig,
    pad_empty_sentences,
    search_decoder,
    sentence_limits,
    sentence_outputs,
)
from docnmt_jax.models import layers, transformer
from docnmt_jax.models.base import ModelError, register, require_context_somewhere
from docnmt_jax.models.transformer import Cache, Segments, TransformerConfig
from docnmt_jax.models.window import (
    WindowContextModel,
    context_attend,
    context_present,
    packed_window_rows,
)

Array = jax.Array

#: ``theta_d`` (Sec. 2.4): the parameters DocT adds to the sentence Transformer.
DOCUMENT_PARAMETERS = r"context_layers_\d+/.*|context_norm/.*|(?:en|de)coder_layers_\d+/context_.*"
#: ``theta_s`` as a ``train.freeze`` pattern (searched): every parameter path outside ``theta_d``.
SENTENCE_PARAMETERS = rf"^(?!(?:{DOCUMENT_PARAMETERS})$)"


@dataclasses.dataclass(frozen=True)
class DocTConfig(TransformerConfig):
    """Transformer hyper-parameters plus DocT's: the context length ``k`` (Table 1), the
    context encoder's layers ``N_c`` (Table 2), where the context is integrated (Table 8) and
    gating or a residual after the context attentions (Table 9). ``sentence_rows``: batch
    rows are single sentences, each with its ``k`` predecessors from the pipeline's context
    window (as THUMT batches them; less padding than chunks of 20 on real documents), instead
    of whole chunks; the same model and outputs either way."""

    context_sentences: int = 2
    num_context_layers: int = 1
    context_in_encoder: bool = True
    context_in_decoder: bool = True
    context_gating: bool = True
    sentence_rows: bool = False

    def __post_init__(self) -> None:
        if self.context_sentences < 1:
            raise ValueError(f"context_sentences must be >= 1: {self.context_sentences}")
        if self.num_context_layers < 0:
            raise ValueError(f"num_context_layers must be >= 0: {self.num_context_layers}")
        require_context_somewhere(self.context_in_encoder, self.context_in_decoder)


class ContextSublayer(nn.Module):
    """The sublayer wrapper after a context attention: gating (Eq. 21-22) or the residual,
    each followed by LayerNorm (post-LN); rows or tokens without context (``present`` ``[N]``
    or ``[N, T]`` False: a document's first sentence) pass ``H`` through unchanged."""

    config: DocTConfig

    @nn.compact
    def __call__(self, x: Array, fn: Callable[[Array], Array], present: Array) -> Array:
        cfg = self.config
        norm = layers.layer_norm(cfg.dtype, name="norm")
        sub = fn(norm(x) if cfg.pre_ln else x)
        if cfg.context_gating:
            gate = jax.nn.sigmoid(
                self._gate_projection("gate_input")(x) + self._gate_projection("gate_context")(sub)
            )
            self.sow("intermediates", "gate_values", gate)
            out = gate * x + (1.0 - gate) * sub
        else:
            out = x + nn.Dropout(cfg.dropout_rate)(sub, deterministic=cfg.deterministic)
        if not cfg.pre_ln:
            out = norm(out)
        return jnp.where(present.reshape(present.shape + (1,) * (x.ndim - present.ndim)), out, x)

    def _gate_projection(self, name: str) -> nn.Dense:
        """``W_i`` or ``W_s`` of Eq. (22): ``D x D``, no bias (THUMT)."""
        return nn.Dense(
            self.config.d_model,
            use_bias=False,
            dtype=self.config.dtype,
            kernel_init=layers.partitioned(nn.initializers.xavier_uniform(), ("embed", "mlp")),
            name=name,
        )


class ContextEncoderLayer(nn.Module):
    """Encoder layer of Eq. (11)-(13): self-attention, context attention, FFN (parameter
    names of :class:`~.transformer.EncoderLayer` plus ``context_attention``/``context_block``)."""

    config: DocTConfig

    def setup(self) -> None:
        cfg = self.config
        self.self_attention = cfg.attention("self_attention")
        self.attention_block = cfg.sublayer("attention_block")
        if cfg.context_in_encoder:
            self.context_attention = cfg.attention("context_attention")
            self.context_block = ContextSublayer(cfg, name="context_block")
        self.ffn = cfg.feed_forward("ffn")
        self.ffn_block = cfg.sublayer("ffn_block")

    def __call__(
        self,
        x: Array,
        mask: Array,
        context: Array,
        context_mask: Array,
        present: Array,
        context_kv: tuple[Array, Array] | None = None,
    ) -> Array:
        """``context_kv``: this layer's context keys/values ``[N, Lc, H, d]``, projected
        with every layer's at once (:meth:`DocT.context_kv`); None: from ``context``."""
        x = self.attention_block(x, lambda h: self.self_attention(h, h, mask))
        if self.config.context_in_encoder:
            attention = self.context_attention
            x = self.context_block(
                x,
                lambda h: context_attend(attention, h, context, context_mask, context_kv),
                present,
            )
        x = self.ffn_block(x, self.ffn)
        return layers.constrain(x, ("batch", "length", "embed"))


class ContextDecoderLayer(transformer.DecoderLayer):
    """Decoder layer of Eq. (15)-(18): self-attention, context attention, encoder-decoder
    attention, FFN. ``context_kv``: the context keys/values projected beforehand (training:
    ``[N, Lc, H, d]`` with every layer's at once; decoding, with ``cache``: heads-major, once
    per example, :meth:`DocT.decode_inputs`, like the cross-attention's)."""

    config: DocTConfig

    def setup(self) -> None:
        super().setup()
        if self.config.context_in_decoder:
            self.context_attention = self.config.attention("context_attention")
            self.context_block = ContextSublayer(self.config, name="context_block")

    def __call__(  # type: ignore[override]
        self,
        y: Array,
        self_mask: Array,
        encoded: Array | None,
        cross_mask: Array,
        context: Array | None,
        context_mask: Array,
        present: Array,
        cache: Cache | None = None,
        index: Array | None = None,
        cross_kv: tuple[Array, Array] | None = None,
        context_kv: tuple[Array, Array] | None = None,
    ) -> tuple[Array, Cache | None]:
        y, new_cache = self.self_attention_sublayer(y, self_mask, cache, index)
        if self.config.context_in_decoder:
            attention, heads_major = self.context_attention, cache is not None
            y = self.context_block(
                y,
                lambda h: context_attend(
                    attention, h, context, context_mask, context_kv, heads_major
                ),
                present,
            )
        y = self.cross_attention_sublayer(y, encoded, cross_mask, cross_kv)
        y = self.ffn_block(y, self.ffn)
        return layers.constrain(y, ("batch", "length", "embed")), new_cache


class DocT(transformer.Transformer):
    """DocT over sentence rows: ``src [N, Ts]`` with each row's context ``[N, Lc]``
    (:func:`~.window.context_windows`) -> logits ``[N, Tt, V]``; or packed rows ``[B, L]``
    with ``segments`` (:func:`~.window.packed_window_rows`): each segment one sentence,
    its window the context tokens with its segment id. Same parameter names as the sentence
    Transformer for ``theta_s``. ``fuse_context_kv``: the context keys/values of every
    layer from one product over the context states (:meth:`context_kv`)."""

    config: DocTConfig
    fuse_context_kv: bool = True
    encoder_layer_class: ClassVar[type[nn.Module]] = ContextEncoderLayer
    decoder_layer_class: ClassVar[type[nn.Module]] = ContextDecoderLayer

    def setup(self) -> None:
        super().setup()
        cfg = self.config
        self.context_layers = [transformer.EncoderLayer(cfg) for _ in range(cfg.num_context_layers)]
        if cfg.pre_ln:
            self.context_norm = layers.layer_norm(cfg.dtype)

    def encode_context(
        self, context: Array, context_mask: Array, segments: Segments | None = None
    ) -> Array:
        """``C^(N_c)`` (Eq. 4-9) of contexts ``[N, Lc]``: positions count the real tokens of the
        concatenation (packed: of each window, ``context_positions``; a window attends only
        to itself); no input dropout (THUMT)."""
        if segments is None:
            positions = jnp.maximum(jnp.cumsum(context_mask > 0, axis=-1) - 1, 0)
            mask = layers.padding_mask(context_mask, context_mask)
        else:
            positions, ids = segments["context_positions"], segments["context_segment_ids"]
            mask = layers.segment_mask(ids, ids)
        x = self.embed(context) + layers.sinusoidal_encoding(
            positions, self.config.d_model, jnp.float32
        )
        for layer in self.context_layers:
            x = layer(x, mask)
        return self.context_norm(x) if self.config.pre_ln else x

    def context_kv(self, states: Array, stacks: tuple[str, ...]) -> list[tuple[Array, Array]]:
        """Context-attention keys/values ``[N, Lc, H, d]`` of the context states for every
        layer of ``stacks`` (``"encoder"``, ``"decoder"``), in order: the ``K_i = C W^K_i``,
        ``V_i = C W^V_i`` of Eq. (12) and (16). With :attr:`fuse_context_kv` one product of
        ``C`` with the layers' kernels concatenated (the parameters stay per layer)."""
        attentions = [
            (f"{stack}_layers_{i}", layer.context_attention)
            for stack in stacks
            for i, layer in enumerate(getattr(self, f"{stack}_layers"))
        ]
        if not self.fuse_context_kv or self.is_initializing() or not attentions:
            return [attention.project_kv(states) for _, attention in attentions]
        params = nn.meta.unbox(self.variables["params"])
        kernels, biases = [], []
        for path, _ in attentions:
            for name in ("key", "value"):
                dense = params[path]["context_attention"][name]
                kernels.append(dense["kernel"])
                biases.append(dense["bias"])
        dtype = self.config.dtype
        kernel = jnp.stack(kernels, axis=1).astype(dtype)  # [D, 2P, H, d]
        kv = jnp.einsum("nlD,Dphd->nlphd", states.astype(dtype), kernel)
        kv = kv + jnp.stack(biases).astype(dtype)
        return [(kv[:, :, 2 * j], kv[:, :, 2 * j + 1]) for j in range(len(attentions))]

    def _stacks(self) -> tuple[str, ...]:
        cfg = self.config
        return ("encoder",) * cfg.context_in_encoder + ("decoder",) * cfg.context_in_decoder

    def encode(  # type: ignore[override]
        self,
        src: Array,
        src_mask: Array,
        context: Array,
        context_mask: Array,
        segments: Segments | None = None,
    ) -> tuple[Array, Array]:
        """(encoder states ``S^(N_s)`` ``[N, Ts, D]``, context states ``C^(N_c)``
        ``[N, Lc, D]``) of sentences ``src [N, Ts]`` and their contexts ``[N, Lc]``."""
        encoded, states, _ = self._encode(src, src_mask, context, context_mask, segments)
        return encoded, states

    def _encode(
        self,
        src: Array,
        src_mask: Array,
        context: Array,
        context_mask: Array,
        segments: Segments | None,
    ) -> tuple[Array, Array, list[tuple[Array, Array]]]:
        """:meth:`encode` and the decoder layers' context keys/values (one product with the
        encoder layers')."""
        states = self.encode_context(context, context_mask, segments)
        kv = self.context_kv(states, self._stacks())
        encoder_kv = kv[: len(self.encoder_layers)] if self.config.context_in_encoder else []
        if segments is None:
            positions = jnp.broadcast_to(jnp.arange(src.shape[-1]), src.shape)
            mask = layers.padding_mask(src_mask, src_mask)
            to_context = layers.padding_mask(src_mask, context_mask)
        else:
            positions, ids = segments["src_positions"], segments["src_segment_ids"]
            mask = layers.segment_mask(ids, ids)
            to_context = layers.segment_mask(ids, segments["context_segment_ids"])
        present = context_present(to_context, context_mask, segments)
        x = self._embed(src, positions)
        for i, layer in enumerate(self.encoder_layers):
            layer_kv = encoder_kv[i] if encoder_kv else None
            x = layer(x, mask, states, to_context, present, layer_kv)
        encoded = self.encoder_norm(x) if self.config.pre_ln else x
        return encoded, states, kv[len(encoder_kv) :]

    def decode(  # type: ignore[override]
        self,
        encoded: Array,
        src_mask: Array,
        tgt_in: Array,
        tgt_mask: Array,
        context_states: Array,
        context_mask: Array,
        segments: Segments | None = None,
        context_kv: list[tuple[Array, Array]] | None = None,
    ) -> Array:
        """Teacher-forced decoder: ``tgt_in [N, Tt]`` (shifted right) -> logits;
        ``context_kv``: the decoder layers' context keys/values (None: projected here)."""
        causal = layers.causal_mask(tgt_in.shape[-1])
        if segments is None:
            positions = jnp.broadcast_to(jnp.arange(tgt_in.shape[-1]), tgt_in.shape)
            self_mask = causal & layers.padding_mask(tgt_mask, tgt_mask)
            cross_mask = layers.padding_mask(tgt_mask, src_mask)
            to_context = layers.padding_mask(tgt_mask, context_mask)
        else:
            positions, ids = segments["tgt_positions"], segments["tgt_segment_ids"]
            self_mask = causal & layers.segment_mask(ids, ids)
            cross_mask = layers.segment_mask(ids, segments["src_segment_ids"])
            to_context = layers.segment_mask(ids, segments["context_segment_ids"])
        present = context_present(to_context, context_mask, segments)
        if context_kv is None and self.config.context_in_decoder:
            context_kv = self.context_kv(context_states, ("decoder",))
        y = self._embed(tgt_in, positions)
        for i, layer in enumerate(self.decoder_layers):
            layer_kv = context_kv[i] if context_kv else None
            y, _ = layer(
                y, self_mask, encoded, cross_mask, context_states, to_context, present,
                context_kv=layer_kv,
            )  # fmt: skip
        return self._output(y)

    def __call__(  # type: ignore[override]
        self,
        src: Array,
        src_mask: Array,
        tgt: Array,
        tgt_mask: Array,
        context: Array,
        context_mask: Array,
        segments: Segments | None = None,
    ) -> Array:
        """Logits ``[N, Tt, V]`` for targets ``tgt`` (not shifted; EOS-terminated); with
        ``segments``, of every segment of the packed rows with its own window."""
        encoded, states, kv = self._encode(src, src_mask, context, context_mask, segments)
        if segments is None:
            tgt_in = layers.shift_right(tgt, BOS_ID)
        else:
            tgt_in = layers.shift_right_segments(tgt, segments["tgt_positions"], BOS_ID)
        return self.decode(
            encoded, src_mask, tgt_in, tgt_mask, states, context_mask, segments, kv or None
        )

    def decode_inputs(  # type: ignore[override]
        self, encoded: Array, src_mask: Array, context_states: Array, context_mask: Array
    ) -> dict[str, Any]:
        """Per-example inputs of :meth:`decode_step`: the Transformer's (source mask,
        cross-attention keys/values) plus the context mask, whether a context exists, and
        every layer's context-attention keys/values, computed once per sentence."""
        extra = super().decode_inputs(encoded, src_mask)
        extra["context_mask"] = context_mask
        if self.config.context_in_decoder:
            kv = self.context_kv(context_states, ("decoder",))
            for i, (k, v) in enumerate(kv):
                k, v = layers.heads_major(k), layers.heads_major(v)
                extra[f"layer_{i}"].update(context_key=k, context_value=v)
        return extra

    def decode_step(self, cache: Cache, token: Array, extra: dict[str, Any]) -> tuple[Array, Cache]:
        """One step: ``token [N]`` at ``cache['index']`` -> logits ``[N, V]``; ``extra``
        (:meth:`decode_inputs`) has one row per example, ``N`` a multiple of it."""
        index = cache["index"]
        max_len = cache["layer_0"]["key"].shape[2]
        y = self._embed(token[:, None], jnp.full(token.shape + (1,), index))
        self_mask = (jnp.arange(max_len) <= index)[None, None, None, :]
        cross_mask = (extra["src_mask"] > 0)[:, None, None, :]
        context_mask = extra["context_mask"] > 0
        beams = token.shape[0] // context_mask.shape[0]
        present = jnp.repeat(jnp.any(context_mask, axis=-1), beams)[:, None]
        new_cache: Cache = {"index": index + 1}
        for i, layer in enumerate(self.decoder_layers):
            inputs = extra[f"layer_{i}"]
            context_kv = None
            if self.config.context_in_decoder:
                context_kv = (inputs["context_key"], inputs["context_value"])
            y, new_cache[f"layer_{i}"] = layer(
                y,
                self_mask,
                None,
                cross_mask,
                None,
                context_mask[:, None, None, :],
                present,
                cache=cache[f"layer_{i}"],
                index=index,
                cross_kv=(inputs["cross_key"], inputs["cross_value"]),
                context_kv=context_kv,
            )
        return self._output(y)[:, 0], new_cache


def doct_terms(config: DocTConfig, shape: flops.BatchShape) -> flops.Terms:
    """Forward FLOPs of DocT: the sentence Transformer plus, per sentence row, ``N_c`` context
    encoder layers on its ``Lc = k·Ts`` context slots and the context attention
    (:func:`~docnmt_jax.flops.context_attention`) of every encoder and decoder layer."""
    D, F, N = config.d_model, config.ffn_dim, shape.rows
    Ts, Tt = shape.src_len, shape.tgt_len
    Lc, gating = config.context_sentences * Ts, config.context_gating
    total = transformer.transformer_terms(config, shape)
    context = flops.encoder_layer(N, Lc, D, F)
    flops.add_terms(total, "context", context, config.num_context_layers)
    if config.context_in_encoder:
        terms = flops.context_attention(N, Ts, Lc, D, gating)
        flops.add_terms(total, "encoder", terms, config.num_encoder_layers)
    if config.context_in_decoder:
        terms = flops.context_attention(N, Tt, Lc, D, gating)
        flops.add_terms(total, "decoder", terms, config.num_decoder_layers)
    return total


@register("doct", config=DocTConfig, flops=doct_terms)
class DocTModel(WindowContextModel):
    """DocT behind the model interface: chunks in, every sentence translated with its
    ``k`` preceding source sentences, all sentences of a chunk at once."""

    module_class = DocT
    label = "DocT"
    context_parameters = DOCUMENT_PARAMETERS  # theta_d fresh, theta_s from the Transformer

    def data_spec(self) -> DataSpec:
        """The window (:class:`WindowContextModel`); packed: sentences in rows of 128 slots
        as the sentence Transformer's, each row's windows in a context row of ``k x 128``
        (:mod:`~docnmt_jax.data.window_plan`)."""
        packing = PackingConfig(unit="sentence", row_tokens=128)
        return dataclasses.replace(super().data_spec(), packing=packing)

    def rows(self, batch: dict[str, Array]) -> dict[str, Array]:
        """Sentence rows with their windows (:meth:`WindowContextModel.rows`), or packed rows
        as they are with their context rows (:func:`~.window.packed_window_rows`)."""
        if is_packed(batch):
            return packed_window_rows(batch)
        return super().rows(batch)

    def window_attention_path(self) -> tuple[str, ...]:
        """The last encoder layer's context attention (Eq. 12)."""
        return (f"encoder_layers_{self.config.num_encoder_layers - 1}", "context_attention")

    def sentence_attention(self, params: Any, batch: dict[str, Array]) -> Array:
        """Sentence-to-sentence attention ``[B, S, S]`` (Zheng et al. 2020, Fig. 4) of the last
        encoder layer's context attention (Eq. 12) over the ``k`` previous sentences' context
        states (:meth:`WindowContextModel.sentence_attention`). Without
        ``context_in_encoder`` (Table 8's decoder-only row) it raises :class:`ModelError`."""
        if not self.config.context_in_encoder:
            raise ModelError(
                f"model {self.name!r} with context_in_encoder=False has no encoder context "
                "attention: no sentence-to-sentence attention (Fig. 4)"
            )
        return super().sentence_attention(params, batch)

    def translate(
        self, params: Any, batch: dict[str, Array], search: SearchConfig
    ) -> tuple[Array, dict[str, Array]]:
        """Beam search of every sentence of the chunks at once, each with its context (the
        context and encoder run once): ids ``[B, S, L]``, padding sentences PAD."""
        module, variables = self.eval_module, {"params": params}
        rows = self.rows(batch)
        encoded, states = module.apply(
            variables,
            rows["src"],
            rows["src_mask"],
            rows["context"],
            rows["context_mask"],
            method=module.encode,
        )
        extra = module.apply(
            variables,
            encoded,
            rows["src_mask"],
            states,
            rows["context_mask"],
            method=module.decode_inputs,
        )
        max_len, limits = sentence_limits(rows["src_mask"], search)
        result = search_decoder(module, variables, extra, search, max_len, limits)
        ids, aux = sentence_outputs(result, batch["src"].shape[:2], search)
        return pad_empty_sentences(ids, batch["src_mask"]), aux
