"""Benchmarks of the toolkit, one section per component, selected with ``--sections``.

Sections:
  pipeline  throughput of the tf.data document pipeline on a TSV of documents
            (``doc_id<TAB>src<TAB>tgt``), in document mode and sentence-level mode, for the
            tf.data dataset and the plain NumPy iterator.

Usage:
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


SECTIONS: dict[str, tuple[Section, Callable[[dict[str, Any]], None]]] = {
    "pipeline": (pipeline_section, print_pipeline),
}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sections", default="pipeline", help=f"comma-separated: {', '.join(SECTIONS)}")
    p.add_argument("--json", help="write all results to this JSON file")
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
        show(results[name])
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=2)
            f.write("\n")
    return results


if __name__ == "__main__":
    main()
