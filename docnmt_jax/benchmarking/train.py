"""Train-step speed per model on the shared batch: step time (median of ``--steps`` after
``--warmup`` steps, compilation timed apart), target tokens/s, the analytic FLOPs per step
(``docnmt_jax/flops.py``) next to the exact matmul FLOPs of the traced step ("jaxpr dots",
backward included) and XLA's ``cost_analysis`` count (every op), achieved FLOP/s and MFU
(analytic FLOPs) against the measured peak of ``--dtype``, compiled memory (arguments +
outputs + temporaries - donated), and the ratio to the sentence Transformer."""

from __future__ import annotations

import argparse
import functools
from typing import Any

from docnmt_jax.benchmarking.compilation import TrainStep, compile_train
from docnmt_jax.benchmarking.timing import interleaved_times
from docnmt_jax.benchmarking.workload import (
    add_ratios,
    analytic_train_flops,
    build,
    make_batch,
    model_names,
)

Results = dict[str, Any]


def train_run(
    name: str,
    task: Any,
    batch: Results,
    step: TrainStep,
    step_s: float,
    peak_gflops: float | None,
) -> Results:
    """One model's train-step measurements on the shared batch (``step_s``: median step)."""
    flops, terms = analytic_train_flops(task, batch)
    tokens = int(batch["tgt"].size)
    achieved = flops / step_s if flops else None
    return {
        "model": name,
        "batch": list(batch["tgt"].shape),
        "target_tokens": tokens,
        "compile_seconds": step.compile_seconds,
        "step_seconds": step_s,
        "tokens_per_s": tokens / step_s,
        "flops_per_step": flops,
        "forward_flops_terms": terms,
        "jaxpr_dot_flops_per_step": step.dot_flops,
        "jaxpr_over_analytic": step.dot_flops / flops if flops else None,
        "xla_flops_per_step": step.xla_flops,
        "xla_over_analytic": step.xla_flops / flops if flops else None,
        "achieved_flops_per_s": achieved,
        "xla_flops_per_s": step.xla_flops / step_s,
        "mfu": achieved / (peak_gflops * 1e9) if achieved and peak_gflops else None,
        "memory_bytes": step.memory,
    }


def train_section(args: argparse.Namespace, results: Results) -> Results:
    peak = results.get("peak", {}).get(f"{args.dtype}_gflops")
    prepared = []
    for name in model_names(args):
        task = build(name, args, args.sentences)
        batch = make_batch(args, args.chunks, args.sentences, args.length, task.context_sentences)
        step = compile_train(task, batch)
        step.run(batch, args.warmup)
        prepared.append((name, task, batch, step))
    runners = [functools.partial(lambda s, b: s.run(b, 1)[0], p[3], p[2]) for p in prepared]
    medians = interleaved_times(runners, args.steps)
    runs = [train_run(*p, step_s, peak) for p, step_s in zip(prepared, medians, strict=True)]
    baseline = add_ratios(runs, "tokens_per_s")
    return {
        "size": args.size,
        "dtype": args.dtype,
        "peak_gflops": peak,
        "baseline": baseline,
        "runs": runs,
    }
