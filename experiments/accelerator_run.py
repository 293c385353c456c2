"""One prepared run for a lent accelerator: versions, tests, benchmark, converged Bible results.

    python experiments/accelerator_run.py --out OUT [--data_dir data/bible] [--spm FILE]
        [--stages versions,tests,benchmark,train] [--work /tmp/accelerator_work]
    python experiments/accelerator_run.py --out OUT --smoke   # tiny models, a few steps, on CPU

Stages, in order; each writes its results under ``--out`` as soon as it ends (``STAGE.json``,
and a line in ``summary.md``), so a run cut short still returns what it did; a stage that
fails leaves ``STAGE.error`` (its traceback) and the next one runs:

``versions``   Python, the device, and the versions of jax, jaxlib, flax, optax, orbax,
               sentencepiece, sacrebleu, tensorboard, numpy (and whether TensorFlow and
               ml_collections import): the device's packages are listed nowhere else.
``tests``      ``pytest -m accelerator`` (the tests of device-dependent code: bf16, fused
               attention, sharding), their summary in ``tests.txt``.
``benchmark``  ``launch/benchmark.py`` for the Transformer and FINAL at TED and base size, in
               float32 and bfloat16 (train MFU against the measured peak, beam-5 decode), at
               the benchmark's own large packed batch; ``bench_SIZE_DTYPE.json`` / ``.md``.
``train``      the sentence Transformer trained on the Bible for ``--transformer_minutes``,
               then FINAL, DocT (two-step) and HM-GDC finetuned from it (the results table's
               pretrain -> finetune rows), each translated on the test books (beam 5) and
               scored (s-BLEU, d-BLEU, chrF; Delta_BLEU of one random-context draw for the
               document models): ``ROW.json`` and ``ROW.test.hyp.tsv`` (the paired tests of
               ``launch/evaluate.py --baseline`` then run anywhere). The converged
               Transformer also decodes in bfloat16 (its float32 parameters): the share of
               test sentences identical to float32's (target 95%) in ``transformer.json``.

Checkpoints stay in ``--work`` (they do not come back). Every training uses the configs'
defaults (the recipe study's), the NumPy loader when TensorFlow is missing, float32 unless
``--dtype bfloat16``. ``--smoke`` runs every stage with tiny models and a few steps (the
default test suite runs it on CPU), so the script is known to work before a device is lent.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the results table's rows: experiments/results_rows.py

from docnmt_jax import cli  # noqa: E402

STAGES = ("versions", "tests", "benchmark", "train")
PACKAGES = (
    "jax",
    "jaxlib",
    "flax",
    "optax",
    "orbax-checkpoint",
    "sentencepiece",
    "sacrebleu",
    "tensorboard",
    "numpy",
    "ml_collections",
    "tensorflow",
)
#: The pretrain -> finetune rows of the results table (experiments/results_rows.py), in order.
TRAIN_ROWS = ("transformer", "final_finetuned", "doct_two_step", "hmgdc_finetuned")
#: The benchmark's large packed batch: this many chunks of 8 sentences of 32 tokens (16,384
#: target tokens a step; the CPU benchmark's default is 8 chunks, 2,048 tokens).
LARGE_BATCH_CHUNKS = 64
#: Document models: Delta_BLEU (one random-context draw) is measured for these.
DOCUMENT_ROWS = ("final_finetuned", "doct_two_step", "hmgdc_finetuned")


@dataclasses.dataclass(frozen=True)
class Settings:
    out: str
    data_dir: str
    work: str
    spm: str = ""
    dtype: str = "float32"
    beam: int = 5
    transformer_minutes: float = 1.5
    finetune_minutes: float = 0.5
    max_steps: int = 100_000  # the minutes stop training first
    test_docs: int = 0  # translate only the first N test documents (0: all)
    bench_sizes: tuple[str, ...] = ("ted", "base")
    bench_dtypes: tuple[str, ...] = ("float32", "bfloat16")
    bench_args: tuple[str, ...] = ()
    test_args: tuple[str, ...] = ()
    smoke: bool = False
    timeouts: dict[str, float] = dataclasses.field(
        default_factory=lambda: {"versions": 60, "tests": 120, "benchmark": 150}
    )


def smoke_settings(settings: Settings) -> Settings:
    """Tiny models, a few steps, beam 2, greedy-sized benchmarks, tests only collected."""
    return dataclasses.replace(
        settings,
        beam=2,
        max_steps=3,
        test_docs=2,
        transformer_minutes=15.0,  # max_steps stops first; a busy host must not cut it short
        finetune_minutes=15.0,
        bench_sizes=("tiny",),
        bench_dtypes=("float32",),
        bench_args=("--quick", "--sections", "peak,train"),
        test_args=("--collect-only",),
        smoke=True,
    )


# ---------------------------------------------------------------------------------- stages


def versions_stage(settings: Settings) -> dict[str, Any]:
    from importlib import metadata

    import jax

    found: dict[str, Any] = {}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    importable = {}
    for module in ("tensorflow", "ml_collections"):
        try:
            importlib.import_module(module)
            importable[module] = True
        except ImportError:
            importable[module] = False
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()],
        "device_kind": jax.devices()[0].device_kind,
        "packages": found,
        "importable": importable,
    }


def _run(command: list[str], timeout: float, log: str) -> dict[str, Any]:
    """``command`` from the repository root with ``timeout``; its output into ``log``."""
    start = time.monotonic()
    try:
        done = subprocess.run(
            command, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False
        )
        rc, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as e:
        rc = 124
        output = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
    with open(log, "w", encoding="utf-8") as f:
        f.write(output)
    return {"command": command, "rc": rc, "seconds": time.monotonic() - start}


def tests_stage(settings: Settings) -> dict[str, Any]:
    command = [sys.executable, "-m", "pytest", "-q", "-m", "accelerator", "-p", "no:cacheprovider"]
    result = _run(
        command + list(settings.test_args),
        settings.timeouts["tests"],
        os.path.join(settings.out, "tests.txt"),
    )
    with open(os.path.join(settings.out, "tests.txt"), encoding="utf-8") as f:
        lines = [line for line in f.read().splitlines() if line.strip()]
    return {**result, "summary": lines[-1] if lines else ""}


def benchmark_stage(settings: Settings) -> dict[str, Any]:
    """One benchmark process per (size, dtype), each under its share of the stage's time."""
    runs = [(s, d) for s in settings.bench_sizes for d in settings.bench_dtypes]
    share = settings.timeouts["benchmark"] / max(len(runs), 1)
    record = {}
    for size, dtype in runs:
        name = f"bench_{size}_{dtype}"
        command = [
            sys.executable,
            os.path.join("launch", "benchmark.py"),
            "--models",
            "transformer,final",
            "--size",
            size,
            "--dtype",
            dtype,
            "--json",
            os.path.join(settings.out, f"{name}.json"),
            *settings.bench_args,
        ]
        record[name] = _run(command, share, os.path.join(settings.out, f"{name}.md"))
    return record


