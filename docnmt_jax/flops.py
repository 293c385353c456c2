"""Analytic FLOP counts of the models' matrix multiplies, per batch (for MFU).

A product of an ``[m, k]`` and a ``[k, n]`` matrix costs ``2·m·n·k`` FLOPs (one multiply, one
add). Only matrix multiplies are counted: embedding lookups (gathers), softmax, LayerNorm,
masks, biases and the optimiser are left out, so XLA's ``cost_analysis()`` (which counts every
op) is somewhat higher. A training step is ``TRAIN_FACTOR = 3`` forward passes: the backward
pass computes two products per forward product (input gradient and weight gradient). The few
products with a constant operand (stop-gradient memory, sinusoid table, one-hot) need only one
of the two, so the true backward of FINAL is slightly cheaper than 2x: counting the traced
step's matrix multiplies (:func:`jaxpr_dot_flops`) gives exactly 3x forward for the sentence
Transformer and Doc2Doc, 0.97-0.98 x 3x forward for FINAL.

Notation: a batch of ``B`` chunks of ``S`` sentences, ``Ts`` source and ``Tt`` target tokens
per sentence; ``N = B·S`` sentence rows; ``D`` model, ``F`` feed-forward, ``H`` heads, ``V``
vocabulary; ``R2 = 2·min(max_relative_distance, S-1) + 1``, the sentence distances that
occur. Attention terms are summed over heads (``H`` heads of ``D/H`` = one ``D``-wide
product). Padding costs as much as real tokens.

Sentence Transformer, per sentence row (``N`` rows)::

  encoder layer    projections  4 · 2·Ts·D²            Q, K, V, output
                   attention    2 · 2·Ts²·D            Q·K^T, weights·V
                   ffn          2 · 2·Ts·D·F
  decoder layer    self proj    4 · 2·Tt·D²
                   self attn    2 · 2·Tt²·D            (causal mask: full square computed)
                   cross proj   2 · 2·Tt·D² + 2 · 2·Ts·D²     Q, out on targets; K, V on source
                   cross attn   2 · 2·Tt·Ts·D
                   ffn          2 · 2·Tt·D·F
  output softmax   2·Tt·D·V                            (tied embedding)

FINAL (Zheng et al. 2020) adds or replaces::

  local encoder layers (Le - 1; Le without the global layer): as above on N rows of Ts
                   (doc2sent: on B rows of L = S·Ts tokens)
  global layer, per chunk (B rows of L = S·Ts tokens)
                   projections  4 · 2·L·D²
                   attention    2 · 2·L²·D
                   segment rel  2·L·R2·D               q·γ^K per distance
                                + 2·L·R2·D             attention mass per distance · γ^V
                                + 2 · 2·L·S·R2·H       one-hot spread of q·γ^K to sentence
                                                       pairs, and of the mass back to distances
                   gate         2·L·(2D)·D             W_g [h^L; h^G]
                   ffn          2 · 2·L·D·F
  XL decoder layer, per sentence row, memory Tm = Tt (the previous sentence)
                   memory kv    2 · 2·Tm·D²            K, V of the memory
                   self proj    4 · 2·Tt·D²
                   self attn    3 · 2·Tt·(Tt+Tm)·D     (q+u)·K^T, (q+v)·(W_R R)^T, weights·V
                   position     2·(Tt+Tm)·D²           W_R R, once per layer (not per row)
                   cross, ffn   as the sentence decoder
  output softmax   2·Tt·D·V per sentence row
  doc2sent, chunk-wide cross-attention (``doc2sent_cross_attention = "chunk"``): each
                   sentence row's cross attn over the chunk, 2 · 2·Tt·(S·Ts)·D; the K, V
                   projections stay 2 · 2·Ts·D² per row (once per chunk: B · 2 · 2·S·Ts·D²)

DocT (Zhang et al. 2018) adds, per sentence row, with a context of ``Lc = k·Ts`` slots (the
``k`` previous sentences, each padded to ``Ts``)::

  context encoder  N_c encoder layers (as above) on N rows of Lc tokens
  context attn     per encoder layer (Tq = Ts) and decoder layer (Tq = Tt):
                   projections  2 · 2·Tq·D² + 2 · 2·Lc·D²  Q, out on queries; K, V on context
                   attention    2 · 2·Tq·Lc·D
                   gate         2 · 2·Tq·D²            W_i H, W_s SubLayer(H)

HM-GDC (Tan et al. 2019) adds, with ``N_d`` document layers::

  summary          per sentence row: self-attention projections and attention (no FFN)
  document encoder N_d encoder layers (as above) on B rows of S sentence vectors
  context attn     per sentence row: Q, out 2 · 2·Ts·D², attention 2 · 2·Ts·S·D;
                   per document: K, V 2 · 2·S·D²
  DocEnc-Decoder   per decoder layer: the same with Tt queries per sentence row

Doc2Doc (``models/concat.py``): the sentence Transformer on ``B`` rows of
``S·Ts`` source and ``S·Tt`` target tokens (each chunk packed into one sequence), so its
attention terms grow with ``(S·T)²``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from jax.extend.core import ClosedJaxpr, Jaxpr, jaxprs_in_params

TRAIN_FACTOR = 3  # forward + backward (input and weight gradients)

Terms = dict[str, int]


@dataclasses.dataclass(frozen=True)
class BatchShape:
    """``chunks`` x ``sentences`` x (``src_len`` | ``tgt_len``) tokens."""

    chunks: int
    sentences: int
    src_len: int
    tgt_len: int

    @property
    def rows(self) -> int:
        """Sentence rows ``N = B·S``."""
        return self.chunks * self.sentences


def encoder_layer(rows: int, T: int, D: int, F: int) -> Terms:
    """A self-attention + FFN layer over ``rows`` sequences of ``T`` tokens."""
    return {
        "projections": rows * 4 * 2 * T * D * D,
        "attention": rows * 2 * 2 * T * T * D,
        "ffn": rows * 2 * 2 * T * D * F,
    }


def cross_attention(rows: int, Tt: int, Ts: int, D: int, F: int) -> Terms:
    """Cross-attention to ``Ts`` source tokens and the FFN of a decoder layer."""
    return {
        "cross_projections": rows * (2 * 2 * Tt * D * D + 2 * 2 * Ts * D * D),
        "cross_attention": rows * 2 * 2 * Tt * Ts * D,
        "ffn": rows * 2 * 2 * Tt * D * F,
    }


def decoder_layer(rows: int, Tt: int, Ts: int, D: int, F: int) -> Terms:
    """The sentence Transformer's decoder layer (masked self-attention, cross, FFN)."""
    terms = {
        "self_projections": rows * 4 * 2 * Tt * D * D,
        "self_attention": rows * 2 * 2 * Tt * Tt * D,
    }
    return terms | cross_attention(rows, Tt, Ts, D, F)


