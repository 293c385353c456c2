"""Paired significance of every document row of the results table against its same-token
sentence control (:mod:`docnmt_jax.evaluation.significance`: sacreBLEU's paired bootstrap
and approximate randomisation; s-BLEU over sentences, d-BLEU over chapters).

Controls: a row trained from scratch against the sentence Transformer of its own seed (seed
rows pair seed for seed: ``final_seed1`` against ``transformer_seed1``; seeds are not pooled);
a pretrain -> finetune row against the Transformer continued for the same tokens
(:data:`~experiments.results_rows.CONTROL`); HM-GDC on RNNSearch against RNNSearch. The
controls themselves are not tested. Each test reads the two rows' ``test.hyp.tsv``; its result
is kept in ``ROW/paired.json`` keyed by both files' contents, so a rerun recomputes only what
changed.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from typing import Any

from docnmt_jax.data.documents import Document
from docnmt_jax.evaluation import significance
from docnmt_jax.evaluation.metrics import TextDocument, align_documents, read_hypotheses
from docnmt_jax.evaluation.multiple_testing import holm_by_key

#: Rows that are controls (never tested) or have no sentence control of their kind.
SENTENCE_ROWS = ("transformer", "transformer_continued", "rnnsearch")


def control_of(row: Any, names: Sequence[str]) -> str | None:
    """The same-token sentence control of ``row`` among ``names`` (None: ``row`` is a
    control, or its control is not in the table)."""
    base = row.name.split("_seed")[0]
    if base in SENTENCE_ROWS:
        return None
    if row.name == "rnnsearch_hmgdc":
        control = "rnnsearch"
    elif row.init_from:  # seed k's finetune against seed k's control, where it exists
        seeded = f"transformer_continued_seed{row.seed}"
        control = seeded if row.seed and seeded in names else "transformer_continued"
    else:
        control = "transformer" + (f"_seed{row.seed}" if row.seed else "")
    return control if control in names else None


def _digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _hypotheses(path: str, references: Sequence[Document]) -> list[list[str]]:
    refs = [TextDocument(d.doc_id, tuple(d.tgt), "references", 0) for d in references]
    return [list(h.sentences) for h, _ in align_documents(read_hypotheses(path), refs)]


def paired_rows(
    row_list: Sequence[Any],
    row_dir: Any,
    references: Sequence[Document],
    read_record: Any,
    write_record: Any,
) -> dict[str, dict[str, Any]]:
    """``{row: {"control", "bs", "ar", ...}}`` for every row whose hypotheses and whose
    control's hypotheses exist (``row_dir(name)/test.hyp.tsv``)."""
    names = [r.name for r in row_list]
    refs = [list(d.tgt) for d in references]
    out = {}
    for row in row_list:
        control = control_of(row, names)
        if control is None:
            continue
        paths = [os.path.join(row_dir(n), "test.hyp.tsv") for n in (row.name, control)]
        if not all(os.path.exists(p) for p in paths):
            continue
        inputs = {"control": control, "system": _digest(paths[0]), "baseline": _digest(paths[1])}
        cache = os.path.join(row_dir(row.name), "paired.json")
        saved = read_record(cache)
        if saved is None or saved.get("inputs") != inputs:
            system, baseline = (_hypotheses(p, references) for p in paths)
            saved = {**significance.paired_documents(system, baseline, refs), "inputs": inputs}
            write_record(cache, saved)
        out[row.name] = {"control": control, **saved}
    return out


def add_holm(paired: dict[str, dict[str, Any]]) -> None:
    """Adds ``holm`` (``{test: {metric: adjusted p}}``) to every row of ``paired``: Holm's
    correction over the rows (the family: every document row tested), one family per test
    (bs, ar) and metric (s-BLEU, d-BLEU)."""
    for test in ("bs", "ar"):
        for key in ("s_bleu", "d_bleu"):
            raw = {name: r[test][key]["p_value"] for name, r in paired.items()}
            for name, adjusted in holm_by_key(raw).items():
                paired[name].setdefault("holm", {}).setdefault(test, {})[key] = adjusted


def significance_lines(paired: dict[str, dict[str, Any]]) -> list[str]:
    """The report's section: one line per tested row, raw and Holm-corrected p-values."""
    if not paired:
        return ["- not measured yet (a row and its control need their test translations)"]
    add_holm(paired)
    any_row = next(iter(paired.values()))
    lines = [
        f"{len(paired)} comparisons, each a document row against its same-token control on "
        f"the test books ({any_row['sentences']:,} verses, {any_row['documents']} chapters); "
        "p-values of sacreBLEU's paired bootstrap (bs, 1,000 resamples) and approximate "
        "randomisation (ar, 10,000 trials), raw and, in brackets, corrected by Holm's "
        f"step-down procedure over the {len(paired)} rows (one family per test and metric). "
        "Scratch rows against the Transformer of the same seed, finetuned rows against the "
        "Transformer continued for the same tokens (seed k against the control of seed k "
        "where it exists).",
        "",
        "| row | control | Δ s-BLEU | p bs (Holm) | p ar (Holm) | Δ d-BLEU | p bs (Holm) | "
        "p ar (Holm) |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in paired.items():
        cells = []
        for key in ("s_bleu", "d_bleu"):
            bs, ar = r["bs"][key], r["ar"][key]
            cells += [
                f"{bs['system'] - bs['baseline']:+.2f}",
                f"{bs['p_value']:.4f} ({r['holm']['bs'][key]:.4f})",
                f"{ar['p_value']:.4f} ({r['holm']['ar'][key]:.4f})",
            ]
        lines.append(f"| `{name}` | `{r['control']}` | " + " | ".join(cells) + " |")
    return lines
