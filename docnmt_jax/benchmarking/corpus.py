"""Training speed on a real corpus (``--tsv``, the Bible by default): each model trains on the
batches its own training plan gives it -- the real padding, batch shapes and compilations --
packed rows and the ``[B, S, T]`` grid side by side.

Per model and layout: the plan's batches per epoch, padding (of the whole epoch), shapes, the
compilations the timed batches needed and their seconds (excluded from the rate), and the real
target tokens per second over ``--corpus-steps`` steps. The steps are the first batches of
epoch 0 in the plan's own order, after ``--warmup`` untimed ones; models and layouts take turns
step by step (one round = one step of each), so the machine's drift hits all alike. Ratios are
to the sentence Transformer of the same layout, and packed to grid for each model.

Then translation speed on the real test books: the documents of ``--corpus-test-tsv`` (the
Bible's test split by default; its first ``--corpus-test-docs`` if given; ``''``: skipped).
Every model translates them the way ``launch/translate.py`` does -- the Translator's own
pipeline config (FINAL's budget counting one sentence per chunk), blocks of 256 documents
planned by ``Translator.batches`` (few shapes, chunks grouped by length), the search compiled by
``compiled.compile_translate`` -- with beam ``--beam`` and greedy, in batches of
``--corpus-translate-tokens`` source tokens. Parameters: a trained run with
``--corpus-checkpoint MODEL=WORKDIR`` (restored as ``translate.py`` restores it: the best
checkpoint, the run's tokenizer, model config, ``max_sentences`` and translate.py's search
settings), else the random-init ones (with the training part's ``--max-sentences`` and
``--max-len``) with EOS never generated (``decode.never_eos``) and every output forced to
``--decode-len`` tokens (``decode.fixed_search``), so that every model decodes the same steps
per sentence (Doc2Doc: a chunk's n x L steps, cut at its separators); their
tokens/s counts those decoder steps, the table's tokens/sentence is measured.

Timing: the models' batch plans differ in count (FINAL gets more chunks per batch), so one
call is one whole pass over the test set (every batch searched and its ids fetched to the
host, as the Translator does; tokenisation and detokenisation, alike for every model, are left
out), and each of ``--decode-repeats`` rounds times every model and search once in turn
(``timing.interleaved_times``; the median is reported). A first, untimed pass compiles every
shape; its excess over the median is the compile time. Sentences/s ratios are to the sentence
Transformer with the same search.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from typing import Any

from docnmt_jax.benchmarking.pipeline import pipeline_settings
from docnmt_jax.benchmarking.workload import UsageError, add_ratios, build, model_names

Results = dict[str, Any]

LAYOUTS = ("packed", "grid")
BLOCK_DOCUMENTS = 256  # launch/translate.py --block_documents: documents planned at a time


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
            streams = self.plan.stream_rows if self.plan.config.streams else 0
            step = compile_train(self.task, batch, streams)
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
        """The timed steps' real target tokens/s, and at the epoch's fill: the plan's real
        target tokens per batch over a whole epoch at the timed steps' mean time (a plan has
        one to a few shapes, so a step's time hardly depends on which batch it is)."""
        plan, seconds = self.plan, sum(self.seconds)
        epoch_per_step = plan.stats.tgt_tokens / max(plan.batches_per_epoch, 1)
        mean_step = seconds / len(self.seconds) if self.seconds else 0.0
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
            "epoch_tokens_per_step": epoch_per_step,
            "epoch_tokens_per_s": epoch_per_step / mean_step if mean_step else 0.0,
        }


def corpus_section(args: argparse.Namespace, results: Results) -> Results:
    """``args``: ``tsv``, ``spm``, ``corpus_vocab``, ``size``, ``dtype``, ``models``,
    ``corpus_layouts``, ``corpus_steps``, ``warmup``, ``max_sentences``, ``max_len``,
    ``batch_tokens``."""
    from docnmt_jax.data import builder
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
    base = pipeline_settings(args)
    corpus = P.tokenize_corpus(docs, tokenizer.encode_batch, base)
    needed = args.warmup + args.corpus_steps
    runs: list[CorpusRun] = []
    for name in model_names(args):
        task = build(name, args, args.max_sentences)
        spec = task.data_spec()
        for layout in layouts:
            if layout == "packed" and spec.packing is None:
                continue  # this model trains on the grid only
            plan = builder.build_plan(spec, base, corpus, packed=layout == "packed")
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
        r["epoch_ratio_to_transformer"] = r["epoch_tokens_per_s"] / max(
            base_run["epoch_tokens_per_s"], 1e-9
        )
        grid = next((b for b in out if b["model"] == r["model"] and b["layout"] == "grid"), None)
        r["ratio_to_grid"] = r["tokens_per_s"] / grid["tokens_per_s"] if grid else None
    tasks = {r.name: r.task for r in runs}
    return {
        "tsv": args.tsv,
        "size": args.size,
        "dtype": args.dtype,
        "vocab": tokenizer.vocab_size,
        "corpus": dataclasses.asdict(corpus.stats),
        "timed_steps": max(steps - args.warmup, 0),
        "runs": out,
        "translate": translate_test(args, tasks, tokenizer) if args.corpus_test_tsv else None,
    }