def xl_decoder_layer(rows: int, Tt: int, Tm: int, Ts: int, D: int, F: int) -> Terms:
    """FINAL's Transformer-XL decoder layer with a memory of ``Tm`` tokens."""
    terms = {
        "memory_kv": rows * 2 * 2 * Tm * D * D,
        "self_projections": rows * 4 * 2 * Tt * D * D,
        "self_attention": rows * 3 * 2 * Tt * (Tt + Tm) * D,
        "position": 2 * (Tt + Tm) * D * D,
    }
    return terms | cross_attention(rows, Tt, Ts, D, F)


def global_layer(chunks: int, S: int, Ts: int, config: Any) -> Terms:
    """FINAL's global context layer over chunks of ``L = S·Ts`` tokens."""
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


def _add(total: Terms, prefix: str, terms: Terms, times: int = 1) -> None:
    for name, flops in terms.items():
        key = f"{prefix}.{name}"
        total[key] = total.get(key, 0) + times * flops


def transformer_terms(config: Any, shape: BatchShape) -> Terms:
    """Forward FLOPs of the sentence Transformer on the ``N`` sentences of ``shape``."""
    D, F, N = config.d_model, config.ffn_dim, shape.rows
    Ts, Tt = shape.src_len, shape.tgt_len
    total: Terms = {}
    _add(total, "encoder", encoder_layer(N, Ts, D, F), config.num_encoder_layers)
    _add(total, "decoder", decoder_layer(N, Tt, Ts, D, F), config.num_decoder_layers)
    total["output"] = N * 2 * Tt * D * config.vocab_size
    return total


