"""HM-GDC: hierarchical modeling of global document context, Tan et al. (2019), Sec. 2.

No public implementation exists; every reading below follows the equations and is tested in
``tests/test_hmgdc.py`` (naive per-document reference, sharing, scope, search).

* Sentence encoder (Eq. 1): the Transformer encoder over every sentence alone, ``H_i``
  (parameter names of the sentence Transformer, so pretraining fills them).
* Sentence summary (Eq. 2-3): one multi-head self-attention over ``H_i`` as printed --
  ``MultiHead-Self(H_i, H_i, H_i)``, attention only (own projections, no residual,
  LayerNorm or FFN) -- then ``h~_{S_i}`` = the SUM of its outputs over the sentence's real
  words (padding excluded).
* Document encoder (Eq. 4): ``N_d`` (``num_document_layers``) Transformer encoder layers
  ("the same as the sentence-level encoding": self-attention and FFN, residual and
  LayerNorm) over the summaries of the document's sentences, padding sentences masked. No
  sentence-order positions (the paper adds none; Eq. 5's queries carry no sentence index
  either, so the global context is a set of sentences). Sharing (Sec. 2.3, after Voita et
  al.): document layer ``l`` uses the self-attention module of sentence-encoder layer ``l``
  (one set of arrays, gradients of both uses summed); document layers beyond the sentence
  encoder's depth have their own; FFN and LayerNorms are always the document layer's own.
  ``share_self_attention = False`` gives every document layer its own self-attention.
* Back-propagation of global context (Eq. 5-6), the workable reading of the printed
  ``MultiHead-Ctx(h_ij, h_ij, H_{S_i})``: query ``h_{i,j}``, keys and values the document
  encoder's outputs ``H_S`` of ALL sentences of the document (the sentence itself included,
  padding sentences masked); Eq. 7: ``h_ctx = h + ResidualDrop(d_ctx, P)``, dropout ``P =
  context_dropout_rate`` (0.1) on ``d_ctx``, no LayerNorm.
* Decoder (Eq. 8-10): every decoder layer adds a DocEnc-Decoder attention whose keys and
  values come from the document encoder's output: ``C = H_S`` (the text: "keys and values ...
  come from the output of the document encoder"; Eq. 8's ``h_ctx_i``, "the integrated
  representation of the i-th sentence", read as the sentence vector of the document
  encoder) and ``C^(n) = C`` in every layer ``n`` (each layer projects it with its own
  keys/values, as the encoder output of the encoder-decoder attention). Eq. 10 ``H = E + G``
  sits inside the encoder-decoder attention sublayer: ``LN(T + Dropout(E + G))`` post-LN,
  ``T + Dropout(E(LN T) + G(LN T))`` pre-LN; the FFN sublayer follows.
* Integration switches (Table 2): ``context_in_encoder`` (Eq. 7; off: the decoder's
  encoder-decoder attention reads the plain ``H``) and ``context_in_decoder`` (Eq. 8-10; off:
  the Transformer decoder). The "decoder only" row thus feeds the decoder ``H`` and ``H_S``.
* Global scope ("once for all"): with ``document_scope`` the pipeline's chunks are whole
  documents, however long (:attr:`HMGDCModel.whole_documents`, ``PipelineConfig.
  whole_documents``): the summaries, the document encoder and every gradient see the whole
  document. ``document_scope = False`` restricts the context to the pipeline chunk
  (``data.max_sentences``), the chunk-only scope measured against it in docs/log.
* Training layout (real documents): sentences packed into rows of 128 slots, every document
  whole within its batch (``PackingConfig(unit="grouped")``,
  :class:`~docnmt_jax.data.grouped_plan.GroupedPackedPlan`); the per-sentence parts (Eq. 1-2,
  the decoder) attend within their segment, Eq. 3 sums each sentence into one of
  ``packed_row_sentences`` slots of its row, and the document encoder, Eq. 5-6 and the
  DocEnc-Decoder attention run over the batch's slots masked by document number, so the
  loss and gradients are the grid's (``tests/test_hmgdc_packed.py``). The ``[B, S, T]`` grid
  (one document a row) stays the layout of decoding and ``score``.
* Sentence-to-sentence attention (Zheng et al. 2020's Fig. 4, :meth:`HMGDCModel.
  sentence_attention`): Eq. 5-6's attention of every word over the document states, one key
  per sentence, averaged over the sentence's words and the heads.
* Decoding: the context is source-only, so all sentences of a document are searched at once;
  the document states are encoded once and each decoder layer's DocEnc-Decoder keys/values
  are projected once per document and shared by its sentences and beams.
* Two-step training (Sec. 2.3, Eq. 11-12; Table 4): ``theta_s`` are the parameters named as
  in the sentence Transformer (:meth:`HMGDCModel.transformer_rules` restores them from a
  sentence Transformer trained on sentence pairs; ``theta_d`` = :data:`DOCUMENT_PARAMETERS`
  start fresh) and every parameter is then finetuned (``configs/hmgdc.py:finetune``).
"""

