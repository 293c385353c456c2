"""Does a trained model read its source at all? Two probes for a collapsed run.

BLEU cannot tell a model that translates badly from one that ignores its input: at a small
budget a constant output can score within the sentence model's seed spread (the results
table's Doc2Sent rows, docs/log/2026-11-26-results-table-demo.md). These probes can:

* **Source sensitivity** (:func:`source_sensitivity`): the teacher-forced log-likelihood per
  target token of a set of documents with their true sources, with another document's sources
  (:func:`other_sources`) and with every source sentence blanked to ``"."``
  (:func:`blank_sources`), the targets and the document structure (sentence counts, chunks)
  unchanged. A model that reads its source loses likelihood when the source is replaced; a
  model that has learned the target language alone does not.
* **Token variance share** (:func:`token_variance_share`): ``sum_i |h_i - h_bar|^2 / sum_i
  |h_i|^2`` over the real tokens ``i`` of one encoder output (``h_bar`` their mean): the share
  of the encodings' squared norm that differs across tokens. 0 when every token is encoded as
  the same vector (the decoder then cannot tell the source's words apart); it is read from
  the top-level module's ``encode`` call (:func:`captured_encoding`), on the largest chunk of
  the documents as the model's pipeline cuts them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import numpy as np

from docnmt_jax.data import pipeline as pipeline_lib
from docnmt_jax.data.documents import Document
from docnmt_jax.errors import InputMismatchError
from docnmt_jax.evaluation.analysis import chunk_batches
from docnmt_jax.models.base import Model

#: ``score(documents) -> (log p per sentence, target tokens per sentence)`` per document, as
#: :func:`docnmt_jax.evaluation.context_marginal.sentence_scorer` returns.
Score = Callable[[Sequence[Document]], tuple[list[np.ndarray], list[np.ndarray]]]

#: What a blanked source sentence reads.
BLANK = "."


def other_sources(documents: Sequence[Document]) -> list[Document]:
    """Every document's targets with the sources of the next document (the last takes the
    first's): sentence ``j`` reads the other document's sentence ``j mod its length``, so
    each document keeps its sentence count. Needs two documents or more."""
    if len(documents) < 2:
        raise InputMismatchError("other_sources needs at least two documents to swap sources")
    swapped = []
    for i, doc in enumerate(documents):
        other = documents[(i + 1) % len(documents)]
        src = tuple(other.src[j % len(other)] for j in range(len(doc)))
        swapped.append(dataclasses.replace(doc, src=src))
    return swapped


def blank_sources(documents: Sequence[Document]) -> list[Document]:
    """Every document with each source sentence replaced by :data:`BLANK`."""
    return [dataclasses.replace(doc, src=(BLANK,) * len(doc)) for doc in documents]


@dataclasses.dataclass(frozen=True)
class SourceSensitivity:
    """Log-likelihood per target token (nats) with the true, another document's and blank
    sources, over ``tokens`` target tokens; ``drop_*``: how much lower than the true one."""

    true: float
    other: float
    blank: float
    tokens: int

    @property
    def drop_other(self) -> float:
        return self.true - self.other

    @property
    def drop_blank(self) -> float:
        return self.true - self.blank


def per_token(score: Score, documents: Sequence[Document]) -> tuple[float, int]:
    """(total log-likelihood / target tokens, target tokens) of ``documents`` under ``score``;
    sentences the scorer left out (NaN) count nowhere."""
    logp, tokens = score(documents)
    total, count = 0.0, 0
    for values, lengths in zip(logp, tokens, strict=True):
        kept = ~np.isnan(values)
        total += float(np.sum(values[kept]))
        count += int(np.sum(lengths[kept]))
    if count == 0:
        raise InputMismatchError("no target token was scored (are the documents empty?)")
    return total / count, count


def source_sensitivity(score: Score, documents: Sequence[Document]) -> SourceSensitivity:
    """:class:`SourceSensitivity` of ``documents`` (two or more) under ``score``."""
    true, tokens = per_token(score, documents)
    other, _ = per_token(score, other_sources(documents))
    blank, _ = per_token(score, blank_sources(documents))
    return SourceSensitivity(true=true, other=other, blank=blank, tokens=tokens)


def token_variance_share(encodings: Any, mask: Any) -> float:
    """``sum_i |h_i - h_bar|^2 / sum_i |h_i|^2`` over the tokens with ``mask > 0`` of
    ``encodings [..., D]`` (``mask``: the leading shape), in float64. Raises
    :class:`InputMismatchError` when no token is real."""
    h = np.asarray(encodings, np.float64)
    keep = np.asarray(mask).reshape(h.shape[:-1]) > 0
    tokens = h[keep]
    if len(tokens) == 0:
        raise InputMismatchError("token_variance_share: the mask holds no real token")
    total = float(np.sum(tokens**2))
    if total == 0.0:
        return 0.0
    return float(np.sum((tokens - tokens.mean(axis=0)) ** 2)) / total


def captured_encoding(model: Model, params: Any, batch: dict[str, np.ndarray]) -> tuple[Any, Any]:
    """(encodings ``[..., D]``, their mask) of a grid ``batch``: the output of the call of the
    top-level module's ``encode`` (its first array when it returns several) and the
    ``src_mask`` it was given, reshaped to the encodings' leading shape, while
    :meth:`Model.score` runs on ``batch``. Raises :class:`InputMismatchError` for a model
    whose module encodes other than once through ``encode``."""
    found: list[tuple[Any, Any]] = []

    def interceptor(next_fun: Callable[..., Any], args: Any, kwargs: Any, context: Any) -> Any:
        out = next_fun(*args, **kwargs)
        if context.method_name == "encode" and not context.module.path:
            mask = args[1] if len(args) > 1 else kwargs["src_mask"]
            found.append((out[0] if isinstance(out, tuple) else out, mask))
        return out

    with nn.intercept_methods(interceptor):
        model.score(params, batch)
    if len(found) != 1:
        raise InputMismatchError(
            f"model {model.name!r}: its module encoded {len(found)} times through encode, not once"
        )
    encodings, mask = found[0]
    encodings = np.asarray(jax.device_get(encodings))
    mask = np.asarray(jax.device_get(mask))
    if mask.size != int(np.prod(encodings.shape[:-1])):
        raise InputMismatchError(
            f"model {model.name!r}: encodings {encodings.shape} do not match the source mask "
            f"{mask.shape}"
        )
    return encodings, mask.reshape(encodings.shape[:-1])


def largest_chunk_share(
    model: Model,
    params: Any,
    encode: Callable[[list[str]], list[list[int]]],
    config: pipeline_lib.PipelineConfig,
    documents: Sequence[Document],
) -> tuple[float, int]:
    """(:func:`token_variance_share` of the encoder output, its real source tokens) for the
    chunk of ``documents`` (as ``config`` cuts them, :func:`chunk_batches`) with the most
    source tokens."""
    rows = [row for doc in documents for row in chunk_batches(model, encode, config, doc)]
    if not rows:
        raise InputMismatchError("no chunk to encode (are the documents empty?)")
    row = max(rows, key=lambda r: int(np.sum(r["src_mask"] > 0)))
    encodings, mask = captured_encoding(model, params, row)
    return token_variance_share(encodings, mask), int(np.sum(mask > 0))
