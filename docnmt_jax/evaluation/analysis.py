"""The analyses of Zheng et al. (2020), Sec. 5, for any registered model through the model
interface: the context-size curve (Fig. 3), the sentence-to-sentence attention map (Fig. 4)
and single-sentence translation (Table 2). ``launch/analyze.py`` is the command line.

Readings (measured: docs/log/2026-11-25-analyses.md):

* **Context size k (Fig. 3)**: sentence ``i`` of a document is translated inside the window
  document ``[i-k .. i]`` (its ``k`` previous sentences, fewer at the document's start) and
  only the window's last translation is kept (:func:`window_documents`), so it sees exactly
  its previous ``k`` sentences and nothing after it; ``k = 0`` is the sentence alone. The
  model lays the window out as it lays out any document (FINAL: the window is the chunk, its
  first sentence segment 0; the XL memory is the window's own translation). Cost: every
  sentence is translated ``k + 1`` times. Exact shortcuts (:func:`context_plan`): a model
  without context (sentence-level, no window) is translated once and its curve is flat; a
  window model (``context_sentences = K > 0``: DocT, Jean & Cho) reads only its ``K``
  predecessors, so for ``k >= K`` the window equals the document translation, done once. A
  chunk model sees at most its chunk: windows are cut to ``max_sentences`` sentences (``k``
  beyond ``max_sentences - 1`` gives that; the TSV's ``mean_context`` is what the sentences
  saw); a whole-document model (HM-GDC) has no such limit.
* **Attention map (Fig. 4)**: :meth:`~docnmt_jax.models.base.Model.sentence_attention` of one
  chunk of a document as the translator's pipeline cuts it (the first by default; chunks of
  ``data.max_sentences``, the whole document for whole-document models), laid out as chunks
  (``[1, S, T]``, whatever the model's decoding layout). Rows = attending sentence ``k``,
  columns = attended sentence ``kappa``; rows of real sentences sum to 1 (window models: over
  the window inside the chunk; the document's first sentence has no context and a zero row).
* **Single sentences (Table 2)**: every sentence translated as its own one-sentence document
  (no context; the window ``k = 0``), scored against the document translation.

Outputs are written through a temporary file and renamed (:func:`write_atomic`).
"""

from __future__ import annotations

import collections
import dataclasses
import math
import os
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Protocol

import jax
import numpy as np
from tqdm.auto import tqdm

from docnmt_jax.data import builder
from docnmt_jax.data import pipeline as pipeline_lib
from docnmt_jax.data.documents import Document
from docnmt_jax.errors import InputMismatchError
from docnmt_jax.evaluation.metrics import score_documents
from docnmt_jax.files import atomic_path, write_atomic, write_hypotheses
from docnmt_jax.models.base import Model

#: Fig. 3's x-axis (Zheng et al. 2020): sentences of context.
DEFAULT_SIZES = (0, 1, 2, 4, 8, 16, 20)
#: Window documents translated per call of the translator (progress granularity).
WINDOW_BLOCK = 256


class DocumentTranslator(Protocol):
    """What the analyses use of :class:`~docnmt_jax.decoding.translator.Translator`."""

    model: Model
    pipeline_config: pipeline_lib.PipelineConfig

    def translate(self, documents: Sequence[Document]) -> list[list[str]]: ...


# ------------------------------------------------------------------------------- windows


@dataclasses.dataclass(frozen=True)
class ContextPlan:
    """How a model translates every sentence with exactly its previous ``k`` sentences:
    ``windows`` (window documents, :func:`window_documents`, of at most ``limit + 1``
    sentences; ``limit`` None: no cap) or the documents as they are (``windows`` False: the
    same translation, cheaper). ``seen(i)`` is how many previous sentences sentence ``i``
    then sees; ``note`` says why, for the report."""

    windows: bool
    k: int
    limit: int | None
    window: int | None  # a window model's K (it sees min(i, K) in a document)
    note: str = ""

    @property
    def effective_k(self) -> int:
        return self.k if self.limit is None else min(self.k, self.limit)

    def seen(self, i: int) -> int:
        """Previous sentences seen by sentence ``i`` of a document."""
        if self.windows:
            return min(i, self.effective_k)
        return 0 if self.window is None else min(i, self.window)

    @property
    def key(self) -> tuple[Any, ...]:
        """Plans with the same key give the same translations."""
        return ("windows", self.effective_k) if self.windows else ("documents",)


