"""Long-document scaling of FINAL: peak memory and time per sentence of training and decoding
ONE document of 20, 200 and 2,000 sentences, recurrent FINAL (context across chunks through a
fixed-size carried state, ``configs/final.py:recurrent``) against chunked FINAL (the paper's).

  python experiments/long_document_scaling.py --out DIR [--size tiny|ted] \\
      [--sentences 20,200,2000] [--models recurrent,chunked] [--phases train,decode] \\
      [--beam 1] [--max-len 32] [--words 24] [--repeats 2] [--min-steps 20] [--run RUN]

Writes ``DIR/long_document_scaling.json`` and ``.md`` and prints the Markdown table (peak RSS
and milliseconds per sentence per document length; ratios largest/smallest document).

Every measurement (model, phase, document) runs in a fresh subprocess (``--worker``); the
parent reads that process's peak resident set size (``ru_maxrss``) from ``os.wait4``, so peaks
never mix. ``rss_before_work_mb`` is the worker's peak once Python, JAX and the library are
imported, before any model or document: the part of the peak that no work explains.

* **Documents**: one synthetic long document (``docnmt_jax/data/synthetic_long.py``: its
  register and elided-verb dependencies cross chunks) of ``max(2000, sizes)`` sentences of
  ``0.75..1.25 x --words`` words; the shorter documents are its prefixes. A sentencepiece
  tokenizer of ``--vocab`` pieces is trained on it once (defaults: ~30 target and ~34 source
  tokens a sentence, the Bible's ~30 target tokens a verse).
* **train**: the library's train step as ``train_and_evaluate`` builds it (``make_steps``; the
  state of ``build_optimizer_state``/``init_state``; every batch shape compiled ahead by
  ``compile_for_shapes``) fed by the data builder's plan of a corpus holding that one
  document: recurrent, document streams with ``stream_rows = 1`` (one chunk a step, its state
  carried to the next); chunked, the packed chunk rows of the token budget. Not the trainer
  itself: for a one-document corpus on one stream its shuffled epochs hold ``C - 1`` all-padding
  steps besides the document's ``C`` chunks (``StreamPlan``'s dealing bound), and it also
  trains a tokenizer, evaluates and checkpoints. Here the plan is read in document order
  (``shuffle`` off, last batch padded: nothing dropped). Compilation is excluded: each compiled
  shape runs once before timing (compilations while timed are counted: 0). A repetition is
  whole passes over the document, at least ``--min-steps`` steps; seconds per sentence = its
  seconds / the sentences it trained.
* **decode**: ``Translator.translate([document])`` (one document a call: recurrent, one stream
  row, one chunk per compiled search call; chunked, the translation plan's batches, chunks in
  parallel up to ``--decode-batch-tokens``). Whole translations are repeated until
  ``--repeats`` of them compiled nothing; one that compiled is not timed (the first; for a
  one-chunk recurrent document also the second: its first chunk gets the carry the first call
  left, one search-length long, not the fresh one-slot carry, and ignores it, chunk_index 0).
  Parameters: random (seed 0), or ``--run``'s (its tokenizer too). Outputs stop at
  ``--max-len`` tokens (EOS included), so an untrained model's output length is bounded by it;
  the mean is reported (``output_tokens_per_sentence``).
* Timing: the median of ``--repeats`` repetitions; the host's float32 matmul peak
  (``docnmt_jax/benchmarking/peak.py``) is measured in its own subprocess.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

from docnmt_jax import cli
from docnmt_jax.errors import UserError

Result = dict[str, Any]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = ("recurrent", "chunked")
PHASES = ("train", "decode")
#: Whole translations that may compile (discarded) before the timed ones: a fresh recurrent
#: translator compiles its first chunk's search with no carried memory, later ones with it.
MAX_COMPILING_CALLS = 3
#: Sentences of the generated document at least (the tokenizer's training text).
TOKENIZER_SENTENCES = 2000
#: ``--size``: model overrides of configs/final.py (ted: its defaults, 256/512/4+4).
SIZES: dict[str, dict[str, int]] = {
    "tiny": dict(d_model=64, num_heads=4, ffn_dim=128, num_encoder_layers=2, num_decoder_layers=2),
    "ted": {},
}


def peak_rss_mb() -> float:
    """This process's peak resident set size so far (MB)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024  # bytes on macOS, KB


# ------------------------------------------------------------------------------ the workers


