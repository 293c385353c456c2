"""The stages of a results-table row (``experiments/results.py``): what every row shares
(:class:`Settings`), its training config, and four stages, each writing
``OUT/rows/ROW/STAGE.json`` when it is done (a rerun skips a stage whose record matches its
inputs, and training resumes from its checkpoints: the job is resumable):

``train``
    the row's config on the corpus with the **same budget in real target tokens** for every
    row: ``base_steps`` steps of the packed sentence Transformer, each row's steps from its
    own batch plan (:func:`~docnmt_jax.training.budget.tokens_per_step`, padding excluded).
    One tokenizer for every row (``OUT/spm.model``), warm-up, learning-rate scale and seed as
    in :class:`Settings`; the latest checkpoint is measured. A pretrain->finetune row starts
    from its ``init_from`` row's trained run (its budget counted separately: the table says
    so).
``measure``
    the test books translated (beam 5, alpha 0.6 by default) with the true context, scored
    with sacreBLEU (s-BLEU, d-BLEU, chrF, signatures) and pronoun P/R/F1; with ``draws``
    random contexts (Jean & Cho 2019, Sec. 4: BLEU with random context, Delta_BLEU, Delta^D);
    every sentence translated alone (Zheng et al. 2020, Table 2: single-sentence BLEU);
    decode sentences/s over every translation of the stage (compilation included, as a user
    sees it).
``synthetic``
    the row's architecture trained on the synthetic context task at the proof size
    (:data:`~docnmt_jax.commands.context_proof.TINY`) and scored on its labelled words
    (accuracy overall and per antecedent distance; chance 1/3). Rows that differ only in
    seed or initialisation share their base row's (``synthetic_from``).
``params``
    the number of parameters; Delta|theta| is the difference to the sentence Transformer.

Real train tokens/s is read from the row's ``train.log`` (every logged window: real target
tokens over wall time, compilation excluded, evaluation included). Rows train one after
another on the same machine, so the ratios are sequential measurements, not interleaved ones
(``launch/benchmark.py --sections corpus`` interleaves the registered models).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import resource
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import ml_collections

from docnmt_jax.config_files import load_config
from docnmt_jax.data.documents import Document
from docnmt_jax.files import read_record, write_record
from docnmt_jax.training.budget import TINY_MODEL, resize_model, set_key, train_speed
from experiments.results_rows import Row

STAGES = ("train", "measure", "synthetic", "params")


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
    #: > 0: the converged budget -- every row trains until ``patience`` dev evaluations in a
    #: row (one every ``eval_every_epochs``) bring no better dev BLEU (greedy, the EMA), at
    #: most ``max_epochs``; the best checkpoint on dev is measured. 0: the token budget.
    patience: int = 0
    eval_every_epochs: float = 0.5
    max_epochs: float = 40.0
    #: ``(row, release directory)`` pairs: rows starting from ``row`` (``Row.init_from``)
    #: start from the release instead of its run (a committed base survives a new machine);
    #: ``row`` itself is not trained or measured again, its saved records are reported
    released: tuple[tuple[str, str], ...] = ()
    #: ``(row, release directory)`` pairs: ``row`` continues the interim release of its own
    #: training (``init_from_continue``: its step, schedule and best dev value) when its run
    #: directory holds no checkpoint (a new machine)
    continued: tuple[tuple[str, str], ...] = ()

    @property
    def converged(self) -> bool:
        return self.patience > 0

    @property
    def checkpoint(self) -> str:
        """The checkpoint every stage measures: chosen on dev when converged."""
        return "best" if self.converged else "latest"

    def row_dir(self, row: str) -> str:
        return os.path.join(self.out, "rows", row)

    def release_of(self, row: str) -> str:
        """The release directory that stands for ``row`` ('' for none)."""
        return dict(self.released).get(row, "")

    def continuation_of(self, row: str) -> str:
        """The interim release ``row`` continues ('' for none)."""
        return dict(self.continued).get(row, "")


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


def row_config(
    row: Row, settings: Settings, steps: int, tokenizer: str, eval_every: int = 0
) -> ml_collections.ConfigDict:
    """The training config of ``row``: its file and overrides, the shared tokenizer, budget
    flags and sizes; checkpoints every quarter of the steps, dev loss at the end. With the
    converged budget: dev BLEU and a checkpoint every ``eval_every`` steps, the best on dev
    kept, and ``patience`` (none for a row trained for the tokens of others:
    ``Row.same_tokens_as``)."""
    config = load_config(row.config)
    resize_model(config, settings.model)
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
    if settings.converged:  # steps = max_epochs of this row's batches (compute_budget)
        config.train.dev_bleu = True
        config.train.best_metric = "dev_bleu"
        config.train.best_mode = "max"
        config.train.patience = 0 if row.same_tokens_as else settings.patience
        config.train.eval_every = config.train.checkpoint_every = max(eval_every, 1)
    config.train.log_every = max(min(50, steps // 4), 1)
    config.train.aot_compile = settings.aot_compile
    if row.init_from:
        release = settings.release_of(row.init_from)
        config.init_from = release or settings.row_dir(row.init_from)
        config.init_from_which = "best" if release else settings.checkpoint
        if settings.converged or release:  # the parameters its translations use: the EMA where kept
            config.init_from_params = "auto"
    if settings.continuation_of(row.name):  # resuming its own checkpoints wins
        config.init_from = settings.continuation_of(row.name)
        config.init_from_which, config.init_from_params = "best", "auto"
        config.init_from_continue = True
    for key, value in row.overrides:  # last: a row's own setting is never overwritten
        set_key(config, key, value)
    if "max_segments" in config.model:
        config.model.max_segments = max(config.model.max_segments, config.data.max_sentences)
    return config


def train_row(
    row: Row, settings: Settings, steps: int, tokenizer_path: str, eval_every: int = 0
) -> dict[str, Any]:
    """Trains ``row`` for ``steps`` (resuming its checkpoints) and returns the train record.
    A training stopped before ``steps`` (SIGTERM/SIGINT: its checkpoint saved) raises
    ``KeyboardInterrupt``: no record is written, the whole run stops, and the same command
    resumes the row from its checkpoint."""
    from docnmt_jax.training import trainer
    from docnmt_jax.training.dev_eval import dev_bleu_hook

    workdir = settings.row_dir(row.name)
    config = row_config(row, settings, steps, tokenizer_path, eval_every)
    with cpu_time(os.path.join(workdir, "cpu_seconds.json")) as cpu:
        result = trainer.train_and_evaluate(config, workdir, dev_hook=dev_bleu_hook(config))
    if result.step < steps and result.stopped_by != "patience":  # a signal: resumes
        raise KeyboardInterrupt(f"{row.name}: training stopped at step {result.step}")
    record = {
        "steps": result.step,
        "stopped_by": result.stopped_by,
        "dev": result.dev_metrics,
        **train_speed(os.path.join(workdir, "train.log")),  # wall_seconds: every session's
        "cpu_seconds": cpu["seconds"],  # every session's, this process's threads
        "code": code_version(),
    }
    return record


@contextlib.contextmanager
def cpu_time(path: str) -> Iterator[dict[str, float]]:
    """Adds this process's CPU seconds (user + system, every thread) spent inside the block to
    the total kept in ``path``, also when the block is left by a signal; yields the mapping
    whose ``seconds`` holds the total once the block is done."""
    saved = read_record(path) or {"seconds": 0.0}
    before = resource.getrusage(resource.RUSAGE_SELF)
    try:
        yield saved
    finally:
        after = resource.getrusage(resource.RUSAGE_SELF)
        used = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        saved["seconds"] = float(saved["seconds"]) + used
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_record(path, saved)


def code_version() -> str:
    """The commit of the checkout this runner runs from (``+dirty`` when files differ), or
    ``unknown`` outside a git checkout."""
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        head = subprocess.run(
            ["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


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
        workdir, settings.checkpoint, search, batch_tokens=settings.batch_tokens
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
    if model.uses_context:
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
        "learning_rate",
        "clip_norm",
        "ema_decay",
        "label_smoothing",
        "seed",
        "eval_every",
        "time_budget_minutes",
    )
)


def synthetic_config(row: Row, settings: Settings, data_dir: str) -> ml_collections.ConfigDict:
    """The row's architecture at the proof size on the synthetic corpus in ``data_dir``."""
    from docnmt_jax.commands import context_proof

    config = load_config(row.config)
    for key, value in row.overrides:
        set_key(config, key, value)
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
    resize_model(config, settings.synthetic_model)
    if "max_segments" in config.model:
        config.model.max_segments = max(config.model.max_segments, config.data.max_sentences)
    config.init_from = ""
    config.train.freeze = ()
    config.train.aot_compile = settings.aot_compile
    return config