from __future__ import annotations

import dataclasses
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
from docnmt_jax.models.base import (
    BaseModel,
    BatchLayout,
    Metric,
    ModelError,
    captured_attention,
    register,
    require_context_somewhere,
    require_grid,
    sentence_pair_attention,
)
from docnmt_jax.models.transformer import Cache, TransformerConfig, packed_rows

Array = jax.Array

#: Decoding inputs of a DocEnc-Decoder attention with its projections folded into the document
#: states (:meth:`~docnmt_jax.models.layers.MultiHeadAttention.fold_memory`).
FOLDED = ("document_folded_key", "document_key_bias", "document_folded_value")

#: ``theta_d``: the parameters HM-GDC adds to the sentence Transformer.
DOCUMENT_PARAMETERS = (
    r"summary_attention/.*|document_layers_\d+/.*|document_norm/.*|context_attention/.*"
    r"|decoder_layers_\d+/document_attention/.*"
)


@dataclasses.dataclass(frozen=True)
class HMGDCConfig(TransformerConfig):
    """Transformer hyper-parameters plus HM-GDC's: ``N_d`` (Table 2), where the global context
    is integrated (Table 2), shared or separate self-attention (Sec. 2.3), Eq. 7's residual
    dropout ``P``, the scope of the context (the whole document, or the pipeline chunk) and
    the sentence slots of a packed training row (``packed_row_sentences``)."""

    num_document_layers: int = 1
    context_in_encoder: bool = True
    context_in_decoder: bool = True
    share_self_attention: bool = True
    context_dropout_rate: float = 0.1
    document_scope: bool = True
    packed_row_sentences: int = 16

    def __post_init__(self) -> None:
        if self.num_document_layers < 1:
            raise ValueError(f"num_document_layers must be >= 1: {self.num_document_layers}")
        if self.packed_row_sentences < 1:
            raise ValueError(f"packed_row_sentences must be >= 1: {self.packed_row_sentences}")
        require_context_somewhere(self.context_in_encoder, self.context_in_decoder)


class GlobalContextDecoderLayer(transformer.DecoderLayer):
    """Decoder layer of Fig. 3: self-attention (``T``), then ``E + G`` (Eq. 10) of the
    encoder-decoder attention ``E`` and the DocEnc-Decoder attention ``G`` over the document
    states (Eq. 9) in one residual sublayer, then the FFN."""

    config: HMGDCConfig

    def setup(self) -> None:
        super().setup()
        if self.config.context_in_decoder:
            self.document_attention = self.config.attention("document_attention")

    def __call__(  # type: ignore[override]
        self,
        y: Array,
        self_mask: Array,
        encoded: Array | None,
        cross_mask: Array,
        document: Array | None,
        document_mask: Array,
        cache: Cache | None = None,
        index: Array | None = None,
        cross_kv: tuple[Array, Array] | None = None,
        document_kv: tuple[Array, Array] | None = None,
        document_folded: tuple[Array, Array, Array] | None = None,
    ) -> tuple[Array, Cache | None]:
        y, new_cache = self.self_attention_sublayer(y, self_mask, cache, index)

        def encoder_and_document(h: Array) -> Array:
            e = transformer.memory_attention(self.cross_attention, h, encoded, cross_mask, cross_kv)
            if not self.config.context_in_decoder:
                return e
            if document_folded is not None:  # decoding: projections folded into H_S
                g = self.document_attention.attend_folded(h, document_folded, document_mask)
            elif document_kv is None:
                g = transformer.memory_attention(
                    self.document_attention, h, document, document_mask, None
                )
            else:  # [B, S, H, d]: the rows' documents, each read by its G query rows
                q = self.document_attention.project_q(h)
                g = self.document_attention.attend(q, *document_kv, document_mask)
            return e + g

        y = self.cross_attention_block(y, encoder_and_document)
        y = self.ffn_block(y, self.ffn)
        return layers.constrain(y, ("batch", "length", "embed")), new_cache

    def document_kv(self, document: Array) -> tuple[Array, Array]:
        """DocEnc-Decoder keys/values ``[B, S, H, d]`` of the document states (sentence-major:
        decoding stores them one row per sentence and reads them back with a reshape)."""
        return self.document_attention.project_kv(document)


