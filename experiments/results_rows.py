"""The rows of the results table (``experiments/results.py``, ``make results``).

Every row is a config file plus overrides: the sentence Transformer, Doc2Doc, FINAL and its
Table 3 rows, DocT, HM-GDC, Jean & Cho with and without the margin regulariser, the
pretrain->finetune variants and the RNN baselines; the Transformer and FINAL also with the
seeds of :data:`SEEDED` (the spread the report states).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from docnmt_jax.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Row:
    """One line of the table: ``config`` (``PATH`` or ``PATH:ARG``) with ``overrides``
    (flattened ``section.key`` -> value), trained with ``seed``; ``init_from`` names the row
    whose trained run initialises this one (pretrain -> finetune); ``synthetic_from`` the row
    whose synthetic-task accuracy this row shares (same architecture)."""

    name: str
    label: str
    group: str
    config: str
    overrides: tuple[tuple[str, Any], ...] = ()
    seed: int = 0
    init_from: str = ""
    synthetic_from: str = ""
    #: run only when named (``--rows``) or in the quick run: variants beyond the table's own rows
    extra: bool = False
    #: this row's learning rate over the shared one (``Settings.lr_scale``), on the Bible and
    #: on the synthetic task: a model that diverges at the shared warm-up peak gets a row at
    #: a lower rate beside the shared-rate row, which stays in the table
    lr_factor: float = 1.0
    #: with the converged budget: train (no patience) for the most real target tokens any of
    #: these rows trained, the checkpoint chosen on dev within them (the finetune rows'
    #: sentence control)
    same_tokens_as: tuple[str, ...] = ()

    @property
    def base(self) -> str:
        """The row whose synthetic accuracy this row reports (itself by default)."""
        return self.synthetic_from or self.name


def _seeded(row: Row, seed: int) -> Row:
    return dataclasses.replace(
        row,
        name=f"{row.name}_seed{seed}",
        label=f"{row.label}, seed {seed}",
        seed=seed,
        synthetic_from=row.name,
    )


_T3 = "configs/final_table3.py:"
_GRID = (("data.packed", False),)
_SENTENCE_ROWS = (("model.sentence_rows", True),)
_MARGIN = (("objective.name", "context_margin"),)

_BASE_ROWS: tuple[Row, ...] = (
    Row("transformer", "Sentence Transformer (SENTNMT)", "baselines", "configs/transformer.py"),
    Row("doc2doc", "Doc2Doc: the chunk as one sequence", "baselines", "configs/doc2doc.py"),
    Row("final", "FINAL (Zheng et al. 2020)", "FINAL", "configs/final.py"),
    Row(
        "final_recurrent",
        "FINAL, recurrent across chunks (beyond the paper)",
        "FINAL",
        "configs/final.py:recurrent",
        synthetic_from="final",
        extra=True,
    ),
    Row(
        "final_recurrent_book",
        "FINAL, recurrent across chunks, books as documents",
        "FINAL",
        "configs/final.py:recurrent",
        (("data.document_unit", "book"),),
        synthetic_from="final",
        extra=True,
    ),
    Row(
        "t3_doc2sent",
        "Table 3: Doc2Sent (the chunk as the encoder's input)",
        "FINAL Table 3",
        _T3 + "doc2sent",
    ),
    Row(
        "t3_doc2sent_chunk",
        "Table 3: Doc2Sent, cross-attention over the whole chunk (named variant)",
        "FINAL Table 3",
        _T3 + "doc2sent_chunk",
        extra=True,
    ),
    Row("t3_reset", "Table 3: + reset word positions", "FINAL Table 3", _T3 + "doc2sent+reset"),
    Row(
        "t3_segment",
        "Table 3: + segment embedding",
        "FINAL Table 3",
        _T3 + "doc2sent+reset+segment",
    ),
    Row(
        "t3_relative",
        "Table 3: + segment relative attention",
        "FINAL Table 3",
        _T3 + "+segment_relative_attention",
    ),
    Row(
        "t3_fusion", "Table 3: + context fusion gate", "FINAL Table 3", _T3 + "+context_fusion_gate"
    ),
    Row(
        "t3_sent2doc_xl",
        "Table 3: Sent2Doc, Transformer-XL decoder",
        "FINAL Table 3",
        _T3 + "sent2doc_xl",
    ),
    Row(
        "doct",
        "DocT (Zhang et al. 2018), joint training",
        "DocT",
        "configs/doct.py",
        _SENTENCE_ROWS,
    ),
    Row("hmgdc", "HM-GDC (Tan et al. 2019), whole documents", "HM-GDC", "configs/hmgdc.py"),
    Row(
        "hmgdc_half_lr",
        "HM-GDC, whole documents, half the shared learning rate",
        "HM-GDC",
        "configs/hmgdc.py",
        extra=True,
        lr_factor=0.5,
    ),
    Row(
        "jean_cho",
        "Jean & Cho (2019), maximum likelihood",
        "Jean & Cho",
        "configs/jean_cho.py",
        _SENTENCE_ROWS,
    ),
    Row(
        "jean_cho_margin",
        "Jean & Cho (2019) + context-aware margin regulariser",
        "Jean & Cho",
        "configs/jean_cho.py",
        _SENTENCE_ROWS + _GRID + _MARGIN,
    ),
    Row(
        "jean_cho_margin_half_lr",
        "Jean & Cho (2019) + margin regulariser, half the shared learning rate",
        "Jean & Cho",
        "configs/jean_cho.py",
        _SENTENCE_ROWS + _GRID + _MARGIN,
        extra=True,
        lr_factor=0.5,
    ),
    Row(
        "jean_cho_margin_stopgrad",
        "Jean & Cho (2019) + margin regulariser, no gradient through the random context",
        "Jean & Cho",
        "configs/jean_cho.py",
        _SENTENCE_ROWS
        + _GRID
        + _MARGIN
        + (("objective.context_margin.random_context_gradient", False),),
        extra=True,
    ),
    Row(
        "final_margin",
        "FINAL + context-aware margin regulariser",
        "Jean & Cho",
        "configs/final.py",
        _GRID + _MARGIN,
        extra=True,
    ),
    Row(
        "final_finetuned",
        "FINAL finetuned from the sentence Transformer (source & target TL)",
        "pretrain -> finetune",
        "configs/final.py",
        (("init_from_rules", "all"),),
        init_from="transformer",
        synthetic_from="final",
    ),
    Row(
        "final_finetuned_grid",
        "FINAL finetuned, maximum likelihood on the [B, S, T] grid (the margin rows' batches)",
        "context objectives",
        "configs/final.py",
        (("init_from_rules", "all"),) + _GRID,
        init_from="transformer",
        synthetic_from="final",
        extra=True,
    ),
    Row(
        "final_finetuned_margin",
        "FINAL finetuned + context-aware margin regulariser (Jean & Cho 2019, Eq. 3)",
        "context objectives",
        "configs/final.py",
        (("init_from_rules", "all"),) + _GRID + _MARGIN,
        init_from="transformer",
        synthetic_from="final",
        extra=True,
    ),
    Row(
        "final_finetuned_margin_stopgrad",
        "FINAL finetuned + margin regulariser, no gradient through the random context",
        "context objectives",
        "configs/final.py",
        (("init_from_rules", "all"),)
        + _GRID
        + _MARGIN
        + (("objective.context_margin.random_context_gradient", False),),
        init_from="transformer",
        synthetic_from="final",
        extra=True,
    ),
    Row(
        "final_finetuned_coword",
        "FINAL finetuned + context-aware word dropout (CoWord, Fernandes et al. 2021)",
        "context objectives",
        "configs/final.py",
        (("init_from_rules", "all"), ("objective.name", "coword")),
        init_from="transformer",
        synthetic_from="final",
        extra=True,
    ),
    Row(
        "doct_two_step",
        "DocT two-step: theta_s from the sentence Transformer, frozen",
        "pretrain -> finetune",
        "configs/doct.py:two_step",
        _SENTENCE_ROWS,
        init_from="transformer",
        synthetic_from="doct",
    ),
    Row(
        "hmgdc_finetuned",
        "HM-GDC finetuned from the sentence Transformer",
        "pretrain -> finetune",
        "configs/hmgdc.py:finetune",
        init_from="transformer",
        synthetic_from="hmgdc",
    ),
    Row(
        "jean_cho_finetuned",
        "Jean & Cho (2019) finetuned from the sentence Transformer",
        "pretrain -> finetune",
        "configs/jean_cho.py",
        _SENTENCE_ROWS + (("init_from_rules", "all"),),
        init_from="transformer",
        synthetic_from="jean_cho",
        extra=True,
    ),
    Row(
        "jean_cho_margin_finetuned",
        "Jean & Cho (2019) + margin regulariser, finetuned from the sentence Transformer",
        "pretrain -> finetune",
        "configs/jean_cho.py",
        _SENTENCE_ROWS + (("init_from_rules", "all"),) + _GRID + _MARGIN,
        init_from="transformer",
        synthetic_from="jean_cho",
        extra=True,
    ),
    Row(
        "doc2doc_finetuned",
        "Doc2Doc finetuned from the sentence Transformer",
        "pretrain -> finetune",
        "configs/doc2doc.py",
        (("init_from_rules", "all"),),
        init_from="transformer",
        synthetic_from="doc2doc",
        extra=True,
    ),
    Row(
        "transformer_continued",
        "Sentence Transformer continued from its own checkpoint (the finetune rows' control)",
        "pretrain -> finetune",
        "configs/transformer.py",
        (("init_from_rules", "all"),),
        init_from="transformer",
        synthetic_from="transformer",
        extra=True,
        same_tokens_as=("final_finetuned", "final_finetuned_seed1", "final_finetuned_seed2"),
    ),
    Row("rnnsearch", "RNNSearch (Tan et al.'s sentence baseline)", "RNN", "configs/rnnsearch.py"),
    Row("rnnsearch_hmgdc", "HM-GDC on RNNSearch", "RNN", "configs/rnnsearch_hmgdc.py"),
)

#: Rows trained with seeds 0, 1, 2 (the spread of the Transformer and FINAL).
SEEDED = ("transformer", "final")
#: The converged budget's seeded rows: FINAL finetuned and its control, from the same base
#: (the seed sets data order, dropout and FINAL's new context parameters).
CONVERGED_SEEDED = ("final_finetuned", "transformer_continued")

#: The Transformer trained on from its own checkpoint with a finetune row's budget: what a
#: pretrain -> finetune row is compared with, both having twice the other rows' tokens.
CONTROL = "transformer_continued"


def rows(seeds: Sequence[int] = (0, 1, 2), seeded: Sequence[str] = SEEDED) -> list[Row]:
    """Every row of the table, the extra seeds of the ``seeded`` rows right after their row."""
    out = []
    for row in _BASE_ROWS:
        out.append(row)
        if row.name in seeded:
            out += [_seeded(row, s) for s in seeds if s != row.seed]
    return out


#: The rows of the converged budget (``--converged`` without ``--rows``): the sentence
#: Transformer (seed 0), each paper's model finetuned from its release with the same-token
#: control (FINAL and the control over the seeds of :data:`CONVERGED_SEEDED`). FINAL from
#: scratch, Table 3's rows and Tan et al.'s RNN group stay at the token budget
#: (``docs/results.md``).
CONVERGED_ROWS = (
    "transformer",
    "final_finetuned",
    "doct_two_step",
    "hmgdc_finetuned",
    "jean_cho_finetuned",
    "doc2doc_finetuned",
    "transformer_continued",
)

#: the quick run's rows (``--quick`` without ``--rows``): what proves the runner works end to
#: end in CI's minutes: a sentence row, a document row (random-context Delta_BLEU, the synthetic
#: stage, the paired test against its control), pretrain -> finetune and the same-token
#: continued control. The other models' training, search and scoring are the unit tests';
#: ``--quick --rows A,B`` runs any rows at the quick size.
QUICK_ROWS = (
    "transformer",
    "final",
    "final_finetuned",
    "transformer_continued",
)


def select_rows(
    names: str, seeds: Sequence[int], extras: bool = False, seeded: Sequence[str] = SEEDED
) -> list[Row]:
    """The rows named in ``names`` (comma-separated; '' = every row, the ``extra`` ones only
    with ``extras``) plus the rows they start from (``init_from``, trained first), in table
    order; ``seeded`` rows with every seed of ``seeds``."""
    every = rows(seeds, seeded)
    if not names:
        return [r for r in every if extras or not r.extra]
    by_name = {r.name: r for r in every}
    wanted = [n for n in names.split(",") if n]
    unknown = [n for n in wanted if n not in by_name]
    if unknown:
        raise ConfigError(f"--rows: unknown rows {unknown}; rows: {', '.join(by_name)}")
    needed = set(wanted)
    for name in wanted:
        while by_name[name].init_from:
            name = by_name[name].init_from
            needed.add(name)
    needed.add("transformer")  # the baseline of every ratio and of Delta|theta|
    return [r for r in every if r.name in needed]
