"""How the train step grows with the batch shape: step time, compiled memory and analytic
FLOPs against sentences per chunk (fixed sentence length) and against sentence length (fixed
sentences per chunk), with the fitted log-log slope (growth exponent) per model."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

import numpy as np

from docnmt_jax.benchmarking.compilation import compile_train
from docnmt_jax.benchmarking.timing import median
from docnmt_jax.benchmarking.workload import analytic_train_flops, build, make_batch

Results = dict[str, Any]


def slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of log y against log x (the growth exponent)."""
    if len(xs) < 2 or min(ys) <= 0:
        return float("nan")
    return float(np.polyfit(np.log(xs), np.log(ys), 1)[0])


def growth_point(name: str, args: argparse.Namespace, sentences: int, length: int) -> Results:
    """Train-step time, compiled memory and analytic FLOPs at one batch shape."""
    task = build(name, args, sentences)
    batch = make_batch(args, args.growth_chunks, sentences, length)
    step = compile_train(task, batch)
    step.run(batch, 1)
    flops, _ = analytic_train_flops(task, batch)
    return {
        "model": name,
        "sentences": sentences,
        "length": length,
        "step_seconds": median(step.run(batch, args.growth_steps)),
        "memory_bytes": step.memory["total"],
        "temp_bytes": step.memory["temp"],
        "flops_per_step": flops,
    }


def points_from_train(results: Results, chunks: int) -> dict[tuple[str, int, int], Results]:
    """The train section's runs as growth points (same measurement, not compiled twice)."""
    points = {}
    for r in results.get("train", {}).get("runs", []):
        B, S, T = r["batch"]
        if B == chunks:
            points[r["model"], S, T] = {
                "model": r["model"],
                "sentences": S,
                "length": T,
                "step_seconds": r["step_seconds"],
                "memory_bytes": r["memory_bytes"]["total"],
                "temp_bytes": r["memory_bytes"]["temp"],
                "flops_per_step": r["flops_per_step"],
            }
    return points


def growth_slopes(points: list[Results], axis: str) -> Results:
    xs = [p[axis] for p in points]
    flops = [p["flops_per_step"] for p in points]
    return {
        "time": slope(xs, [p["step_seconds"] for p in points]),
        "memory": slope(xs, [p["memory_bytes"] for p in points]),
        "temp_memory": slope(xs, [p["temp_bytes"] for p in points]),
        "flops": slope(xs, flops) if all(flops) else None,
    }


def growth_section(args: argparse.Namespace, results: Results) -> Results:
    """Sweeps sentences per chunk at ``--length`` and sentence length at ``--sentences``."""
    sweeps = {
        "sentences": [(s, args.length) for s in map(int, args.growth_sentences.split(","))],
        "length": [(args.sentences, t) for t in map(int, args.growth_lengths.split(","))],
    }
    cache = points_from_train(results, args.growth_chunks)
    result: Results = {"chunks": args.growth_chunks, "sweeps": {}, "slopes": {}}
    for name in args.growth_models.split(","):
        for axis, shapes in sweeps.items():
            points = []
            for s, t in shapes:
                if (name, s, t) not in cache:
                    cache[name, s, t] = growth_point(name, args, s, t)
                points.append(cache[name, s, t])
            result["sweeps"].setdefault(axis, {})[name] = points
            result["slopes"].setdefault(axis, {})[name] = growth_slopes(points, axis)
    return result