def parse_checkpoints(specs: list[str] | None, models: list[str]) -> dict[str, str]:
    """``--corpus-checkpoint MODEL=WORKDIR`` (repeatable) -> ``{MODEL: WORKDIR}``."""
    out = {}
    for spec in specs or []:
        name, sep, workdir = spec.partition("=")
        if not sep or not workdir:
            raise UsageError(f"--corpus-checkpoint {spec}: expected MODEL=WORKDIR")
        if name not in models:
            raise UsageError(f"--corpus-checkpoint {spec}: {name} is not in --models {models}")
        out[name] = workdir
    return out


class TranslateRun:
    """One model, one search over the test documents: the Translator's batches (its
    ``batches``, in blocks of :data:`BLOCK_DOCUMENTS`) and its compiled search, one call = one
    whole pass; the first pass (compiling every shape) is run here, untimed, and its outputs
    checked: every test sentence translated."""

    def __init__(
        self,
        name: str,
        model: Any,
        params: Any,
        tokenizer: Any,
        search: Any,
        documents: list[Any],
        forced_len: int | None,
        source: str,
        **translator_options: Any,
    ):
        import jax
        import numpy as np

        from docnmt_jax.benchmarking.compilation import CompileWatch
        from docnmt_jax.decoding.compiled import compile_translate
        from docnmt_jax.decoding.translator import Translator

        self.name, self.search, self.forced_len, self.source = name, search, forced_len, source
        translator = Translator(model, params, tokenizer, search, **translator_options)
        self.batches: list[Results] = []
        for start in range(0, len(documents), BLOCK_DOCUMENTS):
            self.batches += translator.batches(documents[start : start + BLOCK_DOCUMENTS])
        translate = compile_translate(model, search)  # what the Translator runs

        def call() -> list[Any]:
            outputs = []
            for batch in self.batches:
                ids, aux = translate(params, batch)
                outputs.append(np.asarray(jax.device_get(ids)))
                jax.device_get(aux)  # Doc2Doc's sentence counts, fetched by the Translator
            return outputs

        self.call = call
        self.watch, self.timed_watch = CompileWatch(), CompileWatch()
        with self.watch:
            t0 = time.perf_counter()
            outputs = call()
            self.first_seconds = time.perf_counter() - t0
        self.lengths = np.concatenate(
            [
                np.sum(ids > 0, axis=-1)[batch["doc_index"] >= 0][
                    batch["sentence_mask"][batch["doc_index"] >= 0] > 0
                ]
                for batch, ids in zip(self.batches, outputs, strict=True)
            ]
        )  # output tokens (EOS included) of every real sentence, as the Translator counts
        expected = sum(len(d) for d in documents)
        if self.lengths.size != expected:
            raise RuntimeError(
                f"{name}: {self.lengths.size} of {expected} test sentences translated "
                "(a pipeline bug)"
            )

    def time_once(self) -> float:
        from docnmt_jax.benchmarking.timing import time_calls

        with self.timed_watch:
            return time_calls(self.call, 1)[0]

    def result(self, seconds: float) -> Results:
        beam = self.search.beam_size
        sentences = int(self.lengths.size)
        # forced: decoder steps, the fixed budget of every sentence (as the decode section;
        # Doc2Doc's n x L steps of a chunk are cut at separators); else the output tokens
        tokens = sentences * self.forced_len if self.forced_len else int(self.lengths.sum())
        real = sum(int(b["src_mask"].sum()) for b in self.batches)
        slots = sum(b["src_mask"].size for b in self.batches)
        return {
            "model": self.name,
            "search": f"beam {beam}" if beam > 1 else "greedy",
            "beam": beam,
            "params": self.source,
            "sentences": sentences,
            "batches": len(self.batches),
            "shapes": len({tuple(b["src"].shape) for b in self.batches}),
            "src_padding_fraction": 1.0 - real / max(slots, 1),
            "compilations": self.watch.count,
            "recompilations": self.timed_watch.count,
            "compile_seconds": max(self.first_seconds - seconds, 0.0),
            "seconds": seconds,
            "output_tokens": tokens,
            "forced_len": self.forced_len,
            "mean_output_len": float(self.lengths.mean()),
            "min_output_len": int(self.lengths.min()),
            "max_output_len": int(self.lengths.max()),
            "sentences_per_s": sentences / seconds,
            "tokens_per_s": tokens / seconds,
        }