def context_plan(model: Model, max_sentences: int, k: int) -> ContextPlan:
    """The :class:`ContextPlan` of context size ``k`` for ``model`` whose translator cuts
    documents into chunks of ``max_sentences`` (module docstring)."""
    if k < 0:
        raise InputMismatchError(f"context size must be >= 0, got {k}")
    K = model.context_sentences
    if not model.uses_context:
        note = f"model {model.name!r} translates sentences alone: no context, a flat curve"
        return ContextPlan(False, k, None, None, note)
    if K > 0 and k >= K:
        note = f"reads only its {K} previous sentences: k >= {K} is the document translation"
        return ContextPlan(False, k, None, K, note)
    limit = None if model.whole_documents or K > 0 else max_sentences - 1
    note = ""
    if limit is not None and k > limit:
        note = f"chunks of {max_sentences} sentences: at most {limit} previous sentences"
    return ContextPlan(True, k, limit, None, note)


def window_documents(
    documents: Sequence[Document], k: int, limit: int | None = None
) -> list[Document]:
    """One window document per sentence, in document order: sentence ``i`` of a document
    with its ``min(k, limit)`` previous sentences (fewer at the document's start), ids
    ``DOC#i``. Targets are kept (the translator ignores them)."""
    k = k if limit is None else min(k, limit)
    windows = []
    for doc in documents:
        for i in range(len(doc)):
            start = max(0, i - k)
            windows.append(
                Document(f"{doc.doc_id}#{i}", doc.src[start : i + 1], doc.tgt[start : i + 1])
            )
    return windows


def translate_in_context(
    translator: DocumentTranslator,
    documents: Sequence[Document],
    plan: ContextPlan,
    progress: bool = True,
    desc: str = "",
) -> list[list[str]]:
    """The translation of every sentence of ``documents`` under ``plan``: the documents as
    they are, or the last sentence of every window (:func:`window_documents`), translated
    ``WINDOW_BLOCK`` windows at a time."""
    if not plan.windows:
        return translator.translate(documents)
    windows = window_documents(documents, plan.k, plan.limit)
    last: list[str] = []
    with tqdm(total=len(windows), unit="sent", desc=desc, disable=not progress) as bar:
        for start in range(0, len(windows), WINDOW_BLOCK):
            block = windows[start : start + WINDOW_BLOCK]
            last.extend(hyps[-1] for hyps in translator.translate(block))
            bar.update(len(block))
    out, position = [], 0
    for doc in documents:
        out.append(last[position : position + len(doc)])
        position += len(doc)
    return out


def single_sentence_stream(
    translator: Any, documents: Iterable[tuple[str, list[str]]], block_documents: int = 256
) -> Iterator[tuple[str, list[str]]]:
    """``(doc_id, translations)`` in input order, every sentence translated as its own
    one-sentence document (no context; Zheng et al. 2020, Table 2), streamed through
    ``translator.translate_stream`` (``block_documents`` one-sentence documents at a time)."""
    pending: collections.deque[tuple[str, int]] = collections.deque()

    def one_sentence_documents() -> Iterator[tuple[str, list[str]]]:
        for doc_id, sentences in documents:
            pending.append((doc_id, len(sentences)))
            for sentence in sentences:
                yield doc_id, [sentence]

    hyps: list[str] = []

    def ready() -> Iterator[tuple[str, list[str]]]:
        while pending and len(hyps) >= pending[0][1]:
            doc_id, n = pending.popleft()
            yield doc_id, hyps[:n]
            del hyps[:n]

    for _, (hyp,) in translator.translate_stream(one_sentence_documents(), block_documents):
        hyps.append(hyp)
        yield from ready()
    yield from ready()
    if pending or hyps:
        raise RuntimeError("single-sentence translations out of step with the input (a bug)")


