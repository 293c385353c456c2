"""Evaluation: s-BLEU, d-BLEU and chrF of document translations (sacreBLEU)."""

from docnmt_jax.evaluation.metrics import (
    TextDocument,
    align_documents,
    evaluate_files,
    format_report,
    read_hypotheses,
    read_references,
    score_documents,
)

__all__ = [
    "TextDocument",
    "align_documents",
    "evaluate_files",
    "format_report",
    "read_hypotheses",
    "read_references",
    "score_documents",
]
