"""Benchmarks of the models on identical batches in one process, plus the data pipeline.

Sections (``--sections``; default ``peak,train,decode,growth``):
  peak      the machine's matrix-multiply peak (GFLOP/s) in float32 and bfloat16
  train     per model: train-step time (median of --steps after --warmup steps; compilation
            timed apart), target tokens/s, the analytic FLOPs per step (docnmt_jax/flops.py)
            next to the exact matmul FLOPs of the traced step ("jaxpr dots", backward
            included) and XLA's cost_analysis count (every op), achieved FLOP/s and MFU
            (analytic FLOPs) against the measured peak of --dtype, compiled memory (arguments
            + outputs + temporaries - donated), and the ratio to the sentence Transformer
  decode    per model: beam search and greedy on the same documents, sentences/s, tokens/s,
            XLA compilations, and the ratio to the sentence Transformer
            Train steps and decode calls are timed in rounds, every model once per round,
            so that the ratios do not absorb this shared machine's drift over minutes.
  growth    train-step time, compiled memory and analytic FLOPs against sentences per chunk
            (fixed sentence length) and against sentence length (fixed sentences per chunk),
            with the fitted log-log slope per model
  pipeline  (not in the default) throughput of the tf.data document pipeline on a TSV of
            documents (``doc_id<TAB>src<TAB>tgt``), document and sentence mode
  profile   (added by ``--profile DIR``) a ``jax.profiler`` trace per model of 3 train steps
            and one beam and one greedy decode, to see which ops limit speed (TensorBoard's
            profile plugin or Perfetto)

Batches are synthetic and fully real (seeded random tokens, no padding): ``--chunks`` chunks of
``--sentences`` sentences of ``--length`` tokens. Document models get the chunks, the sentence
Transformer the same sentences as rows, so every model learns the same target tokens.

Decoding fixes the output length, since random-init parameters end sentences at arbitrary
points: the EOS row of the tied output embedding is set to zero (EOS logit 0, while about half
of the V logits are positive, so EOS never ranks in a beam's top 2·beam) and every output is
limited to ``--decode-len`` tokens (``len_a=0, len_b=max_len=L``). Every sentence of every model
then takes exactly L decoder steps, the last forcing EOS; tokens/s counts those steps and the
table shows the measured mean length (Doc2Doc searches a chunk as one sequence of S·L steps
and cuts it at separators; empty pieces add an EOS each, so its mean is slightly above L).
Every model decodes the same S·--chunks chunks with --chunks·beam rows per search step: FINAL
(sentences in order) in one call, the others in S calls of --chunks chunks.

Usage:
  python launch/benchmark.py [--models transformer,final] [--size tiny|ted|base]
      [--dtype float32|bfloat16] [--quick] [--json FILE] [--profile DIR]
  python launch/benchmark.py --sections pipeline --tsv data/bible/train.tsv [--spm MODEL.model]

``--quick`` runs the default sections at the tiny size (2 timed steps, 4-token decoding, two
points per growth sweep), its time mostly XLA compilation; explicit options override it. Each
section prints a markdown table; ``--json`` writes all results to one file.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

Results = dict[str, Any]
Section = Callable[[argparse.Namespace, Results], Results]

SIZES = {
    "tiny": {"d_model": 32, "num_heads": 2, "ffn_dim": 64, "layers": 1},  # for tests
    "ted": {"d_model": 256, "num_heads": 4, "ffn_dim": 512, "layers": 4},
    "base": {"d_model": 512, "num_heads": 8, "ffn_dim": 2048, "layers": 6},
}
# Options whose default depends on --quick; an explicit option wins.
PRESETS: dict[str, dict[str, Any]] = {
    "full": dict(
        sections="peak,train,decode,growth",
        size="ted",
        chunks=8,
        sentences=8,
        length=32,
        vocab=8000,
        steps=10,
        warmup=2,
        peak_size=0,
        decode_len=32,
        decode_repeats=3,
        growth_chunks=2,
        growth_sentences="1,5,10,20,40",
        growth_lengths="16,32,64,128",
        growth_steps=3,
    ),
    "quick": dict(
        sections="peak,train,decode,growth",
        size="tiny",
        chunks=2,
        sentences=3,
        length=6,
        vocab=64,
        steps=2,
        warmup=1,
        peak_size=256,
        decode_len=4,
        decode_repeats=1,
        growth_chunks=2,
        growth_sentences="1,3",
        growth_lengths="6,12",
        growth_steps=1,
    ),
}
OPTIONAL_MODELS = ("doc2doc",)  # benchmarked by default once build_task knows them


# ---------------------------------------------------------------------------------------------
# helpers


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """A markdown table; every column but the first is right-aligned."""
    print("| " + " | ".join(headers) + " |")
    print("|---|" + "---:|" * (len(headers) - 1))
    for row in rows:
        print("| " + " | ".join(str(c) for c in row) + " |")


def _median(values: Sequence[float]) -> float:
    return float(np.median(values))


def _time(fn: Callable[[], Any], repeats: int) -> list[float]:
    """Wall seconds of ``repeats`` calls of ``fn``, each waited for."""
    import jax

    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return times


class CompileWatch:
    """Counts XLA backend compilations inside a ``with`` block (via ``jax.monitoring``)."""

    EVENT = "/jax/core/compile/backend_compile_duration"

    def __init__(self) -> None:
        self.count = 0  # over every ``with`` block of this watch

    def __enter__(self) -> CompileWatch:
        import jax

        jax.monitoring.register_event_duration_secs_listener(self._listen)
        return self

    def __exit__(self, *exc: Any) -> None:
        import jax

        jax.monitoring.unregister_event_duration_listener(self._listen)

    def _listen(self, event: str, duration: float, **kwargs: Any) -> None:
        if event == self.EVENT:
            self.count += 1


def _memory_bytes(compiled: Any) -> dict[str, int]:
    """Compiled memory (bytes): arguments, outputs, temporaries (the activations), aliased
    (donated) outputs, and ``total = argument + output + temp - alias``."""
    m = compiled.memory_analysis()
    if m is None:
        return {"total": 0, "temp": 0}
    parts = {
        "argument": m.argument_size_in_bytes,
        "output": m.output_size_in_bytes,
        "temp": m.temp_size_in_bytes,
        "alias": m.alias_size_in_bytes,
    }
    parts["total"] = parts["argument"] + parts["output"] + parts["temp"] - parts["alias"]
    return parts


def _slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of log y against log x (the growth exponent)."""
    if len(xs) < 2 or min(ys) <= 0:
        return float("nan")
    return float(np.polyfit(np.log(xs), np.log(ys), 1)[0])