class HMGDC(transformer.Transformer):
    """HM-GDC over document grids: ``src [B, S, T]`` (one document, or one chunk with the
    chunk scope, per row) -> logits ``[B*S, Tt, V]`` (one row per sentence)."""

    config: HMGDCConfig
    decoder_layer_class: ClassVar[type[nn.Module]] = GlobalContextDecoderLayer

    def setup(self) -> None:
        super().setup()
        cfg = self.config
        self.summary_attention = cfg.attention("summary_attention")
        shared = cfg.num_encoder_layers if cfg.share_self_attention else 0
        self.document_layers = [
            transformer.EncoderLayer(cfg, own_attention=layer >= shared)
            for layer in range(cfg.num_document_layers)
        ]
        if cfg.pre_ln:
            self.document_norm = layers.layer_norm(cfg.dtype)
        self.context_attention = cfg.attention("context_attention")
        self.context_dropout = nn.Dropout(cfg.context_dropout_rate)

    def summarize(self, words: Array, word_mask: Array) -> Array:
        """``h~_{S_i}`` (Eq. 2-3) of sentence rows ``words [N, T, D]``: self-attention over
        the sentence, summed over its real words -> ``[N, D]``."""
        attended = self.summary_attention(words, words, layers.padding_mask(word_mask, word_mask))
        return jnp.sum(attended * (word_mask > 0)[..., None].astype(attended.dtype), axis=1)

    def encode_document(self, summaries: Array, mask: Array) -> Array:
        """``H_S = DocEnc(h~_S)`` (Eq. 4) of ``summaries [B, S, D]`` under the sentence mask
        ``[B, 1, S, S]`` (padding sentences, other documents). Document layer ``l`` shares
        sentence layer ``l``'s self-attention while both exist
        (:class:`~.transformer.EncoderLayer` ``attention``)."""
        x = summaries
        for depth, layer in enumerate(self.document_layers):
            shared = layer.own_attention is False
            x = layer(x, mask, self.encoder_layers[depth].self_attention if shared else None)
        return self.document_norm(x) if self.config.pre_ln else x

    def encode(  # type: ignore[override]
        self, src: Array, src_mask: Array
    ) -> tuple[Array, Array, Array]:
        """(word states ``[B*S, T, D]``: ``h_ctx`` of Eq. 7, or ``H`` without encoder
        integration; document states ``H_S [B, S, D]``; sentence presence ``[B, S]``)."""
        B, S, T = src.shape
        mask = src_mask.reshape(B * S, T)
        words = super().encode(src.reshape(B * S, T), mask)  # H_i, Eq. 1
        present = jnp.any(src_mask > 0, axis=-1)
        states = self.encode_document(
            self.summarize(words, mask).reshape(B, S, -1), layers.padding_mask(present, present)
        )
        if self.config.context_in_encoder:  # Eq. 5-7; S word rows per document row
            d_ctx = self.context_attention(words, states, present[:, None, None, :])
            words = words + self.context_dropout(d_ctx, deterministic=self.config.deterministic)
        return words, states, present

    def decode(  # type: ignore[override]
        self,
        encoded: Array,
        src_mask: Array,
        tgt_in: Array,
        tgt_mask: Array,
        states: Array,
        present: Array,
    ) -> Array:
        """Teacher-forced decoder over sentence rows ``tgt_in [B*S, Tt]`` (shifted right),
        each reading its document's states ``[B, S, D]`` -> logits."""
        positions = jnp.broadcast_to(jnp.arange(tgt_in.shape[-1]), tgt_in.shape)
        self_mask = layers.causal_mask(tgt_in.shape[-1]) & layers.padding_mask(tgt_mask, tgt_mask)
        cross_mask = layers.padding_mask(tgt_mask, src_mask)
        y = self._embed(tgt_in, positions)
        for layer in self.decoder_layers:
            y, _ = layer(y, self_mask, encoded, cross_mask, states, present[:, None, None, :])
        return self._output(y)

    def __call__(  # type: ignore[override]
        self,
        src: Array,
        src_mask: Array,
        tgt: Array,
        tgt_mask: Array,
        segments: transformer.Segments | None = None,
    ) -> Array:
        """Logits ``[B*S, Tt, V]`` for the targets ``tgt [B, S, Tt]`` (EOS-terminated); with
        ``segments``, logits ``[B, L, V]`` of packed rows ``[B, L]`` (:meth:`packed_logits`)."""
        if segments is not None:
            return self.packed_logits(src, tgt, segments)
        encoded, states, present = self.encode(src, src_mask)
        rows = tgt.reshape(-1, tgt.shape[-1])
        tgt_in = layers.shift_right(rows, BOS_ID)
        row_mask = tgt_mask.reshape(rows.shape)
        return self.decode(
            encoded, src_mask.reshape(-1, src.shape[-1]), tgt_in, row_mask, states, present
        )

    # Packed rows (``PackingConfig(unit="grouped")``): sentences of several documents per row,
    # every document whole within the batch; the document side is a table of sentence slots.

    def sentence_table(
        self, attended: Array, segment_ids: Array, chunk_ids: Array
    ) -> tuple[Array, Array]:
        """Eq. 3 on packed rows: the sum of ``attended [B, L, D]`` over each sentence's words,
        in ``K = packed_row_sentences`` slots a row (slot ``k`` = segment ``k + 1``), flattened
        over the batch -> (summaries ``[1, B*K, D]``, document number of each slot ``[1, B*K]``,
        0 = empty slot)."""
        K = self.config.packed_row_sentences
        slots = segment_ids[..., None] == jnp.arange(1, K + 1)  # [B, L, K]; padding: none
        summaries = jnp.einsum("blk,bld->bkd", slots.astype(attended.dtype), attended)
        document = jnp.max(jnp.where(slots, chunk_ids[..., None], 0), axis=1)  # [B, K]
        return summaries.reshape(1, -1, summaries.shape[-1]), document.reshape(1, -1)

    def packed_encode(
        self, src: Array, segments: transformer.Segments
    ) -> tuple[Array, Array, Array]:
        """(word states ``[B, L, D]``, document states ``H_S [1, B*K, D]`` of the batch's
        sentence slots, the slots' document numbers ``[1, B*K]``): Eq. 1-7 as :meth:`encode`,
        every document's sentences gathered across the rows of the batch by its number."""
        src_ids = segments["src_segment_ids"]
        words = super().encode(src, src_ids > 0, segments)  # H_i, Eq. 1
        attended = self.summary_attention(words, words, layers.segment_mask(src_ids, src_ids))
        table, document = self.sentence_table(attended, src_ids, segments["src_chunk_ids"])
        states = self.encode_document(table, layers.segment_mask(document, document))
        if self.config.context_in_encoder:  # Eq. 5-7 over the document's slots
            B, L, D = words.shape
            word_documents = jnp.where(src_ids > 0, segments["src_chunk_ids"], 0).reshape(1, -1)
            mask = layers.segment_mask(word_documents, document)
            d_ctx = self.context_attention(words.reshape(1, B * L, D), states, mask)
            d_ctx = self.context_dropout(d_ctx, deterministic=self.config.deterministic)
            words = words + d_ctx.reshape(B, L, D)
        return words, states, document

    def packed_logits(self, src: Array, tgt: Array, segments: transformer.Segments) -> Array:
        """Teacher-forced logits ``[B, L, V]`` of packed rows: the Transformer's packed decoder
        (segments), each word's DocEnc-Decoder attention over its document's slots."""
        encoded, states, document = self.packed_encode(src, segments)
        tgt_ids, src_ids = segments["tgt_segment_ids"], segments["src_segment_ids"]
        tgt_in = layers.shift_right_segments(tgt, segments["tgt_positions"], BOS_ID)
        self_mask = layers.causal_mask(tgt.shape[-1]) & layers.segment_mask(tgt_ids, tgt_ids)
        cross_mask = layers.segment_mask(tgt_ids, src_ids)
        word_documents = jnp.where(tgt_ids > 0, segments["tgt_chunk_ids"], 0)
        document_mask = layers.segment_mask(
            word_documents, jnp.broadcast_to(document, (tgt.shape[0], document.shape[1]))
        )
        y = self._embed(tgt_in, segments["tgt_positions"])
        for layer in self.decoder_layers:
            document_kv = None
            if self.config.context_in_decoder:  # projected once, shared by the rows
                document_kv = tuple(
                    jnp.broadcast_to(x, (tgt.shape[0],) + x.shape[1:])
                    for x in layer.document_kv(states)
                )
            y, _ = layer(
                y, self_mask, encoded, cross_mask, None, document_mask, document_kv=document_kv
            )
        return self._output(y)

    def decode_inputs(  # type: ignore[override]
        self, encoded: Array, src_mask: Array, states: Array, present: Array
    ) -> dict[str, Any]:
        """Per-sentence-row inputs of :meth:`decode_step`: the Transformer's plus the document
        mask (each row holds its document's ``[S]``) and every layer's DocEnc-Decoder keys and
        values, computed once per document and stored one row per sentence (row ``b*S + s``
        holds key ``s`` of document ``b``, so that every leaf has one row per sentence). When
        ``H * S <= D`` the attention's query and output projections are folded into them
        (:data:`FOLDED`, ``[B*S, H, D]``: each step then costs ``2 H S D`` per row instead of
        ``2 D^2``); else the plain keys and values ``[B*S, H, d]``."""
        extra = super().decode_inputs(encoded, src_mask)
        S = present.shape[1]
        folded = self.config.num_heads * S <= self.config.d_model
        extra["document_mask"] = jnp.repeat(present, S, axis=0).astype(jnp.int32)
        for i, layer in enumerate(self.decoder_layers):
            if self.config.context_in_decoder and folded:
                parts = layer.document_attention.fold_memory(states)
                extra[f"layer_{i}"].update(
                    {
                        name: x.reshape((-1,) + x.shape[2:])
                        for name, x in zip(FOLDED, parts, strict=True)
                    }
                )
            elif self.config.context_in_decoder:
                k, v = (x.reshape((-1,) + x.shape[2:]) for x in layer.document_kv(states))
                extra[f"layer_{i}"].update(document_key=k, document_value=v)
        return extra

    def decode_step(self, cache: Cache, token: Array, extra: dict[str, Any]) -> tuple[Array, Cache]:
        """One step: ``token [N]`` at ``cache['index']`` -> logits ``[N, V]``; the rows of a
        document (its sentences, each with its beams) are contiguous."""
        index = cache["index"]
        max_len = cache["layer_0"]["key"].shape[2]
        y = self._embed(token[:, None], jnp.full(token.shape + (1,), index))
        self_mask = (jnp.arange(max_len) <= index)[None, None, None, :]
        cross_mask = (extra["src_mask"] > 0)[:, None, None, :]
        S = extra["document_mask"].shape[1]
        document_mask = (extra["document_mask"][::S] > 0)[:, None, None, :]  # [B, 1, 1, S]
        new_cache: Cache = {"index": index + 1}
        for i, layer in enumerate(self.decoder_layers):
            inputs = extra[f"layer_{i}"]
            document_kv = document_folded = None
            if FOLDED[0] in inputs:
                document_folded = tuple(
                    inputs[name].reshape((-1, S) + inputs[name].shape[1:]) for name in FOLDED
                )
            elif self.config.context_in_decoder:
                document_kv = tuple(
                    x.reshape((-1, S) + x.shape[1:])
                    for x in (inputs["document_key"], inputs["document_value"])
                )
            y, new_cache[f"layer_{i}"] = layer(
                y,
                self_mask,
                None,
                cross_mask,
                None,
                document_mask,
                cache=cache[f"layer_{i}"],
                index=index,
                cross_kv=(inputs["cross_key"], inputs["cross_value"]),
                document_kv=document_kv,
                document_folded=document_folded,
            )
        return self._output(y)[:, 0], new_cache


