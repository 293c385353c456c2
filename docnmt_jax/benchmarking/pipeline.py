"""Throughput of the training loaders (the plain NumPy iterator, the prefetching NumPy loader,
tf.data where TensorFlow imports) on a TSV of documents (``doc_id<TAB>src<TAB>tgt``), document
and sentence mode: batches, chunks, sentences and
tokens per second, padding, distinct shapes, and the first batch after resuming deep into
training (one epoch plan, not the skipped batches)."""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

Results = dict[str, Any]


def word_encoder() -> Callable[[Sequence[str]], list[list[int]]]:
    """Whitespace word-level encoder; ids from 4 (after PAD/EOS/BOS/UNK) by first occurrence."""
    vocab: dict[str, int] = {}

    def encode(texts: Sequence[str]) -> list[list[int]]:
        return [[vocab.setdefault(w, len(vocab) + 4) for w in t.split()] for t in texts]

    return encode


def spm_encoder(path: str) -> Callable[[Sequence[str]], list[list[int]]]:
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=path)
    return lambda texts: sp.encode(list(texts))


def pipeline_settings(args: argparse.Namespace) -> Any:
    """The ``PipelineConfig`` settings of ``--max-sentences``, ``--max-len`` (both sides) and
    ``--batch-tokens`` (both sides); the rest default (a model's fields: the data builder,
    :func:`docnmt_jax.data.builder.pipeline_config`)."""
    from docnmt_jax.data import pipeline as P

    return P.PipelineConfig(
        max_sentences=args.max_sentences,
        max_src_len=args.max_len,
        max_tgt_len=args.max_len,
        batch_src_tokens=args.batch_tokens,
        batch_tgt_tokens=args.batch_tokens,
    )


def pipeline_section(args: argparse.Namespace, results: Results) -> Results:
    """``args``: ``tsv``, ``spm`` (None: :func:`word_encoder`), ``modes``, ``num_batches``,
    ``max_sentences``, ``max_len``, ``batch_tokens``."""
    from docnmt_jax.data import loader
    from docnmt_jax.data import pipeline as P
    from docnmt_jax.data.readers import read_tsv

    t0 = time.perf_counter()
    docs = read_tsv(args.tsv)
    read_s = time.perf_counter() - t0
    encode = spm_encoder(args.spm) if args.spm else word_encoder()
    base = pipeline_settings(args)
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
            "numpy": lambda plan=plan: P.numpy_batches(plan),
            "numpy loader": lambda plan=plan: loader.train_batches(plan, loader="numpy"),
        }
        if loader.tensorflow_importable():
            iterators["tf.data"] = lambda plan=plan: P.make_dataset(plan)
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
        next(iter(loader.train_batches(plan, start_step=resume_step)))
        for m in result["runs"][-len(iterators) :]:
            m["resume_first_batch_seconds"] = time.perf_counter() - t0
    return result
