"""Running the results table (``experiments/results.py``): the corpus and budget of a run,
every stage of every row (resuming what is saved, one failed stage reported and the others
run on), the records a committed report restores on a new machine, ``--jobs`` worker
processes, and the report written from whatever is saved.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
import traceback

from docnmt_jax.data import readers
from docnmt_jax.data.documents import write_tsv
from docnmt_jax.errors import ConfigError, RunNotFoundError
from docnmt_jax.files import read_record, write_atomic, write_record
from docnmt_jax.training.budget import tokens_per_step
from experiments.context_use import read_context_use
from experiments.results_report import header, report, update_readme
from experiments.results_rows import Row, rows
from experiments.results_significance import paired_rows
from experiments.results_stages import (
    STAGES,
    Plan,
    Settings,
    measure_row,
    params_row,
    row_config,
    run_stage,
    stage_inputs,
    synthetic_row,
    train_row,
)

#: The command that ``--jobs`` starts once per worker.
RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results.py")
QUICK_DOCS = {"train": 60, "dev": 3, "test": 4}  # shortest chapters per split (--quick)


def shortest(path: str, n: int) -> list:
    """The ``n`` chapters of ``path`` whose longest verse is shortest (the quick run's data:
    small batch shapes, every verse well within 128 pieces)."""
    docs = readers.read_tsv(path)
    return sorted(docs, key=lambda d: max(len(s.split()) for s in d.src + d.tgt))[:n]


def prepare(args: argparse.Namespace, settings: Settings) -> Plan:
    """The corpus (the quick run's subset), the shared tokenizer, the synthetic corpus and
    the Transformer's tokens per step (the budget's unit)."""
    from docnmt_jax.commands import context_proof
    from docnmt_jax.data.tokenizer import get_or_train_tokenizer
    from docnmt_jax.training import data_setup

    have_bible = os.path.exists(os.path.join(args.data_dir, "test.tsv"))
    if not have_bible and not settings.quick:
        raise RunNotFoundError(
            f"{args.data_dir}/test.tsv not found: prepare the Bible first (`make data`, or "
            f"`python launch/prepare_data.py --corpus bible --out {args.data_dir}`)"
        )
    if settings.quick and not have_bible:
        # A machine without the SWORD modules: the synthetic corpus stands in (the header
        # says so), so that the quick run still checks every row and column.
        print(
            f"results.py: {args.data_dir}/test.tsv not found: the quick run uses the "
            "synthetic corpus instead of the Bible",
            file=sys.stderr,
        )
        counts = QUICK_DOCS
        context_proof.make_corpus(
            settings.data_dir, counts["train"], counts["dev"], counts["test"], seed=1
        )
    elif settings.quick:
        os.makedirs(settings.data_dir, exist_ok=True)
        for split, n in QUICK_DOCS.items():
            path = os.path.join(settings.data_dir, f"{split}.tsv")
            if not os.path.exists(path):
                write_tsv(shortest(os.path.join(args.data_dir, f"{split}.tsv"), n), path)
    import ml_collections

    data = ml_collections.ConfigDict({"data_dir": settings.data_dir, "corpus": "bible"})
    train_docs = data_setup.load_documents(data, "train")
    tokenizer_path = os.path.join(settings.out, "spm.model")
    os.makedirs(settings.out, exist_ok=True)
    use_release_tokenizer(settings, tokenizer_path)
    tokenizer = get_or_train_tokenizer(tokenizer_path, train_docs, vocab_size=settings.vocab_size)
    reference = row_config(rows()[0], settings, 1, tokenizer_path)
    ref_tokens, epoch = tokens_per_step(reference, tokenizer)
    synthetic_dir = context_proof.make_corpus(
        os.path.join(settings.out, "synthetic", "data"),
        settings.synthetic_train_docs,
        dev=max(settings.synthetic_test_docs // 5, 4),
        test=settings.synthetic_test_docs,
        task=context_proof.DENSE_TASK,
    )
    test = data_setup.load_documents(data, "test")
    stand_in = os.path.exists(os.path.join(settings.data_dir, "test.labels.jsonl"))
    corpus = "synthetic" if stand_in else "Bible"
    return Plan(tokenizer_path, ref_tokens, epoch, test, synthetic_dir, corpus)


def use_release_tokenizer(settings: Settings, tokenizer_path: str) -> None:
    """The shared tokenizer of a run whose rows start from releases: the releases' own
    ``spm.model`` (copied to ``tokenizer_path`` on first use; a different one there, or
    releases with different tokenizers, is an error: finetuning must keep the pieces)."""
    from docnmt_jax.export import release as release_lib

    digests = set()
    for _, directory in settings.released + settings.continued:
        manifest = release_lib.read_manifest(directory)
        source = release_lib.check_file(directory, manifest, release_lib.TOKENIZER_FILE)
        digests.add(release_lib.sha256(source))
        if not os.path.exists(tokenizer_path):
            shutil.copyfile(source, tokenizer_path)
    if digests and (len(digests) > 1 or release_lib.sha256(tokenizer_path) not in digests):
        raise ConfigError(
            f"{tokenizer_path}: not the tokenizer of the releases "
            f"{', '.join(d for _, d in settings.released)} (use a new --out)"
        )


def row_steps(row: Row, settings: Settings, plan: Plan) -> float:
    """The row's real target tokens per training step on its own batch plan."""
    from docnmt_jax.data.tokenizer import load_tokenizer

    config = row_config(row, settings, 1, plan.tokenizer_path)
    per_step, _ = tokens_per_step(config, load_tokenizer(plan.tokenizer_path))
    return per_step


