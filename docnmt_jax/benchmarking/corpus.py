"""Training speed on a real corpus (``--tsv``, the Bible by default): each model trains on the
batches its own training plan gives it -- the real padding, batch shapes and compilations --
packed rows and the ``[B, S, T]`` grid side by side.

Per model and layout: the plan's batches per epoch, padding (of the whole epoch), shapes, the
compilations the timed batches needed and their seconds (excluded from the rate), and the real
target tokens per second over ``--corpus-steps`` steps. The steps are the first batches of
epoch 0 in the plan's own order, after ``--warmup`` untimed ones; models and layouts take turns
step by step (one round = one step of each), so the machine's drift hits all alike. Ratios are
to the sentence Transformer of the same layout, and packed to grid for each model.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from typing import Any

from docnmt_jax.benchmarking.workload import UsageError, build, model_names

Results = dict[str, Any]

LAYOUTS = ("packed", "grid")


def corpus_tokenizer(args: argparse.Namespace, docs: list) -> Any:
    """``--spm``, or a SentencePiece model of ``--corpus-vocab`` pieces trained on the corpus
    (cached next to it as ``spm_<vocab>.model``, as the trainer's ``WORKDIR/spm.model``)."""
    from docnmt_jax.data.tokenizer import get_or_train_tokenizer, load_tokenizer

    if args.spm:
        return load_tokenizer(args.spm)
    vocab = args.corpus_vocab
    path = os.path.join(os.path.dirname(os.path.abspath(args.tsv)), f"spm_{vocab}.model")
    return get_or_train_tokenizer(path, docs, vocab_size=vocab)


class CorpusRun:
    """One model on one layout: its plan, its compiled steps (one per shape met) and times."""

    def __init__(self, name: str, layout: str, task: Any, plan: Any, batches: list[Results]):
        self.name, self.layout, self.task, self.plan = name, layout, task, plan
        self.batches = batches
        self.step = None
        self.compiled: dict[tuple[int, ...], Any] = {}
        self.compile_seconds = 0.0
        self.seconds: list[float] = []
        self.tokens: list[int] = []

    def run(self, i: int, timed: bool) -> None:
        import jax

        from docnmt_jax.benchmarking.compilation import compile_train

        batch = self.batches[i]
        shape = batch["src"].shape
        if shape not in self.compiled:
            t0 = time.perf_counter()
            step = compile_train(self.task, batch)
            if self.step is not None:
                step.state = self.step.state  # one training run across shapes
            self.step = step
            self.compiled[shape] = step.compiled
            self.compile_seconds += time.perf_counter() - t0
        t0 = time.perf_counter()
        self.step.state, metrics = self.compiled[shape](self.step.state, batch)
        jax.block_until_ready(metrics)
        if timed:
            self.seconds.append(time.perf_counter() - t0)
            self.tokens.append(int(batch["tgt_mask"].sum()))

    def result(self) -> Results:
        plan, seconds = self.plan, sum(self.seconds)
        return {
            "model": self.name,
            "layout": self.layout,
            "batches_per_epoch": plan.batches_per_epoch,
            "plan_shapes": len(plan.shapes),
            "padding_fraction": plan.stats.padding_fraction,
            "compilations": len(self.compiled),
            "compile_seconds": self.compile_seconds,
            "steps": len(self.seconds),
            "seconds": seconds,
            "real_target_tokens": sum(self.tokens),
            "real_tokens_per_step": sum(self.tokens) / max(len(self.tokens), 1),
            "tokens_per_s": sum(self.tokens) / seconds if seconds else 0.0,
        }


def corpus_section(args: argparse.Namespace, results: Results) -> Results:
    """``args``: ``tsv``, ``spm``, ``corpus_vocab``, ``size``, ``dtype``, ``models``,
    ``corpus_layouts``, ``corpus_steps``, ``warmup``, ``max_sentences``, ``max_len``,
    ``batch_tokens``."""
    from docnmt_jax.data import pipeline as P
    from docnmt_jax.data.readers import read_tsv

    if not os.path.exists(args.tsv):
        raise UsageError(
            f"--tsv {args.tsv}: no such corpus; prepare the Bible with `python "
            "launch/prepare_data.py --corpus bible --out data/bible` or name another TSV"
        )
    docs = read_tsv(args.tsv)
    tokenizer = corpus_tokenizer(args, docs)
    args = argparse.Namespace(**dict(vars(args), vocab=tokenizer.vocab_size))
    layouts = args.corpus_layouts.split(",")
    if set(layouts) - set(LAYOUTS):
        raise UsageError(f"--corpus-layouts takes {' and/or '.join(LAYOUTS)}: {layouts}")
    base = P.PipelineConfig(
        max_sentences=args.max_sentences,
        max_src_len=args.max_len,
        max_tgt_len=args.max_len,
        batch_src_tokens=args.batch_tokens,
        batch_tgt_tokens=args.batch_tokens,
    )
    corpus = P.tokenize_corpus(docs, tokenizer.encode_batch, base)
    needed = args.warmup + args.corpus_steps
    runs: list[CorpusRun] = []
    for name in model_names(args):
        task = build(name, args, args.max_sentences)
        for layout in layouts:
            packing = task.packing() if layout == "packed" else None
            if layout == "packed" and packing is None:
                continue  # this model trains on the grid only
            config = dataclasses.replace(
                base, sentence_level=task.layout.sentence_level, packing=packing
            )
            plan = P.plan_batches(corpus, config=config)
            batches = [b for _, b in zip(range(needed), P.numpy_batches(plan), strict=False)]
            runs.append(CorpusRun(name, layout, task, plan, batches))
    steps = min(len(r.batches) for r in runs)
    for i in range(steps):
        for r in runs:
            r.run(i, timed=i >= args.warmup)
    out = [r.result() for r in runs]
    for r in out:
        same_layout = [b for b in out if b["layout"] == r["layout"]]
        base_run = next((b for b in same_layout if b["model"] == "transformer"), same_layout[0])
        r["ratio_to_transformer"] = r["tokens_per_s"] / max(base_run["tokens_per_s"], 1e-9)
        grid = next((b for b in out if b["model"] == r["model"] and b["layout"] == "grid"), None)
        r["ratio_to_grid"] = r["tokens_per_s"] / grid["tokens_per_s"] if grid else None
    return {
        "tsv": args.tsv,
        "size": args.size,
        "dtype": args.dtype,
        "vocab": tokenizer.vocab_size,
        "corpus": dataclasses.asdict(corpus.stats),
        "timed_steps": max(steps - args.warmup, 0),
        "runs": out,
    }
