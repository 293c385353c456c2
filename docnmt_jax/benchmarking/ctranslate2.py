"""Our jitted search against CTranslate2 on the same trained sentence Transformer
(docs/performance.md).

``--sections ctranslate2 --ctranslate2-workdir RUN`` (a sentence Transformer run or release):
the run's parameters are converted (:mod:`docnmt_jax.export.ctranslate2`, float32 weights)
and the documents of ``--corpus-test-tsv`` (the Bible's test books; the first
``--corpus-test-docs`` if given) are translated by

* ours: the Translator's batches of ``--corpus-translate-tokens`` source tokens and its
  compiled search (:class:`OursRun`, as ``launch/translate.py``), float32;
* CTranslate2 with compute types ``--ctranslate2-compute-types`` (float32 and int8: weights
  quantized when the model loads), ``intra_threads=--ctranslate2-threads``, one translator
  (``inter_threads=1``); the sentences sorted by length and cut into batches of at most as
  many source tokens, padding included, one ``translate_batch`` call per batch whose
  ``max_decoding_length`` is its longest output limit (ours is per sentence: a sentence that
  reaches its own limit may run longer there). ``--ctranslate2-batching limit`` gives every
  batch one output limit instead (outputs as ours, more and smaller batches). The
  ``identical`` column counts the outputs equal to ours token for token.

Both with beam ``--beam`` and greedy, length penalty 0 (the same ranking in both engines,
so both produce the same hypotheses and the rates compare the same work). Tokenisation and
detokenisation are left out of both. One call is one whole pass over the test set; each of
``--decode-repeats`` rounds times every engine and search once in turn
(:func:`~docnmt_jax.benchmarking.timing.interleaved_times`), the median is reported, a first
untimed pass warms up (and compiles ours). Tokens/s counts output tokens, EOS included (one per
sentence for CTranslate2, which returns none); sentences/s ratios are to ours with the same
search. The float32 matmul peak of the host (the ``peak`` section's, else measured here) is
recorded beside them. XLA uses every core of the host: for the same threads on a larger
host, pin the process (``taskset -c 0,1``). ``--ctranslate2-profile DIR`` adds a
``jax.profiler`` trace of one pass of each of our searches (:func:`profile_ours`).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from docnmt_jax.benchmarking.workload import UsageError

Results = dict[str, Any]


def batch_members(
    sources: Sequence[Sequence[int]], limits: Sequence[int], batch_tokens: int, by_limit: bool
) -> list[list[int]]:
    """The indices of ``sources`` (piece ids, no EOS) in CTranslate2's batches: sorted by
    length (``by_limit``: by output limit first, one limit per batch), each batch at most
    ``batch_tokens`` source tokens, padding and EOS included (at least one sentence)."""
    key = (lambda i: (limits[i], len(sources[i]))) if by_limit else (lambda i: len(sources[i]))
    batches: list[list[int]] = []
    for i in sorted(range(len(sources)), key=key):
        batch = batches[-1] if batches else []
        fits = (len(batch) + 1) * (len(sources[i]) + 1) <= batch_tokens  # i is the longest
        if batch and fits and not (by_limit and limits[batch[0]] != limits[i]):
            batch.append(i)
        else:
            batches.append([i])
    return batches


class Ctranslate2Run:
    """CTranslate2's translation of ``sources`` (piece ids, no EOS) with ``search``'s beam
    and alpha, in :func:`batch_members`; the first pass is run here, untimed, and its outputs
    kept (:attr:`outputs`, ids without EOS)."""

    def __init__(
        self,
        translator: Any,
        compute_type: str,
        pieces: Sequence[str],
        sources: Sequence[Sequence[int]],
        limits: Sequence[int],
        search: Any,
        batch_tokens: int,
        by_limit: bool = False,
    ):
        from docnmt_jax.export import ctranslate2 as conversion

        self.compute_type, self.search = compute_type, search
        self.translator, self.sentences = translator, len(sources)
        self.options = conversion.search_options(search, pieces)
        self.batches = []
        for members in batch_members(sources, limits, batch_tokens, by_limit):
            tokens = [[pieces[t] for t in sources[i]] for i in members]
            length = conversion.decoding_length(max(limits[i] for i in members))
            self.batches.append((members, tokens, length))
        order = [i for members, _, _ in self.batches for i in members]
        index = {piece: i for i, piece in enumerate(pieces)}
        t0 = time.perf_counter()
        hypotheses = [h for results in self.call() for h in results]
        self.first_seconds = time.perf_counter() - t0
        self.outputs: list[list[int]] = [[] for _ in sources]
        for i, result in zip(order, hypotheses, strict=True):
            self.outputs[i] = [index[t] for t in result.hypotheses[0]]

    def call(self) -> list[Any]:
        return [
            self.translator.translate_batch(tokens, max_decoding_length=length, **self.options)
            for _, tokens, length in self.batches
        ]

    def time_once(self) -> float:
        t0 = time.perf_counter()
        self.call()
        return time.perf_counter() - t0

    def result(self, seconds: float, ours: Sequence[Sequence[int]]) -> Results:
        beam = self.search.beam_size
        tokens = sum(len(o) + 1 for o in self.outputs)  # EOS counted, as ours counts it
        identical = sum(a == list(b) for a, b in zip(self.outputs, ours, strict=True))
        return {
            "engine": f"CTranslate2 {self.compute_type}",
            "search": f"beam {beam}" if beam > 1 else "greedy",
            "beam": beam,
            "sentences": self.sentences,
            "batches": len(self.batches),
            "compile_seconds": max(self.first_seconds - seconds, 0.0),
            "seconds": seconds,
            "output_tokens": tokens,
            "mean_output_len": tokens / max(self.sentences, 1),
            "identical": identical,
            "sentences_per_s": self.sentences / seconds,
            "tokens_per_s": tokens / seconds,
        }


class OursRun:
    """Our translation of ``documents`` as ``launch/translate.py`` runs it: the Translator's
    batches and its compiled search (one call = one pass, ids fetched to the host); the first
    pass (compiling every shape) is run here, untimed, and its outputs kept."""

    def __init__(
        self,
        model: Any,
        params: Any,
        tokenizer: Any,
        search: Any,
        documents: Sequence[Any],
        batch_tokens: int,
        max_sentences: int,
    ):
        import jax
        import numpy as np

        from docnmt_jax.decoding.compiled import compile_translate
        from docnmt_jax.decoding.translator import Translator
        from docnmt_jax.export import ctranslate2_equality as equality

        self.search = search
        translator = Translator(
            model, params, tokenizer, search, batch_tokens=batch_tokens, max_sentences=max_sentences
        )
        self.batches = list(translator.batches(documents))
        translate = compile_translate(model, search)

        def call() -> list[Any]:
            return [np.asarray(jax.device_get(translate(params, b)[0])) for b in self.batches]

        self.call = call
        t0 = time.perf_counter()
        outputs = call()
        self.first_seconds = time.perf_counter() - t0
        self.outputs = equality.sentence_ids(self.batches, outputs, documents)

    def time_once(self) -> float:
        t0 = time.perf_counter()
        self.call()
        return time.perf_counter() - t0

    def result(self, seconds: float) -> Results:
        beam, sentences = self.search.beam_size, len(self.outputs)
        tokens = sum(len(o) + 1 for o in self.outputs)  # EOS included
        return {
            "engine": "ours (jit, float32)",
            "search": f"beam {beam}" if beam > 1 else "greedy",
            "beam": beam,
            "sentences": sentences,
            "batches": len(self.batches),
            "compile_seconds": max(self.first_seconds - seconds, 0.0),
            "seconds": seconds,
            "output_tokens": tokens,
            "mean_output_len": tokens / max(sentences, 1),
            "identical": sentences,
            "sentences_per_s": sentences / seconds,
            "tokens_per_s": tokens / seconds,
        }


def profile_ours(runs: Sequence[OursRun], directory: str) -> str:
    """A ``jax.profiler`` trace of one pass of each of our ``runs`` under ``directory``
    (TensorBoard's profile plugin or Perfetto): where our search's time goes."""
    import jax

    with jax.profiler.trace(directory):
        for run in runs:
            with jax.profiler.TraceAnnotation(f"ours_beam{run.search.beam_size}"):
                run.call()
    return directory


def _documents(args: argparse.Namespace) -> list[Any]:
    from docnmt_jax.data.documents import Document
    from docnmt_jax.data.readers import iter_source_documents

    path = args.corpus_test_tsv
    if not path or not os.path.exists(path):
        raise UsageError(f"--corpus-test-tsv {path!r}: no such file (the ctranslate2 section)")
    docs = [Document(d, tuple(src), ("",) * len(src)) for d, src, _ in iter_source_documents(path)]
    return docs[: args.corpus_test_docs] if args.corpus_test_docs else docs


def _translators(
    args: argparse.Namespace, model: Any, params: Any, tokenizer: Any, directory: str
) -> dict[str, Any]:
    """The run converted into ``directory``, loaded once per compute type."""
    from docnmt_jax.export import ctranslate2 as conversion
    from docnmt_jax.export import release

    ctranslate2 = conversion.import_ctranslate2()
    flat = release.flatten_params(params)
    conversion.converter(model.config, flat, tokenizer, conversion.MAX_POSITIONS).convert(
        directory, force=True
    )
    threads = args.ctranslate2_threads
    return {
        compute_type: ctranslate2.Translator(
            directory, compute_type=compute_type, intra_threads=threads, inter_threads=1
        )
        for compute_type in args.ctranslate2_compute_types.split(",")
    }


def ctranslate2_section(args: argparse.Namespace, results: Results) -> Results:
    """The section (module docstring)."""
    from docnmt_jax.benchmarking.peak import peak_section
    from docnmt_jax.benchmarking.timing import interleaved_times
    from docnmt_jax.decoding.search import SearchConfig
    from docnmt_jax.export import ctranslate2 as conversion
    from docnmt_jax.export import ctranslate2_equality as equality
    from docnmt_jax.training import restore

    if not args.ctranslate2_workdir:
        raise UsageError("the ctranslate2 section needs --ctranslate2-workdir RUN")
    workdir = args.ctranslate2_workdir
    model, tokenizer, config = restore.load_model(workdir)
    conversion.check_convertible(model)
    params, step = restore.load_params(model, workdir, "best")
    documents = _documents(args)
    sources = tokenizer.encode_batch([s for d in documents for s in d.src])
    pieces = conversion.vocabulary(tokenizer)
    peak = results.get("peak") or peak_section(args, results)
    ours: list[OursRun] = []
    theirs: list[tuple[Ctranslate2Run, OursRun]] = []
    with tempfile.TemporaryDirectory() as directory:
        translators = _translators(args, model, params, tokenizer, directory)
        for beam in sorted({args.beam, 1}, reverse=True):
            search = SearchConfig(beam_size=beam, alpha=0.0)
            limits = [equality.output_limit(len(s), search) for s in sources]
            ours.append(
                OursRun(
                    model,
                    params,
                    tokenizer,
                    search,
                    documents,
                    args.corpus_translate_tokens,
                    config.data.max_sentences,
                )
            )
            for compute_type, translator in translators.items():
                run = Ctranslate2Run(
                    translator,
                    compute_type,
                    pieces,
                    sources,
                    limits,
                    search,
                    args.corpus_translate_tokens,
                    args.ctranslate2_batching == "limit",
                )
                theirs.append((run, ours[-1]))
        runs = ours + [r for r, _ in theirs]
        medians = interleaved_times([r.time_once for r in runs], args.decode_repeats)
    profile = profile_ours(ours, args.ctranslate2_profile) if args.ctranslate2_profile else None
    rows = [run.result(s) for run, s in zip(ours, medians, strict=False)]
    for (run, our_run), seconds in zip(theirs, medians[len(ours) :], strict=True):
        rows.append(run.result(seconds, our_run.outputs))
    for row in rows:
        base = next(r for r in rows[: len(ours)] if r["beam"] == row["beam"])
        row["sentences_per_s_ratio"] = row["sentences_per_s"] / base["sentences_per_s"]
    import ctranslate2

    return {
        "workdir": workdir,
        "step": step,
        "test_tsv": args.corpus_test_tsv,
        "documents": len(documents),
        "sentences": len(sources),
        "batch_tokens": args.corpus_translate_tokens,
        "threads": args.ctranslate2_threads,
        "batching": args.ctranslate2_batching,
        "cpus": os.cpu_count(),
        "ctranslate2": ctranslate2.__version__,
        "float32_peak_gflops": peak["float32_gflops"],
        "repeats": args.decode_repeats,
        "profile": profile,
        "runs": rows,
    }


def print_ctranslate2(result: Results) -> None:
    """The section's markdown table."""
    from docnmt_jax.benchmarking.report import print_table

    print(
        f"\n### ctranslate2: {result['workdir']} step {result['step']} on {result['test_tsv']} "
        f"({result['documents']} documents, {result['sentences']} sentences), batches of "
        f"{result['batch_tokens']} source tokens (CTranslate2's by {result['batching']}), "
        f"length penalty 0; CTranslate2 "
        f"{result['ctranslate2']} on {result['threads']} threads, XLA on {result['cpus']} "
        f"cores; host float32 peak {result['float32_peak_gflops']:,.0f} GFLOP/s; median of "
        f"{result['repeats']} interleaved passes; ratio to ours with the same search\n"
    )
    rows = [
        [
            r["engine"],
            r["search"],
            r["sentences"],
            r["batches"],
            f"{r['identical']} ({100 * r['identical'] / max(r['sentences'], 1):.1f}%)",
            f"{r['mean_output_len']:.1f}",
            f"{r['compile_seconds']:.1f}",
            f"{r['seconds']:.2f}",
            f"{r['sentences_per_s']:,.1f}",
            f"{r['tokens_per_s']:,.0f}",
            f"{r['sentences_per_s_ratio']:.2f}",
        ]
        for r in result["runs"]
    ]
    headers = [
        "engine",
        "search",
        "sentences",
        "batches",
        "identical to ours",
        "tokens/sent",
        "warm-up s",
        "s (pass)",
        "sentences/s",
        "tokens/s",
        "× ours",
    ]
    print_table(headers, rows)