def load_records(row_list: list[Row], settings: Settings, budget: dict) -> dict:
    """Every saved stage record whose inputs match this run's (what the workers wrote)."""
    records: dict[str, dict] = {}
    for row in row_list:
        records[row.name] = {}
        if row.name not in budget:
            continue
        for stage in STAGES:
            saved = read_record(os.path.join(settings.row_dir(row.name), f"{stage}.json"))
            inputs = stage_inputs(stage, row, settings, budget[row.name][0])
            frozen = bool(settings.release_of(row.name))  # its release's records, as saved
            if saved is not None and (frozen or saved.get("inputs") == inputs):
                records[row.name][stage] = saved
    return records


def wait_until_trained(names: list[str], settings: Settings, timeout_s: float = 48 * 3600) -> None:
    """Blocks until every row of ``names`` has a train record or a train error (another
    worker trains it)."""
    deadline = time.monotonic() + timeout_s
    for name in names:
        directory = settings.row_dir(name)
        while not any(
            os.path.exists(os.path.join(directory, f)) for f in ("train.json", "train.error")
        ):
            if time.monotonic() > deadline:
                raise RuntimeError(f"row {name!r} is still not trained after {timeout_s:.0f} s")
            time.sleep(5)


def wait_for(row: Row, settings: Settings, timeout_s: float = 6 * 3600) -> None:
    """Blocks until the row this one starts from is trained (another worker trains it)."""
    done = os.path.join(settings.row_dir(row.init_from), "train.json")
    failed = os.path.join(settings.row_dir(row.init_from), "train.error")
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(done):
        if os.path.exists(failed) or time.monotonic() > deadline:
            raise RuntimeError(
                f"row {row.init_from!r}, which {row.name} starts from, is not trained"
            )
        time.sleep(5)


def run_rows(
    row_list: list[Row],
    settings: Settings,
    plan: Plan,
    budget: dict,
    stages: list[str],
    say,
    on_stage,
    after_row=lambda: None,
) -> list[str]:
    """Runs (or finds saved) every stage of ``row_list`` (``after_row()`` after each row);
    returns the failed stages."""
    failures: list[str] = []
    for row in row_list:
        if row.name not in budget or settings.release_of(row.name):  # a release: as saved
            on_stage(len(STAGES))
            continue
        steps, per_step = budget[row.name]
        eval_every = round(settings.eval_every_epochs * plan.epoch_tokens / per_step)
        if settings.converged and row.same_tokens_as:
            steps = control_steps(row, settings, budget, stages)
            if not steps:
                names = ", ".join(row.same_tokens_as)
                say(f"{row.name}: none of {names} is trained: run one first")
                on_stage(len(STAGES))
                continue

        def train(
            row: Row = row, steps: int = steps, per_step: float = per_step, every: int = eval_every
        ) -> dict:
            if row.init_from and not settings.release_of(row.init_from):
                wait_for(row, settings)
            record = train_row(row, settings, steps, plan.tokenizer_path, every)
            record["tokens_per_step"] = per_step
            record["epochs"] = record["steps"] * per_step / max(plan.epoch_tokens, 1)
            return record

        work = {
            "train": train,
            "measure": lambda row=row: measure_row(row, settings, plan.test),
            "synthetic": lambda row=row: synthetic_row(row, settings, plan.synthetic_dir),
            "params": lambda row=row: params_row(row, settings),
        }
        trained = False
        for stage in STAGES:
            skip = (
                stage not in stages
                or (stage == "synthetic" and row.base != row.name)  # shares its base row's
                or (stage != "train" and not trained)
            )
            if skip:
                if stage == "train":
                    trained = os.path.exists(os.path.join(settings.row_dir(row.name), "train.json"))
                on_stage(1)
                continue
            inputs = stage_inputs(stage, row, settings, steps)
            t0 = time.monotonic()
            try:
                _, fresh = run_stage(stage, row, settings, work[stage], inputs)
            except Exception as error:  # one row's failure must not end the table
                error_path = os.path.join(settings.row_dir(row.name), f"{stage}.error")
                os.makedirs(os.path.dirname(error_path), exist_ok=True)
                write_atomic(error_path, traceback.format_exc())
                first = str(error).splitlines()[0] if str(error) else type(error).__name__
                failures.append(f"{row.name} {stage}")
                say(f"{row.name}: {stage} FAILED: {first} (traceback: {error_path})")
                on_stage(1)
                continue
            error_path = os.path.join(settings.row_dir(row.name), f"{stage}.error")
            if os.path.exists(error_path):
                os.remove(error_path)
            trained = trained or stage == "train"
            if fresh:
                say(f"{row.name}: {stage} done in {time.monotonic() - t0:.0f} s")
            on_stage(1)
        after_row()
    return failures


