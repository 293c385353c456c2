"""One results table for every model on the Bible: ``make results``.

    python launch/results.py [--out runs/results] [--doc docs/results.md]
        [--base_steps 3000] [--rows transformer,final,...] [--seeds 0,1,2]
        [--beam 5] [--draws 1] [--synthetic_steps 1500]
    python launch/results.py --quick        # tiny models, a few steps: minutes (CI)

Trains every row of :data:`docnmt_jax.evaluation.results.ROWS` on the Bible with the same
budget in real target tokens (``--base_steps`` packed sentence-Transformer steps), translates
the test books (beam 5, alpha 0.6), measures BLEU with random context and Delta_BLEU,
single-sentence BLEU, pronoun F1, parameters, train and decode speed, and the synthetic
context task; then writes ``OUT/results.md`` and ``OUT/results.json`` (and ``--doc``). Every
stage of every row is saved when done: run the same command again to resume (a larger
``--base_steps`` trains the rows on from their checkpoints). A stage that fails is reported
in one line (its traceback in ``OUT/rows/ROW/STAGE.error``) and the others go on; the exit
status is then 1. ``--quick`` takes the few shortest chapters of each split (``OUT/data``)
and tiny models; its table has every row and column of the full one.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import platform
import sys
import time
import traceback

from docnmt_jax import cli
from docnmt_jax.data import readers
from docnmt_jax.data.documents import write_tsv
from docnmt_jax.errors import RunNotFoundError
from docnmt_jax.evaluation import results as R
from docnmt_jax.evaluation.results_significance import paired_rows
from docnmt_jax.files import log_line, write_atomic

QUICK_DOCS = {"train": 60, "dev": 3, "test": 4}  # shortest chapters per split (--quick)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = cli.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny models, a few steps (CI)")
    p.add_argument("--out", help="run directory (default runs/results, --quick runs/results_quick)")
    p.add_argument(
        "--doc", help="also write the report here (default docs/results.md; --quick: none)"
    )
    p.add_argument("--data_dir", default="data/bible", help="the prepared Bible corpus")
    p.add_argument(
        "--readme",
        help="also fill this file's <!-- results:begin/end --> block with the table "
        "(default README.md; --quick: none)",
    )
    p.add_argument("--rows", default="", help="comma-separated rows (default: all)")
    p.add_argument("--seeds", default="0,1,2", help="seeds of the Transformer and FINAL rows")
    p.add_argument("--base_steps", type=int, help="budget: packed sentence-Transformer steps")
    p.add_argument("--beam", type=int)
    p.add_argument("--draws", type=int, help="random-context draws for Delta_BLEU")
    p.add_argument("--synthetic_steps", type=int)
    p.add_argument(
        "--stages",
        default=",".join(R.STAGES),
        help="stages to run ('': only write the report of what is saved)",
    )
    p.add_argument(
        "--jobs", type=int, default=0, help="processes sharing the rows (default 1; --quick 2)"
    )
    p.add_argument("--worker", type=int, help=argparse.SUPPRESS)  # set by --jobs
    args = p.parse_args(argv)
    if args.readme is None:
        args.readme = "" if args.quick else "README.md"
    return args


def settings_from(args: argparse.Namespace) -> R.Settings:
    out = args.out or ("runs/results_quick" if args.quick else "runs/results")
    if args.quick:
        settings = R.quick_settings(out, os.path.join(out, "data"))
    else:
        settings = R.Settings(out=out, data_dir=args.data_dir)
    changes = {
        k: getattr(args, k)
        for k in ("base_steps", "beam", "draws", "synthetic_steps")
        if getattr(args, k) is not None
    }
    return dataclasses.replace(settings, **changes)


def shortest(path: str, n: int) -> list:
    """The ``n`` chapters of ``path`` whose longest verse is shortest (the quick run's data:
    small batch shapes, every verse well within 128 pieces)."""
    docs = readers.read_tsv(path)
    return sorted(docs, key=lambda d: max(len(s.split()) for s in d.src + d.tgt))[:n]


def prepare(args: argparse.Namespace, settings: R.Settings) -> R.Plan:
    """The corpus (the quick run's subset), the shared tokenizer, the synthetic corpus and
    the Transformer's tokens per step (the budget's unit)."""
    from docnmt_jax.data.tokenizer import get_or_train_tokenizer
    from docnmt_jax.evaluation import context_proof
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
    tokenizer = get_or_train_tokenizer(tokenizer_path, train_docs, vocab_size=settings.vocab_size)
    reference = R.row_config(R.rows()[0], settings, 1, tokenizer_path)
    ref_tokens, epoch = R.tokens_per_step(reference, tokenizer)
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
    return R.Plan(tokenizer_path, ref_tokens, epoch, test, synthetic_dir, corpus)


def row_steps(row: R.Row, settings: R.Settings, plan: R.Plan) -> float:
    """The row's real target tokens per training step on its own batch plan."""
    from docnmt_jax.data.tokenizer import load_tokenizer

    config = R.row_config(row, settings, 1, plan.tokenizer_path)
    per_step, _ = R.tokens_per_step(config, load_tokenizer(plan.tokenizer_path))
    return per_step