def final_terms(config: Any, shape: BatchShape) -> Terms:
    """Forward FLOPs of FINAL (any Table 3 switch setting) on ``shape``'s chunks."""
    D, F, N = config.d_model, config.ffn_dim, shape.rows
    B, S, Ts, Tt = shape.chunks, shape.sentences, shape.src_len, shape.tgt_len
    total: Terms = {}
    local = config.num_encoder_layers - int(config.segment_relative_attention)
    rows, T = (B, S * Ts) if config.doc2sent else (N, Ts)
    _add(total, "encoder", encoder_layer(rows, T, D, F), local)
    if config.segment_relative_attention:
        _add(total, "global", global_layer(B, S, Ts, config))
    if config.xl_decoder:
        layer = xl_decoder_layer(N, Tt, Tt, Ts, D, F)
    else:
        layer = decoder_layer(N, Tt, Ts, D, F)
    if config.cross_attends_chunk:  # every sentence row attends over its chunk's S·Ts keys
        layer["cross_attention"] = N * 2 * 2 * Tt * S * Ts * D
    _add(total, "decoder", layer, config.num_decoder_layers)
    total["output"] = N * 2 * Tt * D * config.vocab_size
    return total


def context_attention(rows: int, Tq: int, Lc: int, D: int, gating: bool) -> Terms:
    """DocT's context attention (and gate) of ``Tq`` queries over ``Lc`` context states."""
    terms = {
        "context_projections": rows * (2 * 2 * Tq * D * D + 2 * 2 * Lc * D * D),
        "context_attention": rows * 2 * 2 * Tq * Lc * D,
    }
    if gating:
        terms["context_gate"] = rows * 2 * 2 * Tq * D * D
    return terms


def doct_terms(config: Any, shape: BatchShape) -> Terms:
    """DocT: the sentence Transformer plus the context encoder over each sentence's ``k``
    previous sentences and the context attentions (module docstring)."""
    D, F, N = config.d_model, config.ffn_dim, shape.rows
    Ts, Tt = shape.src_len, shape.tgt_len
    Lc, gating = config.context_sentences * Ts, config.context_gating
    total = transformer_terms(config, shape)
    _add(total, "context", encoder_layer(N, Lc, D, F), config.num_context_layers)
    if config.context_in_encoder:
        terms = context_attention(N, Ts, Lc, D, gating)
        _add(total, "encoder", terms, config.num_encoder_layers)
    if config.context_in_decoder:
        _add(total, "decoder", context_attention(N, Tt, Lc, D, gating), config.num_decoder_layers)
    return total


def document_attention(documents: int, rows: int, Tq: int, S: int, D: int) -> Terms:
    """HM-GDC's attention of ``rows`` sentence rows (``Tq`` queries each) over their
    document's ``S`` sentence states, keys and values projected once per document."""
    return {
        "document_projections": rows * 2 * 2 * Tq * D * D + documents * 2 * 2 * S * D * D,
        "document_attention": rows * 2 * 2 * Tq * S * D,
    }


def hmgdc_terms(config: Any, shape: BatchShape) -> Terms:
    """HM-GDC: the sentence Transformer plus the summary self-attention over every sentence,
    ``N_d`` document-encoder layers over ``B`` rows of ``S`` sentence vectors, the context
    attention of the source words and the DocEnc-Decoder attention of every decoder layer
    over the document states (module docstring)."""
    D, F, N = config.d_model, config.ffn_dim, shape.rows
    B, S, Ts, Tt = shape.chunks, shape.sentences, shape.src_len, shape.tgt_len
    total = transformer_terms(config, shape)
    summary = encoder_layer(N, Ts, D, F)
    del summary["ffn"]
    _add(total, "summary", summary)
    _add(total, "document", encoder_layer(B, S, D, F), config.num_document_layers)
    if config.context_in_encoder:
        _add(total, "context", document_attention(B, N, Ts, S, D))
    if config.context_in_decoder:
        _add(total, "decoder", document_attention(B, N, Tt, S, D), config.num_decoder_layers)
    return total


def doc2doc_terms(config: Any, shape: BatchShape) -> Terms:
    """Doc2Doc: the sentence Transformer over each chunk packed into one row of ``S·T``."""
    B, S = shape.chunks, shape.sentences
    return transformer_terms(config, BatchShape(B, 1, S * shape.src_len, S * shape.tgt_len))


def forward_terms(model: Any, shape: BatchShape) -> Terms:
    """Forward FLOPs per named term (``encoder.attention``, ``global.gate``, ``output``, ...)
    of ``model`` (a registered model: its counter was registered with it)."""
    from docnmt_jax.models.base import registration

    counter = registration(model.name).flops
    if counter is None:
        raise NotImplementedError(f"model {model.name!r} registered no FLOP counter")
    return counter(model.config, shape)


def supported(model: Any) -> bool:
    """Whether ``model`` registered an analytic FLOP count."""
    from docnmt_jax.models.base import registration

    return registration(model.name).flops is not None


