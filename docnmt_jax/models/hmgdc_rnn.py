"""HM-GDC (Tan et al. 2019) in the encoder of RNNSearch: Table 1's first group, on the blocks
of :mod:`.rnn_layers` and the sentence model of :mod:`.rnnsearch` (parameters of ``theta_s``
named as there).

``rnnsearch_hmgdc`` (document model, layout ``CHUNKS``: the context is source-only, so every
sentence of a chunk is searched at once). HM-GDC "into the encoder of the RNNSearch model
using the same method in Section 2.2" (Sec. 3.2); the decoder is RNNSearch's, attending over
``h_ctx``:

* Global context = the whole document: with ``document_scope`` (default) the pipeline's
  chunks are whole documents (:attr:`RNNSearchHMGDCModel.whole_documents`, as
  :mod:`.hmgdc`); ``document_scope = False`` cuts it to chunks of ``data.max_sentences``.
* SentEnc (Eq. 1): RNNSearch's bi-GRU encoder over each sentence alone: ``H_i``.
* Sentence summary (Eq. 2-3, as printed): one multi-head self-attention over ``H_i`` (its
  padding masked; no residual, FFN or LayerNorm), then the *sum* over the sentence's real
  words: ``h~_{S_i} [d_model]``.
* DocEnc (Eq. 4): ``num_document_layers`` bi-GRU layers over the chunk's summaries in order,
  padding sentences masked like padding words: ``H_S [S, d_model]``; dropout between its
  layers as in SentEnc, none on the summaries. Sharing (Sec. 2.3, "we
  share the parameters in the hidden layers of Bi-RNNs in the sentence and document
  encoders"): with ``share_encoder`` document layer ``l`` *is* encoder layer ``l`` (one copy
  of the arrays, gradients summed) for ``l < num_layers``; deeper document layers get their
  own cells (``document_layers_l``). Without it every document layer has its own cells.
  Sharing layer 0 needs ``embed_dim == d_model`` (its input kernel reads embeddings in SentEnc
  and summaries in DocEnc; the paper's 500/500).
* Context attention (Eq. 5-6, the workable reading of ``MultiHead-Ctx(h_ij, h_ij, H_Si)``):
  each word state ``h_{i,j}`` is the query, keys and values are ``H_S`` of *all* sentences of
  the chunk (padding sentences masked), multi-head (``num_heads``; 8 does not divide 500).
* Eq. 7: ``h_ctx = h + Dropout(d_ctx, context_dropout_rate = P = 0.1)``, no LayerNorm.
* The decoder's initial state comes from SentEnc's final states (the sentence's own), its
  attention reads ``h_ctx``. A chunk without real sentences attends uniformly over masked
  keys (finite, no NaN); a one-sentence chunk's context is its own sentence.
* Two-step training (Sec. 2.3): ``theta_s`` are the parameters named as in ``rnnsearch``
  (identical paths), ``theta_d`` are :data:`DOCUMENT_PARAMETERS`;
  :meth:`RNNSearchHMGDCModel.transformer_rules` maps an ``rnnsearch`` checkpoint onto
  ``theta_s`` (``init_from_rules = "all"``) and leaves ``theta_d`` fresh. With sharing, the
  DocEnc layers start from the pretrained encoder layers they are.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from docnmt_jax import flops
from docnmt_jax.data.spec import DataSpec
from docnmt_jax.data.tokenizer import BOS_ID
from docnmt_jax.decoding.search import (
    SearchConfig,
    pad_empty_sentences,
    search_decoder,
    sentence_limits,
    sentence_outputs,
)
from docnmt_jax.models import layers
from docnmt_jax.models.base import (
    BaseModel,
    BatchLayout,
    captured_attention,
    register,
    require_grid,
)
from docnmt_jax.models.hmgdc import document_state_attention
from docnmt_jax.models.rnn_layers import BiGRU
from docnmt_jax.models.rnnsearch import (
    SOURCE_PARAMETERS,
    RNNSearch,
    RNNSearchConfig,
    rnnsearch_terms,
)

Array = jax.Array
Weights = dict[str, Any]

#: ``theta_d``: the parameters HM-GDC adds to RNNSearch.
DOCUMENT_PARAMETERS = r"sentence_attention/.*|context_attention/.*|document_layers_\d+/.*"


@dataclasses.dataclass(frozen=True)
class RNNSearchHMGDCConfig(RNNSearchConfig):
    """RNNSearch plus HM-GDC in the encoder: heads of the self- and context attention
    (Eq. 2, 5), DocEnc depth (Eq. 4), SentEnc/DocEnc sharing (Sec. 2.3), Eq. 7's ``P``."""

    num_heads: int = 4
    num_document_layers: int = 2
    share_encoder: bool = True
    context_dropout_rate: float = 0.1
    attention_dropout_rate: float = 0.0
    document_scope: bool = True  # chunks are whole documents (as hmgdc.py); False: the chunk

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_document_layers < 1:
            raise ValueError(f"num_document_layers must be >= 1: {self.num_document_layers}")
        if self.d_model % self.num_heads:
            raise ValueError(f"d_model {self.d_model} is not divisible by {self.num_heads} heads")
        if self.share_encoder and self.embed_dim != self.d_model:
            raise ValueError(
                f"share_encoder needs embed_dim == d_model (document layer 0 is encoder layer 0, "
                f"whose input kernel reads embeddings): {self.embed_dim} != {self.d_model}"
            )