def translate_test(args: argparse.Namespace, tasks: dict[str, Any], tokenizer: Any) -> Results:
    """Translation speed on ``--corpus-test-tsv`` (module docstring) of the models ``tasks``
    (random-init ones decode with ``tokenizer``); ``args``: also ``corpus_checkpoint``,
    ``corpus_test_docs``, ``beam``, ``decode_len``, ``decode_repeats``,
    ``corpus_translate_tokens``."""
    from docnmt_jax.benchmarking.compilation import init_params
    from docnmt_jax.benchmarking.decode import fixed_search, never_eos
    from docnmt_jax.benchmarking.timing import interleaved_times
    from docnmt_jax.data.documents import Document
    from docnmt_jax.data.readers import iter_source_documents
    from docnmt_jax.data.schema import dummy_batch
    from docnmt_jax.decoding.search import SearchConfig
    from docnmt_jax.training import restore

    path = args.corpus_test_tsv
    if not os.path.exists(path):
        raise UsageError(
            f"--corpus-test-tsv {path}: no such file; prepare the Bible with `python "
            "launch/prepare_data.py --corpus bible --out data/bible`, name another file, or "
            "pass --corpus-test-tsv '' to skip translating"
        )
    documents = [
        Document(doc_id, tuple(src), ("",) * len(src))
        for doc_id, src, _ in iter_source_documents(path)
    ]
    if args.corpus_test_docs:
        documents = documents[: args.corpus_test_docs]
    checkpoints = parse_checkpoints(args.corpus_checkpoint, list(tasks))
    beams = sorted({args.beam, 1}, reverse=True)
    prepared: list[TranslateRun] = []
    for name, task in tasks.items():
        if name in checkpoints:  # as launch/translate.py (restore.load_translator) does
            workdir = checkpoints[name]
            model, model_tokenizer, config = restore.load_model(workdir)
            if config.model.name != name:
                raise UsageError(
                    f"--corpus-checkpoint {name}={workdir}: that run trained "
                    f"{config.model.name}, not {name}"
                )
            params, step = restore.load_params(model, workdir, "best")
            options = dict(max_sentences=config.data.max_sentences)
            searches = [SearchConfig(beam_size=b) for b in beams]  # translate.py --beam b
            source, forced = f"{workdir} step {step}", None
        else:
            model, model_tokenizer = task, tokenizer
            params = never_eos(init_params(task, dummy_batch()))
            # the training part's limits; translate.py's default max_src_len (256) would give
            # Doc2Doc chunks of 20 x 256 slots, over its max_len
            options = dict(max_sentences=args.max_sentences, max_src_len=args.max_len)
            searches = [fixed_search(b, args.decode_len) for b in beams]
            source, forced = "random, EOS never", args.decode_len
        for search in searches:
            prepared.append(
                TranslateRun(
                    name,
                    model,
                    params,
                    model_tokenizer,
                    search,
                    documents,
                    forced,
                    source,
                    batch_tokens=args.corpus_translate_tokens,
                    **options,
                )
            )
    medians = interleaved_times([r.time_once for r in prepared], args.decode_repeats)
    runs = [r.result(seconds) for r, seconds in zip(prepared, medians, strict=True)]
    baseline = add_ratios(runs, "sentences_per_s", group="search")
    return {
        "test_tsv": path,
        "documents": len(documents),
        "sentences": sum(len(d) for d in documents),
        "decode_len": args.decode_len,
        "batch_tokens": args.corpus_translate_tokens,
        "repeats": args.decode_repeats,
        "baseline": baseline,
        "runs": runs,
    }
