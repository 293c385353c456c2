"""One results table for every model on the Bible (``launch/results.py``, ``make results``).

Every row is a config file plus overrides (:data:`ROWS`): the sentence Transformer, Doc2Doc,
FINAL and its Table 3 rows, DocT, HM-GDC, Jean & Cho with and without the margin regulariser,
the pretrain->finetune variants and the RNN baselines. Each row goes through four stages,
each writing ``OUT/rows/ROW/STAGE.json`` when it is done (a rerun skips a stage whose record
matches its inputs, and training resumes from its checkpoints: the job is resumable):

``train``
    the row's config on the corpus with the **same budget in real target tokens** for every
    row: ``base_steps`` steps of the packed sentence Transformer, each row's steps from its
    own batch plan (:func:`tokens_per_step`, padding excluded). One tokenizer for every row
    (``OUT/spm.model``), warm-up, learning-rate scale and seed as in :class:`Settings`; the
    latest checkpoint is measured. A pretrain->finetune row starts from its ``init_from``
    row's trained run (its budget counted separately: the table says so).
``measure``
    the test books translated (beam 5, alpha 0.6 by default) with the true context, scored
    with sacreBLEU (s-BLEU, d-BLEU, chrF, signatures) and pronoun P/R/F1; with ``draws``
    random contexts (Jean & Cho 2019, Sec. 4: BLEU with random context, Delta_BLEU, Delta^D);
    every sentence translated alone (Zheng et al. 2020, Table 2: single-sentence BLEU);
    decode sentences/s over every translation of the stage (compilation included, as a user
    sees it).
``synthetic``
    the row's architecture trained on the synthetic context task at the proof size
    (:data:`~docnmt_jax.evaluation.context_proof.TINY`) and scored on its labelled words
    (accuracy overall and per antecedent distance; chance 1/3). Rows that differ only in
    seed or initialisation share their base row's (``synthetic_from``).
``params``
    the number of parameters; Delta|theta| is the difference to the sentence Transformer.

Real train tokens/s is read from the row's ``train.log`` (every logged window: real target
tokens over wall time, compilation excluded, evaluation included). Rows train one after
another on the same machine, so the ratios are sequential measurements, not interleaved ones
(``launch/benchmark.py --sections corpus`` interleaves the registered models).

:func:`report` turns the records into ``results.md`` / ``results.json``: one table, the
spread over the seeds of the Transformer and FINAL (which differences exceed it), and the
quality goals checked on the numbers.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import ml_collections

from docnmt_jax.config_files import load_config
from docnmt_jax.data.documents import Document
from docnmt_jax.errors import ConfigError
from docnmt_jax.files import log_timestamp, write_atomic

# ------------------------------------------------------------------------------------ rows


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
    #: run only when named (``--rows``) or in the quick run: variants beyond the issue's rows
    extra: bool = False
    #: this row's learning rate over the shared one (``Settings.lr_scale``), on the Bible and
    #: on the synthetic task: a model that diverges at the shared warm-up peak gets a row at
    #: a lower rate beside the shared-rate row, which stays in the table
    lr_factor: float = 1.0

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
        "transformer_continued",
        "Sentence Transformer continued from its own checkpoint (the finetune rows' control)",
        "pretrain -> finetune",
        "configs/transformer.py",
        (("init_from_rules", "all"),),
        init_from="transformer",
        synthetic_from="transformer",
        extra=True,
    ),
    Row("rnnsearch", "RNNSearch (Tan et al.'s sentence baseline)", "RNN", "configs/rnnsearch.py"),
    Row("rnnsearch_hmgdc", "HM-GDC on RNNSearch", "RNN", "configs/rnnsearch_hmgdc.py"),
)

#: Rows trained with seeds 0, 1, 2 (the spread of the Transformer and FINAL).
SEEDED = ("transformer", "final")

#: The Transformer trained on from its own checkpoint with a finetune row's budget: what a
#: pretrain -> finetune row is compared with, both having twice the other rows' tokens.
CONTROL = "transformer_continued"


def rows(seeds: Sequence[int] = (0, 1, 2)) -> list[Row]:
    """Every row of the table, the extra seeds of :data:`SEEDED` right after their row."""
    out = []
    for row in _BASE_ROWS:
        out.append(row)
        if row.name in SEEDED:
            out += [_seeded(row, s) for s in seeds if s != row.seed]
    return out


def select_rows(names: str, seeds: Sequence[int], extras: bool = False) -> list[Row]:
    """The rows named in ``names`` (comma-separated; '' = every row, the ``extra`` ones only
    with ``extras``) plus the rows they start from (``init_from``, trained first), in table
    order."""
    every = rows(seeds)
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


# -------------------------------------------------------------------------------- settings


@dataclasses.dataclass(frozen=True)
class Settings:
    """What every row shares. ``model`` overrides the models' sizes (the quick run's tiny
    models); ``base_steps`` is the budget in packed sentence-Transformer steps. Every row
    trains with its config's own recipe (the defaults of ``configs/transformer.py``, chosen
    by the recipe study); ``warmup_steps``/``lr_scale`` replace them when set (the quick
    run's few steps)."""

    out: str
    data_dir: str
    base_steps: int = 600
    warmup_steps: int | None = None
    lr_scale: float | None = None
    vocab_size: int = 8000
    beam: int = 5
    alpha: float = 0.6
    draws: int = 1
    #: chapters (doc-id prefixes) translated with random contexts and sentence by sentence
    #: (Delta_BLEU, single-sentence BLEU); empty: every test chapter
    context_books: tuple[str, ...] = ("Ruth.", "Gal.", "Jas.")
    batch_tokens: int = 4096
    synthetic_steps: int = 1200
    synthetic_train_docs: int = 2000
    synthetic_test_docs: int = 500
    model: tuple[tuple[str, Any], ...] = ()
    synthetic_model: tuple[tuple[str, Any], ...] = ()
    max_len: int = 128
    aot_compile: bool = True
    quick: bool = False

    def row_dir(self, row: str) -> str:
        return os.path.join(self.out, "rows", row)


#: Model sizes of the quick run (any model; keys a model lacks are dropped).
TINY_MODEL = (
    ("d_model", 32),
    ("embed_dim", 32),
    ("hidden_dim", 32),
    ("num_heads", 2),
    ("ffn_dim", 64),
    ("num_encoder_layers", 2),  # FINAL: a local layer under the global one
    ("num_decoder_layers", 1),
    ("num_layers", 1),
    ("num_context_layers", 1),
)


def quick_settings(out: str, data_dir: str) -> Settings:
    """The quick run (``--quick``): tiny models, a few steps, beam 2, a few short chapters;
    minutes on a CPU. Every row, stage and column of the full run."""
    return Settings(
        out=out,
        data_dir=data_dir,
        base_steps=12,
        warmup_steps=4,
        lr_scale=1.0,
        vocab_size=400,
        beam=2,
        draws=1,
        context_books=(),
        batch_tokens=2048,
        synthetic_steps=16,
        synthetic_train_docs=60,
        synthetic_test_docs=12,
        model=TINY_MODEL,
        synthetic_model=TINY_MODEL,
        aot_compile=False,  # compile only the batch shapes a few steps meet
        quick=True,
    )


# ------------------------------------------------------------------------------ configs


def _set(config: ml_collections.ConfigDict, key: str, value: Any) -> None:
    *path, leaf = key.split(".")
    node = config
    for part in path:
        node = node[part]
    node[leaf] = value


def _sized(config: ml_collections.ConfigDict, sizes: Sequence[tuple[str, Any]]) -> None:
    for key, value in sizes:
        if key in config.model:
            config.model[key] = value
    if "num_heads" in config.model and "d_model" in config.model:
        config.model.num_heads = min(config.model.num_heads, config.model.d_model)


def row_config(
    row: Row, settings: Settings, steps: int, tokenizer: str
) -> ml_collections.ConfigDict:
    """The training config of ``row``: its file and overrides, the shared tokenizer, budget
    flags and sizes; checkpoints every quarter of the steps, dev loss at the end."""
    config = load_config(row.config)
    _sized(config, settings.model)
    config.data.data_dir = settings.data_dir
    config.data.tokenizer = tokenizer
    config.data.max_src_len = config.data.max_tgt_len = settings.max_len
    config.train.seed = row.seed
    config.train.num_steps = steps
    if settings.warmup_steps is not None:
        config.train.warmup_steps = settings.warmup_steps
    if settings.lr_scale is not None:
        config.train.lr_scale = settings.lr_scale
    config.train.lr_scale *= row.lr_factor
    config.train.dev_bleu = False
    config.train.best_metric = "dev_loss"
    config.train.best_mode = "min"
    config.train.eval_every = steps
    config.train.checkpoint_every = max(steps // 4, 1)
    config.train.log_every = max(min(50, steps // 4), 1)
    config.train.aot_compile = settings.aot_compile
    if row.init_from:
        config.init_from = settings.row_dir(row.init_from)
        config.init_from_which = "latest"
    for key, value in row.overrides:  # last: a row's own setting is never overwritten
        _set(config, key, value)
    if "max_segments" in config.model:
        config.model.max_segments = max(config.model.max_segments, config.data.max_sentences)
    return config


def tokens_per_step(config: ml_collections.ConfigDict, tokenizer: Any) -> tuple[float, int]:
    """Mean real target tokens of one training step of ``config`` over an epoch of its own
    batch plan (its packing or grid, its padding excluded), and the epoch's target tokens."""
    from docnmt_jax.data import pipeline as pipeline_lib
    from docnmt_jax.models import build_model
    from docnmt_jax.objectives import build_objective
    from docnmt_jax.training import data_setup

    model = build_model(config.model, tokenizer.vocab_size)
    objective = build_objective(config.get("objective", {}), model)
    packed = config.data.get("packed", True) and not objective.needs_grid
    cfg = data_setup.pipeline_config(
        config.data,
        config.train.seed,
        True,
        model.layout.sentence_level,
        packing=model.packing() if packed else None,
        context_sentences=model.context_sentences,
        whole_documents=model.whole_documents,
    )
    docs = data_setup.load_documents(config.data, "train", config.train.seed)
    plan = pipeline_lib.plan_batches(docs, tokenizer.encode_batch, cfg)
    return plan.stats.tgt_tokens / max(plan.stats.batches_per_epoch, 1), plan.stats.tgt_tokens


# ---------------------------------------------------------------------------- records


def read_record(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError):
        return None


def write_record(path: str, record: dict[str, Any]) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_atomic(path, json.dumps(record, indent=2, default=float) + "\n")


def train_speed(log_path: str) -> dict[str, float]:
    """Real target tokens, seconds and tokens/s over every logged training window of
    ``train.log`` (a window's seconds = its tokens / its tokens/s). A run that starts again at
    step N (``starting at step N``: resumed, or from scratch where no checkpoint was left)
    drops the earlier runs' windows past N: their steps were trained again.

    ``wall_seconds`` sums each run's first-to-last log line (a run starts at the trainer's
    ``data: N train / M dev documents`` line), so a row trained over several sessions states
    its whole wall time; a run that starts again at step 0 drops the earlier runs' time."""
    windows: list[tuple[int, float, float]] = []  # (last step, tokens, seconds)
    runs: list[list[float]] = []  # [first, last] timestamp of each run of the trainer
    window = re.compile(r"step=(\d+) .*train/tokens=([\d.e+-]+) train/tokens_per_s=([\d.e+-]+)")
    start = re.compile(r"starting at step (\d+)")
    run_start = re.compile(r"data: \d+ train / \d+ dev documents")
    try:
        with open(log_path, encoding="utf-8") as f:
            for line in f:
                stamp = log_timestamp(line)
                if stamp is not None:
                    if run_start.search(line) or not runs:
                        runs.append([stamp, stamp])
                    runs[-1][1] = stamp
                if match := start.search(line):
                    windows = [w for w in windows if w[0] <= int(match.group(1))]
                    if int(match.group(1)) == 0:
                        runs = runs[-1:]
                elif (match := window.search(line)) and float(match.group(3)) > 0:
                    tokens = float(match.group(2))
                    windows.append((int(match.group(1)), tokens, tokens / float(match.group(3))))
    except OSError:
        pass
    tokens = sum(w[1] for w in windows)
    seconds = sum(w[2] for w in windows)
    return {
        "train_tokens": tokens,
        "train_seconds": seconds,
        "train_tokens_per_s": tokens / seconds if seconds else 0.0,
        "wall_seconds": sum(last - first for first, last in runs),
    }


# ------------------------------------------------------------------------------- stages


def train_row(row: Row, settings: Settings, steps: int, tokenizer_path: str) -> dict[str, Any]:
    """Trains ``row`` for ``steps`` (resuming its checkpoints) and returns the train record.
    A training stopped before ``steps`` (SIGTERM/SIGINT: its checkpoint saved) raises
    ``KeyboardInterrupt``: no record is written, the whole run stops, and the same command
    resumes the row from its checkpoint."""
    from docnmt_jax.training import trainer

    workdir = settings.row_dir(row.name)
    config = row_config(row, settings, steps, tokenizer_path)
    result = trainer.train_and_evaluate(config, workdir)
    if result.step < steps:  # stopped by a signal: checkpoint saved, no record (resumes)
        raise KeyboardInterrupt(f"{row.name}: training stopped at step {result.step}")
    record = {
        "steps": result.step,
        "stopped_by": result.stopped_by,
        "dev": result.dev_metrics,
        **train_speed(os.path.join(workdir, "train.log")),  # wall_seconds: every session's
    }
    return record


def uses_context(model: Any) -> bool:
    """Whether the model reads anything but the sentence it translates."""
    return not (model.layout.sentence_level and model.context_sentences == 0)


def measure_row(
    row: Row, settings: Settings, documents: Sequence[Document], progress: bool = True
) -> dict[str, Any]:
    """Translates ``documents`` with the row's latest checkpoint: true context, random
    contexts and single sentences; scores each (module docstring)."""
    from docnmt_jax.decoding.search import SearchConfig
    from docnmt_jax.evaluation import analysis, context_marginal
    from docnmt_jax.evaluation.metrics import score_documents
    from docnmt_jax.evaluation.pronouns import pronoun_scores
    from docnmt_jax.training import restore

    workdir = settings.row_dir(row.name)
    search = SearchConfig(beam_size=settings.beam, alpha=settings.alpha)
    translator, step = restore.load_translator(
        workdir, "latest", search, batch_tokens=settings.batch_tokens
    )
    model = translator.model
    refs = [list(d.tgt) for d in documents]
    record: dict[str, Any] = {"step": step, "beam": settings.beam, "alpha": settings.alpha}
    hyps = translator.translate(documents, progress="test books" if progress else None)
    record["scores"] = score_documents(hyps, refs)
    record["pronouns"] = pronoun_scores(
        [h for d in hyps for h in d], [s for d in documents for s in d.tgt], "en"
    )
    # Delta_BLEU and single-sentence BLEU on the context books: both against the same
    # books translated with the true context (taken from the full translation).
    picked = [
        i
        for i, d in enumerate(documents)
        if not settings.context_books or d.doc_id.startswith(settings.context_books)
    ]
    subset = [documents[i] for i in picked]
    subset_hyps = [hyps[i] for i in picked]
    subset_refs = [refs[i] for i in picked]
    record["context_subset"] = {
        "chapters": len(subset),
        "verses": sum(len(d) for d in subset),
        "s_bleu": score_documents(subset_hyps, subset_refs)["s_bleu"]["score"],
    }
    if uses_context(model):
        usage = context_marginal.model_context_usage(
            translator,
            subset,
            settings.max_len,
            settings.draws,
            0,
            settings.batch_tokens,
            progress,
            true_hypotheses=subset_hyps,
        )
        record["context"] = usage.to_json()
    else:
        record["context"] = None
    plan = analysis.context_plan(model, translator.pipeline_config.max_sentences, 0)
    single = (
        analysis.translate_in_context(translator, subset, plan, progress, "single sentences")
        if plan.windows
        else subset_hyps
    )
    record["single_sentence"] = score_documents(single, subset_refs)["s_bleu"]
    stats = translator.stats
    record["decode"] = {
        "sentences": stats.sentences,
        "seconds": stats.seconds,
        "sentences_per_s": stats.sentences / max(stats.seconds, 1e-9),
        "compilations": stats.compilations,
        "output_capped": stats.output_capped,
    }
    from docnmt_jax.files import write_hypotheses

    write_hypotheses(os.path.join(workdir, "test.hyp.tsv"), documents, hyps)
    return record


#: proof_config overrides that are not model keys.
_PROOF_KEYS = frozenset(
    (
        "vocab_size",
        "batch_tokens",
        "num_steps",
        "warmup_steps",
        "lr_scale",
        "label_smoothing",
        "seed",
        "eval_every",
        "time_budget_minutes",
    )
)


def synthetic_config(row: Row, settings: Settings, data_dir: str) -> ml_collections.ConfigDict:
    """The row's architecture at the proof size on the synthetic corpus in ``data_dir``."""
    from docnmt_jax.evaluation import context_proof

    config = load_config(row.config)
    for key, value in row.overrides:
        _set(config, key, value)
    sizes = dict(context_proof.TINY)
    sizes.update(num_steps=settings.synthetic_steps, lr_scale=0.5 * row.lr_factor, seed=row.seed)
    if settings.synthetic_model:
        sizes.update({k: v for k, v in settings.synthetic_model if k in sizes})
    if not {"attention_dropout_rate", "relu_dropout_rate"} <= set(config.model):
        # proof_config zeroes both; a model without them (the RNNs) gets its own keys zeroed
        for key in ("dropout_rate", "attention_dropout_rate"):
            if key in config.model:
                config.model[key] = sizes["dropout_rate"]
        del sizes["dropout_rate"]
    sizes = {k: v for k, v in sizes.items() if k in config.model or k in _PROOF_KEYS}
    config = context_proof.proof_config(config, data_dir, **sizes)
    if "embed_dim" in config.model:  # the RNNs: embeddings at the proof's width too
        config.model.embed_dim = config.model.d_model
    _sized(config, settings.synthetic_model)
    if "max_segments" in config.model:
        config.model.max_segments = max(config.model.max_segments, config.data.max_sentences)
    config.init_from = ""
    config.train.freeze = ()
    config.train.aot_compile = settings.aot_compile
    return config


def synthetic_row(row: Row, settings: Settings, data_dir: str) -> dict[str, Any]:
    """The row's architecture on the synthetic context task (proof size): accuracy of the
    labelled words, overall and per antecedent distance."""
    from docnmt_jax.evaluation import context_proof

    config = synthetic_config(row, settings, data_dir)
    scores = context_proof.run(
        config, os.path.join(settings.out, "synthetic", row.name), forced_choice=not settings.quick
    )
    if scores.get("step", settings.synthetic_steps) < settings.synthetic_steps:  # a signal
        raise KeyboardInterrupt(f"{row.name}: synthetic training stopped at {scores['step']}")
    keep = ("accuracy", "correct", "total", "missing", "chance_level", "by_distance", "step")
    out = {k: scores[k] for k in keep if k in scores}
    out["forced_choice"] = scores["contrastive"]["accuracy"] if "contrastive" in scores else None
    out["train_seconds"] = scores.get("train_seconds", 0.0)
    return out


def params_row(row: Row, settings: Settings) -> dict[str, Any]:
    """Parameter count of the row's trained model (every parameter, frozen ones too)."""
    import jax
    import numpy as np

    from docnmt_jax.training import restore

    model, _, _ = restore.load_model(settings.row_dir(row.name))
    params, _ = restore.load_params(model, settings.row_dir(row.name), "latest")
    return {"params": int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(params)))}


# ------------------------------------------------------------------------------- report

GOAL_S_BLEU, GOAL_D_BLEU = 2.0, 2.5


def _fmt(value: float | None, spec: str = ".2f") -> str:
    return (
        "–"
        if value is None or (isinstance(value, float) and math.isnan(value))
        else (format(value, spec))
    )


def row_numbers(record: dict[str, Any]) -> dict[str, Any]:
    """The table's numbers of one row record (``None`` where a stage is missing)."""
    m, t, s, p = (record.get(k) or {} for k in ("measure", "train", "synthetic", "params"))
    scores = m.get("scores") or {}
    context = m.get("context")
    return {
        "s_bleu": (scores.get("s_bleu") or {}).get("score"),
        "d_bleu": (scores.get("d_bleu") or {}).get("score"),
        "chrf": (scores.get("chrf") or {}).get("score"),
        "subset_bleu": (m.get("context_subset") or {}).get("s_bleu"),
        "random_bleu": context["context_marginalised_bleu"] if context else None,
        "delta_bleu": context["delta_bleu"] if context else None,
        "single_bleu": (m.get("single_sentence") or {}).get("score"),
        "pronoun_f1": (m.get("pronouns") or {}).get("f1"),
        "params": p.get("params"),
        "train_tokens_per_s": t.get("train_tokens_per_s"),
        "decode_sentences_per_s": (m.get("decode") or {}).get("sentences_per_s"),
        "synthetic": s.get("accuracy"),
        "steps": t.get("steps"),
        "epochs": t.get("epochs"),
        "wall_minutes": (t.get("wall_seconds") or 0) / 60 if t else None,
    }


def spread(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (NaN for fewer than two values: a spread that is
    not measured is not zero)."""
    values = [v for v in values if v is not None]
    if not values:
        return float("nan"), float("nan")
    sd = statistics.stdev(values) if len(values) > 1 else float("nan")
    return statistics.fmean(values), sd


def seed_spread(numbers: dict[str, dict[str, Any]], base: str, key: str) -> tuple[float, float]:
    names = [n for n in numbers if n == base or n.startswith(base + "_seed")]
    return spread([numbers[n][key] for n in names])


def seed_count(numbers: dict[str, dict[str, Any]], base: str) -> int:
    """How many seeds of ``base`` have an s-BLEU."""
    names = [n for n in numbers if n == base or n.startswith(base + "_seed")]
    return sum(numbers[n].get("s_bleu") is not None for n in names)


def goals(numbers: dict[str, dict[str, Any]], row_list: Sequence[Row]) -> list[str]:
    """The results table's quality goals checked on the numbers, one line each."""
    lines = []
    t_s, t_sd = seed_spread(numbers, "transformer", "s_bleu")
    f_s, f_sd = seed_spread(numbers, "final", "s_bleu")
    t_d, _ = seed_spread(numbers, "transformer", "d_bleu")
    f_d, _ = seed_spread(numbers, "final", "d_bleu")
    if not any(math.isnan(x) for x in (t_s, f_s, t_d, f_d)):
        ds, dd = f_s - t_s, f_d - t_d
        lines.append(
            f"- FINAL ≥ +{GOAL_S_BLEU} s-BLEU over the sentence Transformer (seed means): "
            f"{ds:+.2f} — {'holds' if ds >= GOAL_S_BLEU else f'missed by {GOAL_S_BLEU - ds:.2f}'}"
        )
        lines.append(
            f"- FINAL ≥ +{GOAL_D_BLEU} d-BLEU: {dd:+.2f} — "
            f"{'holds' if dd >= GOAL_D_BLEU else f'missed by {GOAL_D_BLEU - dd:.2f}'}"
        )
    positive, other = [], []
    for row in row_list:
        delta = numbers.get(row.name, {}).get("delta_bleu")
        if delta is not None:
            (positive if delta > 0 else other).append(f"{row.name} {delta:+.2f}")
    if positive or other:
        lines.append(
            f"- every document model's Δ_BLEU > 0: {len(positive)} of "
            f"{len(positive) + len(other)} rows" + (f"; not: {', '.join(other)}" if other else "")
        )
    for plain, margin in (
        ("jean_cho", "jean_cho_margin"),
        ("jean_cho", "jean_cho_margin_stopgrad"),
        ("final", "final_margin"),
    ):
        a = numbers.get(plain, {}).get("delta_bleu")
        b = numbers.get(margin, {}).get("delta_bleu")
        if a is not None and b is not None:
            lines.append(
                f"- the margin regulariser raises Δ_BLEU ({margin} against {plain}): "
                f"{b:+.2f} against {a:+.2f} — {'holds' if b > a else 'does not hold'}"
            )
    control = numbers.get(CONTROL, {})
    for row in row_list:
        n = numbers.get(row.name, {})
        if row.init_from != "transformer" or row.name == CONTROL or n.get("s_bleu") is None:
            continue
        if control.get("s_bleu") is None:
            lines.append(
                f"- {row.name} has twice the tokens of the rows above; its like-for-like "
                f"control, `{CONTROL}`, is not run yet (`--rows {CONTROL}`)"
            )
            continue
        lines.append(
            f"- {row.name} against `{CONTROL}` (the same tokens in all): s-BLEU "
            f"{n['s_bleu'] - control['s_bleu']:+.2f}, d-BLEU {n['d_bleu'] - control['d_bleu']:+.2f}"
        )
    return lines


COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("s_bleu", "s-BLEU", ".2f"),
    ("d_bleu", "d-BLEU", ".2f"),
    ("chrf", "chrF", ".1f"),
    ("subset_bleu", "s-BLEU, context books", ".2f"),
    ("random_bleu", "BLEU, random context", ".2f"),
    ("delta_bleu", "Δ_BLEU", "+.2f"),
    ("single_bleu", "single-sentence BLEU", ".2f"),
    ("pronoun_f1", "pronoun F1", ".3f"),
    ("delta_params", "Δ\\|θ\\|", "+,d"),  # escaped: a bar would split the cell
    ("train_ratio", "train tok/s ratio", ".2f"),
    ("decode_ratio", "decode sent/s ratio", ".2f"),
    ("synthetic", "synthetic acc.", ".3f"),
    ("steps", "steps", ",d"),
    ("epochs", "epochs", ".2f"),
    ("wall_minutes", "train min", ".1f"),
)


def add_ratios(numbers: dict[str, dict[str, Any]]) -> None:
    base = numbers.get("transformer", {})
    for n in numbers.values():
        for key, ratio in (
            ("train_tokens_per_s", "train_ratio"),
            ("decode_sentences_per_s", "decode_ratio"),
        ):
            n[ratio] = n[key] / base[key] if n.get(key) and base.get(key) else None
        n["delta_params"] = (
            n["params"] - base["params"] if n.get("params") and base.get("params") else None
        )


def markdown_table(row_list: Sequence[Row], numbers: dict[str, dict[str, Any]]) -> str:
    head = "| row | " + " | ".join(title for _, title, _ in COLUMNS) + " |"
    lines = [head, "|---|" + "---:|" * len(COLUMNS)]
    for row in row_list:
        n = numbers.get(row.name, {})
        cells = [_fmt(n.get(key), spec) for key, _, spec in COLUMNS]
        lines.append(f"| {row.label} (`{row.name}`) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def report(
    row_list: Sequence[Row],
    records: dict[str, dict[str, Any]],
    settings: Settings,
    header: str,
    paired: dict[str, dict[str, Any]] | None = None,
) -> tuple[str, dict[str, Any]]:
    """The markdown report and its JSON: the table, the seed spreads, the paired
    significance of each document row against its same-token control (``paired``:
    :func:`~docnmt_jax.evaluation.results_significance.paired_rows`), the quality goals, the
    signatures."""
    from docnmt_jax.evaluation.results_significance import significance_lines

    numbers = {row.name: row_numbers(records.get(row.name, {})) for row in row_list}
    for row in row_list:  # rows sharing an architecture share its synthetic accuracy
        if numbers[row.name]["synthetic"] is None and row.base in numbers:
            numbers[row.name]["synthetic"] = numbers[row.base]["synthetic"]
    add_ratios(numbers)
    lines = [header, "", markdown_table(row_list, numbers), ""]
    lines.append("**Seed spread** (mean ± sample standard deviation over seeds):")
    for base in SEEDED:
        cells = []
        for key, title in (("s_bleu", "s-BLEU"), ("d_bleu", "d-BLEU"), ("chrf", "chrF")):
            mean, sd = seed_spread(numbers, base, key)
            cells.append(f"{title} {_fmt(mean)} ± {_fmt(sd)}")
        seeds = seed_count(numbers, base)
        lines.append(f"- {base} ({seeds} seed{'s' if seeds != 1 else ''}): " + ", ".join(cells))
    lines += ["", "**Paired significance against the same-token control:**", ""]
    lines += significance_lines(paired or {})
    lines += ["", "**Quality goals**:"] + (goals(numbers, row_list) or ["- not measured yet"])
    signatures = next(
        (
            records[r.name]["measure"]["scores"]
            for r in row_list
            if (records.get(r.name) or {}).get("measure")
        ),
        None,
    )
    if signatures:
        lines += [
            "",
            f"sacreBLEU signatures: s-BLEU and d-BLEU `{signatures['s_bleu']['signature']}`, "
            f"chrF `{signatures['chrf']['signature']}`.",
        ]
    missing = [r.name for r in row_list if not row_complete(r, records.get(r.name) or {})]
    if missing:
        lines += ["", f"Rows not yet complete: {', '.join(missing)}."]
    payload = {
        "settings": dataclasses.asdict(settings),
        "rows": [
            {
                "name": r.name,
                "label": r.label,
                "group": r.group,
                "config": r.config,
                "overrides": dict(r.overrides),
                "seed": r.seed,
                "init_from": r.init_from,
                "numbers": numbers[r.name],
                "paired": (paired or {}).get(r.name),
                "records": records.get(r.name, {}),
            }
            for r in row_list
        ],
    }
    return "\n".join(lines) + "\n", payload


STAGES = ("train", "measure", "synthetic", "params")


def row_complete(row: Row, record: dict[str, Any]) -> bool:
    """Whether every stage of ``row`` has its record (a row sharing its base row's synthetic
    accuracy has no synthetic stage of its own)."""
    own = [s for s in STAGES if s != "synthetic" or row.base == row.name]
    return all(record.get(stage) for stage in own)


# ---------------------------------------------------------------------------------- run


@dataclasses.dataclass
class Plan:
    """Everything a run needs before its stages: tokenizer, budget, data."""

    tokenizer_path: str
    reference_tokens_per_step: float
    epoch_tokens: int
    test: list[Document]
    synthetic_dir: str
    corpus: str = "Bible"  # or "synthetic": the quick run's stand-in without the Bible


#: The config keys that make a training recipe (what a train record depends on).
RECIPE_KEYS = (
    "model.pre_ln",
    "train.warmup_steps",
    "train.lr_scale",
    "train.learning_rate",
    "train.clip_norm",
    "train.ema_decay",
    "train.accumulate_steps",
    "train.label_smoothing",
    "data.batch_src_tokens",
    "data.batch_tgt_tokens",
)


def training_recipe(config: ml_collections.ConfigDict) -> dict[str, Any]:
    """The :data:`RECIPE_KEYS` of ``config`` that it has."""
    recipe = {}
    for key in RECIPE_KEYS:
        section, name = key.split(".")
        if name in config[section]:
            recipe[key] = config[section][name]
    return recipe


def stage_inputs(stage: str, row: Row, settings: Settings, steps: int) -> dict[str, Any]:
    """What a stage's record depends on: a record with other inputs is redone."""
    if stage == "train":
        return {
            "steps": steps,
            "config": row.config,
            "overrides": [list(o) for o in row.overrides],
            "seed": row.seed,
            "recipe": training_recipe(row_config(row, settings, steps, "")),
        }
    if stage == "measure":
        return {
            "steps": steps,
            "beam": settings.beam,
            "alpha": settings.alpha,
            "draws": settings.draws,
        }
    if stage == "synthetic":
        lower = {"lr_factor": row.lr_factor} if row.lr_factor != 1.0 else {}
        return {"steps": settings.synthetic_steps, **lower}
    return {"steps": steps}


def run_stage(
    stage: str,
    row: Row,
    settings: Settings,
    fn: Callable[[], dict[str, Any]],
    inputs: dict[str, Any],
) -> tuple[dict[str, Any] | None, bool]:
    """The stage's record: the saved one when its inputs match, else ``fn()`` saved. Returns
    (record, whether it was computed now)."""
    path = os.path.join(settings.row_dir(row.name), f"{stage}.json")
    saved = read_record(path)
    if saved is not None and saved.get("inputs") == inputs:
        return saved, False
    record = dict(fn(), inputs=inputs)
    write_record(path, record)
    return record, True
