"""Conditional cross-mutual information (CXMI; Fernandes et al. 2021, Sec. 2) beside Jean &
Cho (2019)'s Delta^D, teacher-forced, for any registered model.

``CXMI(C -> Y | X) = H(Y | X) - H(Y | X, C)``, estimated on a corpus with one model as
``sum_n [log p(y_n | x_n, C_n) - log p(y_n | x_n)] / sum_n T_n`` (per target token, ``T_n``
with EOS): the model's log-likelihood of the reference with its context minus without any.
Fernandes et al. score the context-agnostic term with the same context-aware model given no
context; so does :func:`cxmi`. Readings:

* **Context** of sentence ``n``: its document's previous sentences (source and reference
  target, teacher-forced), as :mod:`docnmt_jax.evaluation.contrastive` scores a contrastive
  instance, cut to what the model sees (:func:`context_view`): a chunk model (FINAL,
  doc2doc) the ``max_sentences - 1`` before it, a window model (DocT, Jean & Cho) its ``K``
  window sentences, a whole-document model (HM-GDC) all of them.
* **No context** (:func:`no_context_meaning`): the sentence scored alone -- a one-sentence
  chunk (chunk models), an all-padding window as for a document's first sentence (window
  models), a one-sentence document (HM-GDC). A sentence model never sees context: its CXMI
  is 0 by construction and nothing is scored.
* **By sentence distance** (``by_size``): CXMI with only the ``k`` previous sentences as
  context, for each ``k`` of ``sizes`` below the model's view (Fernandes et al., Fig. 2).
* **Delta^D** (Jean & Cho 2019, Sec. 4.4): ``sum_n [log p(y_n | x_n, C_n) - log mean_r
  p(y_n | x_n, C_r)] / sum_n T_n`` on the same windows, ``C_r`` another document's
  sentences of the same count (``draws`` draws,
  :func:`~docnmt_jax.evaluation.contrastive.with_context`): what the true context adds over a
  random one, where CXMI measures what it adds over none.

Sentences without previous sentences (a document's first) count with a difference of 0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from docnmt_jax.data.documents import Document
from docnmt_jax.data.tokenizer import Tokenizer
from docnmt_jax.evaluation import contrastive
from docnmt_jax.evaluation.context_marginal import log_mean_exp
from docnmt_jax.models.base import Model

#: Context sizes (previous sentences) of the by-distance breakdown.
DEFAULT_SIZES = (1, 2, 3, 5, 10)


@dataclasses.dataclass(frozen=True)
class Window:
    """A sentence with its previous sentences: the fields the forced-choice scorer reads,
    with one candidate (the reference)."""

    context_src: tuple[str, ...]
    src: str
    context_tgt: tuple[tuple[str, ...], ...]
    candidates: tuple[str, ...]
    correct: int = 0


def context_view(model: Model, max_sentences: int) -> int | None:
    """The previous sentences the forced-choice path shows ``model`` (None: all)."""
    if model.whole_documents:
        return None
    own = 0 if model.layout.sentence_level else max_sentences - 1
    return own + model.context_sentences


def no_context_meaning(model: Model) -> str:
    """What "no context" is for ``model`` (module docstring)."""
    if model.whole_documents:
        return "the sentence as a one-sentence document"
    if model.layout.sentence_level and not model.context_sentences:
        return "a sentence model: it never sees context (CXMI = 0 by construction)"
    if model.layout.sentence_level:
        return f"an all-padding window of {model.context_sentences} sentences"
    window = f" and no {model.context_sentences}-sentence window" if model.context_sentences else ""
    return f"the sentence as a one-sentence chunk{window}"


def sentence_windows(
    documents: Sequence[Document], size: int | None = None
) -> tuple[list[Window], list[str]]:
    """Every sentence with its ``size`` previous sentences (None: all), and its doc id."""
    windows, groups = [], []
    for doc in documents:
        for i in range(len(doc.src)):
            lo = 0 if size is None else max(0, i - size)
            windows.append(
                Window(tuple(doc.src[lo:i]), doc.src[i], (tuple(doc.tgt[lo:i]),), (doc.tgt[i],))
            )
            groups.append(doc.doc_id)
    return windows, groups


def window_scores(
    model: Model,
    params: Any,
    tokenizer: Tokenizer,
    windows: Sequence[Window],
    max_sentences: int,
    rows: int = 32,
    scorer: Callable[[Any, dict[str, np.ndarray]], Any] | None = None,
) -> np.ndarray:
    """``log p`` of every window's current reference (``[N]``), forced-choice path."""
    scores = contrastive.instance_scores(
        model,
        params,
        tokenizer,
        windows,  # type: ignore[arg-type]  (duck-typed single-candidate instances)
        max_sentences=max_sentences,
        rows=rows,
        scorer=scorer,
    )
    return np.array([s[0] for s in scores], np.float64)