def recipe_words(settings: R.Settings) -> str:
    """How the rows' training recipe is set, for the report's header."""
    if settings.warmup_steps is None and settings.lr_scale is None:
        return (
            "Every row trains with its config's defaults (the recipe chosen on dev by the "
            "recipe study, [`recipe_study.md`](recipe_study.md)); a row at a lower rate says so."
        )
    return (
        f"Every row's warm-up {settings.warmup_steps} and learning-rate scale "
        f"{settings.lr_scale} replace its config's (a run of a few steps)."
    )


def header(args: argparse.Namespace, settings: R.Settings, plan: R.Plan) -> str:
    import jax

    device = jax.devices()[0]
    kind = (
        "quick run (tiny models: checks the pipeline, not the models)"
        if settings.quick
        else ("budgeted comparison" if device.platform == "cpu" else "comparison")
    )
    budget = settings.base_steps * plan.reference_tokens_per_step
    shown = [  # what makes the table; --stages/--jobs only say how this call works
        a
        for a in (sys.argv[1:] if argv_is_cli() else [])
        if not a.startswith(("--stages", "--jobs", "--worker")) and a != ""
    ]
    command = "python launch/results.py " + " ".join(shown)
    return "\n".join(
        [
            f"# Results on the Bible (Es→En): {kind}",
            "",
            *(
                [
                    "**The Bible is not prepared on this machine: the synthetic corpus "
                    f"stands in for it ({settings.data_dir}).**",
                    "",
                ]
                if plan.corpus != "Bible"
                else []
            ),
            f"Command: `{command.strip()}` (resumable; `make results`). Written "
            f"{datetime.datetime.now().strftime('%Y-%m-%d %H:%M')} on {platform.node() or 'host'}: "
            f"{os.cpu_count()} CPUs, JAX device {device.device_kind}.",
            "",
            f"**Budget per row:** the real target tokens of {settings.base_steps:,} packed "
            f"sentence-Transformer steps ({plan.reference_tokens_per_step:,.0f} a step, "
            f"{budget / 1e6:.2f}M tokens, {budget / max(plan.epoch_tokens, 1):.2f} epochs of "
            f"{plan.epoch_tokens:,} training target tokens); each row's steps from its own batch "
            "plan (padding excluded). "
            + recipe_words(settings)
            + f" One sentencepiece model ({settings.vocab_size} pieces) for every row, seed 0 "
            "unless stated, latest "
            "checkpoint. Pretrain→finetune rows start from the sentence Transformer row and then "
            "get the same budget again (twice the tokens in all). Training recipes at this "
            "budget, chosen on dev: [`recipe_study.md`](recipe_study.md)."
            + (
                " Not converged: a CPU budget; differences within the seed spread below mean "
                "nothing."
                if not settings.quick
                else ""
            ),
            "",
            f"**Test:** {len(plan.test)} chapters, {sum(len(d) for d in plan.test):,} verses; "
            f"beam {settings.beam}, α {settings.alpha}; s-BLEU, d-BLEU, chrF and pronoun F1 "
            "(clipped English pronoun matches per sentence) on every test chapter. "
            + context_scope(settings, plan)
            + f" BLEU with random context: {settings.draws} draw(s) of contexts from other "
            "chapters (Jean & Cho 2019), Δ_BLEU = BLEU with the true context (s-BLEU, context "
            "books) − that; single-sentence BLEU: every verse of the same chapters translated "
            "alone (Zheng et al. 2020, Table 2). Ratios are to the "
            "sentence Transformer: real train tokens/s from each row's train.log (rows trained one "
            "after another, not interleaved), decode sentences/s over every translation of the "
            "row (compilation included). Synthetic acc.: labelled-word accuracy on the synthetic "
            f"context task (tiny models, {settings.synthetic_steps} steps; chance 0.333).",
        ]
    )


