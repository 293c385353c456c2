"""How the train step grows with the batch shape: step time, compiled memory and analytic
FLOPs against sentences per chunk (fixed sentence length) and against sentence length (fixed
sentences per chunk), with the fitted log-log slope (growth exponent) per model and layout.

``grid`` times the ``[chunks, S, T]`` batch; ``packed`` the model's packed rows
(``task.packing()``) laid as the Bible's :class:`PackedPlan` lays equal items: rows of
``row_tokens * 2**i`` slots, as many whole items a row as fit, every row full, as many rows as
the grid's tokens need (a model carrying state across chunks: the grid only, its packed rows
are document streams). Times and slopes are per grid batch of real tokens (``work_seconds``),
so both layouts are compared on the same work; the analytic FLOPs are the grid's."""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from docnmt_jax.benchmarking.compilation import compile_train
from docnmt_jax.benchmarking.timing import median
from docnmt_jax.benchmarking.workload import UsageError, analytic_train_flops, build, make_batch
from docnmt_jax.models import contract

Results = dict[str, Any]

LAYOUTS = ("grid", "packed")


def slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of log y against log x (the growth exponent)."""
    if len(xs) < 2 or min(ys) <= 0:
        return float("nan")
    return float(np.polyfit(np.log(xs), np.log(ys), 1)[0])


def packed_rows(task: Any, args: argparse.Namespace, sentences: int, length: int) -> Results:
    """Full packed rows of ``task``'s items (``packing.unit``: a sentence, or a chunk of
    ``sentences``; ``grouped``: sentences, each chunk of ``sentences`` numbered across the
    rows) of ``length`` tokens, as the plan lays equal items: ``row_len // size`` a row of
    ``row_len = row_tokens * 2**i`` slots (the shortest that holds one), and as many rows as
    the grid batch's ``--growth-chunks`` chunks need, every row filled."""
    from docnmt_jax.data import schema

    packing = task.packing()
    per_item = sentences if packing.unit == "chunk" else 1
    size = per_item * length
    row_len = packing.row_tokens * 2 ** max(math.ceil(math.log2(size / packing.row_tokens)), 0)
    per_row = row_len // size
    rows = math.ceil(args.growth_chunks * sentences / per_item / per_row)
    items = make_batch(args, rows * per_row, per_item, length)
    rows_of = [list(range(r * per_row, (r + 1) * per_row)) for r in range(rows)]
    packed, _ = schema.pack_grid(items, row_len, rows_of, drift=packing.drift)
    if packing.unit == "grouped":  # chunk numbers count the chunks of the batch, across rows
        for side in schema.SIDES:
            segment = packed[f"{side}_segment_ids"]
            item = np.arange(rows)[:, None] * per_row + segment - 1
            packed[f"{side}_chunk_ids"] = np.where(segment > 0, item // sentences + 1, 0).astype(
                segment.dtype
            )
    if task.context_sentences:  # a window model: every sentence's full window of k sentences
        packed.update(window_rows(packed, task.context_sentences, length))
    return packed


def window_rows(packed: Results, k: int, length: int) -> Results:
    """Context rows ``[rows, k*L]`` of packed sentence rows
    (:class:`~docnmt_jax.data.window_plan.WindowPackedPlan`'s features): each segment's window
    ``k * length`` tokens (ids 4), one after another."""
    segment_ids = np.asarray(packed["src_segment_ids"])
    rows, L = segment_ids.shape
    per_row = int(segment_ids.max(initial=0))
    slot = np.arange(k * L)
    segment = np.where(slot < per_row * k * length, slot // (k * length) + 1, 0)
    segment = np.broadcast_to(segment, (rows, k * L)).astype(segment_ids.dtype)
    real = (segment > 0).astype(segment.dtype)
    return {
        "context_src": 4 * real,
        "context_src_mask": real,
        "context_positions": real * (slot % (k * length)).astype(segment.dtype),
        "context_segment_ids": segment,
    }


def growth_point(
    name: str, args: argparse.Namespace, sentences: int, length: int, layout: str = "grid"
) -> Results:
    """Train-step time, compiled memory and analytic FLOPs at one batch shape and layout.
    ``work_seconds``: the step time per grid batch of real tokens (``--growth-chunks`` x
    ``sentences`` x ``length``), which packed rows may hold more or fewer of."""
    task = build(name, args, sentences)
    grid = make_batch(args, args.growth_chunks, sentences, length)
    batch = packed_rows(task, args, sentences, length) if layout == "packed" else grid
    step = compile_train(task, batch)
    step.run(batch, 1)
    flops, _ = analytic_train_flops(task, grid)
    seconds = median(step.run(batch, args.growth_steps))
    real = int(np.asarray(batch["tgt_mask"]).sum())
    return {
        "model": name,
        "layout": layout,
        "sentences": sentences,
        "length": length,
        "batch": list(batch["src"].shape),
        "real_target_tokens": real,
        "step_seconds": seconds,
        "work_seconds": seconds * grid["tgt_mask"].size / real,
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
                "layout": "grid",
                "sentences": S,
                "length": T,
                "batch": [B, S, T],
                "real_target_tokens": B * S * T,
                "step_seconds": r["step_seconds"],
                "work_seconds": r["step_seconds"],
                "memory_bytes": r["memory_bytes"]["total"],
                "temp_bytes": r["memory_bytes"]["temp"],
                "flops_per_step": r["flops_per_step"],
            }
    return points


def growth_slopes(points: list[Results], axis: str) -> Results:
    xs = [p[axis] for p in points]
    flops = [p["flops_per_step"] for p in points]
    return {
        "time": slope(xs, [p["work_seconds"] for p in points]),
        "memory": slope(xs, [p["memory_bytes"] for p in points]),
        "temp_memory": slope(xs, [p["temp_bytes"] for p in points]),
        "flops": slope(xs, flops) if all(flops) else None,
    }


def growth_section(args: argparse.Namespace, results: Results) -> Results:
    """Sweeps sentences per chunk at ``--length`` and sentence length at ``--sentences``, in
    each of ``--growth-layouts`` (a model without packing has grid points only). Results:
    ``sweeps[axis][layout][model]`` points and ``slopes[axis][layout][model]``."""
    layouts = args.growth_layouts.split(",")
    if set(layouts) - set(LAYOUTS):
        raise UsageError(f"--growth-layouts takes {' and/or '.join(LAYOUTS)}: {layouts}")
    sweeps = {
        "sentences": [(s, args.length) for s in map(int, args.growth_sentences.split(","))],
        "length": [(args.sentences, t) for t in map(int, args.growth_lengths.split(","))],
    }
    cache = {("grid", *key): p for key, p in points_from_train(results, args.growth_chunks).items()}
    result: Results = {"chunks": args.growth_chunks, "sweeps": {}, "slopes": {}}
    for name in args.growth_models.split(","):
        task = build(name, args, 1)  # packed streams (a carried state) are no equal items
        packs = task.packing() is not None and not contract.carries_state(task)
        for layout in [x for x in layouts if x == "grid" or packs]:
            for axis, shapes in sweeps.items():
                points = []
                for s, t in shapes:
                    if (layout, name, s, t) not in cache:
                        cache[layout, name, s, t] = growth_point(name, args, s, t, layout)
                    points.append(cache[layout, name, s, t])
                result["sweeps"].setdefault(axis, {}).setdefault(layout, {})[name] = points
                slopes = result["slopes"].setdefault(axis, {}).setdefault(layout, {})
                slopes[name] = growth_slopes(points, axis)
    return result
