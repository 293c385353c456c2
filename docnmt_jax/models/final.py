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

Packed rows (training; docs/design/packing_plan.md §1, §2.3-2.5): the module computes, for
every real token, exactly what the grid computes, with masks in place of the grid's axes
(the argument and the attention bands: :mod:`.final_layers`; the two-layout step of
``packed_layout = "two_layout"``, its sentence and chunk layouts: :mod:`.final_two_layout`).

Switches make the rows of Table 3 configurations of this one module (the switch table is in
the config layer, ``configs/final_table3.py``); the decoder layer class is chosen once, in
:meth:`Final.setup` (:class:`~.xl.XLDecoderLayer` or
:class:`~.final_layers.SentenceDecoderLayer`); the steps of the search are
:class:`~.final_decode.FinalSearchSteps`.
Decisions beyond the paper: per-head scaling ``1/sqrt(d_model/heads)``; without the fusion
gate ``h = LN(h^L + h^G)``; with ``pre_ln`` the global layer normalises its input and the
fusion has no output LayerNorm; the memory readings of :mod:`.xl`; three readings of the
layers (the global layer's feed-forward sublayer, per-head ``gamma^K``/``gamma^V``,
projection biases) in :mod:`.final_layers`; and one of the model:

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
  it wrote one sentence for 1,440 of 1,443 test verses, docs/papers/final.md).