def context_scope(settings: R.Settings, plan: R.Plan) -> str:
    """Which chapters the random-context and single-sentence translations cover."""
    if not settings.context_books:
        return "Random-context and single-sentence translations: every test chapter."
    picked = [d for d in plan.test if d.doc_id.startswith(settings.context_books)]
    books = ", ".join(b.rstrip(".") for b in settings.context_books)
    return (
        f"Random-context and single-sentence translations on {books} ({len(picked)} "
        f"chapters, {sum(len(d) for d in picked):,} verses; CPU time), as Jean & Cho's "
        "Table 1 analogue in BUILD_NOTES."
    )


README_BEGIN, README_END = "<!-- results:begin -->", "<!-- results:end -->"


def update_readme(path: str, report: str) -> None:
    """Replaces the text between the results markers of ``path`` with the report's table
    and notes (its title and header paragraphs stay in docs/results.md)."""
    with open(path, encoding="utf-8") as f:
        readme = f.read()
    if README_BEGIN not in readme or README_END not in readme:
        raise R.ConfigError(f"{path}: no {README_BEGIN} ... {README_END} block to fill")
    table = report[report.index("| row |") :]
    head, rest = readme.split(README_BEGIN, 1)
    _, tail = rest.split(README_END, 1)
    write_atomic(path, f"{head}{README_BEGIN}\n{table.rstrip()}\n{README_END}{tail}")


def argv_is_cli() -> bool:
    return os.path.basename(sys.argv[0]) == "results.py"


def load_records(row_list: list[R.Row], settings: R.Settings, budget: dict) -> dict:
    """Every saved stage record whose inputs match this run's (what the workers wrote)."""
    records: dict[str, dict] = {}
    for row in row_list:
        records[row.name] = {}
        if row.name not in budget:
            continue
        for stage in R.STAGES:
            saved = R.read_record(os.path.join(settings.row_dir(row.name), f"{stage}.json"))
            inputs = R.stage_inputs(stage, row, settings, budget[row.name][0])
            if saved is not None and saved.get("inputs") == inputs:
                records[row.name][stage] = saved
    return records


def wait_for(row: R.Row, settings: R.Settings, timeout_s: float = 6 * 3600) -> None:
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
    row_list: list[R.Row],
    settings: R.Settings,
    plan: R.Plan,
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
        if row.name not in budget:
            on_stage(len(R.STAGES))
            continue
        steps, per_step = budget[row.name]

        def train(row: R.Row = row, steps: int = steps, per_step: float = per_step) -> dict:
            if row.init_from:
                wait_for(row, settings)
            record = R.train_row(row, settings, steps, plan.tokenizer_path)
            record["tokens_per_step"] = per_step
            record["epochs"] = record["steps"] * per_step / max(plan.epoch_tokens, 1)
            return record

        work = {
            "train": train,
            "measure": lambda row=row: R.measure_row(row, settings, plan.test),
            "synthetic": lambda row=row: R.synthetic_row(row, settings, plan.synthetic_dir),
            "params": lambda row=row: R.params_row(row, settings),
        }
        trained = False
        for stage in R.STAGES:
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
            inputs = R.stage_inputs(stage, row, settings, steps)
            t0 = time.monotonic()
            try:
                _, fresh = R.run_stage(stage, row, settings, work[stage], inputs)
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


def doc_path(args: argparse.Namespace, settings: R.Settings) -> str:
    """Where the report goes besides ``OUT`` ('' for none)."""
    return args.doc if args.doc is not None else ("" if settings.quick else "docs/results.md")


def committed_rows(doc: str) -> set[str]:
    """The rows with a train record in the committed report (``DOC`` with ``.json``)."""
    import json

    path = os.path.splitext(doc)[0] + ".json" if doc else ""
    if not path or not os.path.exists(path):
        return set()
    with open(path, encoding="utf-8") as f:
        return {
            r["name"] for r in json.load(f).get("rows", []) if r.get("records", {}).get("train")
        }


def restore_records(doc: str, row_list: list[R.Row], settings: R.Settings, budget: dict) -> int:
    """Copies the stage records of the committed report (``DOC`` with ``.json``) into ``OUT``
    where ``OUT`` has none and the inputs match: a fresh checkout (a new machine) keeps the
    rows measured before. Checkpoints are not in the report: a row that a row still to run
    starts from (``init_from``), or whose measure or params stage is still to run, is trained
    again, and a larger ``--base_steps`` retrains every row."""
    import json

    path = os.path.splitext(doc)[0] + ".json" if doc else ""
    if not path or not os.path.exists(path):
        return 0
    with open(path, encoding="utf-8") as f:
        saved = {r["name"]: r.get("records", {}) for r in json.load(f).get("rows", [])}
    # A row another row still has to start from needs its checkpoints: its training is not
    # restored (it trains again; its measured records, which match, are kept).
    bases = {r.init_from for r in row_list if r.init_from and "params" not in saved.get(r.name, {})}
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
            inputs = R.stage_inputs(stage, row, settings, budget[row.name][0])
            if not os.path.exists(target) and record.get("inputs") == inputs:
                R.write_record(target, record)
                count += 1
    return count