def document_state_attention(weights: Array, src_mask: Array) -> Array:
    """Zheng et al. (2020)'s Fig. 4 matrix ``[B, S, S]`` of Eq. 5-6's attention ``weights [B,
    H, S*T, S]`` (every word of a row's ``S`` sentences over the row's ``S`` document states,
    one key per sentence) for sources ``src_mask [B, S, T]``: the mean over sentence ``k``'s
    real words of their weight on state ``kappa``, heads averaged."""
    B, S, T = src_mask.shape
    number = jnp.broadcast_to(jnp.arange(S)[None, :, None], (B, S, T))
    query = jnp.where(src_mask > 0, number, -1).reshape(B, S * T)
    present = jnp.any(src_mask > 0, axis=-1)
    key = jnp.where(present, jnp.arange(S)[None, :], -1)
    return sentence_pair_attention(weights, query, key, S)


def document_attention(documents: int, rows: int, Tq: int, S: int, D: int) -> flops.Terms:
    """FLOPs of the attention of ``rows`` sentence rows (``Tq`` queries each) over their
    document's ``S`` sentence states, keys and values projected once per document."""
    return {
        "document_projections": rows * 2 * 2 * Tq * D * D + documents * 2 * 2 * S * D * D,
        "document_attention": rows * 2 * 2 * Tq * S * D,
    }