def final_config(args: argparse.Namespace) -> Any:
    """configs/final.py (``:recurrent`` for the recurrent model) at ``--size``, one stream."""
    from docnmt_jax.config_files import load_config

    name = "final.py:recurrent" if args.model == "recurrent" else "final.py"
    config = load_config(os.path.join(ROOT, "configs", name))
    config.model.update(SIZES[args.size])
    config.data.stream_rows = 1
    return config


def load_document(args: argparse.Namespace) -> Any:
    """The first ``--sentences`` sentences of the document in ``--document``."""
    from docnmt_jax.data.documents import Document
    from docnmt_jax.data.readers import read_tsv

    whole = read_tsv(args.document)[0]
    n = args.sizes[0]
    if n > len(whole):
        raise UserError(f"{args.document}: {len(whole)} sentences, {n} asked")
    return Document(f"{whole.doc_id}:{n}", whole.src[:n], whole.tgt[:n])


def batch_sentences(batch: dict[str, Any]) -> int:
    """Real target sentences of a grid ``[B, S, T]`` or packed ``[B, L]`` batch."""
    import numpy as np

    if batch["tgt"].ndim == 3:
        return int(np.sum(np.any(batch["tgt_mask"] > 0, axis=-1)))
    segments = batch["tgt_segment_ids"]
    return sum(int(np.unique(row[row > 0]).size) for row in segments)


def one_document_plan(
    config: Any, model: Any, packed: bool, document: Any, encode: Any, shards: int = 1
) -> Any:
    """The training plan of a corpus of ``document`` alone (the trainer's settings, read in
    document order, the last batch padded: every sentence once)."""
    from docnmt_jax.data import builder
    from docnmt_jax.training import data_setup

    settings = data_setup.data_settings(config.data, config.train.seed, True, shards)
    settings = dataclasses.replace(settings, shuffle=False, num_epochs=1, pad_batch=True)
    return builder.build_plan(model.data_spec(), settings, [document], encode, packed=packed)


def train_setup(args: argparse.Namespace) -> tuple[Any, ...]:
    """(compiled step, state, plan, layout, compile seconds) of the one-document corpus."""
    from docnmt_jax import parallel
    from docnmt_jax.data.tokenizer import load_tokenizer
    from docnmt_jax.models import build_model
    from docnmt_jax.objectives import build_objective
    from docnmt_jax.training import data_setup, steps
    from docnmt_jax.training import state as train_state

    config = final_config(args)
    tcfg = config.train
    tokenizer = load_tokenizer(args.tokenizer)
    model = build_model(config.model, tokenizer.vocab_size, tcfg.label_smoothing)
    objective = build_objective(config.get("objective", {}), model)
    layout = parallel.Layout(parallel.make_mesh(config.get("mesh", {})))
    packed = data_setup.trains_packed(config, objective.needs_grid)
    plan = one_document_plan(
        config, model, packed, load_document(args), tokenizer.encode_batch, layout.batch_shards
    )
    rows = getattr(plan, "stream_rows", 0)
    shardings, abstract, tx, schedule = train_state.build_optimizer_state(
        model, config, layout, lambda _: None, carry_rows=rows
    )
    state = train_state.init_state(model, tx, shardings, tcfg.seed, carry=abstract.get("carry"))
    step, _ = steps.make_steps(
        objective, tx, schedule, tcfg.seed, layout, shardings, float(tcfg.ema_decay)
    )
    start = time.perf_counter()
    shapes = sorted(plan.local_shapes)
    step = steps.compile_for_shapes(
        step, state, shapes, layout, lambda _: None, model.context_sentences, plan.config.streams
    )
    return step, state, plan, layout, time.perf_counter() - start