def _fmt(value: float | None, spec: str = ",.0f", scale: float = 1.0) -> str:
    return "n/a" if value is None else format(value * scale, spec)


# ---------------------------------------------------------------------------------------------
# models and batches


def model_names(args: argparse.Namespace) -> list[str]:
    """``--models``, or ``transformer,final`` plus the optional models build_task knows."""
    if args.models != "auto":
        return args.models.split(",")
    names = ["transformer", "final"]
    for name in OPTIONAL_MODELS:
        try:
            build(name, args, 1)
        except ValueError:
            continue
        names.append(name)
    return names


def build(name: str, args: argparse.Namespace, sentences: int) -> Any:
    """The task of model ``name`` at ``--size``/``--dtype``, fit for chunks of ``sentences``."""
    from docnmt_jax.models import build_task

    size = SIZES[args.size]
    config = {
        "name": name,
        "d_model": size["d_model"],
        "num_heads": size["num_heads"],
        "ffn_dim": size["ffn_dim"],
        "num_encoder_layers": size["layers"],
        "num_decoder_layers": size["layers"],
        "dtype": args.dtype,
    }
    task = build_task(config, args.vocab)
    if getattr(task.config, "max_segments", sentences) < sentences:
        task = type(task)(dataclasses.replace(task.config, max_segments=sentences))
    return task


def make_batch(args: argparse.Namespace, chunks: int, sentences: int, length: int) -> Results:
    """The shared synthetic batch: ``[chunks, sentences, length]``, seeded, no padding."""
    from docnmt_jax.training.restore import dummy_batch

    return dummy_batch(sentences, length, rows=chunks, vocab_size=args.vocab)


def init_params(task: Any, batch: Results) -> Any:
    """Seeded parameters (one jitted init: faster than op-by-op for every model)."""
    import flax.linen as nn
    import jax

    return nn.meta.unbox(jax.jit(task.init)(jax.random.PRNGKey(0), batch)["params"])