def shared_tokenizer(settings: Settings) -> str:
    """The sentencepiece model every row uses: ``--spm``, else one trained on the training
    split into ``--work`` (once)."""
    if settings.spm:
        return settings.spm
    from docnmt_jax.data import readers
    from docnmt_jax.data.tokenizer import get_or_train_tokenizer

    docs = readers.read_tsv(os.path.join(settings.data_dir, "train.tsv"))
    path = os.path.join(settings.work, "spm.model")
    get_or_train_tokenizer(path, docs, vocab_size=300 if settings.smoke else 8000)
    return path


def corpus_bench_args(settings: Settings) -> tuple[str, ...]:
    """The benchmark's sections: synthetic train and decode, and the Bible's own training
    and translation plans (its 1,024-token batches: padding, shapes, compilations)."""
    if settings.smoke:
        return settings.bench_args
    return (
        "--chunks",
        str(LARGE_BATCH_CHUNKS),
        "--sections",
        "peak,train,decode,corpus",
        "--tsv",
        os.path.join(settings.data_dir, "train.tsv"),
        "--corpus-test-tsv",
        os.path.join(settings.data_dir, "test.tsv"),
        "--spm",
        shared_tokenizer(settings),
        *settings.bench_args,
    )


def row_config(name: str, settings: Settings, tokenizer: str, minutes: float) -> Any:
    """The results table's row ``name`` (config, layout overrides, init_from) with the
    configs' default recipe, trained for ``minutes`` on ``settings.data_dir``."""
    from docnmt_jax.config_files import load_config
    from docnmt_jax.training.budget import TINY_MODEL, resize_model, set_key
    from experiments.results_rows import rows

    row = {r.name: r for r in rows(seeds=())}[name]
    config = load_config(os.path.join(ROOT, row.config))
    for key, value in row.overrides:
        set_key(config, key, value)
    if settings.smoke:
        resize_model(config, TINY_MODEL)
    config.model.dtype = settings.dtype
    config.data.data_dir = settings.data_dir
    config.data.tokenizer = tokenizer
    tcfg = config.train
    tcfg.num_steps = settings.max_steps
    tcfg.time_budget_minutes = minutes
    tcfg.dev_bleu = False
    tcfg.best_metric, tcfg.best_mode = "dev_loss", "min"
    tcfg.eval_every = tcfg.checkpoint_every = settings.max_steps
    tcfg.aot_compile = not settings.smoke
    if row.init_from:
        config.init_from = os.path.join(settings.work, row.init_from)
        config.init_from_which = "latest"
    return config


