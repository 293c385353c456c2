"""The larger-context Transformer of Jean & Cho (2019), Appendix A (and Sec. 5, "Models").

Paper -> code (``../shared/papers/004_*``; the paper's contribution is the context-aware
regulariser, :mod:`docnmt_jax.objectives`; this is its model). Readings of what the text leaves
open, each tested in ``tests/test_jean_cho.py``:

* ``c = TransformerEnc(C)``, ``x = TransformerEnc(X)``: one shared encoder (the sentence
  Transformer's ``encoder_layers``, embedding, input dropout and, pre-LN, ``encoder_norm``)
  encodes the current sentence and, independently, its context. The context ``C`` is the
  ``context_sentences`` (``k``, default 1 as in the paper) source sentences before ``X`` in
  its document, concatenated (each with its EOS) into one sequence whose sinusoidal positions
  run over its real tokens ``0..M-1`` (for ``k = 1`` exactly the previous sentence encoded on
  its own). The windows come from the pipeline's ``context_src`` as for DocT
  (:func:`~.window.context_windows`); they never cross a document boundary.
* ``x_hat_c = Attn(q = x; k, v = c)``: one multi-head attention (``context_attention``), its
  raw output (no residual, no LayerNorm: the gate mixes it with ``x``).
* ``g = Linear([x; x_hat_c])``: a ``2D -> D`` affine map with bias (``context_gate``), one
  gate value per feature. The printed gate is unbounded (``gate = "linear"``); the footnote
  suggests a sigmoid, which is the default (``gate = "sigmoid"``: ``g = sigmoid(Linear(...))``).
  The gate reads ``x_hat_c`` before dropout.
* ``x_c = FF(g * Dropout(x_hat_c) + (1 - g) * x)``: "a feed-forward module (FF) used in typical
  transformer layers" is read as the Transformer's whole FFN sublayer with its residual and
  LayerNorm (``context_ffn``, ``context_ffn_block``): post-LN ``x_c = LN(h + Dropout(FFN(h)))``
  for the mixture ``h``; pre-LN ``x_c = LN_out(h + Dropout(FFN(LN(h))))`` (``context_norm``,
  so the decoder reads normalised states as from the pre-LN encoder).
* ``p(y_t | y_<t, X, C) = TransformerDec(y_<t, x_c)``: the sentence Transformer's decoder,
  cross-attending to ``x_c``; source, target and output embeddings shared (one matrix).
* Empty context (a document's first sentence; not specified by the paper): the context is
  all padding and masked; attention over an empty key set is defined as zero,
  ``x_hat_c = 0``, so ``x_c = FF((1 - g) * x)`` with ``g = Linear([x; 0])``: the same
  parameters on every sentence, and the first sentence depends on ``X`` only.
* Layout: rows of whole chunks (``CHUNKS``) or, with ``sentence_rows``, of single sentences
  each with its window (``SENTENCES``, DocT's option; less padding on real documents): the
  same model, outputs and loss (tested).
* Decoding: every sentence of a chunk is searched at once; ``x_c`` is
  computed once per sentence and the decoder is the Transformer's (its ``decode_inputs`` /
  ``decode_step`` over ``x_c``), so the shared beam search needs nothing new.
* Sentence-to-sentence attention (Zheng et al. 2020's Fig. 4, :meth:`JeanChoModel.
  sentence_attention`): the weights of ``Attn`` per context sentence; the matrix covers the
  window only.
* Pretraining: every parameter named as in the sentence Transformer (embedding, encoder,
  decoder) is filled from a Transformer checkpoint (:meth:`JeanChoModel.transformer_rules`);
  :data:`CONTEXT_PARAMETERS` (attention, gate, FF) start fresh.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from docnmt_jax import flops
from docnmt_jax.data.tokenizer import BOS_ID
from docnmt_jax.decoding.search import (
    SearchConfig,
    pad_empty_sentences,
    search_decoder,
    sentence_limits,
    sentence_outputs,
)
from docnmt_jax.models import layers, transformer
from docnmt_jax.models.base import register
from docnmt_jax.models.transformer import TransformerConfig
from docnmt_jax.models.window import WindowContextModel

Array = jax.Array

#: The parameters this model adds to the sentence Transformer (Appendix A's Attn, Linear, FF).
CONTEXT_PARAMETERS = r"context_.*"
GATES = ("sigmoid", "linear")


@dataclasses.dataclass(frozen=True)
class JeanChoConfig(TransformerConfig):
    """Transformer hyper-parameters plus the context length ``k`` (previous source sentences,
    1 in the paper) and the gate: ``"sigmoid"`` (footnote 1, default) or ``"linear"``
    (unbounded, as printed in Appendix A). ``sentence_rows``: batch rows are single sentences,
    each with its ``k`` predecessors from the pipeline's context window (DocT's option: less
    padding than chunks of 20 on real documents), instead of whole chunks; the same model and
    outputs either way."""

    context_sentences: int = 1
    gate: str = "sigmoid"
    sentence_rows: bool = False

    def __post_init__(self) -> None:
        if self.context_sentences < 1:
            raise ValueError(f"context_sentences must be >= 1: {self.context_sentences}")
        if self.gate not in GATES:
            raise ValueError(f"gate must be one of {GATES}: {self.gate!r}")


class JeanCho(transformer.Transformer):
    """Sentence rows ``src [N, Ts]`` with each row's context ``[N, Lc]`` -> logits
    ``[N, Tt, V]``; the sentence Transformer's parameter names plus ``context_*``."""

    config: JeanChoConfig

    def setup(self) -> None:
        super().setup()
        cfg = self.config
        self.context_attention = cfg.attention("context_attention")
        self.context_gate = nn.Dense(
            cfg.d_model,
            dtype=cfg.dtype,
            kernel_init=layers.partitioned(nn.initializers.xavier_uniform(), ("mlp", "embed")),
            bias_init=layers.partitioned(nn.initializers.zeros_init(), ("embed",)),
            name="context_gate",
        )
        self.context_dropout = nn.Dropout(cfg.dropout_rate)
        self.context_ffn = cfg.feed_forward("context_ffn")
        self.context_ffn_block = cfg.sublayer("context_ffn_block")
        if cfg.pre_ln:
            self.context_norm = layers.layer_norm(cfg.dtype)

    def shared_encoder(self, ids: Array, mask: Array) -> Array:
        """``TransformerEnc`` of rows ``ids [N, L]`` whose real tokens (``mask``) may be
        interleaved with padding: positions count the real tokens."""
        positions = jnp.maximum(jnp.cumsum(mask > 0, axis=-1) - 1, 0)
        x = self._embed(ids, positions)
        attention_mask = layers.padding_mask(mask, mask)
        for layer in self.encoder_layers:
            x = layer(x, attention_mask)
        return self.encoder_norm(x) if self.config.pre_ln else x

    def encode(  # type: ignore[override]
        self, src: Array, src_mask: Array, context: Array, context_mask: Array
    ) -> Array:
        """``x_c [N, Ts, D]`` (Appendix A) of sentences ``src [N, Ts]`` and their contexts
        ``[N, Lc]`` (all padding: no context, ``x_hat_c = 0``)."""
        cfg = self.config
        x = self.shared_encoder(src, src_mask)
        c = self.shared_encoder(context, context_mask)
        present = jnp.any(context_mask > 0, axis=-1)[:, None, None]
        x_hat = self.context_attention(x, c, layers.padding_mask(src_mask, context_mask))
        x_hat = jnp.where(present, x_hat, 0.0).astype(x.dtype)
        g = self.context_gate(jnp.concatenate([x, x_hat], axis=-1))
        if cfg.gate == "sigmoid":
            g = jax.nn.sigmoid(g)
        self.sow("intermediates", "gate_values", g)  # experiments/gate_stats.py reads these three
        self.sow("intermediates", "source_states", x)
        self.sow("intermediates", "context_states", x_hat)
        h = g * self.context_dropout(x_hat, deterministic=cfg.deterministic) + (1.0 - g) * x
        x_c = self.context_ffn_block(h, self.context_ffn)
        x_c = self.context_norm(x_c) if cfg.pre_ln else x_c
        return layers.constrain(x_c, ("batch", "length", "embed"))

    def __call__(  # type: ignore[override]
        self,
        src: Array,
        src_mask: Array,
        tgt: Array,
        tgt_mask: Array,
        context: Array,
        context_mask: Array,
    ) -> Array:
        """Logits ``[N, Tt, V]`` for targets ``tgt`` (not shifted; EOS-terminated): the
        Transformer's decoder over ``x_c``."""
        x_c = self.encode(src, src_mask, context, context_mask)
        return self.decode(x_c, src_mask, layers.shift_right(tgt, BOS_ID), tgt_mask)