def synthetic_row(row: Row, settings: Settings, data_dir: str) -> dict[str, Any]:
    """The row's architecture on the synthetic context task (proof size): accuracy of the
    labelled words, overall and per antecedent distance."""
    from docnmt_jax.commands import context_proof

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
    params, _ = restore.load_params(model, settings.row_dir(row.name), settings.checkpoint)
    return {"params": int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(params)))}


def row_complete(row: Row, record: dict[str, Any]) -> bool:
    """Whether every stage of ``row`` has its record (a row sharing its base row's synthetic
    accuracy has no synthetic stage of its own)."""
    own = [s for s in STAGES if s != "synthetic" or row.base == row.name]
    return all(record.get(stage) for stage in own)


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
            **release_input(row, settings),
            **(
                {"patience": settings.patience, "eval_every_epochs": settings.eval_every_epochs}
                if settings.converged
                else {}
            ),
        }
    if stage == "measure":
        return {
            "steps": steps,
            **({"checkpoint": "best"} if settings.converged else {}),
            "beam": settings.beam,
            "alpha": settings.alpha,
            "draws": settings.draws,
        }
    if stage == "synthetic":
        lower = {"lr_factor": row.lr_factor} if row.lr_factor != 1.0 else {}
        return {"steps": settings.synthetic_steps, **lower}
    return {"steps": steps}


def release_input(row: Row, settings: Settings) -> dict[str, Any]:
    """A train input naming the release ``row`` starts from by its parameters' sha256 (none
    when it starts from a run)."""
    release = settings.release_of(row.init_from) if row.init_from else ""
    if not release:
        return {}
    from docnmt_jax.export import release as release_lib

    manifest = release_lib.read_manifest(release)
    return {"init_release": manifest["files"][release_lib.PARAMS_FILE]["sha256"]}


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