def train_row(name: str, settings: Settings, tokenizer: str) -> dict[str, Any]:
    """Trains row ``name``, translates the test books and scores them."""
    from docnmt_jax.data import readers
    from docnmt_jax.decoding.search import SearchConfig
    from docnmt_jax.evaluation import context_marginal
    from docnmt_jax.evaluation.metrics import score_documents
    from docnmt_jax.files import write_hypotheses
    from docnmt_jax.training import restore, trainer
    from docnmt_jax.training.budget import train_speed

    minutes = settings.transformer_minutes if name == "transformer" else settings.finetune_minutes
    config = row_config(name, settings, tokenizer, minutes)
    workdir = os.path.join(settings.work, name)
    result = trainer.train_and_evaluate(config, workdir)
    record: dict[str, Any] = {
        "steps": result.step,
        "stop": result.stopped_by,
        "dev": result.dev_metrics,
        **train_speed(os.path.join(workdir, "train.log")),
    }
    documents = readers.read_tsv(os.path.join(settings.data_dir, "test.tsv"))
    documents = documents[: settings.test_docs or len(documents)]
    search = SearchConfig(beam_size=settings.beam, alpha=0.6)
    translator, _ = restore.load_translator(workdir, "latest", search)
    hyps = translator.translate(documents, progress=f"{name} test")
    write_hypotheses(os.path.join(settings.out, f"{name}.test.hyp.tsv"), documents, hyps)
    refs = [list(d.tgt) for d in documents]
    scores = score_documents(hyps, refs)
    record["test"] = {k: scores[k]["score"] for k in ("s_bleu", "d_bleu", "chrf")}
    record["test"]["length_ratio"] = scores["s_bleu"]["ratio"]
    record["decode_sentences_per_s"] = translator.stats.sentences / max(
        translator.stats.seconds, 1e-9
    )
    if name == "transformer" and settings.dtype == "float32":
        record["bf16_decode"] = bf16_agreement(workdir, documents, hyps, search, settings)
    if name in DOCUMENT_ROWS:
        max_len = max(config.data.max_src_len, config.data.max_tgt_len)
        usage = context_marginal.model_context_usage(
            translator, documents, max_len, draws=1, progress=False, true_hypotheses=hyps
        )
        record["delta_bleu"] = usage.delta_bleu
    return record


def bf16_agreement(
    workdir: str, documents: list, hyps32: list, search: Any, settings: Settings
) -> dict[str, Any]:
    """The converged run's float32 parameters searched again with the model computing in
    bfloat16: the share of test sentences identical to float32's (experiments/bf16_decode.py,
    target 95%) and both dtypes' scores; the bfloat16 hypotheses in
    ``transformer.test.bfloat16.hyp.tsv``."""
    from docnmt_jax.files import write_hypotheses
    from docnmt_jax.training import restore
    from experiments.bf16_decode import compare

    translator, _ = restore.load_translator(workdir, "latest", search, dtype="bfloat16")
    hyps16 = translator.translate(documents, progress="transformer test bfloat16")
    write_hypotheses(
        os.path.join(settings.out, "transformer.test.bfloat16.hyp.tsv"), documents, hyps16
    )
    return compare({"float32": hyps32, "bfloat16": hyps16}, documents)


