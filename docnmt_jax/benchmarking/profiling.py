"""A ``jax.profiler`` trace per model of 3 train steps and one beam and one greedy decode, to
see which ops limit speed (TensorBoard's profile plugin or Perfetto)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from docnmt_jax.benchmarking.compilation import compile_train, init_params
from docnmt_jax.benchmarking.decode import fixed_search, never_eos
from docnmt_jax.benchmarking.workload import build, make_batch, model_names

Results = dict[str, Any]


def profile_section(args: argparse.Namespace, results: Results) -> Results:
    """A ``jax.profiler`` trace per model under ``--profile``: 3 train steps, one beam and one
    greedy decode."""
    import jax

    from docnmt_jax.decoding.compiled import compile_translate

    batch = make_batch(args, args.chunks, args.sentences, args.length)
    traces = {}
    for name in model_names(args):
        task = build(name, args, args.sentences)
        step = compile_train(task, batch)
        step.run(batch, 1)
        params = never_eos(init_params(task, batch))
        decoders = {}
        for beam in sorted({args.beam, 1}, reverse=True):
            search = fixed_search(beam, args.decode_len)
            decoders[beam] = compile_translate(task, search)
            jax.block_until_ready(decoders[beam](params, batch))  # compile outside the trace
        path = os.path.join(args.profile, name)
        with jax.profiler.trace(path):
            for i in range(3):
                with jax.profiler.StepTraceAnnotation("train", step_num=i):
                    step.run(batch, 1)
            for beam, decode in decoders.items():
                with jax.profiler.TraceAnnotation(f"decode_beam{beam}"):
                    jax.block_until_ready(decode(params, batch))
        traces[name] = path
    return {"traces": traces}
