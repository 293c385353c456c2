"""Document-level translation metrics: s-BLEU, d-BLEU and chrF via sacreBLEU.

All metrics use sacreBLEU's defaults on detokenised text (13a tokenisation for BLEU, cased
unless ``lowercase``):

* **s-BLEU**: corpus BLEU over the aligned sentences;
* **d-BLEU**: corpus BLEU over documents, each document's sentences joined with one space
  (Liu et al., 2020; Zheng et al., 2020's BLEU_doc; G-Transformer);
* **chrF**: corpus chrF over the aligned sentences;
* optionally **pronoun overlap** (:mod:`docnmt_jax.evaluation.pronouns`; not APT).

:func:`score_documents` scores aligned lists of documents in memory (e.g. dev BLEU in the
training loop). :func:`evaluate_files` reads, aligns and scores a hypothesis and a reference
file. Accepted files (UTF-8; a file is a TSV if its first non-blank line holds a tab):

* hypotheses: TSV ``doc_id<TAB>hyp`` (optional header ``doc_id<TAB>hyp``), one row per
  sentence, a document's rows contiguous; an empty ``hyp`` is an empty hypothesis. Or plain
  text, one sentence per line, blank lines between documents.
* references: the corpus TSV ``doc_id<TAB>src<TAB>tgt`` (optional header
  ``doc_id<TAB>src<TAB>tgt``), a two-column TSV ``doc_id<TAB>tgt`` (optional header
  ``doc_id<TAB>tgt``, ``doc_id<TAB>ref`` or ``doc_id<TAB>hyp``), or plain text as above.
  Empty reference sentences are errors.

Plain-text documents have no ids: they are called ``doc N`` (``N`` 1-based) and, if either
file is plain text, documents are matched by position; otherwise by doc id, in the
reference's order. Files are read by :mod:`docnmt_jax.data.readers` (the readers of training
and translation: one fault, one message). Malformed files and mismatches raise
:class:`~docnmt_jax.data.documents.CorpusFormatError` (one line, ``FILE[:LINE]: reason``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Sequence
from typing import Any

from sacrebleu.metrics import BLEU, CHRF

from docnmt_jax.data import readers
from docnmt_jax.data.documents import CorpusFormatError
from docnmt_jax.data.readers import _is_blank
from docnmt_jax.errors import InputMismatchError
from docnmt_jax.evaluation.pronouns import format_pronoun_report, pronoun_scores

PathLike = str | os.PathLike

_MAX_LISTED = 5  # Document ids listed in one error message.


@dataclasses.dataclass(frozen=True)
class TextDocument:
    """One side of a document: its sentences and where it starts in its file.

    ``positional`` is True when the file carries no ids (plain text) and ``doc_id`` is
    ``doc N``.
    """

    doc_id: str
    sentences: tuple[str, ...]
    path: str
    line: int
    positional: bool = False

    def __len__(self) -> int:
        return len(self.sentences)

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


# ---------------------------------------------------------------------------------------------
# Reading.


def _plain_documents(path: str) -> list[TextDocument]:
    """The blank-line separated documents of a plain-text file, called ``doc N``."""
    return [
        TextDocument(f"doc {n}", tuple(block.texts), path, block.start, positional=True)
        for n, block in enumerate(readers.iter_text_blocks(path), start=1)
    ]


def _tsv_documents(path: str, layout: readers.TsvLayout, column: str) -> list[TextDocument]:
    """The documents of a TSV of ``layout`` (:func:`~docnmt_jax.data.readers.iter_tsv_rows`),
    their sentences the text of ``column`` (a blank one ``""``)."""
    rows: list[tuple[str, int, list[str]]] = []  # (doc_id, first line, sentences)
    for row in readers.iter_tsv_rows(path, layout):
        if not rows or row.doc_id != rows[-1][0]:
            rows.append((row.doc_id, row.line, []))
        text = row.texts[column]
        rows[-1][2].append("" if _is_blank(text) else text)
    return [TextDocument(d, tuple(sents), path, line) for d, line, sents in rows]


def read_hypotheses(path: PathLike) -> list[TextDocument]:
    """Reads system output: TSV ``doc_id<TAB>hyp`` (header optional) or blank-line separated
    plain text. Empty hypotheses are allowed in the TSV (as ``""``)."""
    path = os.fspath(path)
    if readers.is_tsv(path):
        return _tsv_documents(path, readers.HYPOTHESIS_TSV, "hyp")
    return _plain_documents(path)


def read_references(path: PathLike) -> list[TextDocument]:
    """Reads references: TSV ``doc_id<TAB>src<TAB>tgt`` or ``doc_id<TAB>tgt`` (header
    optional), or blank-line separated plain text. Empty references are errors."""
    path = os.fspath(path)
    if readers.is_tsv(path):
        return _tsv_documents(path, readers.REFERENCE_TSV, "tgt")
    return _plain_documents(path)


# ---------------------------------------------------------------------------------------------
# Alignment.


def _listing(docs: Sequence[TextDocument]) -> str:
    shown = ", ".join(f"{d.doc_id!r} ({d.where})" for d in docs[:_MAX_LISTED])
    more = f" and {len(docs) - _MAX_LISTED} more" if len(docs) > _MAX_LISTED else ""
    return shown + more


def align_documents(
    hyp_docs: Sequence[TextDocument], ref_docs: Sequence[TextDocument]
) -> list[tuple[TextDocument, TextDocument]]:
    """Pairs hypothesis and reference documents, in the reference's order.

    By doc id when both sides have ids, else by position. Raises
    :class:`CorpusFormatError` naming missing/extra documents, or the first document whose
    sentence counts differ (with both counts and both start lines).
    """
    if not ref_docs:
        raise CorpusFormatError("<reference>", None, "the reference holds no documents")
    hyp_path, ref_path = hyp_docs[0].path if hyp_docs else "<hypothesis>", ref_docs[0].path
    by_position = any(d.positional for d in (*hyp_docs[:1], *ref_docs[:1]))
    if by_position:
        if len(hyp_docs) != len(ref_docs):
            n = min(len(hyp_docs), len(ref_docs))
            extra = (
                f"reference documents without a hypothesis: {_listing(ref_docs[n:])}"
                if len(ref_docs) > n
                else f"hypothesis documents beyond the reference: {_listing(hyp_docs[n:])}"
            )
            raise CorpusFormatError(
                hyp_path,
                None,
                f"{len(hyp_docs)} hypothesis documents but {len(ref_docs)} in {ref_path} "
                f"(matched by position); {extra}",
            )
        pairs = list(zip(hyp_docs, ref_docs, strict=True))
    else:
        hyp_by_id = {d.doc_id: d for d in hyp_docs}
        ref_ids = {d.doc_id for d in ref_docs}
        missing = [d for d in ref_docs if d.doc_id not in hyp_by_id]
        extra = [d for d in hyp_docs if d.doc_id not in ref_ids]
        if missing or extra:
            parts = []
            if missing:
                parts.append(f"{len(missing)} reference documents missing: {_listing(missing)}")
            if extra:
                parts.append(f"{len(extra)} documents not in the reference: {_listing(extra)}")
            raise CorpusFormatError(
                hyp_path, None, f"document ids differ from {ref_path}: " + "; ".join(parts)
            )
        pairs = [(hyp_by_id[r.doc_id], r) for r in ref_docs]
    for h, r in pairs:
        if len(h) != len(r):
            name = r.doc_id if not r.positional else h.doc_id
            raise CorpusFormatError(
                h.path,
                h.line,
                f"document {name!r} has {len(h)} hypothesis sentences starting at line "
                f"{h.line} but {len(r)} reference sentences in {r.path} starting at line "
                f"{r.line}",
            )
    return pairs


# ---------------------------------------------------------------------------------------------
# Scoring.


def _bleu_result(metric: BLEU, hyps: list[str], refs: list[str]) -> dict[str, Any]:
    s = metric.corpus_score(hyps, [refs])
    return {
        "score": s.score,
        "signature": str(metric.get_signature()),
        "precisions": list(s.precisions),
        "bp": s.bp,
        "ratio": s.ratio,
        "sys_len": s.sys_len,
        "ref_len": s.ref_len,
        "counts": list(s.counts),
        "totals": list(s.totals),
    }


def score_documents(
    hyp_docs: Sequence[Sequence[str]],
    ref_docs: Sequence[Sequence[str]],
    lowercase: bool = False,
) -> dict[str, Any]:
    """Scores aligned documents (each a list of sentences): s-BLEU, d-BLEU and chrF.

    Returns ``{"s_bleu", "d_bleu": {score, signature, precisions, bp, ratio, sys_len,
    ref_len, counts, totals}, "chrf": {score, signature, char_order, word_order, beta},
    "documents", "sentences", "empty_hypotheses", "lowercase"}``. Raises ValueError if the
    documents or their sentence counts are not aligned, or there is nothing to score.
    """
    if len(hyp_docs) != len(ref_docs):
        raise InputMismatchError(
            f"{len(hyp_docs)} hypothesis documents but {len(ref_docs)} references"
        )
    for k, (h, r) in enumerate(zip(hyp_docs, ref_docs, strict=True)):
        if len(h) != len(r):
            raise InputMismatchError(
                f"document {k}: {len(h)} hypothesis sentences but {len(r)} reference sentences"
            )
    hyps = [s for d in hyp_docs for s in d]
    refs = [s for d in ref_docs for s in d]
    if not refs:
        raise InputMismatchError("no sentences to score")
    chrf = CHRF(lowercase=lowercase)
    c = chrf.corpus_score(hyps, [refs])
    return {
        "s_bleu": _bleu_result(BLEU(lowercase=lowercase), hyps, refs),
        "d_bleu": _bleu_result(
            BLEU(lowercase=lowercase),
            [" ".join(d) for d in hyp_docs],
            [" ".join(d) for d in ref_docs],
        ),
        "chrf": {
            "score": c.score,
            "signature": str(chrf.get_signature()),
            "char_order": c.char_order,
            "word_order": c.word_order,
            "beta": c.beta,
        },
        "documents": len(ref_docs),
        "sentences": len(refs),
        "empty_hypotheses": sum(1 for s in hyps if not s.strip()),
        "lowercase": lowercase,
    }


def evaluate_files(
    hyp_path: PathLike,
    ref_path: PathLike,
    lowercase: bool = False,
    pronouns: str | Iterable[str] | None = None,
) -> dict:
    """Reads, aligns (see :func:`align_documents`) and scores two files; the result of
    :func:`score_documents` plus ``hyp`` and ``ref`` (the paths). With ``pronouns`` (a
    language key or a word list) also ``"pronouns"``: :func:`pronoun_scores` of the aligned
    sentences (always case-insensitive)."""
    hyp_path, ref_path = os.fspath(hyp_path), os.fspath(ref_path)
    ref_docs = read_references(ref_path)
    hyp_docs = read_hypotheses(hyp_path)
    pairs = align_documents(hyp_docs, ref_docs)
    result = score_documents(
        [h.sentences for h, _ in pairs], [r.sentences for _, r in pairs], lowercase=lowercase
    )
    if pronouns is not None:
        result["pronouns"] = pronoun_scores(
            [s for h, _ in pairs for s in h.sentences],
            [s for _, r in pairs for s in r.sentences],
            pronouns,
        )
    return {**result, "hyp": hyp_path, "ref": ref_path}


def format_report(result: dict[str, Any]) -> str:
    """The human-readable block printed by ``launch/evaluate.py``."""
    lines = []
    for key, name in (("s_bleu", "s-BLEU"), ("d_bleu", "d-BLEU")):
        r = result[key]
        prec = "/".join(f"{p:.1f}" for p in r["precisions"])
        lines.append(f"{name:9s}{r['score']:6.2f}  ({r['signature']})")
        lines.append(
            f"{'':15s}{prec} (BP = {r['bp']:.3f} ratio = {r['ratio']:.3f} "
            f"hyp_len = {r['sys_len']} ref_len = {r['ref_len']})"
        )
    c = result["chrf"]
    lines.append(f"{'chrF':9s}{c['score']:6.2f}  ({c['signature']})")
    lines.append(f"{'documents':11s}{result['documents']}")
    lines.append(
        f"{'sentences':11s}{result['sentences']}  ({result['empty_hypotheses']} empty hypotheses)"
    )
    if "pronouns" in result:
        lines.append(format_pronoun_report(result["pronouns"]))
    return "\n".join(lines)
