"""Exports a converged results row as a committed release, with how it was trained.

    python experiments/release_row.py --run_dir /work/campaign/out --row transformer \\
        --out releases/bible-transformer [--commit SHA] [--command "..."] [--max_mib 32]

The row's best checkpoint on dev (its parameters' EMA where kept) goes through
``docnmt-export`` into ``--out``; the manifest's ``training`` holds the commit and command
that trained it (the row's record names its commit; ``--commit`` for a record written before
it did), the steps, real target tokens and epochs, why training stopped, the dev metrics of
the chosen checkpoint (from ``train.log``) and the test scores of the row's ``measure``
record. A release over ``--max_mib`` MiB (all its files together) is refused and removed:
releases are committed to the repository.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from docnmt_jax import cli  # noqa: E402
from docnmt_jax.errors import RunNotFoundError, UserError  # noqa: E402
from docnmt_jax.export import release as release_lib  # noqa: E402
from docnmt_jax.files import read_record  # noqa: E402

MIB = 1 << 20


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = cli.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--run_dir", required=True, help="the results runner's --out")
    p.add_argument("--row", required=True, help="the row to release (e.g. transformer)")
    p.add_argument("--out", required=True, help="the release directory (e.g. releases/NAME)")
    p.add_argument("--commit", default="", help="the commit that trained it, if not recorded")
    p.add_argument("--command", default="", help="the command that trained it")
    p.add_argument("--max_mib", type=float, default=32.0, help="largest release allowed")
    p.add_argument("--overwrite", action="store_true", help="replace a release at --out")
    p.add_argument(
        "--interim",
        action="store_true",
        help="release a row still training: its best checkpoint so far (module docstring)",
    )
    return p.parse_args(argv)


def dev_metrics_at(train_log: str, step: int) -> dict[str, float]:
    """The dev metrics ``train.log`` logged at ``step`` (``step=N dev_bleu=... dev_loss=...``),
    empty when none were."""
    metrics: dict[str, float] = {}
    with open(train_log, encoding="utf-8") as f:
        for line in f:
            fields = line.split()[2:]  # after the date and time
            if f"step={step}" not in fields[:1]:
                continue
            for field in fields[1:]:
                key, _, value = field.partition("=")
                if key.startswith("dev_"):
                    metrics[key] = float(value)
    return metrics


def logged_tokens_per_step(train_log: str, up_to: int) -> float | None:
    """Mean real target tokens per step over the ``train/tokens`` that ``train.log`` logged
    (each the sum over the steps since the previous log line) up to step ``up_to``."""
    last, steps, tokens = 0, 0, 0.0
    with open(train_log, encoding="utf-8") as f:
        for line in f:
            fields = dict(x.partition("=")[::2] for x in line.split()[2:] if "=" in x)
            if "step" not in fields or "train/tokens" not in fields:
                continue
            step = int(fields["step"])
            if step <= last or step > up_to:  # a resumed run logs its steps again
                continue
            steps, tokens, last = steps + step - last, tokens + float(fields["train/tokens"]), step
    return tokens / steps if steps else None


def interim_record(workdir: str, step: int) -> dict:
    """The train record of a row still training, from ``train.log`` up to ``step``."""
    log = os.path.join(workdir, "train.log")
    record = {"steps": step, "tokens_per_step": logged_tokens_per_step(log, step)}
    with open(log, encoding="utf-8") as f:
        found = re.search(r"(\d+) train batches per epoch", f.read())
    if found:
        record["epochs"] = round(step / int(found.group(1)), 3)
    return dict(record, stopped_by="interim")


def best_step(workdir: str) -> int:
    """The step of the row's best checkpoint on dev."""
    best = os.path.join(workdir, "best")
    steps = sorted(int(d) for d in os.listdir(best) if d.isdigit()) if os.path.isdir(best) else []
    if not steps:
        raise RunNotFoundError(f"{best}: no best checkpoint (was the row trained converged?)")
    return steps[-1]


def training_record(args: argparse.Namespace) -> dict:
    """The manifest's ``training`` entry of the row (module docstring)."""
    workdir = os.path.join(args.run_dir, "rows", args.row)
    train = read_record(os.path.join(workdir, "train.json"))
    step = best_step(workdir)
    if train is None and args.interim:
        train = interim_record(workdir, step)
    elif train is None:
        raise RunNotFoundError(
            f"{workdir}/train.json not found: the row is not trained (--interim: release its "
            "best checkpoint so far)"
        )
    measure = read_record(os.path.join(workdir, "measure.json")) or {}
    scores = measure.get("scores") or {}
    commit = train.get("code") or args.commit
    if not commit:
        raise UserError(f"{workdir}/train.json names no commit: give --commit")
    per_step = train.get("tokens_per_step")
    record = {
        "row": args.row,
        "commit": commit,
        "command": args.command,
        "stopped_by": train.get("stopped_by"),
        "steps_trained": train["steps"],
        "chosen_step": step,
        "target_tokens_trained": round(train["steps"] * per_step) if per_step else None,
        "epochs_trained": train.get("epochs"),
        "wall_seconds": train.get("wall_seconds"),
        "cpu_seconds": train.get("cpu_seconds"),
        "dev_at_chosen_step": dev_metrics_at(os.path.join(workdir, "train.log"), step),
        "test": {k: (scores.get(k) or {}).get("score") for k in ("s_bleu", "d_bleu", "chrf")},
        "test_signature": (scores.get("s_bleu") or {}).get("signature"),
        "test_beam": (measure.get("inputs") or {}).get("beam"),
    }
    earlier = previous_interim(args.out)
    if earlier:  # the run continued this release (init_from_continue): say how it began
        record["continued_from"] = earlier
    return record


def previous_interim(out: str) -> dict | None:
    """The training record of the interim release at ``out`` (None: none there)."""
    if not release_lib.is_release(out):
        return None
    training = release_lib.read_manifest(out).get("training") or {}
    return training if training.get("stopped_by") == "interim" else None


def main(argv: list[str] | None = None) -> int:
    from docnmt_jax.commands import export

    args = parse_args(argv)
    record = training_record(args)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "training.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(record, f, indent=1)
        workdir = os.path.join(args.run_dir, "rows", args.row)
        flags = ["--workdir", workdir, "--out", args.out, "--checkpoint", "best"]
        flags += ["--params", "auto", "--training_record", path]  # the EMA where kept
        export.main(flags + (["--overwrite"] if args.overwrite else []))
    size = release_lib.directory_bytes(args.out)
    if size > args.max_mib * MIB:
        shutil.rmtree(args.out)
        raise UserError(
            f"{args.out}: {size / MIB:.1f} MiB is over --max_mib={args.max_mib:g}: removed"
        )
    print(f"{args.out}: {size / MIB:.2f} MiB; training record {json.dumps(record)}")
    return 0


if __name__ == "__main__":
    cli.run_argparse(main)