def train_worker(args: argparse.Namespace) -> Result:
    """Seconds per sentence of the train step on one document (module docstring)."""
    import jax

    from docnmt_jax import parallel
    from docnmt_jax.benchmarking.compilation import CompileWatch
    from docnmt_jax.data import pipeline as pipeline_lib

    step, state, plan, layout, compile_seconds = train_setup(args)
    first: dict[tuple[int, ...], Any] = {}  # a batch of every shape, run once before timing
    steps_per_pass = sentences_per_pass = 0
    for batch in pipeline_lib.numpy_batches(plan):
        first.setdefault(batch["src"].shape, batch)
        steps_per_pass += 1
        sentences_per_pass += batch_sentences(batch)
    for batch in first.values():
        state, _ = step(state, parallel.global_batch(batch, layout.batch))
    jax.block_until_ready(state)
    passes = -(-args.min_steps // steps_per_pass)
    times = []
    with CompileWatch() as watch:
        for _ in range(args.repeats):
            start = time.perf_counter()
            for _ in range(passes):  # batches materialised while timed (the loader does too)
                for batch in pipeline_lib.numpy_batches(plan):
                    state, _ = step(state, parallel.global_batch(batch, layout.batch))
            jax.block_until_ready(state)
            times.append((time.perf_counter() - start) / (passes * sentences_per_pass))
    return {
        "sentences_per_pass": sentences_per_pass,
        "steps_per_pass": steps_per_pass,
        "steps": steps_per_pass * passes,
        "passes_per_repeat": passes,
        "batch_shapes": sorted(list(s) for s in plan.local_shapes),
        "seconds_per_sentence": statistics.median(times),
        "seconds_per_sentence_repeats": times,
        "compile_seconds": compile_seconds,
        "compilations_while_timed": watch.count,
    }


def decode_model(args: argparse.Namespace) -> tuple[Any, Any, Any, int]:
    """(model, params, tokenizer, max_sentences): ``--run``'s, read recurrently or chunked as
    ``--model`` says, or the ``--size`` model with random parameters (seed 0)."""
    import flax.linen as nn
    import jax

    from docnmt_jax.data.schema import dummy_batch
    from docnmt_jax.data.tokenizer import load_tokenizer
    from docnmt_jax.models import build_model
    from docnmt_jax.training import restore

    recurrent = args.model == "recurrent"
    if args.run:
        model, tokenizer, config = restore.load_model(args.run)
        if model.name != "final":
            raise UserError(f"{args.run}: model {model.name!r}, not final")
        params, _ = restore.load_params(model, args.run, args.checkpoint, tokenizer.model_path)
        layout = "banded" if recurrent else model.config.packed_layout  # decoding reads neither
        cfg = dataclasses.replace(model.config, recurrent=recurrent, packed_layout=layout)
        model = type(model)(cfg)
        return model, params, tokenizer, int(config.data.max_sentences)
    config = final_config(args)
    tokenizer = load_tokenizer(args.tokenizer)
    model = build_model(config.model, tokenizer.vocab_size, config.train.label_smoothing)
    init = jax.jit(model.init)(jax.random.PRNGKey(0), dummy_batch())
    return model, nn.meta.unbox(init["params"]), tokenizer, int(config.data.max_sentences)


def decode_worker(args: argparse.Namespace) -> Result:
    """Seconds per sentence of ``Translator.translate`` of one document (module docstring)."""
    from docnmt_jax.benchmarking.compilation import CompileWatch
    from docnmt_jax.decoding.search import SearchConfig
    from docnmt_jax.decoding.translator import Translator

    model, params, tokenizer, max_sentences = decode_model(args)
    search = SearchConfig(beam_size=args.beam, alpha=args.alpha, max_len=args.max_len)
    translator = Translator(
        model,
        params,
        tokenizer,
        search,
        batch_tokens=args.decode_batch_tokens,
        max_sentences=max_sentences,
    )
    document = load_document(args)
    times: list[float] = []
    calls = discarded = 0
    with CompileWatch() as watch:
        while len(times) < args.repeats and calls < args.repeats + MAX_COMPILING_CALLS:
            compiled = watch.count
            start = time.perf_counter()
            translations = translator.translate([document])[0]
            seconds = time.perf_counter() - start
            calls += 1
            if watch.count > compiled:  # a call that compiled is not timed
                discarded += 1
            else:
                times.append(seconds / len(document))
    if len(times) < args.repeats:
        raise RuntimeError(f"{calls} translations, fewer than {args.repeats} without compiling")
    output_tokens = translator.stats.output_tokens / calls
    return {
        "sentences_translated": sum(isinstance(t, str) for t in translations),
        "empty_translations": sum(not t for t in translations),
        "calls": translator.stats.batches // calls,
        "batch_shapes": sorted(list(s) for s in translator.stats.shapes),
        "output_tokens_per_sentence": output_tokens / len(document),
        "seconds_per_sentence": statistics.median(times),
        "seconds_per_sentence_repeats": times,
        "translations_discarded_for_compiling": discarded,
        "parameters": args.run or "random (seed 0)",
    }


def peak_worker(args: argparse.Namespace) -> Result:
    """The host's matmul peak (GFLOP/s), float32 and bfloat16."""
    from docnmt_jax.benchmarking.peak import peak_section
    from docnmt_jax.benchmarking.runner import host_info

    peak = peak_section(argparse.Namespace(peak_size=0), {})
    return {"host": host_info(), **peak}


WORKERS = {"train": train_worker, "decode": decode_worker, "peak": peak_worker}


def worker_main(args: argparse.Namespace) -> None:
    """Runs one worker; ``rss_before_work_mb``: the peak once JAX and the library are imported."""
    import jax  # noqa: F401

    import docnmt_jax.decoding.translator  # noqa: F401
    import docnmt_jax.training.trainer  # noqa: F401

    before = peak_rss_mb()
    result = WORKERS[args.worker](args)
    result["rss_before_work_mb"] = before
    result["worker_peak_rss_mb"] = peak_rss_mb()
    with open(args.result, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)


# ------------------------------------------------------------------------------ the parent


def run_worker(args: argparse.Namespace, name: str, options: list[str]) -> Result:
    """Runs ``--worker`` ``options`` in a fresh process; its result plus ``peak_rss_mb`` (the
    process's ``ru_maxrss`` from ``os.wait4``). Its output goes to ``OUT/logs/NAME.log``."""
    logs = os.path.join(args.out, "logs")
    os.makedirs(logs, exist_ok=True)
    result_path = os.path.join(logs, f"{name}.json")
    command = [sys.executable, os.path.abspath(__file__), *options, "--result", result_path]
    with open(os.path.join(logs, f"{name}.log"), "w", encoding="utf-8") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        with open(log.name, encoding="utf-8") as f:
            tail = f.read()[-2000:]
        raise RuntimeError(f"worker {name} exited {process.returncode}:\n{tail}")
    with open(result_path, encoding="utf-8") as f:
        result = json.load(f)
    rss = usage.ru_maxrss / (2**20 if sys.platform == "darwin" else 1024)
    result["peak_rss_mb"] = rss
    result["command"] = " ".join(command[1:])
    return result


def make_document(args: argparse.Namespace) -> tuple[str, str]:
    """Writes ``OUT/document.tsv`` (one synthetic document) and ``OUT/spm.model`` (trained on
    it); returns their paths."""
    from docnmt_jax.data import synthetic_long
    from docnmt_jax.data.documents import write_tsv
    from docnmt_jax.data.tokenizer import train_tokenizer

    n = max(TOKENIZER_SENTENCES, *args.sizes)
    low, high = max(3, round(0.75 * args.words)), max(3, round(1.25 * args.words))
    config = synthetic_long.LongSyntheticConfig(
        num_documents=1,
        min_sentences=n,
        max_sentences=n,
        min_words=low,
        max_words=high,
        lexicon_size=args.lexicon,
    )
    documents, _ = synthetic_long.generate(config, split="scaling")
    path = os.path.join(args.out, "document.tsv")
    write_tsv(documents, path)
    tokenizer = os.path.join(args.out, "spm.model")
    train_tokenizer(documents, tokenizer, vocab_size=args.vocab)
    return path, tokenizer


def measure(args: argparse.Namespace, document: str, tokenizer: str) -> list[Result]:
    """Every (model, phase, document length) in its own worker."""
    shared = [
        f"--size={args.size}",
        f"--document={document}",
        f"--tokenizer={tokenizer}",
        f"--repeats={args.repeats}",
        f"--min-steps={args.min_steps}",
        f"--beam={args.beam}",
        f"--alpha={args.alpha}",
        f"--max-len={args.max_len}",
        f"--decode-batch-tokens={args.decode_batch_tokens}",
        f"--run={args.run}",
        f"--checkpoint={args.checkpoint}",
    ]
    results = []
    for model in args.models:
        for phase in args.phases:
            for n in args.sizes:
                name = f"{model}_{phase}_{n}"
                print(f"measuring {name} ...", file=sys.stderr, flush=True)
                options = ["--worker", phase, f"--model={model}", f"--sentences={n}", *shared]
                result = run_worker(args, name, options)
                results.append({"model": model, "phase": phase, "sentences": n, **result})
    return results


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b > 0 else "-"


def markdown(report: Result) -> str:
    """Peak RSS (MB) and ms per sentence per document length, ratios largest/smallest."""
    rows = report["results"]
    sizes = sorted({r["sentences"] for r in rows})
    lo, hi = sizes[0], sizes[-1]
    columns = " / ".join(f"{n:,}" for n in sizes)
    lines = [
        f"| model | phase | peak RSS MB ({columns} sentences) | ×{hi}/{lo} "
        f"| ms per sentence ({columns}) | ×{hi}/{lo} |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for model in dict.fromkeys(r["model"] for r in rows):
        for phase in dict.fromkeys(r["phase"] for r in rows):
            by = {r["sentences"]: r for r in rows if r["model"] == model and r["phase"] == phase}
            if not by:
                continue
            rss = [by[n]["peak_rss_mb"] if n in by else float("nan") for n in sizes]
            ms = [1e3 * by[n]["seconds_per_sentence"] if n in by else float("nan") for n in sizes]
            lines.append(
                f"| {model} | {phase} | {' / '.join(f'{v:.0f}' for v in rss)} "
                f"| {ratio(rss[-1], rss[0])} | {' / '.join(f'{v:.3g}' for v in ms)} "
                f"| {ratio(ms[-1], ms[0])} |"
            )
    host = report.get("host", {})
    if "float32_gflops" in host:
        lines.append(
            f"\nHost float32 matmul peak: {host['float32_gflops']:.1f} GFLOP/s "
            f"({host['host']['device']}, {host['host']['cpus']} CPUs)."
        )
    c = report["config"]
    lines.append(
        f"\nFINAL {c['size']}; synthetic document, {c['words']} words a sentence on average, "
        f"vocabulary {c['vocab']}; decode beam {c['beam']}, outputs capped at {c['max_len']} "
        f"tokens; median of {c['repeats']} repetitions, compilation excluded."
    )
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = cli.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="", help="output directory (parent)")
    p.add_argument("--size", choices=sorted(SIZES), default="tiny")
    p.add_argument("--sentences", default="20,200,2000", help="document lengths, comma-separated")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--phases", default=",".join(PHASES))
    p.add_argument("--words", type=int, default=24, help="mean words a sentence (±25%%)")
    p.add_argument("--lexicon", type=int, default=1000, help="synthetic filler word types")
    p.add_argument("--vocab", type=int, default=2000, help="sentencepiece pieces")
    p.add_argument("--repeats", type=int, default=2, help="timed repetitions (median)")
    p.add_argument("--min-steps", type=int, default=20, help="train steps a repetition, at least")
    p.add_argument("--beam", type=int, default=1, help="decode beam; 1: greedy")
    p.add_argument("--alpha", type=float, default=0.6, help="decode length penalty")
    p.add_argument("--max-len", type=int, default=32, help="output cap, tokens with EOS")
    p.add_argument("--decode-batch-tokens", type=int, default=4096, help="Translator budget")
    p.add_argument("--run", default="", help="decode this run's parameters and tokenizer")
    p.add_argument("--checkpoint", default="latest", help="--run's checkpoint")
    p.add_argument("--skip-peak", action="store_true", help="no matmul peak measurement")
    p.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    p.add_argument("--model", choices=MODELS, default="recurrent", help=argparse.SUPPRESS)
    p.add_argument("--document", default="", help=argparse.SUPPRESS)
    p.add_argument("--tokenizer", default="", help=argparse.SUPPRESS)
    p.add_argument("--result", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.sizes = sorted({int(n) for n in args.sentences.split(",") if n.strip()})
    args.models = [m for m in args.models.split(",") if m]
    args.phases = [ph for ph in args.phases.split(",") if ph]
    bad = [m for m in args.models if m not in MODELS] + [x for x in args.phases if x not in PHASES]
    if bad or not args.sizes or min(args.sizes) < 1:
        p.error(f"need sentences >= 1 and models from {MODELS}, phases from {PHASES}: {bad}")
    if min(args.repeats, args.min_steps, args.beam, args.max_len, args.words) < 1:
        p.error("--repeats, --min-steps, --beam, --max-len and --words must be >= 1")
    if not args.worker and not args.out:
        p.error("--out is required")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.worker:
        worker_main(args)
        return
    os.makedirs(args.out, exist_ok=True)
    document, tokenizer = make_document(args)
    host = {} if args.skip_peak else run_worker(args, "peak", ["--worker", "peak"])
    config = {
        k: getattr(args, k)
        for k in ("size", "sizes", "words", "lexicon", "vocab", "repeats", "min_steps", "beam")
    }
    config.update(max_len=args.max_len, decode_batch_tokens=args.decode_batch_tokens)
    report = {"config": config, "host": host, "results": measure(args, document, tokenizer)}
    with open(os.path.join(args.out, "long_document_scaling.json"), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)
    table = markdown(report)
    with open(os.path.join(args.out, "long_document_scaling.md"), "w", encoding="utf-8") as f:
        f.write(table)
    print(table)


if __name__ == "__main__":
    cli.run_argparse(main)