# ---------------------------------------------------------------------------- Fig. 3 curve


@dataclasses.dataclass
class CurvePoint:
    """One context size of the curve: scores, sentence count, mean previous sentences seen,
    the hypotheses (per document) and the plan's note."""

    k: int
    s_bleu: float
    d_bleu: float
    sentences: int
    mean_context: float
    hypotheses: list[list[str]]
    note: str = ""


def context_curve(
    translator: DocumentTranslator,
    documents: Sequence[Document],
    sizes: Sequence[int],
    progress: bool = True,
) -> list[CurvePoint]:
    """Fig. 3: s-BLEU and d-BLEU of ``documents`` (with references) translated with every
    context size in ``sizes`` (:func:`context_plan`; plans that give the same translation are
    translated once)."""
    refs = [list(doc.tgt) for doc in documents]
    max_sentences = translator.pipeline_config.max_sentences
    done: dict[tuple[Any, ...], list[list[str]]] = {}
    points = []
    for k in tqdm(sizes, unit="k", desc="context sizes", disable=not progress):
        plan = context_plan(translator.model, max_sentences, k)
        if plan.key not in done:
            done[plan.key] = translate_in_context(translator, documents, plan, progress, f"k={k}")
        hyps = done[plan.key]
        scores = score_documents(hyps, refs)
        seen = [plan.seen(i) for doc in documents for i in range(len(doc))]
        points.append(
            CurvePoint(
                k=k,
                s_bleu=scores["s_bleu"]["score"],
                d_bleu=scores["d_bleu"]["score"],
                sentences=scores["sentences"],
                mean_context=float(np.mean(seen)) if seen else 0.0,
                hypotheses=hyps,
                note=plan.note,
            )
        )
    return points


def format_curve(points: Sequence[CurvePoint]) -> str:
    """The printed table of :func:`context_curve`."""
    lines = [f"{'k':>4s} {'s-BLEU':>7s} {'d-BLEU':>7s} {'sentences':>10s} {'mean ctx':>9s}  note"]
    for p in points:
        lines.append(
            f"{p.k:4d} {p.s_bleu:7.2f} {p.d_bleu:7.2f} {p.sentences:10d} "
            f"{p.mean_context:9.2f}  {p.note}".rstrip()
        )
    return "\n".join(lines)