def compute_budget(row_list: list[R.Row], settings: R.Settings, plan: R.Plan, say) -> dict:
    """Each row's (steps, real target tokens per step), cached in ``OUT/budget.json``."""
    import json

    path = os.path.join(settings.out, "budget.json")
    cache = R.read_record(path) or {}
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
        budget[row.name] = (
            max(round(settings.base_steps * plan.reference_tokens_per_step / per_step), 1),
            per_step,
        )
    return budget


def main(argv: list[str] | None = None) -> int:
    import json

    from tqdm import tqdm

    args = parse_args(argv)
    settings = settings_from(args)
    seeds = [int(s) for s in args.seeds.split(",") if s]
    row_list = R.select_rows(args.rows, seeds if not settings.quick else [0], extras=True)
    committed = committed_rows(doc_path(args, settings))

    def trained(row: R.Row) -> bool:
        return row.name in committed or os.path.exists(
            os.path.join(settings.row_dir(row.name), "train.json")
        )

    if not args.rows and not settings.quick:  # extra rows run only by name; reported once run
        row_list = [r for r in row_list if not r.extra or trained(r)]
    stages = [s for s in args.stages.split(",") if s]
    unknown = set(stages) - set(R.STAGES)
    if unknown:
        raise R.ConfigError(f"--stages: unknown {sorted(unknown)}; stages: {', '.join(R.STAGES)}")
    jobs = args.jobs or (2 if settings.quick else 1)
    start = time.monotonic()
    plan = prepare(args, settings)
    log_path = os.path.join(settings.out, "results.log")

    def say(message: str) -> None:
        tqdm.write(message)
        with open(log_path, "a", encoding="utf-8") as f:
            f.write(log_line(message))

    planned = row_list
    if not stages:  # a report of what is saved: rows never trained need no budget
        planned = [r for r in row_list if trained(r)]
    budget = compute_budget(planned, settings, plan, say)
    restored = restore_records(doc_path(args, settings), row_list, settings, budget)
    if restored:
        say(f"restored {restored} stage records from {doc_path(args, settings)}")
    if args.worker is not None:  # one of --jobs processes: its share of the rows, no report
        mine = [r for i, r in enumerate(row_list) if i % jobs == args.worker]
        try:
            return 1 if run_rows(mine, settings, plan, budget, stages, say, lambda n: None) else 0
        except KeyboardInterrupt as stop:
            say(f"{stop or 'interrupted'}; run the same command again to resume")
            return 130

    doc = doc_path(args, settings)

    def write_report() -> str:
        """The report of every record saved so far (after each row and at the end)."""
        records = load_records(row_list, settings, budget)
        paired = paired_rows(row_list, settings.row_dir, plan.test, R.read_record, R.write_record)
        text, payload = R.report(row_list, records, settings, header(args, settings, plan), paired)
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

    bar = tqdm(total=len(row_list) * len(R.STAGES), desc="results", unit="stage")
    if jobs > 1:
        failures = run_workers(args, jobs, settings, row_list, bar)
    else:
        try:
            failures = run_rows(
                row_list, settings, plan, budget, stages, say, bar.update, write_report
            )
        except KeyboardInterrupt as stop:  # SIGTERM/SIGINT: checkpoint saved, no record
            bar.close()
            write_report()
            say(f"{stop or 'interrupted'}; run the same command again to resume")
            return 130
    bar.close()
    text = write_report()
    print(text)
    print(
        f"written: {settings.out}/results.md, results.json{', ' + doc if doc else ''} "
        f"({(time.monotonic() - start) / 60:.1f} min)"
    )
    missing = [r.name for r in planned if r.name not in budget]
    if failures or missing:
        print(
            f"results.py: failed: {', '.join(failures + [m + ' budget' for m in missing])}",
            file=sys.stderr,
        )
        return 1
    return 0


def run_workers(
    args: argparse.Namespace, jobs: int, settings: R.Settings, row_list: list, bar
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
            os.path.abspath(__file__),
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
            for s in R.STAGES
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


if __name__ == "__main__":
    cli.run_argparse(main)