def analytic_train_flops(task: Any, batch: Results) -> tuple[int | None, dict[str, int]]:
    """flops.py's count for one train step on ``batch`` and its forward terms (None if the
    model has no analytic count)."""
    from docnmt_jax import flops

    if not flops.supported(task.config):
        return None, {}
    B, S, T = batch["tgt"].shape
    shape = flops.BatchShape(B, S, batch["src"].shape[-1], T)
    return flops.train_flops(task.config, shape), flops.forward_terms(task.config, shape)


class TrainStep:
    """A compiled train step with its state and the compilation's measurements."""

    def __init__(self, compiled: Any, state: Any, compile_seconds: float, dot_flops: int):
        self.compiled = compiled
        self.state = state
        self.compile_seconds = compile_seconds
        self.dot_flops = dot_flops  # exact matmul FLOPs of the traced step (backward included)
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        self.xla_flops = float(cost.get("flops", 0.0))
        self.memory = _memory_bytes(compiled)

    def run(self, batch: Results, steps: int) -> list[float]:
        """Runs ``steps`` steps; wall seconds of each (state carried over)."""
        import jax

        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            self.state, metrics = self.compiled(self.state, batch)
            jax.block_until_ready(metrics)
            times.append(time.perf_counter() - t0)
        return times


def compile_train(task: Any, batch: Results) -> TrainStep:
    """The trainer's jitted step for ``task``, compiled ahead of time for ``batch``."""
    import jax.numpy as jnp

    from docnmt_jax import flops
    from docnmt_jax.training import optim, trainer

    params = init_params(task, batch)
    tx, schedule = optim.make_optimizer(task.config.d_model, warmup_steps=4000)
    train_step, _ = trainer.make_steps(task, tx, schedule, smoothing=0.1, seed=0)
    state = {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": tx.init(params)}
    t0 = time.perf_counter()
    traced = train_step.trace(state, batch)
    compiled = traced.lower().compile()
    compile_s = time.perf_counter() - t0
    return TrainStep(compiled, state, compile_s, flops.jaxpr_dot_flops(traced.jaxpr))


def add_ratios(runs: list[Results], key: str, group: str | None = None) -> str:
    """Adds ``{key}_ratio`` (run / baseline) to every run; the baseline is the sentence
    Transformer if present, else the first model (per ``group`` value when given)."""
    names = [r["model"] for r in runs]
    baseline = "transformer" if "transformer" in names else names[0]
    for r in runs:
        base = next(
            b for b in runs if b["model"] == baseline and (group is None or b[group] == r[group])
        )
        r[f"{key}_ratio"] = r[key] / base[key]
    return baseline


# ---------------------------------------------------------------------------------------------
# peak


def _matmul_gflops(n: int, dtype: Any, calls: int = 5) -> tuple[float, float]:
    """(GFLOP/s, seconds per call) of an ``n x n`` matmul, median over ``calls`` batches of
    ``calls`` back-to-back calls (so dispatch overhead is amortised)."""
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32).astype(dtype)
    matmul = jax.jit(lambda x, y: jnp.matmul(x, y, preferred_element_type=jnp.float32))
    jax.block_until_ready(matmul(a, a))

    def burst() -> list[Any]:
        return [matmul(a, a) for _ in range(calls)]

    per_call = _median(_time(burst, calls)) / calls
    return 2 * n**3 / per_call / 1e9, per_call


def peak_section(args: argparse.Namespace, results: Results) -> Results:
    """Matmul peak per dtype; with ``--peak-size 0`` the size doubles from 512 until one call
    takes 20 ms (or 8192), so the measurement is compute-bound on any machine."""
    import jax
    import jax.numpy as jnp

    result: Results = {"device": str(jax.devices()[0])}
    sizes = [args.peak_size] if args.peak_size else [512, 1024, 2048, 4096, 8192]
    for name, dtype in (("float32", jnp.float32), ("bfloat16", jnp.bfloat16)):
        for n in sizes:
            gflops, per_call = _matmul_gflops(n, dtype)
            if per_call >= 0.02:
                break
        result[f"{name}_gflops"] = gflops
        result[f"{name}_size"] = n
    return result