class RNNSearchHMGDC(RNNSearch):
    """RNNSearch with HM-GDC in the encoder over chunks: ``src [B, S, Ts]`` -> logits
    ``[B, S, Tt, V]``. RNNSearch's parameter names for ``theta_s``."""

    config: RNNSearchHMGDCConfig

    def setup(self) -> None:
        super().setup()
        cfg = self.config

        def attention() -> layers.MultiHeadAttention:
            return layers.MultiHeadAttention(
                cfg.num_heads, cfg.d_model, cfg.attention_dropout_rate, cfg.deterministic, cfg.dtype
            )

        self.sentence_attention = attention()
        self.context_attention = attention()
        first = cfg.num_layers if cfg.share_encoder else 0
        self.document_layers = {
            i: BiGRU(cfg.d_model, cfg) for i in range(first, cfg.num_document_layers)
        }
        self.context_dropout = nn.Dropout(cfg.context_dropout_rate)

    def document_stack(self) -> list[BiGRU]:
        """DocEnc's layers: encoder layer ``l`` itself where shared, else its own cells."""
        cfg = self.config
        return [
            self.encoder_layers[i]
            if cfg.share_encoder and i < cfg.num_layers
            else self.document_layers[i]
            for i in range(cfg.num_document_layers)
        ]

    def encode(self, src: Array, src_mask: Array) -> tuple[Array, Array]:  # type: ignore[override]
        """(``h_ctx [B*S, Ts, D]`` (Eq. 7), SentEnc's final states ``[B*S, L, D]``) of chunks
        ``src [B, S, Ts]``."""
        B, S, T = src.shape
        D = self.config.d_model
        mask = src_mask.reshape(B * S, T)
        states, finals = super().encode(src.reshape(B * S, T), mask)  # Eq. 1
        h_s = self.sentence_attention(states, states, layers.padding_mask(mask, mask))  # Eq. 2
        summary = jnp.sum(jnp.where((mask > 0)[..., None], h_s, 0.0), axis=1)  # Eq. 3
        sentences = jnp.any(src_mask > 0, axis=-1)  # [B, S]
        doc, _ = self.encode_stack(
            self.document_stack(), summary.reshape(B, S, D).astype(states.dtype), sentences
        )  # Eq. 4: H_S [B, S, D]
        d_ctx = self.context_attention(
            states.reshape(B, S * T, D), doc, sentences[:, None, None, :]
        )  # Eq. 5-6
        d_ctx = self.context_dropout(d_ctx, deterministic=self.config.deterministic)
        return states + d_ctx.reshape(B * S, T, D), finals  # Eq. 7

    def __call__(self, src: Array, src_mask: Array, tgt: Array, tgt_mask: Array) -> Array:
        """Logits ``[B, S, Tt, V]`` for every sentence of the chunks."""
        B, S, T = tgt.shape
        encoded = self.encode(src, src_mask)
        flat = lambda x: x.reshape(B * S, x.shape[-1])  # noqa: E731
        tgt_in = layers.shift_right(flat(tgt), BOS_ID)
        logits = self.decode(encoded, flat(src_mask), tgt_in, flat(tgt_mask))
        return logits.reshape(B, S, T, -1)