def write_curve(
    points: Sequence[CurvePoint], documents: Sequence[Document], out_dir: str, title: str
) -> list[str]:
    """Writes ``context_curve.tsv`` (k, s_bleu, d_bleu, sentences, mean_context),
    ``context_curve.png`` (s-BLEU and d-BLEU against k) and ``hyp.k{K}.tsv`` per size into
    ``out_dir``; returns the paths."""
    rows = ["k\ts_bleu\td_bleu\tsentences\tmean_context"]
    rows += [
        f"{p.k}\t{p.s_bleu:.4f}\t{p.d_bleu:.4f}\t{p.sentences}\t{p.mean_context:.4f}"
        for p in points
    ]
    paths = [write_atomic(os.path.join(out_dir, "context_curve.tsv"), "\n".join(rows) + "\n")]
    for p in points:
        paths.append(
            write_hypotheses(os.path.join(out_dir, f"hyp.k{p.k}.tsv"), documents, p.hypotheses)
        )
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    ks = [p.k for p in points]
    ax.plot(ks, [p.s_bleu for p in points], "o-", label="s-BLEU")
    ax.plot(ks, [p.d_bleu for p in points], "s--", label="d-BLEU")
    ax.set_xlabel("previous sentences of context k")
    ax.set_ylabel("BLEU")
    ax.set_xticks(ks)
    notes = sorted({p.note for p in points if p.note})
    ax.set_title(title + ("\n" + "; ".join(notes) if notes else ""), fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    paths.append(save_figure(fig, os.path.join(out_dir, "context_curve.png")))
    return paths


# ------------------------------------------------------------------------ Table 2: sentences


def single_sentence_comparison(
    translator: DocumentTranslator, documents: Sequence[Document], progress: bool = True
) -> dict[str, Any]:
    """Table 2: ``documents`` translated as documents and every sentence as its own
    one-sentence document (:func:`context_plan` with ``k = 0``: a model without context is
    translated once), each scored (s-BLEU, d-BLEU, sacreBLEU). Returns ``{"document",
    "single_sentence": {"s_bleu", "d_bleu", "hypotheses"}, "sentences", "note"}``."""
    refs = [list(doc.tgt) for doc in documents]
    document = translator.translate(documents)
    plan = context_plan(translator.model, translator.pipeline_config.max_sentences, 0)
    if plan.windows:
        single = translate_in_context(translator, documents, plan, progress, "sentences")
    else:
        single = document
    result: dict[str, Any] = {"note": plan.note}
    for name, hyps in (("document", document), ("single_sentence", single)):
        scores = score_documents(hyps, refs)
        result[name] = {
            "s_bleu": scores["s_bleu"]["score"],
            "d_bleu": scores["d_bleu"]["score"],
            "hypotheses": hyps,
        }
        result["sentences"] = scores["sentences"]
    return result


def format_single_sentence(result: dict[str, Any]) -> str:
    """The printed side-by-side table of :func:`single_sentence_comparison`."""
    d, s = result["document"], result["single_sentence"]
    lines = [
        f"{'':18s}{'s-BLEU':>8s}{'d-BLEU':>8s}",
        f"{'document':18s}{d['s_bleu']:8.2f}{d['d_bleu']:8.2f}",
        f"{'single sentences':18s}{s['s_bleu']:8.2f}{s['d_bleu']:8.2f}",
        f"{'difference':18s}{s['s_bleu'] - d['s_bleu']:+8.2f}{s['d_bleu'] - d['d_bleu']:+8.2f}",
        f"({result['sentences']} sentences{'; ' + result['note'] if result['note'] else ''})",
    ]
    return "\n".join(lines)


def write_single_sentence(
    result: dict[str, Any], documents: Sequence[Document], out_dir: str
) -> list[str]:
    """Writes ``single_sentence.tsv`` (translation, s_bleu, d_bleu, sentences) and the
    hypotheses ``hyp.document.tsv``, ``hyp.single_sentence.tsv`` into ``out_dir``."""
    rows = ["translation\ts_bleu\td_bleu\tsentences"]
    paths = []
    for name in ("document", "single_sentence"):
        r = result[name]
        rows.append(f"{name}\t{r['s_bleu']:.4f}\t{r['d_bleu']:.4f}\t{result['sentences']}")
        paths.append(
            write_hypotheses(os.path.join(out_dir, f"hyp.{name}.tsv"), documents, r["hypotheses"])
        )
    table = write_atomic(os.path.join(out_dir, "single_sentence.tsv"), "\n".join(rows) + "\n")
    return [table, *paths]


# --------------------------------------------------------------------------- Fig. 4 map


@dataclasses.dataclass
class AttentionMap:
    """Fig. 4 for one chunk: ``matrix [n, n]`` (row = attending sentence, column = attended
    sentence, the chunk's real sentences), their indices in the document and sources."""

    doc_id: str
    chunk: int
    chunks: int
    sentences: list[int]
    sources: list[str]
    matrix: np.ndarray


def chunk_batches(
    model: Model,
    encode: Callable[[list[str]], list[list[int]]],
    config: pipeline_lib.PipelineConfig,
    document: Document,
) -> list[dict[str, np.ndarray]]:
    """The grid rows ``[1, S, T]`` of ``document``'s chunks as ``config``'s pipeline cuts
    them with ``model``'s window and whole documents (the data builder's decoding config),
    laid out as chunks (``sentence_level`` off, one chunk per search step), in order."""
    config = dataclasses.replace(
        builder.pipeline_config(model.data_spec(), config, decoding=True),
        sentence_level=False,
        sequential_sentences=False,
        shuffle=False,
        num_epochs=1,
        pad_batch=True,
    )
    plan = pipeline_lib.plan_batches([document], encode, config)
    rows = []
    for batch in pipeline_lib.numpy_batches(plan):
        for r in np.flatnonzero(batch["doc_index"] >= 0):
            rows.append({key: value[r : r + 1] for key, value in batch.items()})
    return sorted(rows, key=lambda row: int(row["chunk_index"][0]))


def attention_map(
    model: Model,
    params: Any,
    encode: Callable[[list[str]], list[list[int]]],
    config: pipeline_lib.PipelineConfig,
    document: Document,
    chunk: int = 0,
) -> AttentionMap:
    """Fig. 4 of chunk ``chunk`` of ``document`` (:func:`chunk_batches`) from the model's
    :meth:`~docnmt_jax.models.base.Model.sentence_attention` (which raises
    :class:`~docnmt_jax.models.base.ModelError` for a model without attention across
    sentences). Raises ValueError for a chunk the document does not have."""
    rows = chunk_batches(model, encode, config, document)
    if not 0 <= chunk < len(rows):
        raise InputMismatchError(
            f"document {document.doc_id!r} has {len(rows)} chunk(s) (0..{len(rows) - 1}), "
            f"not chunk {chunk}"
        )
    row = rows[chunk]
    matrix = np.asarray(jax.device_get(jax.jit(model.sentence_attention)(params, row)))[0]
    n = int(np.sum(row["sentence_mask"][0] > 0))
    offset = int(row["sentence_offset"][0])
    sentences = list(range(offset, offset + n))
    return AttentionMap(
        doc_id=document.doc_id,
        chunk=chunk,
        chunks=len(rows),
        sentences=sentences,
        sources=[document.src[i] for i in sentences],
        matrix=matrix[:n, :n].astype(np.float64),
    )


def write_attention(amap: AttentionMap, prefix: str, title: str) -> list[str]:
    """Writes ``PREFIX.tsv`` (per attending sentence: its slot ``k`` in the chunk, its index
    in the document, ``alpha_0 .. alpha_{n-1}``, the row sum, its source) and ``PREFIX.png``
    (the labelled heatmap); returns the two paths."""
    n = len(amap.sentences)
    header = ["k", "sentence", *(f"alpha_{c}" for c in range(n)), "row_sum", "source"]
    lines = ["\t".join(header)]
    for k in range(n):
        values = "\t".join(f"{v:.6f}" for v in amap.matrix[k])
        source = amap.sources[k].replace("\t", " ")
        lines.append(f"{k}\t{amap.sentences[k]}\t{values}\t{amap.matrix[k].sum():.6f}\t{source}")
    paths = [write_atomic(prefix + ".tsv", "\n".join(lines) + "\n")]
    plt = _pyplot()
    size = min(max(4.0, 0.35 * n + 2.0), 16.0)
    fig, ax = plt.subplots(figsize=(size + 1.0, size))
    image = ax.imshow(amap.matrix, cmap="viridis", vmin=0.0, interpolation="nearest")
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="alpha (row sums to 1)")
    labels = [str(i) for i in amap.sentences]
    step = max(1, math.ceil(n / 40))
    ax.set_xticks(range(0, n, step), labels[::step], rotation=90 if n > 20 else 0)
    ax.set_yticks(range(0, n, step), labels[::step])
    ax.set_xlabel("attended sentence kappa (index in the document)")
    ax.set_ylabel("attending sentence k (index in the document)")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    paths.append(save_figure(fig, prefix + ".png"))
    return paths


# ------------------------------------------------------------------------------- writing


def save_figure(fig: Any, path: str) -> str:
    """Saves a matplotlib figure as PNG through a temporary file and a rename; closes it."""
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format="png", dpi=120)
    finally:
        _pyplot().close(fig)
    return path


def file_name(text: str) -> str:
    """``text`` usable in a file name (document ids: ``Ruth.1`` stays, ``a/b`` -> ``a_b``)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._") or "doc"


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