def print_peak(result: Results) -> None:
    print(
        f"\n### peak: matmul on {result['device']}: float32 {result['float32_gflops']:,.0f} "
        f"GFLOP/s ({result['float32_size']}²), bfloat16 {result['bfloat16_gflops']:,.0f} "
        f"GFLOP/s ({result['bfloat16_size']}²)\n"
    )


# ---------------------------------------------------------------------------------------------
# train


def interleaved_times(runners: list[Callable[[], float]], rounds: int) -> list[float]:
    """Median seconds of each runner over ``rounds`` rounds, each round calling every runner
    once in turn: a drift of this shared machine's speed over minutes then hits every model
    alike, instead of the ratio between models measured minutes apart."""
    times: list[list[float]] = [[] for _ in runners]
    for _ in range(rounds):
        for i, runner in enumerate(runners):
            times[i].append(runner())
    return [_median(t) for t in times]


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
        batch = make_batch(args, args.chunks, args.sentences, args.length)
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


def print_train(result: Results) -> None:
    print(
        f"\n### train: size {result['size']}, {result['dtype']}, MFU against the measured "
        f"{result['dtype']} peak; ratio to {result['baseline']}\n"
    )
    rows = []
    for r in result["runs"]:
        rows.append(
            [
                r["model"],
                "x".join(map(str, r["batch"])),
                f"{r['compile_seconds']:.1f}",
                f"{1000 * r['step_seconds']:.1f}",
                f"{r['tokens_per_s']:,.0f}",
                f"{r['tokens_per_s_ratio']:.2f}",
                _fmt(r["flops_per_step"], ".3f", 1e-9),
                _fmt(r["jaxpr_over_analytic"], ".3f"),
                _fmt(r["xla_over_analytic"], ".3f"),
                _fmt(r["achieved_flops_per_s"], ",.1f", 1e-9),
                _fmt(r["mfu"], ".1%"),
                f"{r['memory_bytes']['total'] / 2**20:,.2f}",
                f"{r['memory_bytes']['temp'] / 2**20:,.2f}",
            ]
        )
    print_table(
        [
            "model",
            "batch BxSxT",
            "compile s",
            "step ms",
            "target tok/s",
            "tok/s ratio",
            "GFLOP/step",
            "jaxpr dots/analytic",
            "XLA/analytic",
            "GFLOP/s",
            "MFU",
            "compiled MiB",
            "temp MiB",
        ],
        rows,
    )


# ---------------------------------------------------------------------------------------------
# decode


def never_eos(params: Any) -> Any:
    """``params`` with the EOS row of every ``embedding`` table set to zero (fixed-length
    decoding with a tied output embedding; see the module docstring)."""
    import jax

    from docnmt_jax.data.tokenizer import EOS_ID

    def zero_eos(path: Any, x: Any) -> Any:
        last = path[-1]
        if getattr(last, "key", None) == "embedding" and x.ndim == 2:
            return x.at[EOS_ID].set(0)
        return x

    return jax.tree_util.tree_map_with_path(zero_eos, params)


def _fixed_search(beam: int, length: int) -> Any:
    """Beam ``beam`` (1: greedy, alpha 0; else alpha 0.6), every output exactly ``length``."""
    from docnmt_jax.decoding.translator import SearchConfig

    alpha = 0.6 if beam > 1 else 0.0
    return SearchConfig(beam_size=beam, alpha=alpha, len_a=0.0, len_b=length, max_len=length)


class DecodeRun:
    """``task.translate_batch`` with beam ``beam`` (1: greedy) on ``batch``, in calls of
    ``rows`` chunks each, compiled as the Translator does (``translator.search_function``) and
    run once (compilation timed; XLA compilations counted in that run and, apart, in the timed
    calls, which should have none)."""

    def __init__(
        self, name: str, task: Any, params: Any, batch: Results, rows: int, beam: int, args: Any
    ):
        import jax

        from docnmt_jax.decoding.translator import search_function

        self.name, self.batch, self.beam, self.args = name, batch, beam, args
        self.search = _fixed_search(beam, args.decode_len)
        translate = search_function(task, self.search)
        parts = [
            {key: value[start : start + rows] for key, value in batch.items()}
            for start in range(0, batch["src"].shape[0], rows)
        ]
        self.calls = len(parts)

        def call() -> Any:
            outputs = [translate(params, part) for part in parts]
            if isinstance(outputs[0], tuple):  # (ids, aux)
                outputs = [ids for ids, _ in outputs]
            return np.concatenate([np.asarray(ids) for ids in outputs])

        self.call = call
        self.watch, self.timed_watch = CompileWatch(), CompileWatch()
        with self.watch:
            t0 = time.perf_counter()
            self.output = jax.block_until_ready(self.call())
            self.first_seconds = time.perf_counter() - t0

    def time_once(self) -> float:
        with self.timed_watch:
            return _time(self.call, 1)[0]


