"""Shared fixtures: a small synthetic document corpus and a tiny training config."""

import os
import shutil
import subprocess
import sys
import tempfile

import pytest

# One persistent XLA compilation cache for the whole test session, set before jax is imported:
# the pytest-xdist workers and the CLI subprocesses that the tests start inherit it through
# the environment, and many tests compile the same tiny programs (a train step, a search) again
# in other processes. Compilations under a second are not cached (jax's default threshold).
# The controller (not an xdist worker) creates it and removes it at exit.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ and "PYTEST_XDIST_WORKER" not in os.environ:
    _CACHE_DIR = tempfile.mkdtemp(prefix="docnmt-test-xla-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _CACHE_DIR

    def pytest_unconfigure(config):
        shutil.rmtree(_CACHE_DIR, ignore_errors=True)


# Tests compile hundreds of small programs: XLA's LLVM backend skips its expensive passes (the
# same operations; the golden translations agree). Set before jax is imported, so the xdist
# workers and the CLI subprocesses inherit it. Not --xla_backend_optimization_level=0: its
# rounding depends on the batch shape, so a translation changed with the rows beside it
# (test_translate's streamed and trimmed batches), and it saved only ~20% of a file's CPU time.
# `make results-quick` and the accelerator run compile with XLA's defaults; so does a test
# session started with DOCNMT_TEST_XLA_DEFAULTS=1.
FAST_XLA_FLAGS = "--xla_llvm_disable_expensive_passes=true"
if os.environ.get("DOCNMT_TEST_XLA_DEFAULTS") != "1" and FAST_XLA_FLAGS not in os.environ.get(
    "XLA_FLAGS", ""
):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {FAST_XLA_FLAGS}".strip()

from docnmt_jax.config_files import load_config_module  # noqa: E402 (after XLA_FLAGS)
from docnmt_jax.models import registered  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Zheng et al. 2020, Table 3: the rows' switch settings (the config layer holds them).
TABLE3_CONFIG = os.path.join(ROOT, "configs", "final_table3.py")
TABLE3_SWITCHES = load_config_module(TABLE3_CONFIG).TABLE3_SWITCHES


def run_launch(
    script: str, *args: str, timeout: float = 600, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``python launch/SCRIPT ARGS`` from the repository root, output captured (generous
    timeout: the CI machine may be busy); ``env``: the process's environment."""
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, "launch", script), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=timeout,
        env=env,
    )


def tiny_pairs_batch() -> tuple[dict, int]:
    """One [6, 1, T] grid batch of :data:`TINY_PAIRS` (words numbered from 4 as they come)
    and the vocabulary size it needs."""
    from docnmt_jax.data.documents import Document
    from docnmt_jax.data.pipeline import PipelineConfig, numpy_batches

    vocab: dict[str, int] = {}

    def encode(texts):
        return [[vocab.setdefault(w, len(vocab) + 4) for w in t.split()] for t in texts]

    docs = [Document(f"d{i}", (s,), (t,)) for i, (s, t) in enumerate(TINY_PAIRS)]
    config = PipelineConfig(sentence_level=True, shuffle=False, num_epochs=1, pad_batch=True)
    batch = next(numpy_batches(docs, encode, config))
    return batch, len(vocab) + 4


@pytest.fixture(scope="session")
def synthetic_dir(tmp_path_factory):
    """A small synthetic context corpus (train/dev/test TSVs and labels)."""
    from docnmt_jax.data import synthetic

    out = tmp_path_factory.mktemp("synthetic")
    config = synthetic.SyntheticConfig(num_documents=120, seed=7)
    synthetic.write_corpus(str(out), config, splits={"train": 120, "dev": 12, "test": 12})
    return str(out)


@pytest.fixture(scope="session")
def one_step_run(synthetic_dir, tmp_path_factory):
    """A workdir trained for one step of :func:`tiny_config` (a run to point command lines at:
    config.json, spm.model, a checkpoint)."""
    from docnmt_jax.training import trainer

    workdir = str(tmp_path_factory.mktemp("one_step_run"))
    trainer.train_and_evaluate(tiny_config(synthetic_dir, num_steps=1), workdir)
    return workdir


#: Six different sentence pairs of a made-up language (step-level tests).
TINY_PAIRS = [
    ("a b c", "x y z"),
    ("b c d e", "y z w v"),
    ("c a", "z x"),
    ("d d b", "w w y"),
    ("e a c b", "v x z y"),
    ("a e", "x v"),
]

#: A one-layer, dropout-free Transformer for step-level tests.
TINY_TRANSFORMER = {
    "d_model": 32,
    "num_heads": 2,
    "ffn_dim": 64,
    "num_encoder_layers": 1,
    "num_decoder_layers": 1,
    "dropout_rate": 0.0,
}