def control_steps(row: Row, settings: Settings, budget: dict, stages: list[str]) -> int:
    """A converged control's steps (:func:`same_token_steps`) once the rows it matches that
    this run trains (maybe in another worker) are trained; also set in ``budget`` for the
    report. 0: none of them is trained."""
    if "train" in stages:
        wait_until_trained([n for n in row.same_tokens_as if n in budget], settings)
    per_step = budget[row.name][1]
    steps = same_token_steps(row, settings, per_step)
    budget[row.name] = (steps or budget[row.name][0], per_step)
    return steps


def same_token_steps(row: Row, settings: Settings, per_step: float) -> int:
    """The converged budget of a control (``Row.same_tokens_as``): the steps of ``row``'s
    batches that hold the most real target tokens any of those rows trained (0: none is
    trained yet)."""
    tokens = []
    for name in row.same_tokens_as:
        record = read_record(os.path.join(settings.row_dir(name), "train.json"))
        if record is not None:
            tokens.append(record["steps"] * record["tokens_per_step"])
    return math.ceil(max(tokens) / per_step) if tokens else 0


def doc_path(args: argparse.Namespace, settings: Settings) -> str:
    """Where the report goes besides ``OUT`` ('' for none)."""
    if args.doc is not None:
        return args.doc
    if settings.quick:
        return ""
    return "docs/results_converged.md" if settings.converged else "docs/results.md"


def committed_rows(doc: str) -> set[str]:
    """The rows with a train record in the committed report (``DOC`` with ``.json``)."""
    path = os.path.splitext(doc)[0] + ".json" if doc else ""
    if not path or not os.path.exists(path):
        return set()
    with open(path, encoding="utf-8") as f:
        return {
            r["name"] for r in json.load(f).get("rows", []) if r.get("records", {}).get("train")
        }


def restore_records(doc: str, row_list: list[Row], settings: Settings, budget: dict) -> int:
    """Copies the stage records of the committed report (``DOC`` with ``.json``) into ``OUT``
    where ``OUT`` has none and the inputs match: a fresh checkout (a new machine) keeps the
    rows measured before. Checkpoints are not in the report: a row that a row still to run
    starts from (``init_from``), or whose measure or params stage is still to run, is trained
    again, and a larger ``--base_steps`` retrains every row."""
    path = os.path.splitext(doc)[0] + ".json" if doc else ""
    if not path or not os.path.exists(path):
        return 0
    with open(path, encoding="utf-8") as f:
        saved = {r["name"]: r.get("records", {}) for r in json.load(f).get("rows", [])}
    # A row another row still has to start from needs its checkpoints: its training is not
    # restored (it trains again; its measured records, which match, are kept).
    bases = {
        r.init_from
        for r in row_list
        if r.init_from
        and "params" not in saved.get(r.name, {})
        and not settings.release_of(r.init_from)
    }
    count = 0
    for row in row_list:
        if row.name not in budget:
            continue
        # A row measured only in part (its session ended between stages) has stages still to
        # run from checkpoints that were not committed (measure, params): it trains again too.
        unmeasured = not {"measure", "params"} <= set(saved.get(row.name, {}))
        retrain = (row.name in bases or unmeasured) and not os.path.isdir(
            os.path.join(settings.row_dir(row.name), "checkpoints")
        )
        for stage, record in saved.get(row.name, {}).items():
            if stage == "train" and retrain:
                continue
            target = os.path.join(settings.row_dir(row.name), f"{stage}.json")
            inputs = stage_inputs(stage, row, settings, budget[row.name][0])
            if not os.path.exists(target) and record.get("inputs") == inputs:
                write_record(target, record)
                count += 1
    return count