"""

from __future__ import annotations

from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from docnmt_jax import flops
from docnmt_jax.data import schema
from docnmt_jax.data.spec import Bound, DataLimits, DataSpec, PackingConfig
from docnmt_jax.data.tokenizer import BOS_ID
from docnmt_jax.decoding.beam_search import BeamResult
from docnmt_jax.decoding.search import SearchConfig
from docnmt_jax.models import final_decode, final_two_layout, layers
from docnmt_jax.models import final_recurrence as recurrence
from docnmt_jax.models.base import BaseModel, BatchLayout, ModelError, register, require_grid
from docnmt_jax.models.final_layers import (
    SEGMENT_FEATURES,
    FinalConfig,
    GlobalContextLayer,
    LocalEncoderLayer,
    Segments,
    SentenceDecoderLayer,
    global_layer_terms,
    transformer_rules,
)
from docnmt_jax.models.xl import MemoryKV, XLDecoderLayer, xl_decoder_terms

Array = jax.Array


class Final(final_decode.FinalSearchSteps):
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
        x = self.embed(src) + layers.sinusoidal_encoding(positions, cfg.d_model, jnp.float32)
        if cfg.segment_embedding:
            if S > cfg.max_segments:
                raise ValueError(f"{S} sentences per chunk > max_segments={cfg.max_segments}")
            x = x + jnp.asarray(self.segment_table[:S], cfg.dtype)[:, None, :]
        return self.input_dropout(x, deterministic=cfg.deterministic)

    def _encode(
        self, src: Array, src_mask: Array, memory: tuple[Array, Array] | None = None
    ) -> tuple[Array, Array | None]:
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
            h_global, weights = self.global_layer(h, src_mask, memory=memory)
            num_sentences = jnp.sum(jnp.any(src_mask > 0, axis=-1), axis=-1)
            several = num_sentences > 1  # or a single sentence with a memory to read
            if memory is not None:
                several = several | jnp.any(memory[1] > 0, axis=-1)
            h = jnp.where(several[:, None, None, None], h_global, h)
        if cfg.pre_ln:
            h = self.encoder_norm(h)
        return h, weights

    def encode(
        self, src: Array, src_mask: Array, memory: tuple[Array, Array] | None = None
    ) -> Array:
        """``src [B, S, T]`` ids and mask -> fused source encodings ``h [B, S, T, D]``; with
        ``memory`` the global layer also reads the previous chunk's summaries
        (:mod:`.final_recurrence`)."""
        return self._encode(src, src_mask, memory)[0]

    def encode_packed(
        self, src: Array, segments: Segments, memory: tuple[Array, Array] | None = None
    ) -> Array:
        """Packed source rows ``src [B, L]`` (:data:`Segments`) -> ``h [B, L, D]``: what
        :meth:`encode` gives every real token of the grid. Local layers attend within the
        sentence (``doc2sent``: the chunk, dense over the row), banded; the global layer within
        the chunk, dense over the row (or its chunk spans, ``packed_chunk_spans``), at clipped
        sentence-index distances; tokens of chunks with one sentence (and no ``memory`` to
        read) keep ``h^L``. ``memory``: the carried
        summaries each row's tokens may read, ``[B, K, D]`` and mask ``[B, 1, L, K]``
        (:func:`~.final_recurrence.packed_memory_keys`)."""
        cfg = self.config
        L = src.shape[-1]
        sidx, chunks = segments["src_sentence_index"], segments["src_chunk_ids"]
        positions = segments["src_positions" if cfg.reset_word_positions else "src_chunk_positions"]
        x = self.embed(src) + layers.sinusoidal_encoding(positions, cfg.d_model, jnp.float32)
        if cfg.segment_embedding:  # slots >= max_segments are the data's to exclude
            x = x + jnp.take(jnp.asarray(self.segment_table, cfg.dtype), sidx, axis=0)
        x = self.input_dropout(x, deterministic=cfg.deterministic)
        if cfg.doc2sent:
            band, ids = layers.Band.dense(L), chunks
        else:  # banded windows, or the sentence layout's blocks (two_layout)
            band, ids = final_two_layout.local_band(cfg, L), segments["src_segment_ids"]
        blocks = band.blocks(ids)
        mask = layers.segment_mask(blocks, band.windows(blocks))
        x = band.blocks(x)
        for layer in self.encoder_layers:
            x = layer(x, mask, band)
        h = band.unblock(x)
        if cfg.segment_relative_attention:  # over the row, or its chunk spans (two_layout)
            spans = cfg.packed_chunk_spans if cfg.packed_layout == "two_layout" else 1
            h = final_two_layout.global_context(self.global_layer, h, segments, spans, memory)
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
            y = y + layers.sinusoidal_encoding(positions, cfg.d_model, jnp.float32)
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
        return self.decode_with_states(encoded, src_mask, tgt_in, tgt_mask)[0]

    def decode_with_states(
        self,
        encoded: Array,
        src_mask: Array,
        tgt_in: Array,
        tgt_mask: Array,
        first_memory: tuple[list[Array], Array] | None = None,
    ) -> tuple[Array, list[Array]]:
        """:meth:`decode`, and every layer's inputs ``[B, S, T, D]``; ``first_memory``: the
        memory of sentence 0 (per layer ``[B, T, D]``, mask ``[B, T]``), else none."""
        cfg = self.config
        B, S, T = tgt_in.shape

        def shift(x: Array, first: Array | None) -> Array:  # sentence k gets row k-1 of x
            if first is None:
                return jnp.pad(x[:, :-1], [(0, 0), (1, 0)] + [(0, 0)] * (x.ndim - 2))
            return jnp.concatenate([first[:, None].astype(x.dtype), x[:, :-1]], axis=1)

        first_states, first_mask = first_memory or (None, None)
        memory_mask = shift(tgt_mask, first_mask).reshape(B * S, T)

        def memory_fn(i: int, states: Array) -> tuple[Array, Array]:
            first = None if first_states is None else first_states[i]
            memory = shift(jax.lax.stop_gradient(states).reshape(B, S, T, cfg.d_model), first)
            return memory.reshape(B * S, T, cfg.d_model), memory_mask

        y, inputs = self._decode_rows(
            *self.cross_memory(encoded, src_mask),
            tgt_in.reshape(B * S, T),
            tgt_mask.reshape(B * S, T),
            memory_fn,
            cfg.num_decoder_layers,
        )
        inputs = [x.reshape(B, S, T, cfg.d_model) for x in inputs]
        return self._output(y).reshape(B, S, T, -1), inputs

    def decode_packed(self, encoded: Array, tgt_in: Array, segments: Segments) -> Array:
        """Teacher-forced over packed rows: ``tgt_in [B, L]`` (shifted right within each
        sentence) and ``encoded [B, L, D]`` (:meth:`encode_packed`) -> logits ``[B, L, V]``,
        banded (:func:`~.xl.packed_decoder_attention`); the XL memory of sentence ``k`` is
        ``SG`` of sentence ``k - 1`` of the same chunk, in the same row. Cross-attention reads
        the source sentence with the query's segment id, banded, or with
        :attr:`FinalConfig.cross_attends_chunk` every source token of the query's chunk,
        dense over the row (the row's query blocks grouped against it)."""
        return self.decode_packed_with_states(encoded, tgt_in, segments)[0]

    def decode_packed_with_states(
        self,
        encoded: Array,
        tgt_in: Array,
        segments: Segments,
        carried: tuple[list[Array], Array] | None = None,
    ) -> tuple[Array, list[Array]]:
        """:meth:`decode_packed`, and every layer's inputs ``[B, L, D]``. ``carried``: states
        carried from another chunk (per layer ``[B, L, D]``) and the slots that hold them
        (``[B, L]``): there the memory keys read the carried states (with their gradient),
        elsewhere ``SG`` of the layer's input (:mod:`.final_recurrence`)."""
        cfg = self.config
        attention = final_two_layout.decoder_attention(cfg, segments)  # bands or two_layout
        band = attention.current  # the self-attention bands have the same blocks
        y = band.blocks(self._embed_target(tgt_in, segments["tgt_positions"]))
        encoded = attention.cross.blocks(encoded)  # own slice: band's blocks; chunk: the rows
        inputs = []
        for i, layer in enumerate(self.decoder_layers):
            inputs.append(band.unblock(y))
            memory = None
            if carried is not None:
                slots = band.blocks(carried[1])[..., None]
                states = band.blocks(carried[0][i]).astype(y.dtype)
                memory = jnp.where(slots, states, jax.lax.stop_gradient(y))
            y = layer.teacher_forced_packed(y, encoded, attention, memory)
        return self._output(band.unblock(y)), inputs

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


def final_terms(config: FinalConfig, shape: flops.BatchShape) -> flops.Terms:
    """Forward FLOPs of FINAL (any Table 3 switch setting) on ``shape``'s chunks: the local
    encoder layers (``Le - 1``; ``Le`` without the global layer) on ``N`` rows of ``Ts``
    tokens (doc2sent: ``B`` rows of ``S·Ts``), the global layer per chunk
    (:func:`~docnmt_jax.models.final_layers.global_layer_terms`), the XL decoder layers with
    the previous sentence as memory (``Tm = Tt``, :func:`~docnmt_jax.models.xl.xl_decoder_terms`)
    or the sentence decoder's, the output softmax ``2·Tt·D·V`` per sentence row. With the
    chunk-wide cross-attention of doc2sent each row attends over ``S·Ts`` keys
    (``2·2·Tt·S·Ts·D``); its K, V projections stay ``2·2·Ts·D²`` per row."""
    D, F, N = config.d_model, config.ffn_dim, shape.rows
    B, S, Ts, Tt = shape.chunks, shape.sentences, shape.src_len, shape.tgt_len
    total: flops.Terms = {}
    local = config.num_encoder_layers - int(config.segment_relative_attention)
    rows, T = (B, S * Ts) if config.doc2sent else (N, Ts)
    flops.add_terms(total, "encoder", flops.encoder_layer(rows, T, D, F), local)
    if config.segment_relative_attention:
        flops.add_terms(total, "global", global_layer_terms(B, S, Ts, config))
    if config.xl_decoder:
        layer = xl_decoder_terms(N, Tt, Tt, Ts, D, F)
    else:
        layer = flops.decoder_layer(N, Tt, Ts, D, F)
    if config.cross_attends_chunk:  # every sentence row attends over its chunk's S·Ts keys
        layer["cross_attention"] = N * 2 * 2 * Tt * S * Ts * D
    flops.add_terms(total, "decoder", layer, config.num_decoder_layers)
    total["output"] = N * 2 * Tt * D * config.vocab_size
    return total


@register("final", config=FinalConfig, flops=final_terms)
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

    def data_spec(self) -> DataSpec:
        """Chunks (read by the global layer); packed: whole chunks in rows of 1024 slots, a
        sentence's source and target offsets within ``packed_drift`` (the bound the
        cross-attention windows rely on). Packed rows are banded for sentences of at most
        ``max_sentence_len`` tokens and chunks of at most ``max_segments`` sentences: longer
        ones would lose keys silently. ``packed_layout="two_layout"``: aligned rows of blocks
        of ``max_sentence_len`` slots (:mod:`docnmt_jax.data.two_layout_plan`), rows of
        ``1024 * packed_chunk_spans`` whose chunks fit spans of 1024 source slots. Recurrent:
        document streams (``bptt_chunks`` steps of a stream a batch), packed as the banded rows
        (:mod:`docnmt_jax.data.packed_stream_plan`) or on the grid, sentences of at most
        ``max_sentence_len`` tokens (the carried target memory's length)."""
        cfg = self.config
        if cfg.recurrent:
            return DataSpec(
                rows=self.layout.value,
                context="chunk",
                packing=PackingConfig("chunk", 1024, cfg.packed_drift),
                streams=True,
                stream_window=cfg.bptt_chunks,
                limits=DataLimits(
                    packed_sentence_tokens=Bound(cfg.max_sentence_len, "max_sentence_len"),
                    chunk_sentences=Bound(cfg.max_segments, "max_segments"),
                ),
            )
        aligned = cfg.max_sentence_len if cfg.packed_layout == "two_layout" else None
        spans = cfg.packed_chunk_spans if aligned else 1
        return DataSpec(
            rows=self.layout.value,
            context="chunk",
            packing=PackingConfig(  # two_layout: aligned rows (data/two_layout_plan.py)
                "chunk",
                1024 * spans,
                None if aligned else cfg.packed_drift,
                block_tokens=aligned,
                chunk_spans=spans,
            ),
            limits=DataLimits(
                packed_sentence_tokens=Bound(cfg.max_sentence_len, "max_sentence_len"),
                chunk_sentences=Bound(cfg.max_segments, "max_segments"),
            ),
        )

    @property
    def carries_state(self) -> bool:
        """Whether the model reads context across chunks (:mod:`.final_recurrence`)."""
        return self.config.recurrent

    def initial_carry(self, rows: int) -> recurrence.Carry:
        """The state before the first chunk of ``rows`` documents."""
        return recurrence.initial_carry(self.config, rows)

    def loss_with_carry(self, params: Any, batch: Any, carry: Any, rng: Any, train: bool):
        """:meth:`loss` of stream chunks (``bptt_chunks`` a stream) with the carried state."""
        return recurrence.carried_loss(self, params, batch, carry, rng, train)

    def carried_search_inputs(self, params: Any, batch: dict[str, Array], carry: Any, search: Any):
        """:meth:`search_inputs` of stream chunks with the decoding ``carry``."""
        return recurrence.carried_search_inputs(self, params, batch, carry, search)

    def initial_decode_carry(self, rows: int) -> recurrence.Carry:
        """The decoding state before the first chunk of ``rows`` documents."""
        return recurrence.empty_decode_carry(self.config, rows)

    #: The source side: embeddings, segment table, local layers, global layer (and pre-LN's
    #: final encoder norm).
    source_parameters: ClassVar[str] = r"embed/.*|segment_embedding|encoder.*|global_layer/.*"

    def transformer_rules(self) -> list[tuple[str, str]]:
        """What a sentence Transformer fills in FINAL (Table 4):
        :func:`~.final_layers.transformer_rules`."""
        return transformer_rules(self.config)

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
    ) -> tuple[final_decode.Slots, MemoryKV]:
        """Per sentence slot ``[S, B, ...]``: the cross-attention inputs, their mask and the
        source mask; and the empty memory of sentence 0 (:func:`.final_decode.search_inputs`)."""
        return final_decode.search_inputs(self, params, batch, search)

    def search_slot(
        self, params: Any, memory: MemoryKV, slot: final_decode.Slots, search: SearchConfig
    ) -> BeamResult:
        """Beam search of one sentence per row with the previous sentence's ``memory``,
        keeping the chosen hypothesis's cache (:func:`.final_decode.search_slot`)."""
        return final_decode.search_slot(self, params, memory, slot, search)

    @property
    def uses_memory(self) -> bool:
        return self.layout.sequential

    def searches_in_one_call(self, search: SearchConfig) -> bool:
        """Whether :meth:`translate` searches every sentence slot in one compiled loop: with
        the XL decoder the continuous search, unless sampling (slot by slot)."""
        return not search.sample

    def translate(
        self, params: Any, batch: dict[str, Array], search: SearchConfig
    ) -> tuple[Array, dict[str, Array]]:
        """Beam search of every sentence of the chunks: ids ``[B, S, L]`` (EOS, then PAD;
        padding sentences PAD); :func:`.final_decode.translate`."""
        require_grid(batch, "translate")
        return final_decode.translate(self, params, batch, search)