def tiny_config(data_dir: str, **train_overrides):
    """The transformer config shrunk to seconds-per-run size, reading ``data_dir``."""
    from docnmt_jax.config_files import load_config

    # The papers' schedule (post-LN, d_model-scaled peak, no EMA): the tests' training
    # dynamics (steps to learn, losses compared across runs) were set under it.
    config = load_config(os.path.join(ROOT, "configs", "transformer.py:paper"))
    config.data.data_dir = data_dir
    config.data.vocab_size = 300
    config.data.batch_src_tokens = 256
    config.data.batch_tgt_tokens = 256
    config.data.eval_batch_tokens = 512
    config.model.d_model = 32
    config.model.num_heads = 2
    config.model.ffn_dim = 64
    config.model.num_encoder_layers = 1
    config.model.num_decoder_layers = 1
    config.train.warmup_steps = 50
    config.train.log_every = 5
    config.train.eval_every = 1000
    config.train.checkpoint_every = 1000
    config.train.num_steps = 10
    config.train.dev_bleu = False
    config.train.best_metric = "dev_loss"
    config.train.best_mode = "min"
    config.train.update(train_overrides)
    return config


def tiny_final_config(data_dir: str, **train_overrides):
    """:func:`tiny_config` with the FINAL model (``configs/final.py``) on chunks of 4 sentences."""
    from docnmt_jax.config_files import load_config

    config = tiny_config(data_dir, **train_overrides)
    final = load_config(os.path.join(ROOT, "configs", "final.py"))
    for key, value in final.model.items():
        if key not in config.model:
            config.model[key] = value
    config.model.name = "final"
    config.data.max_sentences = 4
    return config


# The default suite's heaviest files (seconds in the profile of docs/log/2026-11-28-ci-time.md),
# run first: with --no-loadscope-reorder (the Makefile) pytest-xdist's loadfile hands files to
# its two workers in collection order, so a heavy file collected last would run alone at the
# end (longest-processing-time-first).
HEAVY_FILES_FIRST = (
    "test_accelerator_run.py",
    "test_accumulation_ema.py",
    "test_doct.py",
    "test_doct_packed.py",
    "test_final.py",
    "test_final_two_layout.py",
    "test_final_continuous.py",
    "test_training.py",
    "test_model_interface.py",
    "test_jean_cho.py",
    "test_beam_search.py",
    "test_context_marginal.py",
    "test_rnnsearch.py",
    "test_translate.py",
    "test_loader.py",
    "test_analysis.py",
    "test_golden.py",
    "test_attention_bf16.py",
    "test_packing.py",
    "test_translation_golden.py",
    "test_nonfinite.py",
)


# Tests run only by `make test-slow` (tests/slow_by_measured_time.txt): those of the default
# suite that took 10 s or more in the profile of docs/log/2026-11-28-ci-time.md, except one
# test of each model's equality with its naive reference, each search's equality with teacher
# forcing, the crash-safety, error and golden-output tests, and the ones the design requires
# in the default suite (loader equality, bf16, accumulation/EMA, the toy model, the
# accelerator run's --smoke of its quick stages; its whole --smoke is slow and `make
# test-jax-next` runs it). The default suite keeps every behaviour's fast test; these are
# its deeper or slower variants.
SLOW_BY_MEASURED_TIME = frozenset(
    line.strip()
    for line in open(os.path.join(ROOT, "tests", "slow_by_measured_time.txt"), encoding="utf-8")
    if line.strip() and not line.startswith("#")
)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Marks :data:`SLOW_BY_MEASURED_TIME` ``slow`` (before ``-m`` selects) and orders files
    heaviest first (:data:`HEAVY_FILES_FIRST`), keeping each file's order."""
    for item in items:
        if item.nodeid.removeprefix("tests/") in SLOW_BY_MEASURED_TIME:
            item.add_marker(pytest.mark.slow)
    rank = {name: n for n, name in enumerate(HEAVY_FILES_FIRST)}
    order = {id(item): n for n, item in enumerate(items)}
    items.sort(key=lambda item: (rank.get(item.path.name, len(rank)), order[id(item)]))


@pytest.fixture(autouse=True)
def _absl_verbosity_restored():
    """The commands' ``main`` lowers absl's verbosity to WARNING for their own run; a test that
    calls one in-process must not silence the INFO logs a later test in the same worker reads."""
    from absl import logging as absl_logging

    verbosity = absl_logging.get_verbosity()
    yield
    absl_logging.set_verbosity(verbosity)


def shipped_models() -> set[str]:
    """The registered models the package ships: not the toys a test file registers in the
    same worker process."""
    entries = registered().items()
    return {n for n, e in entries if e.model_class.__module__.startswith("docnmt_jax.")}