def jean_cho_terms(config: JeanChoConfig, shape: flops.BatchShape) -> flops.Terms:
    """Forward FLOPs: the sentence Transformer, the shared encoder again over every row's
    context of ``Lc = k·Ts`` slots, the context attention (``Ts`` queries), the gate
    ``2·Ts·2D·D`` and the FF ``2·2·Ts·D·F`` per row."""
    D, F, N, Ts = config.d_model, config.ffn_dim, shape.rows, shape.src_len
    Lc = config.context_sentences * Ts
    total = transformer.transformer_terms(config, shape)
    for name, count in flops.encoder_layer(N, Lc, D, F).items():
        total[f"context.{name}"] = config.num_encoder_layers * count
    fusion = flops.context_attention(N, Ts, Lc, D, gating=False)
    fusion |= {"context_gate": N * 2 * Ts * 2 * D * D, "context_ffn": N * 2 * 2 * Ts * D * F}
    return total | {f"fusion.{name}": count for name, count in fusion.items()}


@register("jean_cho", config=JeanChoConfig, flops=jean_cho_terms)
class JeanChoModel(WindowContextModel):
    """Jean & Cho's larger-context Transformer behind the model interface: chunks in, every
    sentence translated with its ``k`` preceding source sentences, all sentences at once.
    Random contexts rotate the chunk and its ``context_src`` together (Sec. 4.3, 5), as
    DocT's (the same context windows)."""

    module_class = JeanCho
    label = "the jean_cho model"
    context_parameters = CONTEXT_PARAMETERS  # Appendix A's Attn, Linear, FF start fresh

    def window_attention_path(self) -> tuple[str, ...]:
        """``x_hat_c = Attn(q = x; k, v = c)`` over the ``k`` previous sentences."""
        return ("context_attention",)

    def translate(
        self, params: Any, batch: dict[str, Array], search: SearchConfig
    ) -> tuple[Array, dict[str, Array]]:
        """Beam search of every sentence of the chunks at once; ``x_c`` computed once per
        sentence: ids ``[B, S, L]``, padding sentences PAD."""
        module, variables = self.eval_module, {"params": params}
        rows = self.rows(batch)
        x_c = module.apply(
            variables,
            rows["src"],
            rows["src_mask"],
            rows["context"],
            rows["context_mask"],
            method=module.encode,
        )
        extra = module.apply(variables, x_c, rows["src_mask"], method=module.decode_inputs)
        max_len, limits = sentence_limits(rows["src_mask"], search)
        result = search_decoder(module, variables, extra, search, max_len, limits)
        ids, aux = sentence_outputs(result, batch["src"].shape[:2], search)
        return pad_empty_sentences(ids, batch["src_mask"]), aux
