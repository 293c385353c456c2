"""What the window-context models share (DocT, Zhang et al. 2018, Sec. 2.1; Jean & Cho 2019,
Appendix A): every sentence reads the ``k`` source sentences before it in its document (its
window, ``context_sentences``), concatenated. The pipeline gives every chunk the ``k`` sentences
before its first one (``context_src``), so :func:`context_windows` builds every sentence's
window from ``[context_src; src]``; :class:`WindowContextModel` is the model interface both
share: rows of chunks or, with ``sentence_rows``, of single sentences, the window declared in
its :meth:`~WindowContextModel.data_spec`, the sentence Transformer's parameters filled from a
Transformer checkpoint, and Zheng et al. (2020)'s Fig. 4 matrix from the attention over the
window (:func:`window_sentence_attention`). Random contexts rotate the window with the chunk
(:func:`~.context_rotation.random_context_batch`).
"""

from __future__ import annotations

import abc
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from docnmt_jax.data.spec import DataSpec
from docnmt_jax.models import layers
from docnmt_jax.models.base import (
    BaseModel,
    BatchLayout,
    ModelError,
    captured_attention,
    require_grid,
    sentence_pair_attention,
)
from docnmt_jax.models.transformer import Segments, packed_rows

Array = jax.Array


def rows_with_context(batch: dict[str, Array], k: int, what: str) -> dict[str, Array]:
    """Module inputs of a grid batch: one row per sentence (``src``, ``src_mask``, ``tgt``,
    ``tgt_mask`` ``[B*S, T]``) and its ``k``-sentence window (``context``, ``context_mask``,
    :func:`context_windows`); ``what`` names the model in the packed-batch error."""
    require_grid(batch, what)
    T = batch["src"].shape[-1]
    rows = {key: batch[key].reshape(-1, T) for key in ("src", "src_mask", "tgt", "tgt_mask")}
    rows["context"], rows["context_mask"] = context_windows(batch, k)
    return rows


def packed_window_rows(batch: dict[str, Array]) -> dict[str, Array]:
    """Module inputs of packed sentence rows with context rows
    (:class:`~docnmt_jax.data.window_plan.WindowPackedPlan`): ``src``, ``src_mask``, ``tgt``,
    ``tgt_mask`` ``[B, L]``, ``context``, ``context_mask`` ``[B, K*L]`` and ``segments``: the
    sentence segments (:func:`~.transformer.packed_rows`) plus ``context_positions`` and
    ``context_segment_ids`` (a window has its sentence's segment id)."""
    if "context_segment_ids" not in batch:
        raise ModelError(
            "a window model's packed batch needs its context rows (context_src, "
            "context_segment_ids ...): build it with PipelineConfig(context_sentences=k)"
        )
    rows = packed_rows(batch, unit="segment")
    rows["context"], rows["context_mask"] = batch["context_src"], batch["context_src_mask"]
    for name in ("context_positions", "context_segment_ids"):
        rows["segments"][name] = batch[name]
    return rows


def context_attend(
    attention: layers.MultiHeadAttention,
    h: Array,
    context: Array | None,
    mask: Array,
    kv: tuple[Array, Array] | None,
    heads_major: bool = False,
) -> Array:
    """The context attention of queries ``h`` over the context states (Eq. 12, 16): over
    ``kv`` when given (``[N, Lc, H, d]``, or heads-major in decoding), else over ``context``
    projected here."""
    k, v = attention.project_kv(context) if kv is None else kv
    return attention.attend(attention.project_q(h), k, v, mask, heads_major=heads_major)


def context_present(to_context: Array, context_mask: Array, segments: Segments | None) -> Array:
    """Which queries have a context (a document's first sentence has none: its context
    sublayers are skipped): ``[N, 1]`` per sentence row, packed ``[B, L]`` per token (a
    context token with the query's segment id exists)."""
    if segments is None:
        return jnp.any(context_mask > 0, axis=-1)[:, None]
    return jnp.any(to_context[:, 0], axis=-1)


def context_windows(batch: dict[str, Array], k: int) -> tuple[Array, Array]:
    """Every sentence's context: the ``k`` source sentences before it in its document,
    concatenated, ``(ids, mask)`` ``[B*S, k*T]`` from a grid batch ``[B, S, T]``.

    Sentence ``s`` of a chunk reads rows ``s .. s+k-1`` of ``[context_src; src]`` (the
    pipeline's ``k`` sentences before the chunk, then the chunk): ``k`` static slices, no loop
    over sentences. A batch without ``context_src`` (built outside the pipeline) gives the
    chunk's first sentence no context. Empty slots (before the document's start, padding)
    are all padding, so they drop out of the concatenation.
    """
    src, mask = batch["src"], batch["src_mask"]
    B, S, T = src.shape
    if "context_src" in batch:
        before, before_mask = batch["context_src"], batch["context_src_mask"]
        if before.shape[1] < k or before.shape[2] != T:
            raise ModelError(
                f"the batch's context_src {before.shape} holds fewer than "
                f"config.model.context_sentences={k} sentences of {T} tokens: build the "
                "batches with PipelineConfig(context_sentences=k) (the model's context_sentences)"
            )
        first = before.shape[1] - k
        before, before_mask = before[:, first:], before_mask[:, first:]
    else:
        before = before_mask = jnp.zeros((B, k, T), src.dtype)
    ids, real = jnp.concatenate([before, src], 1), jnp.concatenate([before_mask, mask], 1)
    windows = [jnp.stack([x[:, j : j + S] for j in range(k)], axis=2) for x in (ids, real)]
    return tuple(w.reshape(B * S, k * T) for w in windows)  # type: ignore[return-value]