def hmgdc_terms(config: HMGDCConfig, shape: flops.BatchShape) -> flops.Terms:
    """Forward FLOPs of HM-GDC: the sentence Transformer plus the summary self-attention (no
    FFN) over every sentence row, ``N_d`` document-encoder layers on ``B`` rows of ``S``
    sentence vectors, the context attention of the source words (Q, out ``2·2·Ts·D²`` and
    attention ``2·2·Ts·S·D`` per row; K, V ``2·2·S·D²`` per document) and the same with
    ``Tt`` queries in every decoder layer (DocEnc-Decoder)."""
    D, F, N = config.d_model, config.ffn_dim, shape.rows
    B, S, Ts, Tt = shape.chunks, shape.sentences, shape.src_len, shape.tgt_len
    total = transformer.transformer_terms(config, shape)
    summary = flops.encoder_layer(N, Ts, D, F)
    del summary["ffn"]
    flops.add_terms(total, "summary", summary)
    document = flops.encoder_layer(B, S, D, F)
    flops.add_terms(total, "document", document, config.num_document_layers)
    if config.context_in_encoder:
        flops.add_terms(total, "context", document_attention(B, N, Ts, S, D))
    if config.context_in_decoder:
        terms = document_attention(B, N, Tt, S, D)
        flops.add_terms(total, "decoder", terms, config.num_decoder_layers)
    return total


