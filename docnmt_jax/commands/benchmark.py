"""Benchmarks of the models on identical batches in one process, plus the data pipeline.

Sections (``--sections``; default ``peak,train,corpus,decode,growth``):
  peak      the machine's matrix-multiply peak (GFLOP/s) in float32 and bfloat16
  train     per model: train-step time, target tokens/s, analytic / traced / XLA FLOPs per
            step, achieved FLOP/s and MFU against the measured peak, compiled memory
  corpus    per model, packed rows and [B,S,T] grid: real target tokens/s training on the
            real corpus plan (``--tsv``, its padding, shapes and compilations), padding %,
            shapes, compile seconds, ratios to the Transformer and to the grid; then
            translating the test books (``--corpus-test-tsv``) as translate.py batches them,
            beam and greedy, --decode-repeats passes: sentences/s, tokens/s, batches,
            shapes, compilations, ratio to the Transformer
  decode    per model: fixed-length beam search and greedy on the same documents,
            sentences/s, tokens/s, XLA compilations
  growth    train-step time, compiled memory and analytic FLOPs against sentences per chunk
            and against sentence length, on the grid and on the model's packed rows
            (``--growth-layouts``), with the fitted log-log slope per model and layout
  pipeline  (not in the default) throughput of the tf.data document pipeline on a TSV of
            documents (``doc_id<TAB>src<TAB>tgt``), document and sentence mode
  profile   (added by ``--profile DIR``) a ``jax.profiler`` trace per model
  ctranslate2  (not in the default; ``--ctranslate2-workdir RUN``) a trained sentence
            Transformer on the test books, our jitted search against CTranslate2 float32 and
            int8 on the same weights, beam and greedy: sentences/s, tokens/s, identical outputs
Batches are synthetic (seeded, no padding): ``--chunks`` chunks of ``--sentences`` sentences of
``--length`` tokens; ratios are to the sentence Transformer. How each number is measured:
the modules of ``docnmt_jax/benchmarking/``.

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
from collections.abc import Sequence
from typing import Any

from docnmt_jax import benchmarking, cli
from docnmt_jax.benchmarking.workload import SIZES


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = cli.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--sections",
        help=f"comma-separated of {', '.join(benchmarking.SECTIONS)}; "
        "default: peak,train,corpus,decode,growth",
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
    g.add_argument(
        "--growth-layouts", default="grid,packed", help="grid and/or packed (the model's rows)"
    )
    g = p.add_argument_group("corpus and pipeline")
    g.add_argument("--tsv", default="data/bible/train.tsv", help="TSV corpus of documents")
    g.add_argument(
        "--spm",
        help="SentencePiece model; default: corpus trains spm_<vocab>.model next to --tsv, "
        "pipeline uses a whitespace word-level encoder",
    )
    g.add_argument("--corpus-steps", type=int, help="timed train steps per model: 20 / 2")
    g.add_argument("--corpus-layouts", default="packed,grid", help="packed and/or grid")
    g.add_argument("--corpus-vocab", type=int, help="SentencePiece pieces trained: 8000 / 300")
    g.add_argument(
        "--corpus-test-tsv",
        default="data/bible/test.tsv",
        help="documents the corpus section translates (TSV or blank-line text); '': skip",
    )
    g.add_argument(
        "--corpus-test-docs", type=int, help="translate the first N test documents; 0: all / 4"
    )
    g.add_argument(
        "--corpus-checkpoint",
        action="append",
        metavar="MODEL=WORKDIR",
        help="translate with MODEL's trained run (best checkpoint, its tokenizer) instead of "
        "random-init parameters at a forced --decode-len; repeatable",
    )
    g.add_argument(
        "--corpus-translate-tokens",
        type=int,
        default=4096,
        help="padded source tokens per translation batch (translate.py --batch_tokens)",
    )
    g.add_argument("--num-batches", type=int, default=2000, help="batches timed per run")
    g.add_argument("--modes", default="document,sentence", help="document and/or sentence")
    g.add_argument("--max-sentences", type=int, default=20)
    g.add_argument("--max-len", type=int, default=128, help="max tokens per sentence (+EOS)")
    g.add_argument("--batch-tokens", type=int, default=2048, help="padded slots per side")
    add_ctranslate2_flags(p)
    args = p.parse_args(argv)
    return benchmarking.apply_presets(args)


def add_ctranslate2_flags(p: argparse.ArgumentParser) -> None:
    """The ``ctranslate2`` section's flags (the same model in CTranslate2 beside our search)."""
    g = p.add_argument_group("ctranslate2 (needs the optional ctranslate2 package)")
    g.add_argument("--ctranslate2-workdir", help="the sentence Transformer run or release")
    g.add_argument("--ctranslate2-threads", type=int, default=2, help="CTranslate2 threads")
    g.add_argument(
        "--ctranslate2-compute-types", default="float32,int8", help="CTranslate2 compute types"
    )
    g.add_argument(
        "--ctranslate2-batching",
        default="length",
        choices=("length", "limit"),
        help="CTranslate2's batches: by length (a batch's longest limit) or one output limit each",
    )
    g.add_argument("--ctranslate2-profile", help="a jax.profiler trace of our passes here")


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    return benchmarking.run(parse_args(argv))


def run() -> None:
    """The command line: ``python launch/benchmark.py``."""
    cli.run_argparse(main)


if __name__ == "__main__":
    run()
