"""Speed before and after a change, each in its own source tree, interleaved in one run.

    python experiments/speed_before_after.py --before /work/bench/before --after . \\
        --out runs/speed_before_after [--rounds 2] \\
        [--before-models transformer,final,doct] \\
        [--after-models transformer,final,final:packed_layout=two_layout,doct] \\
        -- --size ted --sections peak,corpus --tsv data/bible/train.tsv ...

Runs ``launch/benchmark.py`` of each tree (its own code: the tree is the working directory
and the first entry of ``PYTHONPATH``) with the arguments after ``--``, alternating the trees
round by round in ABBA order (round 1 before then after, round 2 after then before, ...), so
the host's drift over the run hits both alike. Inside one benchmark process every model takes
its turn step by step, so a model's ratio to the sentence Transformer of the same process is
the number that compares; this script reports those ratios per tree and round, their medians,
and after/before of each (``summary.md`` and ``summary.json`` under ``--out``, each process's
own JSON and log beside them).

Ratios read from the benchmark's ``corpus`` section: training, a model's real target tokens/s
on its fastest layout (packed where it has one) against the Transformer's packed rows;
translation, sentences/s per search against the Transformer's with the same search.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

TREES = ("before", "after")


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    if argv is None:
        argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", required=True, help="source tree of the code before the change")
    p.add_argument("--after", required=True, help="source tree of the code after the change")
    p.add_argument("--out", required=True, help="folder for the JSONs, logs and summary")
    p.add_argument("--rounds", type=int, default=2, help="ABBA rounds (each runs both trees)")
    p.add_argument("--before-models", default="transformer,final,doct")
    p.add_argument("--after-models", default="transformer,final,doct")
    args = p.parse_args(argv[:split])
    if args.rounds < 1:
        p.error("--rounds must be >= 1")
    for tree in TREES:
        if not os.path.isfile(os.path.join(getattr(args, tree), "launch", "benchmark.py")):
            p.error(f"--{tree} {getattr(args, tree)}: no launch/benchmark.py there")
    return args, argv[split + 1 :]


def order(rounds: int) -> list[tuple[int, str]]:
    """(round, tree) in ABBA order."""
    out = []
    for r in range(rounds):
        out += [(r, t) for t in (TREES if r % 2 == 0 else TREES[::-1])]
    return out


def run_benchmark(tree: str, models: str, bench_args: list[str], json_path: str) -> float:
    """One benchmark process of ``tree``; its output into ``json_path`` (.json and .log)."""
    tree = os.path.abspath(tree)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([tree, os.environ.get("PYTHONPATH", "")]))
    command = [sys.executable, os.path.join(tree, "launch", "benchmark.py"), "--models", models]
    command += [*bench_args, "--json", os.path.abspath(json_path)]
    start = time.monotonic()
    with open(json_path.removesuffix(".json") + ".log", "w", encoding="utf-8") as log:
        done = subprocess.run(command, cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise SystemExit(f"{json_path}: benchmark of {tree} failed (rc {done.returncode})")
    return time.monotonic() - start


def ratios(result: dict[str, Any]) -> dict[str, float]:
    """A benchmark JSON's ratios to the Transformer (module docstring), by row name:
    ``train MODEL`` and ``SEARCH MODEL``."""
    corpus = result.get("corpus") or {}
    runs = corpus.get("runs") or []
    base = next(r for r in runs if r["model"] == "transformer" and r["layout"] == "packed")
    out: dict[str, float] = {}
    for name in dict.fromkeys(r["model"] for r in runs):
        best = max((r for r in runs if r["model"] == name), key=lambda r: r["tokens_per_s"])
        out[f"train {name}"] = best["tokens_per_s"] / base["tokens_per_s"]
    translate = corpus.get("translate") or {}
    for r in translate.get("runs", []):
        same = next(b for b in translate["runs"] if b["model"] == "transformer"
                    and b["search"] == r["search"])  # fmt: skip
        out[f"{r['search']} {r['model']}"] = r["sentences_per_s"] / same["sentences_per_s"]
    return out


def peak(result: dict[str, Any]) -> float | None:
    """The run's measured float32 matmul peak (GFLOP/s), if it measured one."""
    value = (result.get("peak") or {}).get("float32_gflops")
    return float(value) if isinstance(value, int | float) else None


def summarise(measured: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per tree and ratio: every round's value and the median; after/before of the medians."""
    medians: dict[str, dict[str, float]] = {}
    rounds: dict[str, dict[str, list[float]]] = {}
    for tree, results in measured.items():
        per_round = [ratios(r) for r in results]
        rounds[tree] = {k: [p[k] for p in per_round if k in p] for k in per_round[0]}
        medians[tree] = {k: statistics.median(v) for k, v in rounds[tree].items()}
    change = {
        k: medians["after"][k] / medians["before"][k]
        for k in medians["after"]
        if k in medians["before"] and medians["before"][k]
    }
    peaks = [peak(r) for results in measured.values() for r in results]
    return {"rounds": rounds, "medians": medians, "after_over_before": change,
            "peaks_gflops_float32": [p for p in peaks if p is not None]}  # fmt: skip


def markdown(summary: dict[str, Any]) -> str:
    names = list(dict.fromkeys([*summary["medians"]["after"], *summary["medians"]["before"]]))
    lines = [
        "| ratio to the Transformer | before (rounds) | before | after (rounds) | after "
        "| after / before |",
        "|---|---|---:|---|---:|---:|",
    ]
    for k in names:
        cells = []
        for tree in TREES:
            values = summary["rounds"][tree].get(k, [])
            cells += [", ".join(f"{v:.3f}" for v in values) or "-",
                      f"{summary['medians'][tree][k]:.3f}" if values else "-"]  # fmt: skip
        change = summary["after_over_before"].get(k)
        lines.append(f"| {k} | {' | '.join(cells)} | {f'{change:.2f}' if change else '-'} |")
    peaks = summary["peaks_gflops_float32"]
    if peaks:
        lines.append(f"\nfloat32 matmul peak: {', '.join(f'{p:.0f}' for p in peaks)} GFLOP/s")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args, bench_args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    measured: dict[str, list[dict[str, Any]]] = {t: [] for t in TREES}
    for r, tree in order(args.rounds):
        path = os.path.join(args.out, f"{tree}_{r}.json")
        if not os.path.exists(path):  # a finished process is not run again
            models = getattr(args, f"{tree}_models")
            seconds = run_benchmark(getattr(args, tree), models, bench_args, path)
            print(f"round {r} {tree}: {seconds:.0f} s", flush=True)
        with open(path, encoding="utf-8") as f:
            measured[tree].append(json.load(f))
    summary = summarise(measured)
    with open(os.path.join(args.out, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
    text = markdown(summary)
    with open(os.path.join(args.out, "summary.md"), "w", encoding="utf-8") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
