"""Benchmarks of the toolkit, one section per component, selected with ``--sections``.

Sections:
  peak      the machine's matrix-multiply peak (GFLOP/s), float32 and bfloat16
  train     train-step time, target tokens/s and achieved GFLOP/s (FLOPs counted by XLA's
            cost analysis of the compiled step) against the measured peak, per model
  pipeline  throughput of the tf.data document pipeline on a TSV of documents
            (``doc_id<TAB>src<TAB>tgt``), in document mode and sentence-level mode, for the
            tf.data dataset and the plain NumPy iterator.

Usage:
  python launch/benchmark.py --sections peak,train [--models transformer] [--size ted]
  python launch/benchmark.py --sections pipeline --tsv data/bible/train.tsv \\
      [--spm MODEL.model] [--num-batches 2000] [--json runs/bench.json]

Each section prints a markdown table; ``--json`` writes all results to one file.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

Section = Callable[[argparse.Namespace], dict[str, Any]]


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


def pipeline_section(args: argparse.Namespace) -> dict[str, Any]:
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


def print_pipeline(result: dict[str, Any]) -> None:
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
# peak and train


def _time(fn: Callable[[], Any], repeats: int) -> list[float]:
    import jax

    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return times


def peak_section(args: argparse.Namespace) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    n = args.peak_size
    result: dict[str, Any] = {"size": n, "device": str(jax.devices()[0])}
    for name, dtype in (("float32", jnp.float32), ("bfloat16", jnp.bfloat16)):
        a = jnp.ones((n, n), dtype)
        matmul = jax.jit(lambda x, y: jnp.matmul(x, y, preferred_element_type=jnp.float32))
        jax.block_until_ready(matmul(a, a))
        times = sorted(_time(lambda a=a, f=matmul: f(a, a), 5))
        result[f"{name}_gflops"] = 2 * n**3 / times[len(times) // 2] / 1e9
    return result


def print_peak(result: dict[str, Any]) -> None:
    print(
        f"\n### peak: {result['size']}x{result['size']} matmul on {result['device']}: "
        f"float32 {result['float32_gflops']:.0f} GFLOP/s, "
        f"bfloat16 {result['bfloat16_gflops']:.0f} GFLOP/s\n"
    )


SIZES = {
    "tiny": {"d_model": 32, "num_heads": 2, "ffn_dim": 64, "layers": 1},  # for tests
    "ted": {"d_model": 256, "num_heads": 4, "ffn_dim": 512, "layers": 4},
    "base": {"d_model": 512, "num_heads": 8, "ffn_dim": 2048, "layers": 6},
}


def train_section(args: argparse.Namespace) -> dict[str, Any]:
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    from docnmt_jax.models import build_task
    from docnmt_jax.training import optim, trainer
    from docnmt_jax.training.restore import dummy_batch

    size = SIZES[args.size]
    rows = max(1, args.batch_tokens // args.length)
    batch = dummy_batch(1, args.length, rows=rows, vocab_size=args.vocab)
    results = []
    for name in args.models.split(","):
        model_cfg = {
            "name": name,
            "d_model": size["d_model"],
            "num_heads": size["num_heads"],
            "ffn_dim": size["ffn_dim"],
            "num_encoder_layers": size["layers"],
            "num_decoder_layers": size["layers"],
            "dtype": args.dtype,
        }
        task = build_task(model_cfg, args.vocab)
        params = nn.meta.unbox(task.init(jax.random.PRNGKey(0), batch)["params"])
        tx, schedule = optim.make_optimizer(size["d_model"], warmup_steps=4000)
        train_step, _ = trainer.make_steps(task, tx, schedule, smoothing=0.1, seed=0)
        state = {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": tx.init(params)}
        t0 = time.perf_counter()
        compiled = train_step.lower(state, batch).compile()
        compile_s = time.perf_counter() - t0
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        flops = float(cost.get("flops", 0.0))
        for _ in range(2):  # warm-up
            state, _ = compiled(state, batch)
        jax.block_until_ready(state)
        times = []
        for _ in range(args.steps):
            t = time.perf_counter()
            state, metrics = compiled(state, batch)
            jax.block_until_ready(metrics)
            times.append(time.perf_counter() - t)
        step_s = sorted(times)[len(times) // 2]
        tokens = rows * args.length
        results.append(
            {
                "model": name,
                "batch": [rows, 1, args.length],
                "target_tokens": tokens,
                "compile_seconds": compile_s,
                "step_seconds": step_s,
                "tokens_per_s": tokens / step_s,
                "xla_flops_per_step": flops,
                "gflops_per_s": flops / step_s / 1e9,
            }
        )
    return {"size": args.size, "dtype": args.dtype, "runs": results}


def print_train(result: dict[str, Any], peak: dict[str, Any] | None = None) -> None:
    print(f"\n### train: size {result['size']}, {result['dtype']}\n")
    print("| model | batch | step ms | target tokens/s | GFLOP/step (XLA) | GFLOP/s | of peak |")
    print("|---|---|---:|---:|---:|---:|---:|")
    peak_gflops = (peak or {}).get(f"{result['dtype']}_gflops")
    for r in result["runs"]:
        share = f"{100 * r['gflops_per_s'] / peak_gflops:.0f}%" if peak_gflops else "n/a"
        print(
            f"| {r['model']} | {'x'.join(map(str, r['batch']))} | {1000 * r['step_seconds']:.0f} "
            f"| {r['tokens_per_s']:,.0f} | {r['xla_flops_per_step'] / 1e9:.1f} "
            f"| {r['gflops_per_s']:.1f} | {share} |"
        )


# ---------------------------------------------------------------------------------------------


SECTIONS: dict[str, tuple[Section, Callable[[dict[str, Any]], None]]] = {
    "pipeline": (pipeline_section, print_pipeline),
    "peak": (peak_section, print_peak),
    "train": (train_section, print_train),
}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sections", default="pipeline", help=f"comma-separated: {', '.join(SECTIONS)}")
    p.add_argument("--json", help="write all results to this JSON file")
    g = p.add_argument_group("peak and train")
    g.add_argument("--peak-size", type=int, default=2048, help="matrix size of the peak test")
    g.add_argument("--models", default="transformer", help="comma-separated model names")
    g.add_argument("--size", default="ted", choices=sorted(SIZES), help="model size")
    g.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    g.add_argument("--length", type=int, default=32, help="tokens per sentence in train batches")
    g.add_argument("--vocab", type=int, default=8000, help="vocabulary size")
    g.add_argument("--steps", type=int, default=10, help="timed train steps (median reported)")
    g = p.add_argument_group("pipeline")
    g.add_argument("--tsv", default="data/bible/train.tsv", help="TSV corpus of documents")
    g.add_argument("--spm", help="SentencePiece model; default: whitespace word-level encoder")
    g.add_argument("--num-batches", type=int, default=2000, help="batches timed per run")
    g.add_argument("--modes", default="document,sentence", help="document and/or sentence")
    g.add_argument("--max-sentences", type=int, default=20)
    g.add_argument("--max-len", type=int, default=128, help="max tokens per sentence (+EOS)")
    g.add_argument("--batch-tokens", type=int, default=2048, help="padded slots per side")
    args = p.parse_args(argv)
    unknown = set(args.sections.split(",")) - set(SECTIONS)
    if unknown:
        p.error(f"unknown sections {sorted(unknown)}; known: {sorted(SECTIONS)}")
    if set(args.modes.split(",")) - {"document", "sentence"}:
        p.error("--modes takes document and/or sentence")
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    results: dict[str, Any] = {
        "host": {"python": platform.python_version(), "cpus": os.cpu_count()},
    }
    for name in args.sections.split(","):
        run, show = SECTIONS[name]
        results[name] = run(args)
        if name == "train":
            show(results[name], results.get("peak"))
        else:
            show(results[name])
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=2)
            f.write("\n")
    return results


if __name__ == "__main__":
    main()
