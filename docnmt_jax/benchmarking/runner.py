"""The benchmark sections in order: the registry (:data:`SECTIONS`), the defaults of a full
and a ``--quick`` run (:data:`PRESETS`), the host description and the JSON of all results."""

from __future__ import annotations

import argparse
import json
import os
import platform
from collections.abc import Callable
from typing import Any

from docnmt_jax.benchmarking import report
from docnmt_jax.benchmarking.corpus import corpus_section
from docnmt_jax.benchmarking.ctranslate2 import ctranslate2_section, print_ctranslate2
from docnmt_jax.benchmarking.decode import decode_section
from docnmt_jax.benchmarking.growth import growth_section
from docnmt_jax.benchmarking.peak import peak_section
from docnmt_jax.benchmarking.pipeline import pipeline_section
from docnmt_jax.benchmarking.profiling import profile_section
from docnmt_jax.benchmarking.train import train_section
from docnmt_jax.benchmarking.workload import UsageError
from docnmt_jax.files import write_atomic

Results = dict[str, Any]


Section = Callable[[argparse.Namespace, Results], Results]

# Options whose default depends on --quick; an explicit option wins.
PRESETS: dict[str, dict[str, Any]] = {
    "full": dict(
        sections="peak,train,corpus,decode,growth",
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
        corpus_steps=20,
        corpus_vocab=8000,
        corpus_test_docs=0,
    ),
    "quick": dict(
        sections="peak,train,corpus,decode,growth",
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
        corpus_steps=2,
        corpus_vocab=300,
        corpus_test_docs=4,
    ),
}

# name: (measure, print its markdown table)
SECTIONS: dict[str, tuple[Section, Callable[[Results], None]]] = {
    "peak": (peak_section, report.print_peak),
    "train": (train_section, report.print_train),
    "corpus": (corpus_section, report.print_corpus),
    "decode": (decode_section, report.print_decode),
    "growth": (growth_section, report.print_growth),
    "pipeline": (pipeline_section, report.print_pipeline),
    "profile": (profile_section, report.print_profile),
    "ctranslate2": (ctranslate2_section, print_ctranslate2),
}


def apply_presets(args: argparse.Namespace) -> argparse.Namespace:
    """Fills the options ``args`` leaves None from :data:`PRESETS` (``args.quick`` picks the
    preset), adds the profile section when ``args.profile`` names a directory, and checks the
    sections and modes (ValueError)."""
    for key, value in PRESETS["quick" if args.quick else "full"].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    sections = [s for s in args.sections.split(",") if s]
    if args.profile and "profile" not in sections:
        sections.append("profile")
    args.sections = ",".join(sections)
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        raise UsageError(f"unknown sections {sorted(unknown)}; known: {sorted(SECTIONS)}")
    if "profile" in sections and not args.profile:
        raise UsageError("the profile section needs --profile DIR")
    if set(args.modes.split(",")) - {"document", "sentence"}:
        raise UsageError("--modes takes document and/or sentence")
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


def run(args: argparse.Namespace) -> Results:
    """Runs ``args.sections`` in order, printing each one's table; with ``args.json`` writes
    all results (host, options, one entry per section) to that file."""
    results: Results = {"host": host_info(), "args": vars(args)}
    for name in filter(None, args.sections.split(",")):
        measure, show = SECTIONS[name]
        results[name] = measure(args, results)
        show(results[name])
    if args.json:
        write_atomic(args.json, json.dumps(results, indent=2) + "\n")
    return results