def decode_run(run: DecodeRun, seconds: float) -> Results:
    """The measurements of ``run`` whose median call took ``seconds``."""
    from docnmt_jax.data.tokenizer import PAD_ID

    name, batch, beam, args, search, output = (
        run.name,
        run.batch,
        run.beam,
        run.args,
        run.search,
        run.output,
    )
    first_s, watch = run.first_seconds, run.watch
    ids = output
    sentences = int(np.prod(batch["src"].shape[:2]))
    tokens = sentences * args.decode_len  # decoder steps: the fixed budget of every sentence
    return {
        "model": name,
        "search": f"beam {beam}" if beam > 1 else "greedy",
        "beam": beam,
        "alpha": search.alpha,
        "sentences": sentences,
        "calls": run.calls,
        "output_tokens": tokens,
        "mean_output_len": int(np.sum(ids != PAD_ID)) / sentences,  # measured: should be L
        "compile_seconds": max(first_s - seconds, 0.0),
        "compilations": watch.count,
        "recompilations": run.timed_watch.count,
        "seconds": seconds,
        "sentences_per_s": sentences / seconds,
        "tokens_per_s": tokens / seconds,
    }


def decode_section(args: argparse.Namespace, results: Results) -> Results:
    prepared = []
    for name in model_names(args):
        task = build(name, args, args.sentences)
        # Every model translates the same S x --chunks chunks. As the Translator does, a task
        # that searches a chunk's sentences one after another gets S times more chunks per
        # call, so every search step has as many rows as the sentence model's (the same token
        # budget per row); the others get them in S calls of --chunks chunks.
        sequential = bool(getattr(task, "sequential_sentences", False))
        rows = args.chunks * (args.sentences if sequential else 1)
        batch = make_batch(args, args.chunks * args.sentences, args.sentences, args.length)
        params = never_eos(init_params(task, batch))
        for beam in sorted({args.beam, 1}, reverse=True):
            prepared.append(DecodeRun(name, task, params, batch, rows, beam, args))
    medians = interleaved_times([p.time_once for p in prepared], args.decode_repeats)
    runs = [decode_run(p, seconds) for p, seconds in zip(prepared, medians, strict=True)]
    baseline = add_ratios(runs, "sentences_per_s", group="beam")
    return {"decode_len": args.decode_len, "baseline": baseline, "runs": runs}


def print_decode(result: Results) -> None:
    print(
        f"\n### decode: every sentence {result['decode_len']} tokens (EOS forced last); "
        f"ratio to {result['baseline']}\n"
    )
    rows = [
        [
            r["model"],
            r["search"],
            r["sentences"],
            r["calls"],
            f"{r['mean_output_len']:.1f}",
            f"{r['compile_seconds']:.1f}",
            f"{r['compilations']}" + (f" +{r['recompilations']}" if r["recompilations"] else ""),
            f"{1000 * r['seconds']:.1f}",
            f"{r['sentences_per_s']:,.1f}",
            f"{r['tokens_per_s']:,.0f}",
            f"{r['sentences_per_s_ratio']:.2f}",
        ]
        for r in result["runs"]
    ]
    print_table(
        [
            "model",
            "search",
            "sentences",
            "calls",
            "tokens/sent",
            "compile s",
            "compilations",
            "ms (all calls)",
            "sentences/s",
            "tokens/s",
            "sent/s ratio",
        ],
        rows,
    )


# ---------------------------------------------------------------------------------------------
# growth


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
        "step_seconds": _median(step.run(batch, args.growth_steps)),
        "memory_bytes": step.memory["total"],
        "temp_bytes": step.memory["temp"],
        "flops_per_step": flops,
    }


