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

Each model's counter lives beside the model and is registered with it
(``@register(name, config=..., flops=counter)``, :mod:`docnmt_jax.models.base`): FINAL's in
``models/final.py`` (its global layer's in ``final_layers.py``, the XL decoder layer's in
``xl.py``), DocT's in ``doct.py``, HM-GDC's in ``hmgdc.py``, Doc2Doc's in ``concat.py``,
RNNSearch's in ``rnnsearch.py`` and ``hmgdc_rnn.py``, Jean & Cho's in ``jean_cho.py``, the
sentence Transformer's in ``transformer.py``. This module holds the layer costs they share and
asks a model for its count through the FLOP-counting capability
(:class:`~docnmt_jax.models.contract.FlopCounting`): it imports no model.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from jax.extend.core import ClosedJaxpr, Jaxpr, jaxprs_in_params

from docnmt_jax.errors import CapabilityError

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


def add_terms(total: Terms, prefix: str, terms: Terms, times: int = 1) -> None:
    """Adds ``times`` x ``terms`` to ``total`` under ``prefix.name`` keys."""
    for name, flops in terms.items():
        key = f"{prefix}.{name}"
        total[key] = total.get(key, 0) + times * flops


def context_attention(rows: int, Tq: int, Lc: int, D: int, gating: bool) -> Terms:
    """An attention of ``rows`` x ``Tq`` queries over ``Lc`` context states (DocT, Jean & Cho):
    projections ``2·2·Tq·D² + 2·2·Lc·D²`` (Q, out on the queries; K, V on the context),
    attention ``2·2·Tq·Lc·D``, and with ``gating`` DocT's gate ``2·2·Tq·D²`` (``W_i H``,
    ``W_s SubLayer(H)``)."""
    terms = {
        "context_projections": rows * (2 * 2 * Tq * D * D + 2 * 2 * Lc * D * D),
        "context_attention": rows * 2 * 2 * Tq * Lc * D,
    }
    if gating:
        terms["context_gate"] = rows * 2 * 2 * Tq * D * D
    return terms


def supported(model: Any) -> bool:
    """Whether ``model`` has an analytic FLOP count (a registered counter)."""
    return bool(getattr(model, "counts_flops", False))


def forward_terms(model: Any, shape: BatchShape) -> Terms:
    """Forward FLOPs per named term (``encoder.attention``, ``global.gate``, ``output``, ...)
    of ``model`` on a batch of ``shape``: its :meth:`flop_terms`; a one-line ``CapabilityError``
    when the model has no counter."""
    if not supported(model):
        raise CapabilityError(f"model {model.name!r} registered no FLOP counter")
    return model.flop_terms(shape)


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
