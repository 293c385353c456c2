"""One results table for every model on the Bible: ``make results``.

    python experiments/results.py [--out runs/results] [--doc docs/results.md]
        [--base_steps 3000] [--rows transformer,final,...] [--seeds 0,1,2]
        [--beam 5] [--draws 1] [--synthetic_steps 1500]
    python experiments/results.py --quick        # tiny models, a few steps: minutes (CI)
    python experiments/results.py --converged [--patience 3] [--eval_every_epochs 0.5]
        [--max_epochs 40] [--rows ...]           # every row until dev BLEU stops improving

Trains every row of :func:`experiments.results_rows.rows` on the Bible with the same
budget in real target tokens (``--base_steps`` packed sentence-Transformer steps), translates
the test books (beam 5, alpha 0.6), measures BLEU with random context and Delta_BLEU,
single-sentence BLEU, pronoun F1, parameters, train and decode speed, and the synthetic
context task; then writes ``OUT/results.md`` and ``OUT/results.json`` (and ``--doc``). Every
stage of every row is saved when done: run the same command again to resume (a larger
``--base_steps`` trains the rows on from their checkpoints). A stage that fails is reported
in one line (its traceback in ``OUT/rows/ROW/STAGE.error``) and the others go on; the exit
status is then 1. ``--quick`` takes the few shortest chapters of each split (``OUT/data``)
and tiny models, and trains the rows of ``QUICK_ROWS`` (a sentence row, a document row,
pretrain -> finetune and its continued control; ``--rows`` names others); its table has every
column of the full one.

``--converged`` replaces the token budget: every row trains until ``--patience`` dev
evaluations in a row (one every ``--eval_every_epochs`` of its own batches) bring no better
dev BLEU, at most ``--max_epochs``, and its best checkpoint on dev is measured; finetune rows
start from the best checkpoint (its EMA) of seed 0's sentence Transformer -- from its committed
release ``releases/bible-transformer`` once it exists (``--init_release``) -- and their
control ``transformer_continued`` trains as many real target tokens as the longest-trained
FINAL row; FINAL finetuned and the control over every ``--seeds``
(:data:`~experiments.results_rows.CONVERGED_ROWS`; report ``docs/results_converged.md``,
run directory ``runs/results_converged``).

``--init_release ROW=DIR[,ROW=DIR]``: rows that start from ``ROW`` start from the release in
``DIR`` (``docnmt-export``) instead of ``ROW``'s run, and ``ROW`` is reported from its saved
records, never trained again. Default with ``--converged``:
``transformer=releases/bible-transformer`` when that release exists and is not interim;
``''``: none. ``--continue_release ROW=DIR``: ``ROW`` continues its own training from the
interim release in ``DIR`` (``experiments/release_row.py --interim``) when its run directory
holds no checkpoint: a campaign's row survives a new machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from docnmt_jax import cli  # noqa: E402
from docnmt_jax.errors import ConfigError  # noqa: E402
from docnmt_jax.files import log_line  # noqa: E402
from experiments import results_run  # noqa: E402
from experiments.results_rows import (  # noqa: E402
    CONVERGED_ROWS,
    CONVERGED_SEEDED,
    QUICK_ROWS,
    SEEDED,
    Row,
    select_rows,
)
from experiments.results_stages import STAGES, Settings, quick_settings  # noqa: E402


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
        default="",
        help="also fill this file's <!-- results:begin/end --> block with the table "
        "(default: none; the README links docs/results.md instead)",
    )
    p.add_argument("--rows", default="", help="comma-separated rows (default: all)")
    p.add_argument("--seeds", default="0,1,2", help="seeds of the Transformer and FINAL rows")
    p.add_argument("--base_steps", type=int, help="budget: packed sentence-Transformer steps")
    p.add_argument(
        "--converged",
        action="store_true",
        help="the converged budget: every row until its dev BLEU stops improving (default "
        "--out runs/results_converged, --doc docs/results_converged.md)",
    )
    p.add_argument("--patience", type=int, default=3, help="--converged: dev evaluations")
    p.add_argument(
        "--eval_every_epochs", type=float, default=0.5, help="--converged: between dev BLEUs"
    )
    p.add_argument("--max_epochs", type=float, default=40.0, help="--converged: at most")
    p.add_argument(
        "--init_release",
        help="ROW=DIR[,ROW=DIR]: rows starting from ROW start from the release DIR (default "
        "with --converged: transformer=releases/bible-transformer when it exists; '': none)",
    )
    p.add_argument(
        "--continue_release",
        default="",
        help="ROW=DIR[,ROW=DIR]: ROW continues its training from its interim release DIR",
    )
    p.add_argument("--beam", type=int)
    p.add_argument("--draws", type=int, help="random-context draws for Delta_BLEU")
    p.add_argument("--synthetic_steps", type=int)
    p.add_argument(
        "--stages",
        default=",".join(STAGES),
        help="stages to run ('': only write the report of what is saved)",
    )
    p.add_argument(
        "--jobs", type=int, default=0, help="processes sharing the rows (default 1; --quick 2)"
    )
    p.add_argument("--worker", type=int, help=argparse.SUPPRESS)  # set by --jobs
    return p.parse_args(argv)


def settings_from(args: argparse.Namespace) -> Settings:
    default = "runs/results_converged" if args.converged else "runs/results"
    out = args.out or ("runs/results_quick" if args.quick else default)
    if args.quick:
        settings = quick_settings(out, os.path.join(out, "data"))
    else:
        settings = Settings(out=out, data_dir=args.data_dir)
    if args.converged:
        settings = dataclasses.replace(
            settings,
            patience=args.patience,
            eval_every_epochs=args.eval_every_epochs,
            max_epochs=args.max_epochs,
        )
    settings = dataclasses.replace(
        settings,
        released=released_rows(args),
        continued=release_pairs(args.continue_release, "--continue_release"),
    )
    changes = {
        k: getattr(args, k)
        for k in ("base_steps", "beam", "draws", "synthetic_steps")
        if getattr(args, k) is not None
    }
    return dataclasses.replace(settings, **changes)


#: The release the converged finetune rows start from once it is committed.
BASE_RELEASE = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "releases", "bible-transformer"
)


def release_pairs(text: str, flag: str) -> tuple[tuple[str, str], ...]:
    """``ROW=DIR[,ROW=DIR]`` as ``(row, absolute directory)`` pairs, each a release."""
    from docnmt_jax.export import release as release_lib

    pairs = []
    for part in (p for p in text.split(",") if p):
        row, sep, directory = part.partition("=")
        if not sep or not row or not directory:
            raise ConfigError(f"{flag}: {part!r} is not ROW=DIR")
        if not release_lib.is_release(directory):
            raise ConfigError(f"{flag}: {directory} is not a release (no release.json)")
        pairs.append((row, os.path.abspath(directory)))
    return tuple(pairs)


def is_final_release(directory: str) -> bool:
    """Whether ``directory`` holds a release whose training ended (not ``--interim``)."""
    from docnmt_jax.export import release as release_lib

    if not release_lib.is_release(directory):
        return False
    training = release_lib.read_manifest(directory).get("training") or {}
    return training.get("stopped_by") != "interim"


def released_rows(args: argparse.Namespace) -> tuple[tuple[str, str], ...]:
    """``--init_release`` as ``(row, absolute directory)`` pairs, each a release."""
    text = args.init_release
    if text is None:
        use_base = args.converged and not args.quick and is_final_release(BASE_RELEASE)
        text = f"transformer={BASE_RELEASE}" if use_base else ""
    pairs = release_pairs(text, "--init_release")
    for row, directory in pairs:
        if not is_final_release(directory):
            raise ConfigError(
                f"--init_release: {directory} is an interim release (its training goes on): "
                f"rows start from {row} once it is final; --continue_release {row}=DIR resumes it"
            )
    return pairs


def chosen_rows(args: argparse.Namespace, settings: Settings) -> tuple[list[Row], set[str]]:
    """The rows this run reports (an extra row only when named, or once it is trained) and
    the names of the rows trained already (here or in the committed report)."""
    seeds = [int(s) for s in args.seeds.split(",") if s]
    seeded = CONVERGED_SEEDED if settings.converged else SEEDED
    every_seed = [f"{n}_seed{s}" for n in seeded for s in seeds if s != 0]
    names = args.rows or (
        ",".join(QUICK_ROWS)
        if settings.quick
        else ",".join([*CONVERGED_ROWS, *every_seed]) * settings.converged
    )
    row_list = select_rows(names, seeds if not settings.quick else [0], True, seeded)
    committed = results_run.committed_rows(results_run.doc_path(args, settings))
    trained = {
        r.name
        for r in row_list
        if r.name in committed
        or os.path.exists(os.path.join(settings.row_dir(r.name), "train.json"))
    }
    if not args.rows and not settings.quick and not settings.converged:  # extra rows: by name
        row_list = [r for r in row_list if not r.extra or r.name in trained]
    return row_list, trained


def main(argv: list[str] | None = None) -> int:
    from tqdm import tqdm

    args = parse_args(argv)
    settings = settings_from(args)
    row_list, trained = chosen_rows(args, settings)
    stages = [s for s in args.stages.split(",") if s]
    unknown = set(stages) - set(STAGES)
    if unknown:
        raise ConfigError(f"--stages: unknown {sorted(unknown)}; stages: {', '.join(STAGES)}")
    jobs = args.jobs or (2 if settings.quick else 1)
    start = time.monotonic()
    plan = results_run.prepare(args, settings)
    log_path = os.path.join(settings.out, "results.log")

    def say(message: str) -> None:
        tqdm.write(message)
        with open(log_path, "a", encoding="utf-8") as f:
            f.write(log_line(message))

    # a report of what is saved (no stages): rows never trained need no budget
    planned = row_list if stages else [r for r in row_list if r.name in trained]
    budget = results_run.compute_budget(planned, settings, plan, say)
    doc = results_run.doc_path(args, settings)
    restored = results_run.restore_records(doc, row_list, settings, budget)
    if restored:
        say(f"restored {restored} stage records from {doc}")
    if args.worker is not None:  # one of --jobs processes: its share of the rows, no report
        mine = [r for i, r in enumerate(row_list) if i % jobs == args.worker]
        try:
            failed = results_run.run_rows(mine, settings, plan, budget, stages, say, lambda n: None)
            return 1 if failed else 0
        except KeyboardInterrupt as stop:
            say(f"{stop or 'interrupted'}; run the same command again to resume")
            return 130

    def write_report() -> str:
        return results_run.write_report(args, settings, plan, row_list, budget)

    bar = tqdm(total=len(row_list) * len(STAGES), desc="results", unit="stage")
    if jobs > 1:
        failures = results_run.run_workers(args, jobs, settings, row_list, bar)
    else:
        try:
            failures = results_run.run_rows(
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


if __name__ == "__main__":
    cli.run_argparse(main)