def cxmi(
    model: Model,
    params: Any,
    tokenizer: Tokenizer,
    documents: Sequence[Document],
    max_sentences: int = 20,
    sizes: Sequence[int] = DEFAULT_SIZES,
    draws: int = 3,
    seed: int = 0,
    rows: int = 32,
    scorer: Callable[[Any, dict[str, np.ndarray]], Any] | None = None,
) -> dict[str, Any]:
    """CXMI per target token (true context vs none), by context size, and Delta^D (true vs
    ``draws`` random contexts), on ``documents`` (module docstring)."""
    view = context_view(model, max_sentences)
    windows, groups = sentence_windows(documents, view)
    references = [w.candidates[0] for w in windows]
    tokens = np.array([len(ids) + 1 for ids in tokenizer.encode_batch(references)])
    total = int(tokens.sum())
    result: dict[str, Any] = {
        "sentences": len(windows),
        "tokens": total,
        "with_context": sum(bool(w.context_src) for w in windows),
        "view": "all previous sentences" if view is None else view,
        "no_context": no_context_meaning(model),
    }
    if view == 0:
        return {**result, "cxmi": 0.0, "by_size": {}, "delta_d": None, "draws": 0}

    def score(ws: Sequence[Any]) -> np.ndarray:
        return window_scores(model, params, tokenizer, ws, max_sentences, rows, scorer)

    alone = score(contrastive.with_context(windows, "none"))  # type: ignore[arg-type]
    true = score(windows)
    by_size = {}
    for k in sorted(set(sizes)):
        if view is None or k < view:
            cut = sentence_windows(documents, k)[0]
            by_size[str(k)] = float(np.sum(score(cut) - alone) / total)
    random = [
        score(contrastive.with_context(windows, "random", groups, seed + r))  # type: ignore[arg-type]
        for r in range(draws)
    ]
    delta_d = float(np.sum(true - log_mean_exp(np.stack(random))) / total) if draws else None
    return {
        **result,
        "cxmi": float(np.sum(true - alone) / total),
        "by_size": by_size,
        "delta_d": delta_d,
        "draws": draws,
        "seeds": list(range(seed, seed + draws)),
    }


def format_cxmi(result: dict[str, Any], title: str) -> str:
    """A readable block of :func:`cxmi`'s result."""
    lines = [
        title,
        f"  CXMI (true context - none)      {result['cxmi']:+.4f} nats/token "
        f"({result['tokens']} tokens, {result['sentences']} sentences, "
        f"{result['with_context']} with context; view: {result['view']})",
        f"  no context means: {result['no_context']}",
    ]
    if result["delta_d"] is not None:
        lines.append(
            f"  Delta^D (true - random, Jean & Cho) {result['delta_d']:+.4f} nats/token "
            f"({result['draws']} draws)"
        )
    for k, value in result["by_size"].items():
        lines.append(f"  CXMI with {k:>2} previous sentences {value:+.4f}")
    return "\n".join(lines)