def _points_from_train(results: Results, chunks: int) -> dict[tuple[str, int, int], Results]:
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


def _growth_slopes(points: list[Results], axis: str) -> Results:
    xs = [p[axis] for p in points]
    flops = [p["flops_per_step"] for p in points]
    return {
        "time": _slope(xs, [p["step_seconds"] for p in points]),
        "memory": _slope(xs, [p["memory_bytes"] for p in points]),
        "temp_memory": _slope(xs, [p["temp_bytes"] for p in points]),
        "flops": _slope(xs, flops) if all(flops) else None,
    }


def growth_section(args: argparse.Namespace, results: Results) -> Results:
    """Sweeps sentences per chunk at ``--length`` and sentence length at ``--sentences``."""
    sweeps = {
        "sentences": [(s, args.length) for s in map(int, args.growth_sentences.split(","))],
        "length": [(args.sentences, t) for t in map(int, args.growth_lengths.split(","))],
    }
    cache = _points_from_train(results, args.growth_chunks)
    result: Results = {"chunks": args.growth_chunks, "sweeps": {}, "slopes": {}}
    for name in args.growth_models.split(","):
        for axis, shapes in sweeps.items():
            points = []
            for s, t in shapes:
                if (name, s, t) not in cache:
                    cache[name, s, t] = growth_point(name, args, s, t)
                points.append(cache[name, s, t])
            result["sweeps"].setdefault(axis, {})[name] = points
            result["slopes"].setdefault(axis, {})[name] = _growth_slopes(points, axis)
    return result


def print_growth(result: Results) -> None:
    print(f"\n### growth: train step against batch shape ({result['chunks']} chunks)\n")
    rows = []
    for axis, by_model in result["sweeps"].items():
        for name, points in by_model.items():
            for p in points:
                rows.append(
                    [
                        name,
                        axis,
                        p["sentences"],
                        p["length"],
                        f"{1000 * p['step_seconds']:.1f}",
                        f"{p['memory_bytes'] / 2**20:,.2f}",
                        f"{p['temp_bytes'] / 2**20:,.2f}",
                        _fmt(p["flops_per_step"], ".3f", 1e-9),
                    ]
                )
    headers = ["model", "sweep", "S", "T", "step ms", "compiled MiB", "temp MiB", "GFLOP/step"]
    print_table(headers, rows)
    print("\nfitted log-log slopes (growth exponents):\n")
    rows = [
        [
            name,
            axis,
            f"{s['time']:.2f}",
            f"{s['memory']:.2f}",
            f"{s['temp_memory']:.2f}",
            _fmt(s["flops"], ".2f"),
        ]
        for axis, by_model in result["slopes"].items()
        for name, s in by_model.items()
    ]
    print_table(["model", "against", "time", "memory", "temp memory", "analytic FLOPs"], rows)


# ---------------------------------------------------------------------------------------------
# pipeline


def _word_encoder() -> Callable[[Sequence[str]], list[list[int]]]:
    """Whitespace word-level encoder; ids from 4 (after PAD/EOS/BOS/UNK) by first occurrence."""
    vocab: dict[str, int] = {}

    def encode(texts: Sequence[str]) -> list[list[int]]:
        return [[vocab.setdefault(w, len(vocab) + 4) for w in t.split()] for t in texts]

    return encode


def _spm_encoder(path: str) -> Callable[[Sequence[str]], list[list[int]]]:
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=path)
    return lambda texts: sp.encode(list(texts))