def compute_budget(row_list: list[Row], settings: Settings, plan: Plan, say) -> dict:
    """Each row's (steps, real target tokens per step), cached in ``OUT/budget.json``: the
    steps of the token budget, or with the converged budget those of ``max_epochs`` (the
    most a row may train before its dev BLEU stops improving)."""
    path = os.path.join(settings.out, "budget.json")
    cache = read_record(path) or {}
    budget = {}
    for row in row_list:
        key = f"{row.config}|{sorted(map(list, row.overrides))}|{plan.reference_tokens_per_step}"
        try:
            if key not in cache:
                cache[key] = row_steps(row, settings, plan)
                write_atomic(path, json.dumps(cache, indent=1) + "\n")
        except Exception as error:  # a row whose config cannot plan the corpus
            say(f"{row.name}: budget FAILED: {str(error).splitlines()[0]}")
            continue
        per_step = cache[key]
        tokens = (
            settings.max_epochs * plan.epoch_tokens  # converged: patience stops it before
            if settings.converged
            else settings.base_steps * plan.reference_tokens_per_step
        )
        steps = max(round(tokens / per_step), 1)
        if settings.converged and row.same_tokens_as:
            steps = same_token_steps(row, settings, per_step) or steps
        budget[row.name] = (steps, per_step)
    return budget


def run_workers(
    args: argparse.Namespace, jobs: int, settings: Settings, row_list: list, bar
) -> list[str]:
    """``jobs`` processes of this script, each with its share of the rows (``--worker``),
    their output in ``OUT/worker_K.log``; the bar follows the stage records they write."""
    import subprocess

    argv, skip = [], False
    for a in sys.argv[1:]:  # this run's own arguments without --jobs/--worker
        if skip or a.startswith(("--jobs=", "--worker=")):
            skip = False
            continue
        skip = a in ("--jobs", "--worker")
        if not skip:
            argv.append(a)
    procs = []
    for k in range(jobs):
        log = open(os.path.join(settings.out, f"worker_{k}.log"), "w", encoding="utf-8")
        command = [
            sys.executable,
            RUNNER,
            *argv,
            f"--jobs={jobs}",
            f"--worker={k}",
        ]
        procs.append((subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT), log))
    done = 0
    while any(p.poll() is None for p, _ in procs):
        time.sleep(3)
        now = sum(
            os.path.exists(os.path.join(settings.row_dir(r.name), f"{s}.{ext}"))
            for r in row_list
            for s in STAGES
            for ext in ("json", "error")
        )
        bar.update(max(now - done, 0))
        done = max(done, now)
    for _, log in procs:
        log.close()
    return [
        f"worker {k} (exit {p.returncode}; see {settings.out}/worker_{k}.log)"
        for k, (p, _) in enumerate(procs)
        if p.returncode != 0
    ]


def write_report(
    args: argparse.Namespace,
    settings: Settings,
    plan: Plan,
    row_list: list[Row],
    budget: dict,
) -> str:
    """The report of every record saved so far (after each row and at the end), written to
    ``OUT/results.md`` and ``OUT/results.json``, ``--doc`` and the ``--readme`` block."""
    doc = doc_path(args, settings)
    records = load_records(row_list, settings, budget)
    for row in row_list:  # experiments/context_use.py's results, where measured
        used = read_context_use(
            settings.row_dir(row.name),
            os.path.join(settings.data_dir, "test.pronouns.jsonl"),
            os.path.join(settings.data_dir, "test.tsv"),
        )
        if used and row.name in records:
            records[row.name]["context_use"] = used
    paired = paired_rows(row_list, settings.row_dir, plan.test, read_record, write_record)
    text, payload = report(row_list, records, settings, header(settings, plan), paired)
    body = json.dumps(payload, indent=2, default=float) + "\n"
    write_atomic(os.path.join(settings.out, "results.md"), text)
    write_atomic(os.path.join(settings.out, "results.json"), body)
    if doc:
        os.makedirs(os.path.dirname(doc) or ".", exist_ok=True)
        write_atomic(doc, text)
        write_atomic(os.path.splitext(doc)[0] + ".json", body)
    if args.readme:
        update_readme(args.readme, text)
    return text
