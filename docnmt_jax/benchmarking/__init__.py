"""Benchmarks of the models on identical batches in one process, plus the data pipeline.

``launch/benchmark.py`` is the command line; this package holds the measurements. A section
is a function ``(options, results) -> result`` (:data:`runner.SECTIONS`), its markdown table a
function of ``report``; ``options`` is the command line's namespace (:data:`runner.PRESETS`
fills what it leaves unset) and ``results`` the earlier sections' results, which later
sections reuse (the train section's peak, the growth sweep's train point).

Modules, one responsibility each:

  timing       wall-clock timing: calls waited for, medians, interleaved rounds
  compilation  XLA compilations counted (``CompileWatch``), the train step compiled ahead of
               time with its FLOP and memory analyses (``compile_train``)
  workload     the compared models and their shared synthetic batch, analytic FLOPs, ratios
  peak         the machine's matrix-multiply peak (GFLOP/s) per dtype
  train        train-step time, tokens/s, FLOPs and MFU per model
  corpus       training on a real corpus's own plan, packed rows and grid: real tokens/s
  decode       fixed-length beam and greedy decoding per model
  growth       train step against sentences per chunk and sentence length, log-log slopes
  pipeline     throughput of the tf.data document pipeline
  profiling    a ``jax.profiler`` trace per model
  report       the markdown table of every section
  runner       the sections in order, presets, host description

Train steps and decode calls are timed in rounds, every model once per round, so that the
ratios between models do not absorb a shared machine's drift over minutes
(:func:`timing.interleaved_times`).
"""

from docnmt_jax.benchmarking.compilation import CompileWatch, TrainStep, compile_train
from docnmt_jax.benchmarking.runner import PRESETS, SECTIONS, apply_presets, host_info, run

__all__ = [
    "PRESETS",
    "SECTIONS",
    "CompileWatch",
    "TrainStep",
    "apply_presets",
    "compile_train",
    "host_info",
    "run",
]