def rnnsearch_hmgdc_terms(config: RNNSearchHMGDCConfig, shape: flops.BatchShape) -> flops.Terms:
    """Forward FLOPs of RNNSearch with HM-GDC in the encoder (Tan et al. 2019): RNNSearch
    (:func:`~docnmt_jax.models.rnnsearch.rnnsearch_terms`) plus, per chunk (``B`` chunks of
    ``S`` sentences, ``L = S·Ts`` words)::

      sentence attn    projections  N · 4 · 2·Ts·D²          Eq. 2: Q, K, V, output
                       attention    N · 2 · 2·Ts²·D
      document layer   as an encoder layer on B rows of S summaries (inputs D), Eq. 4
      context attn     projections  B · (2 · 2·L·D² + 2 · 2·S·D²)  Q, out on words; K, V on H_S
                       attention    B · 2 · 2·L·S·D          Eq. 5-6

    Shared SentEnc/DocEnc cells cost their FLOPs in both uses.
    """
    D, B, S, Ts = config.d_model, shape.chunks, shape.sentences, shape.src_len
    N, L = shape.rows, shape.sentences * shape.src_len
    total = rnnsearch_terms(config, shape)
    sentence = {
        "projections": N * 4 * 2 * Ts * D * D,
        "attention": N * 2 * 2 * Ts * Ts * D,
    }
    flops.add_terms(total, "sentence", sentence)
    flops.add_terms(total, "document", flops.bi_gru(B, S, D, D), config.num_document_layers)
    context = {
        "projections": B * (2 * 2 * L * D * D + 2 * 2 * S * D * D),
        "attention": B * 2 * 2 * L * S * D,
    }
    flops.add_terms(total, "context", context)
    return total


@register("rnnsearch_hmgdc", config=RNNSearchHMGDCConfig, flops=rnnsearch_hmgdc_terms)
class RNNSearchHMGDCModel(BaseModel):
    """RNNSearch + HM-GDC: chunks in, every sentence translated with the chunk's global
    context, all sentences of a chunk at once. ``with_random_context``: the base class's
    rotation of sentence slots across rows (:func:`~.context_rotation.random_context_batch`)."""

    module_class = RNNSearchHMGDC
    layout = BatchLayout.CHUNKS
    source_parameters = SOURCE_PARAMETERS

    def data_spec(self) -> DataSpec:
        """Whole documents with ``document_scope`` (global context, as
        :class:`~.hmgdc.HMGDCModel`), else chunks; the grid only."""
        context = "document" if self.config.document_scope else "chunk"
        return DataSpec(rows=self.layout.value, context=context)

    def rows(self, batch: dict[str, Array]) -> dict[str, Array]:
        require_grid(batch, "RNNSearch HM-GDC")
        return super().rows(batch)

    def transformer_rules(self) -> list[tuple[str, str]]:
        """From an ``rnnsearch`` checkpoint (the sentence model of the two-step training):
        ``theta_s`` from identical paths, ``theta_d`` fresh."""
        return [(DOCUMENT_PARAMETERS, "skip"), (r"(.*)", r"\1")]

    def sentence_attention(self, params: Any, batch: dict[str, Array]) -> Array:
        """Sentence-to-sentence attention ``[B, S, S]`` (Zheng et al. 2020, Fig. 4) of Eq.
        5-6's attention of every word over the document states ``H_S``
        (:func:`~.hmgdc.document_state_attention`, as :class:`~.hmgdc.HMGDCModel`)."""
        rows = self.rows(batch)
        module = self.eval_module
        _, weights = captured_attention(
            lambda: module.apply(
                {"params": params}, rows["src"], rows["src_mask"], method=module.encode
            ),
            ("context_attention",),
        )
        return document_state_attention(weights, batch["src_mask"])

    def translate(
        self, params: Any, batch: dict[str, Array], search: SearchConfig
    ) -> tuple[Array, dict[str, Array]]:
        """Beam search of every sentence of the chunks at once, each attending over its
        ``h_ctx`` (the encoder runs once): ids ``[B, S, L]``, padding sentences PAD."""
        module, variables = self.eval_module, {"params": params}
        rows = self.rows(batch)
        encoded = module.apply(variables, rows["src"], rows["src_mask"], method=module.encode)
        src_mask = rows["src_mask"].reshape(-1, rows["src_mask"].shape[-1])
        extra = module.apply(variables, encoded, src_mask, method=module.decode_inputs)
        max_len, limits = sentence_limits(src_mask, search)
        result = search_decoder(module, variables, extra, search, max_len, limits)
        ids, aux = sentence_outputs(result, batch["src"].shape[:2], search)
        return pad_empty_sentences(ids, batch["src_mask"]), aux