def pipeline_section(args: argparse.Namespace, results: Results) -> Results:
    from docnmt_jax.data import pipeline as P
    from docnmt_jax.data.readers import read_tsv

    t0 = time.perf_counter()
    docs = read_tsv(args.tsv)
    read_s = time.perf_counter() - t0
    encode = _spm_encoder(args.spm) if args.spm else _word_encoder()
    base = P.PipelineConfig(
        max_sentences=args.max_sentences,
        max_src_len=args.max_len,
        max_tgt_len=args.max_len,
        batch_src_tokens=args.batch_tokens,
        batch_tgt_tokens=args.batch_tokens,
    )
    t0 = time.perf_counter()
    corpus = P.tokenize_corpus(docs, encode, base)
    tokenize_s = time.perf_counter() - t0
    result: dict[str, Any] = {
        "tsv": args.tsv,
        "encoder": args.spm or "whitespace words",
        "config": dataclasses.asdict(base),
        "read_seconds": read_s,
        "tokenize_seconds": tokenize_s,
        "corpus": dataclasses.asdict(corpus.stats),
        "runs": [],
    }
    for mode in args.modes.split(","):
        config = dataclasses.replace(base, sentence_level=mode == "sentence")
        t0 = time.perf_counter()
        plan = P.plan_batches(corpus, config=config)
        plan.epoch(0)
        plan_s = time.perf_counter() - t0
        iterators = {
            "tf.data": lambda plan=plan: P.make_dataset(plan),
            "numpy": lambda plan=plan: P.numpy_batches(plan),
        }
        for name, make in iterators.items():
            m = P.measure_throughput(make(), args.num_batches)
            m.update(
                mode=mode,
                iterator=name,
                declared_shapes=len(plan.shapes),
                batches_per_epoch=plan.batches_per_epoch,
                plan_epoch_seconds=plan_s,
                stats=dataclasses.asdict(plan.stats),
            )
            result["runs"].append(m)
        # Resuming deep into training costs one epoch plan, not the skipped batches.
        resume_step = 1000 * max(plan.batches_per_epoch, 1) + 7
        t0 = time.perf_counter()
        next(iter(P.make_dataset(plan, start_step=resume_step)))
        for m in result["runs"][-len(iterators) :]:
            m["resume_first_batch_seconds"] = time.perf_counter() - t0
    return result