def train_stage(settings: Settings) -> dict[str, Any]:
    """Every row of :data:`TRAIN_ROWS` in order (a finetune row needs the Transformer); each
    row's record is written as soon as it is measured."""
    tokenizer = shared_tokenizer(settings)
    record = {}
    for name in TRAIN_ROWS:
        try:
            record[name] = train_row(name, settings, tokenizer)
        except Exception as e:  # the next row may still run (and the record says why not)
            record[name] = {"error": f"{type(e).__name__}: {e}"}
            traceback.print_exc()
        _write_json(os.path.join(settings.out, f"{name}.json"), record[name])
    return record


def _benchmark(settings: Settings) -> dict[str, Any]:
    return benchmark_stage(dataclasses.replace(settings, bench_args=corpus_bench_args(settings)))


STAGE_FUNCTIONS: dict[str, Callable[[Settings], dict[str, Any]]] = {
    "versions": versions_stage,
    "tests": tests_stage,
    "benchmark": _benchmark,
    "train": train_stage,
}


# ------------------------------------------------------------------------------------ main


def _write_json(path: str, data: Any) -> None:
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, default=str)
        f.write("\n")
    os.replace(path + ".tmp", path)


def _summary_line(stage: str, record: dict[str, Any], seconds: float) -> str:
    if stage == "train":
        parts = [
            f"{name} s-BLEU {r['test']['s_bleu']:.2f}" if "test" in r else f"{name} failed"
            for name, r in record.items()
        ]
        if "bf16_decode" in record.get("transformer", {}):
            parts.append(
                f"bf16 decode {record['transformer']['bf16_decode']['identical']:.1%} identical"
            )
        return f"- train ({seconds:.0f} s): " + ", ".join(parts)
    if stage == "versions":
        return f"- versions: {record['device_kind']}, jax {record['packages']['jax']}"
    return f"- {stage} ({seconds:.0f} s): done"


def run_stage(stage: str, settings: Settings) -> bool:
    """Runs ``stage``, writing ``STAGE.json`` (or ``STAGE.error``) and a summary line."""
    start = time.monotonic()
    summary = os.path.join(settings.out, "summary.md")
    try:
        record = STAGE_FUNCTIONS[stage](settings)
    except Exception:
        with open(os.path.join(settings.out, f"{stage}.error"), "w", encoding="utf-8") as f:
            f.write(traceback.format_exc())
        with open(summary, "a", encoding="utf-8") as f:
            f.write(f"- {stage}: FAILED (see {stage}.error)\n")
        return False
    seconds = time.monotonic() - start
    _write_json(os.path.join(settings.out, f"{stage}.json"), {**record, "seconds": seconds})
    with open(summary, "a", encoding="utf-8") as f:
        f.write(_summary_line(stage, record, seconds) + "\n")
    return True


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = cli.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", required=True, help="results directory (small files only)")
    p.add_argument("--data_dir", default="data/bible", help="the prepared Bible TSVs")
    p.add_argument("--spm", default="", help="sentencepiece model (default: trained in --work)")
    p.add_argument("--work", default="/tmp/accelerator_work", help="checkpoints and workdirs")
    p.add_argument("--stages", default=",".join(STAGES), help="comma-separated stages")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--transformer_minutes", type=float, default=1.5)
    p.add_argument("--finetune_minutes", type=float, default=0.5)
    p.add_argument("--smoke", action="store_true", help="tiny models, a few steps (CPU test)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stages = [s for s in args.stages.split(",") if s]
    unknown = [s for s in stages if s not in STAGE_FUNCTIONS]
    if unknown:
        print(f"accelerator_run.py: error: unknown stage {unknown[0]!r}", file=sys.stderr)
        return 2
    settings = Settings(
        out=args.out,
        data_dir=args.data_dir,
        work=args.work,
        spm=args.spm,
        dtype=args.dtype,
        transformer_minutes=args.transformer_minutes,
        finetune_minutes=args.finetune_minutes,
    )
    if args.smoke:
        settings = smoke_settings(settings)
    os.makedirs(settings.out, exist_ok=True)
    os.makedirs(settings.work, exist_ok=True)
    with open(os.path.join(settings.out, "summary.md"), "a", encoding="utf-8") as f:
        f.write(f"# accelerator run {datetime.datetime.now().isoformat(timespec='seconds')}\n")
    failed = sum(not run_stage(stage, settings) for stage in stages)
    return 1 if failed else 0


if __name__ == "__main__":
    cli.run_argparse(main)