def forward_flops(model: Any, shape: BatchShape) -> int:
    """Forward FLOPs of one batch of ``shape``."""
    return sum(forward_terms(model, shape).values())


def train_flops(model: Any, shape: BatchShape) -> int:
    """FLOPs of one training step (forward and backward) on a batch of ``shape``."""
    return TRAIN_FACTOR * forward_flops(model, shape)


def jaxpr_dot_flops(jaxpr: Jaxpr | ClosedJaxpr) -> int:
    """Exact FLOPs of the ``dot_general`` ops of a traced program (e.g. ``jit(f).trace(...)
    .jaxpr``): ``2 · size(lhs) · size(rhs free dims)`` each, sub-programs included (``scan``
    bodies ``length`` times, ``while`` bodies once). An independent check of the analytic
    count, and the exact matmul cost of a training step's backward pass."""
    jaxpr = jaxpr.jaxpr if isinstance(jaxpr, ClosedJaxpr) else jaxpr
    total = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            (_, rhs_contract), (_, rhs_batch) = eqn.params["dimension_numbers"]
            lhs, rhs = (v.aval.shape for v in eqn.invars)
            bound = set(rhs_contract) | set(rhs_batch)
            free = [d for i, d in enumerate(rhs) if i not in bound]
            total += 2 * math.prod(lhs) * math.prod(free)
        times = eqn.params.get("length", 1) if eqn.primitive.name == "scan" else 1
        total += sum(times * jaxpr_dot_flops(sub) for sub in jaxprs_in_params(eqn.params))
    return total


def bi_gru(rows: int, T: int, inputs: int, D: int) -> Terms:
    """One bidirectional GRU layer (two directions of ``h = D/2`` units, gates ``3h``) over
    ``rows`` sequences of ``T`` steps of ``inputs``-wide vectors."""
    h = D // 2
    return {
        "input": rows * 2 * (2 * T * inputs * 3 * h),
        "recurrent": rows * 2 * (2 * T * h * 3 * h),
    }


def rnnsearch_terms(config: Any, shape: BatchShape) -> Terms:
    """RNNSearch (``models/rnnsearch.py``), per sentence row (``N`` rows), ``E`` embedding,
    ``D`` hidden, ``L`` layers::

      encoder layer l  input        2 · 2·Ts·in_l·3(D/2)    in_0 = E, else D; 2 directions
                       recurrent    2 · 2·Ts·(D/2)·3(D/2)
      decoder layer l  input        2·Tt·in_l·3D            in_0 = E + D (input feeding)
                       recurrent    2·Tt·D·3D
      attention        memory       2·Ts·D²                 W_m h, once per source
                       query        2·Tt·D²                 W_q s_t
                       scores       2·Tt·Ts·D               v · tanh(...)
                       context      2·Tt·Ts·D               weights · h
                       output       2·Tt·2D·D               W_c [c_t; s_t]
      output softmax   2·Tt·D·V                             (untied)
    """
    E, D, N, V = config.embed_dim, config.d_model, shape.rows, config.vocab_size
    Ts, Tt = shape.src_len, shape.tgt_len
    total: Terms = {}
    for layer in range(config.num_layers):
        _add(total, "encoder", bi_gru(N, Ts, E if layer == 0 else D, D))
        decoder = {
            "input": N * 2 * Tt * (E + D if layer == 0 else D) * 3 * D,
            "recurrent": N * 2 * Tt * D * 3 * D,
        }
        _add(total, "decoder", decoder)
    attention = {
        "memory": N * 2 * Ts * D * D,
        "query": N * 2 * Tt * D * D,
        "scores": N * 2 * Tt * Ts * D,
        "context": N * 2 * Tt * Ts * D,
        "output": N * 2 * Tt * 2 * D * D,
    }
    _add(total, "attention", attention)
    total["output"] = N * 2 * Tt * D * V
    return total


def rnnsearch_hmgdc_terms(config: Any, shape: BatchShape) -> Terms:
    """RNNSearch with HM-GDC in the encoder (Tan et al. 2019): RNNSearch plus, per chunk
    (``B`` chunks of ``S`` sentences, ``L = S·Ts`` words)::

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
    _add(total, "sentence", sentence)
    _add(total, "document", bi_gru(B, S, D, D), config.num_document_layers)
    context = {
        "projections": B * (2 * 2 * L * D * D + 2 * 2 * S * D * D),
        "attention": B * 2 * 2 * L * S * D,
    }
    _add(total, "context", context)
    return total