def print_pipeline(result: Results) -> None:
    c = result["corpus"]
    print(
        f"\n### pipeline: {result['tsv']} ({c['documents']} documents, {c['sentences']} "
        f"sentences, {c['src_tokens']}+{c['tgt_tokens']} tokens with EOS; encoder: "
        f"{result['encoder']}; tokenised in {result['tokenize_seconds']:.2f} s)\n"
    )
    print(
        "| mode | iterator | batches/s | chunks/s | sentences/s | real tokens/s (src+tgt) "
        "| padded tokens/s | padding % | shapes | resume 1st batch s |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in result["runs"]:
        real = r["src_tokens_per_s"] + r["tgt_tokens_per_s"]
        print(
            f"| {r['mode']} | {r['iterator']} | {r['batches_per_s']:,.0f} "
            f"| {r['chunks_per_s']:,.0f} | {r['sentences_per_s']:,.0f} | {real:,.0f} "
            f"| {r['padded_tokens_per_s']:,.0f} | {100 * r['padding_fraction']:.1f} "
            f"| {r['distinct_shapes']}/{r['declared_shapes']} "
            f"| {r['resume_first_batch_seconds']:.2f} |"
        )


# ---------------------------------------------------------------------------------------------
# profile


def profile_section(args: argparse.Namespace, results: Results) -> Results:
    """A ``jax.profiler`` trace per model: 3 train steps, one beam and one greedy decode."""
    import jax

    batch = make_batch(args, args.chunks, args.sentences, args.length)
    traces = {}
    for name in model_names(args):
        task = build(name, args, args.sentences)
        step = compile_train(task, batch)
        step.run(batch, 1)
        params = never_eos(init_params(task, batch))
        from docnmt_jax.decoding.translator import search_function

        decoders = {}
        for beam in sorted({args.beam, 1}, reverse=True):
            search = _fixed_search(beam, args.decode_len)
            decoders[beam] = search_function(task, search)
            jax.block_until_ready(decoders[beam](params, batch))  # compile outside the trace
        path = os.path.join(args.profile, name)
        with jax.profiler.trace(path):
            for i in range(3):
                with jax.profiler.StepTraceAnnotation("train", step_num=i):
                    step.run(batch, 1)
            for beam, decode in decoders.items():
                with jax.profiler.TraceAnnotation(f"decode_beam{beam}"):
                    jax.block_until_ready(decode(params, batch))
        traces[name] = path
    return {"traces": traces}


def print_profile(result: Results) -> None:
    print("\n### profile traces (tensorboard --logdir DIR, Profile tab)\n")
    print_table(["model", "trace directory"], list(result["traces"].items()))


# ---------------------------------------------------------------------------------------------


SECTIONS: dict[str, tuple[Section, Callable[[Results], None]]] = {
    "peak": (peak_section, print_peak),
    "train": (train_section, print_train),
    "decode": (decode_section, print_decode),
    "growth": (growth_section, print_growth),
    "pipeline": (pipeline_section, print_pipeline),
    "profile": (profile_section, print_profile),
}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--sections",
        help=f"comma-separated of {', '.join(SECTIONS)}; default: peak,train,decode,growth",
    )
    p.add_argument("--quick", action="store_true", help="tiny sizes, a few steps: seconds")
    p.add_argument("--json", help="write all results to this JSON file")
    p.add_argument("--profile", help="write a jax.profiler trace per model under this directory")
    g = p.add_argument_group("models and batches (defaults: full run / --quick)")
    g.add_argument(
        "--models",
        default="auto",
        help="comma-separated; auto: transformer, final (and doc2doc once it exists)",
    )
    g.add_argument("--size", choices=sorted(SIZES), help="ted / tiny")
    g.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    g.add_argument("--chunks", type=int, help="chunks (rows) per batch: 8 / 2")
    g.add_argument("--sentences", type=int, help="sentences per chunk: 8 / 3")
    g.add_argument("--length", type=int, help="tokens per sentence, source and target: 32 / 6")
    g.add_argument("--vocab", type=int, help="vocabulary size: 8000 / 64")
    g.add_argument("--steps", type=int, help="timed train steps, median reported: 10 / 2")
    g.add_argument("--warmup", type=int, help="untimed train steps after compiling: 2 / 1")
    g.add_argument("--peak-size", type=int, help="matmul size of the peak; 0: auto / 256")
    g.add_argument("--beam", type=int, default=5, help="beam size (greedy is always run too)")
    g.add_argument("--decode-len", type=int, help="tokens per decoded sentence: 32 / 4")
    g.add_argument("--decode-repeats", type=int, help="timed decode calls: 3 / 1")
    g = p.add_argument_group("growth")
    g.add_argument("--growth-models", default="transformer,final", help="comma-separated")
    g.add_argument("--growth-chunks", type=int, help="chunks per batch: 2 / 2")
    g.add_argument("--growth-sentences", help="sentences per chunk: 1,5,10,20,40 / 1,3")
    g.add_argument("--growth-lengths", help="tokens per sentence: 16,32,64,128 / 6,12")
    g.add_argument("--growth-steps", type=int, help="timed steps per point: 3 / 1")
    g = p.add_argument_group("pipeline")
    g.add_argument("--tsv", default="data/bible/train.tsv", help="TSV corpus of documents")
    g.add_argument("--spm", help="SentencePiece model; default: whitespace word-level encoder")
    g.add_argument("--num-batches", type=int, default=2000, help="batches timed per run")
    g.add_argument("--modes", default="document,sentence", help="document and/or sentence")
    g.add_argument("--max-sentences", type=int, default=20)
    g.add_argument("--max-len", type=int, default=128, help="max tokens per sentence (+EOS)")
    g.add_argument("--batch-tokens", type=int, default=2048, help="padded slots per side")
    args = p.parse_args(argv)
    for key, value in PRESETS["quick" if args.quick else "full"].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    sections = [s for s in args.sections.split(",") if s]
    if args.profile and "profile" not in sections:
        sections.append("profile")
    args.sections = ",".join(sections)
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        p.error(f"unknown sections {sorted(unknown)}; known: {sorted(SECTIONS)}")
    if "profile" in sections and not args.profile:
        p.error("the profile section needs --profile DIR")
    if set(args.modes.split(",")) - {"document", "sentence"}:
        p.error("--modes takes document and/or sentence")
    return args


def host_info() -> Results:
    import jax

    device = jax.devices()[0]
    return {
        "python": platform.python_version(),
        "jax": jax.__version__,
        "cpus": os.cpu_count(),
        "device": str(device),
        "device_kind": device.device_kind,
    }


def main(argv: Sequence[str] | None = None) -> Results:
    args = parse_args(argv)
    results: Results = {"host": host_info(), "args": vars(args)}
    for name in filter(None, args.sections.split(",")):
        run, show = SECTIONS[name]
        results[name] = run(args, results)
        show(results[name])
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=2)
            f.write("\n")
    return results


if __name__ == "__main__":
    main()