@register("hmgdc", config=HMGDCConfig, flops=hmgdc_terms)
class HMGDCModel(BaseModel):
    """HM-GDC behind the model interface: whole documents in (or chunks, with the chunk
    scope), every sentence translated with the global context of its document, all
    sentences at once."""

    module_class = HMGDC
    layout = BatchLayout.CHUNKS

    def data_spec(self) -> DataSpec:
        """Whole documents (with ``document_scope``, else chunks); packed: sentences in rows
        of 128 slots, every document (chunk, with the chunk scope) whole within its batch
        (:class:`~docnmt_jax.data.grouped_plan.GroupedPackedPlan`), at most
        ``packed_row_sentences`` sentences a row."""
        cfg = self.config
        return DataSpec(
            rows=self.layout.value,
            context="document" if cfg.document_scope else "chunk",
            packing=PackingConfig(
                unit="grouped", row_tokens=128, max_row_sentences=cfg.packed_row_sentences
            ),
        )

    def rows(self, batch: dict[str, Array]) -> dict[str, Array]:
        """The grid as it is; packed rows with the sentence segments plus each token's
        document number in the batch (``{src,tgt}_chunk_ids``)."""
        if not is_packed(batch):
            return super().rows(batch)
        rows = packed_rows(batch, unit="segment")
        rows["segments"].update(
            {f"{side}_chunk_ids": batch[f"{side}_chunk_ids"] for side in ("src", "tgt")}
        )
        return rows

    def loss(
        self, params: Any, batch: dict[str, Array], rng: Array | None, train: bool
    ) -> tuple[Array, dict[str, Metric]]:
        """The token loss; ``split_documents`` counts rows that are not a whole document
        (``chunk_index > 0``: the pipeline cut their document, so their context is a chunk)."""
        loss, metrics = super().loss(params, batch, rng, train)
        if "chunk_index" in batch:
            split = jnp.sum(batch["chunk_index"] > 0).astype(jnp.float32)
            metrics["split_documents"] = Metric(split, jnp.ones(()), "sum")
        return loss, metrics

    def transformer_rules(self) -> list[tuple[str, str]]:
        """``theta_s`` from the sentence Transformer's identical paths; ``theta_d`` fresh."""
        return [(DOCUMENT_PARAMETERS, "skip"), (r"(.*)", r"\1")]

    def sentence_attention(self, params: Any, batch: dict[str, Array]) -> Array:
        """Sentence-to-sentence attention ``[B, S, S]`` (Zheng et al. 2020, Fig. 4) of the
        encoder's global-context attention (Eq. 5-6): word ``h_{k,i}`` over the document
        states ``H_S``, one key per sentence, so ``alpha^kappa_k`` is the mean over sentence
        ``k``'s real words of their weight on ``H_{S_kappa}`` (heads averaged). ``H_S`` has
        passed the document encoder, so a state mixes sentences; the matrix covers the row
        (the whole document with ``document_scope``). Rows of real sentences sum to 1.
        Without ``context_in_encoder`` (Table 2's decoder-only rows) it raises
        :class:`ModelError`."""
        require_grid(batch, "sentence_attention")
        if not self.config.context_in_encoder:
            raise ModelError(
                f"model {self.name!r} with context_in_encoder=False has no encoder context "
                "attention: no sentence-to-sentence attention (Fig. 4)"
            )
        module = self.eval_module
        _, weights = captured_attention(
            lambda: module.apply(
                {"params": params}, batch["src"], batch["src_mask"], method=module.encode
            ),
            ("context_attention",),
        )  # [B, H, S*T, S]: the S sentence rows of a document attend as one group
        return document_state_attention(weights, batch["src_mask"])

    def translate(
        self, params: Any, batch: dict[str, Array], search: SearchConfig
    ) -> tuple[Array, dict[str, Array]]:
        """Beam search of every sentence of the documents at once, each with its document's
        global context (encoded once): ids ``[B, S, L]``, padding sentences PAD."""
        require_grid(batch, "HM-GDC")
        module, variables = self.eval_module, {"params": params}
        encoded, states, present = module.apply(
            variables, batch["src"], batch["src_mask"], method=module.encode
        )
        src_mask = batch["src_mask"].reshape(-1, batch["src"].shape[-1])
        extra = module.apply(
            variables, encoded, src_mask, states, present, method=module.decode_inputs
        )
        max_len, limits = sentence_limits(src_mask, search)
        result = search_decoder(module, variables, extra, search, max_len, limits)
        ids, aux = sentence_outputs(result, batch["src"].shape[:2], search)
        return pad_empty_sentences(ids, batch["src_mask"]), aux
