"""Decoding speed per model: beam search and greedy on the same documents, sentences/s,
tokens/s, XLA compilations, and the ratio to the sentence Transformer.

Decoding fixes the output length, since random-init parameters end sentences at arbitrary
points: the EOS row of the tied output embedding is set to zero (EOS logit 0, while about half
of the V logits are positive, so EOS never ranks in a beam's top 2·beam) and every output is
limited to ``--decode-len`` tokens (``len_a=0, len_b=max_len=L``). Every sentence of every model
then takes exactly L decoder steps, the last forcing EOS; tokens/s counts those steps and the
table shows the measured mean length (Doc2Doc searches a chunk as one sequence of S·L steps
and cuts it at separators; empty pieces add an EOS each, so its mean is slightly above L).
Every model decodes the same S·--chunks chunks with --chunks·beam rows per search step: FINAL
(sentences in order) in one call, the others in S calls of --chunks chunks.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from docnmt_jax.benchmarking.compilation import CompileWatch, init_params
from docnmt_jax.benchmarking.timing import interleaved_times, time_calls
from docnmt_jax.benchmarking.workload import add_ratios, build, make_batch, model_names

Results = dict[str, Any]


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


def fixed_search(beam: int, length: int) -> Any:
    """Beam ``beam`` (1: greedy, alpha 0; else alpha 0.6), every output exactly ``length``."""
    from docnmt_jax.decoding.search import SearchConfig

    alpha = 0.6 if beam > 1 else 0.0
    return SearchConfig(beam_size=beam, alpha=alpha, len_a=0.0, len_b=length, max_len=length)


class DecodeRun:
    """``task.translate`` with beam ``beam`` (1: greedy) on ``batch``, in calls of ``rows``
    chunks each, compiled as the Translator does (``compiled.compile_translate``) and
    run once (compilation timed; XLA compilations counted in that run and, apart, in the timed
    calls, which should have none)."""

    def __init__(
        self, name: str, task: Any, params: Any, batch: Results, rows: int, beam: int, args: Any
    ):
        import jax

        from docnmt_jax.decoding.compiled import compile_translate

        self.name, self.batch, self.beam, self.args = name, batch, beam, args
        self.search = fixed_search(beam, args.decode_len)
        translate = compile_translate(task, self.search)
        parts = [
            {key: value[start : start + rows] for key, value in batch.items()}
            for start in range(0, batch["src"].shape[0], rows)
        ]
        self.calls = len(parts)

        def call() -> Any:
            outputs = [translate(params, part)[0] for part in parts]  # (ids, aux) each
            return np.concatenate([np.asarray(ids) for ids in outputs])

        self.call = call
        self.watch, self.timed_watch = CompileWatch(), CompileWatch()
        with self.watch:
            t0 = time.perf_counter()
            self.output = jax.block_until_ready(self.call())
            self.first_seconds = time.perf_counter() - t0

    def time_once(self) -> float:
        with self.timed_watch:
            return time_calls(self.call, 1)[0]


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
        rows = args.chunks * (args.sentences if task.layout.sequential else 1)
        batch = make_batch(
            args,
            args.chunks * args.sentences,
            args.sentences,
            args.length,
            task.context_sentences,
        )
        params = never_eos(init_params(task, batch))
        for beam in sorted({args.beam, 1}, reverse=True):
            prepared.append(DecodeRun(name, task, params, batch, rows, beam, args))
    medians = interleaved_times([p.time_once for p in prepared], args.decode_repeats)
    runs = [decode_run(p, seconds) for p, seconds in zip(prepared, medians, strict=True)]
    baseline = add_ratios(runs, "sentences_per_s", group="beam")
    return {"decode_len": args.decode_len, "baseline": baseline, "runs": runs}