def encode_windows(
    model: BaseModel, params: Any, batch: dict[str, Array], **apply_kwargs: Any
) -> Any:
    """``model.eval_module.encode`` of a window model (DocT, Jean & Cho) on the sentence rows
    of ``batch`` with their context windows (``model.rows``); ``apply_kwargs`` go to
    ``apply`` (e.g. ``mutable=["intermediates"]``)."""
    rows = model.rows(batch)
    module = model.eval_module
    return module.apply(
        {"params": params},
        rows["src"],
        rows["src_mask"],
        rows["context"],
        rows["context_mask"],
        method=module.encode,
        **apply_kwargs,
    )


def window_sentence_attention(
    weights: Array, src_mask: Array, context_mask: Array, shape: tuple[int, int], k: int
) -> Array:
    """Zheng et al. (2020)'s Fig. 4 matrix ``[B, S, S]`` of a window model's context attention
    ``weights [B*S, H, T, k*T]`` (sentence rows of :func:`rows_with_context`, ``shape = (B,
    S)``): row ``s`` attends to its window, whose slot ``j`` (tokens ``j*T .. j*T+T-1``) is
    sentence ``s - k + j`` of the chunk (:func:`context_windows`). Weight on sentences before
    the chunk (``context_src``) has no column; rows without a context (a document's first
    sentence: the model skips the attention) are 0."""
    B, S = shape
    T = src_mask.shape[-1]
    row = jnp.tile(jnp.arange(S), B)  # sentence slot of each row
    present = jnp.any(context_mask > 0, axis=-1)
    query = jnp.where((src_mask > 0) & present[:, None], row[:, None], -1)
    key = row[:, None] - k + jnp.arange(k * T)[None, :] // T
    key = jnp.where((context_mask > 0) & (key >= 0), key, -1)
    per_row = sentence_pair_attention(weights, query, key, S)  # [B*S, S, S], row s only
    return per_row.reshape(B, S, S, S).sum(axis=1)


class WindowContextModel(BaseModel, abc.ABC):
    """A model whose sentences read their ``k``-sentence window (module docstring); its config
    has ``context_sentences`` (``k``) and ``sentence_rows`` (batch rows are single sentences,
    each with its window, instead of whole chunks: the same model and outputs either way).
    Subclasses set :attr:`label`, :attr:`context_parameters` and implement
    :meth:`window_attention_path` and ``translate``."""

    #: How the model is named in the packed-batch error (:func:`rows_with_context`).
    label: ClassVar[str] = "the window model"
    #: The parameters the model adds to the sentence Transformer (a regular expression over
    #: parameter paths): fresh when a Transformer checkpoint fills the rest.
    context_parameters: ClassVar[str] = r"context_.*"

    def __init__(self, config: Any, label_smoothing: float = 0.0):
        super().__init__(config, label_smoothing)
        self.layout = BatchLayout.SENTENCES if config.sentence_rows else BatchLayout.CHUNKS

    def data_spec(self) -> DataSpec:
        """The ``k`` source sentences before every chunk (``context_src``), on the grid."""
        return DataSpec(
            rows=self.layout.value,
            context="window",
            context_sentences=self.config.context_sentences,
        )

    def rows(self, batch: dict[str, Array]) -> dict[str, Array]:
        """One row per sentence with its context window (:func:`context_windows`)."""
        return rows_with_context(batch, self.config.context_sentences, self.label)

    def transformer_rules(self) -> list[tuple[str, str]]:
        """The sentence Transformer's parameters from its identical paths;
        :attr:`context_parameters` fresh."""
        return [(self.context_parameters, "skip"), (r"(.*)", r"\1")]

    @abc.abstractmethod
    def window_attention_path(self) -> tuple[str, ...]:
        """The parameter path of the attention over the window whose weights give
        :meth:`sentence_attention` (each window model names its own)."""

    def sentence_attention(self, params: Any, batch: dict[str, Array]) -> Array:
        """Sentence-to-sentence attention ``[B, S, S]`` (Zheng et al. 2020, Fig. 4) of the
        attention at :meth:`window_attention_path` over the ``k`` previous sentences
        (:func:`window_sentence_attention`): a row sums to 1 over its window inside the chunk,
        a document's first sentence has none (0)."""
        rows = self.rows(batch)
        _, weights = captured_attention(
            lambda: encode_windows(self, params, batch), self.window_attention_path()
        )
        return window_sentence_attention(
            weights,
            rows["src_mask"],
            rows["context_mask"],
            batch["src"].shape[:2],
            self.config.context_sentences,
        )
