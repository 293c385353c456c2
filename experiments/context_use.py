"""Measures how the results rows use their context: the Bible pronoun set and CXMI per row.

    python experiments/context_use.py --run_dir WORK/out --rows final_finetuned,doct_two_step \\
        [--set data/bible/test.pronouns.jsonl] [--ref data/bible/test.tsv] [--checkpoint best]

For every named row (a workdir ``RUN_DIR/rows/ROW``) it runs ``docnmt-evaluate
--contrastive pronouns --cxmi`` (:mod:`docnmt_jax.commands.evaluate`): forced-choice accuracy
on the pronoun set with the true context, none and another chapter's, McNemar's exact test
against the row's same-token control (:func:`experiments.results_significance.control_of`;
the control is scored the same way), and CXMI and Delta^D on the test books. The results land
in the row's ``contrastive/`` directory, where the results report reads them
(:func:`read_context_use`). A row whose results are newer than its checkpoints is skipped
(rerun to resume). Build the set first: ``docnmt-prepare --corpus pronoun_sets --out
data/bible``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from docnmt_jax import cli  # noqa: E402
from docnmt_jax.errors import RunNotFoundError  # noqa: E402
from experiments.results_rows import CONVERGED_SEEDED, select_rows  # noqa: E402
from experiments.results_significance import control_of  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = cli.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--run_dir", required=True, help="the results runner's --out")
    p.add_argument("--rows", required=True, help="comma-separated rows to measure")
    p.add_argument("--set", default="data/bible/test.pronouns.jsonl", help="the pronoun set")
    p.add_argument("--ref", default="data/bible/test.tsv", help="the test documents (CXMI)")
    p.add_argument("--checkpoint", default="best", help="the checkpoint of every row")
    return p.parse_args(argv)


def result_paths(workdir: str, pronoun_set: str, ref: str) -> tuple[str, str]:
    """Where ``docnmt-evaluate`` writes a run's pronoun and CXMI results."""

    def stem(path: str) -> str:
        name = os.path.basename(os.path.normpath(path))
        for ext in (".jsonl", ".json", ".tsv"):
            name = name[: -len(ext)] if name.endswith(ext) else name
        return name

    directory = os.path.join(workdir, "contrastive")
    return (
        os.path.join(directory, f"pronouns.{stem(pronoun_set)}.json"),
        os.path.join(directory, f"cxmi.{stem(ref)}.json"),
    )


def newest_checkpoint_time(workdir: str) -> float:
    """The modification time of the newest file under the row's checkpoint directories."""
    times = [0.0]
    for sub in ("best", "checkpoints"):
        for root, _, names in os.walk(os.path.join(workdir, sub)):
            times += [os.path.getmtime(os.path.join(root, n)) for n in names]
    return max(times)


def measure(workdir: str, control: str | None, args: argparse.Namespace) -> None:
    """``docnmt-evaluate`` on one row (and its control as the baseline)."""
    command = [sys.executable, os.path.join(ROOT, "launch", "evaluate.py")]
    command += ["--contrastive", "pronouns", "--data", args.set, "--workdir", workdir]
    command += ["--checkpoint", args.checkpoint, "--cxmi", "--ref", args.ref]
    if control:
        command += ["--contrastive_baseline", control]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)


def read_context_use(workdir: str, pronoun_set: str, ref: str) -> dict[str, Any]:
    """The report's numbers of a row's context-use results (empty where not measured):
    context-only pronoun accuracy with the true and a random context, McNemar's p against
    the control on the context-only subset (true context), CXMI and Delta^D."""
    pronouns_path, cxmi_path = result_paths(workdir, pronoun_set, ref)
    out: dict[str, Any] = {}
    if os.path.exists(pronouns_path):
        with open(pronouns_path, encoding="utf-8") as f:
            result = json.load(f)
        system = result.get("system", {})
        for context in ("true", "random"):
            subset = (system.get(context) or {}).get("context_only_subset") or {}
            out[f"pronoun_only_{context}"] = subset.get("accuracy")
        mcnemar = ((result.get("mcnemar") or {}).get("true") or {}).get("context_only") or {}
        out["pronoun_mcnemar_p"] = mcnemar.get("p_value")
    if os.path.exists(cxmi_path):
        with open(cxmi_path, encoding="utf-8") as f:
            result = json.load(f)
        out["cxmi"], out["delta_d"] = result.get("cxmi"), result.get("delta_d")
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for path in (args.set, args.ref):
        if not os.path.exists(path):
            raise RunNotFoundError(
                f"{path} not found (the pronoun set: docnmt-prepare --corpus pronoun_sets "
                "--out data/bible)"
            )
    row_list = select_rows(args.rows, (0, 1, 2), True, CONVERGED_SEEDED)
    rows_dir = os.path.join(args.run_dir, "rows")
    names = sorted(os.listdir(rows_dir)) if os.path.isdir(rows_dir) else []  # trained rows
    for row in row_list:
        if row.name not in args.rows.split(","):
            continue
        workdir = os.path.join(args.run_dir, "rows", row.name)
        pronouns_path, _ = result_paths(workdir, args.set, args.ref)
        if os.path.exists(pronouns_path) and os.path.getmtime(pronouns_path) > (
            newest_checkpoint_time(workdir)
        ):
            print(f"{row.name}: measured already ({pronouns_path})")
            continue
        control = control_of(row, names)
        control_dir = os.path.join(args.run_dir, "rows", control) if control else None
        measure(workdir, control_dir, args)
        numbers = read_context_use(workdir, args.set, args.ref)
        print(f"{row.name}: " + ", ".join(f"{k} {v}" for k, v in numbers.items()))
    return 0


if __name__ == "__main__":
    cli.run_argparse(main)
