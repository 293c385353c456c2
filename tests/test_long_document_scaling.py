"""experiments/long_document_scaling.py: one document at a time, each measurement in its own
process; the fields of its JSON against what the document implies (sentences, chunks of 20),
and the memory of recurrent decoding does not grow with the document."""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT

sys.path.insert(0, ROOT)

from experiments import long_document_scaling as lds  # noqa: E402

SCRIPT = os.path.join(ROOT, "experiments", "long_document_scaling.py")


#: XLA flags for a run whose timings nothing checks: ~30% less compile time.
QUICK_XLA = "--xla_backend_optimization_level=0"


def _run(out, *options, quick_xla=False, timeout=600):
    """The script's report (JSON) after a run into ``out`` with ``options`` (tiny FINAL)."""
    command = [sys.executable, SCRIPT, "--out", str(out), "--size", "tiny", "--skip-peak"]
    env = dict(os.environ)
    if quick_xla:  # also every compilation into the session's cache, for the second worker
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {QUICK_XLA}".strip()
        env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    done = subprocess.run(
        [*command, *options], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stderr[-3000:]
    with open(os.path.join(out, "long_document_scaling.json"), encoding="utf-8") as f:
        return json.load(f)


def _by_sentences(report, model, phase):
    return {
        r["sentences"]: r for r in report["results"] if r["model"] == model and r["phase"] == phase
    }


@pytest.mark.slow
def test_decode_reports_every_sentence_translated_one_chunk_a_call(tmp_path):
    report = _run(
        tmp_path, "--sentences", "20,60", "--models", "recurrent", "--phases", "decode",
        "--max-len", "8", "--words", "6", "--vocab", "600", "--repeats", "2", quick_xla=True,
    )  # fmt: skip
    results = _by_sentences(report, "recurrent", "decode")
    assert sorted(results) == [20, 60] and len(report["results"]) == 2
    for n, r in results.items():
        assert r["sentences_translated"] == n and r["empty_translations"] == 0
        assert r["calls"] == math.ceil(n / 20)  # one stream row, one chunk of 20 a call
        assert 0 < r["output_tokens_per_sentence"] <= 8  # the --max-len cap
        assert len(r["seconds_per_sentence_repeats"]) == 2
        assert min(r["seconds_per_sentence_repeats"]) <= r["seconds_per_sentence"]
        assert r["seconds_per_sentence"] <= max(r["seconds_per_sentence_repeats"])
        assert r["seconds_per_sentence"] > 0
        assert r["peak_rss_mb"] >= r["rss_before_work_mb"] > 0
    table = (tmp_path / "long_document_scaling.md").read_text()
    assert "| recurrent | decode |" in table and "20 / 60" in table


def test_a_bad_option_is_one_line_and_status_2(tmp_path):
    done = subprocess.run(
        [sys.executable, SCRIPT, "--out", str(tmp_path), "--models", "recurrent,rnn"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "error:" in done.stderr and "rnn" in done.stderr


def test_training_batches_hold_the_document_once():
    """The train worker's plan (packed streams of one stream / packed chunk rows, shuffle
    off, last batch padded) holds every sentence of the document once, which
    ``batch_sentences`` counts."""
    from docnmt_jax.data import pipeline as pipeline_lib
    from docnmt_jax.data.documents import Document
    from docnmt_jax.models import build_model
    from docnmt_jax.objectives import build_objective
    from docnmt_jax.training.data_setup import trains_packed

    words = [" ".join(["w"] * (3 + k % 7)) for k in range(70)]
    document = Document("d", tuple(words), tuple(words))
    for model_name in lds.MODELS:
        args = lds.parse_args(["--worker", "train", "--model", model_name, "--sentences", "70"])
        config = lds.final_config(args)
        model = build_model(config.model, 300)
        encode = lambda texts: [[5] * len(t.split()) for t in texts]  # noqa: E731
        packed = trains_packed(config, build_objective(config.objective, model).needs_grid)
        plan = lds.one_document_plan(config, model, packed, document, encode)
        batches = list(pipeline_lib.numpy_batches(plan))
        assert sum(lds.batch_sentences(b) for b in batches) == 70
        if model_name == "recurrent":  # one chunk of 20 a step, in document order
            assert [int(b["tgt_stream"].max()) for b in batches] == [1, 1, 1, 1]
            continues = [bool(np.any(b["tgt_sentence_index"] < 0)) for b in batches]
            assert continues == [False, True, True, True]  # the carried memory's slots


@pytest.mark.slow
def test_train_reports_steps_and_sentences_per_pass(tmp_path):
    report = _run(tmp_path, "--sentences", "20,60", "--phases", "train", "--repeats", "2")
    for model in ("recurrent", "chunked"):
        results = _by_sentences(report, model, "train")
        for n, r in results.items():
            assert r["sentences_per_pass"] == n
            if model == "recurrent":
                assert r["steps_per_pass"] == n // 20
            assert r["steps"] >= 20 and r["compilations_while_timed"] == 0
            assert r["seconds_per_sentence"] > 0 and r["peak_rss_mb"] > r["rss_before_work_mb"]


@pytest.mark.slow
def test_a_2000_sentence_document_translates_in_the_memory_of_a_20_sentence_one(tmp_path):
    """Rule: the peak RSS of the process translating a 2,000-sentence document with tiny
    recurrent FINAL is at most 1.05 x that of the process translating the first 20 sentences
    of it + 30 MB (the state carried across chunks has a fixed size; what may grow is host
    bookkeeping: the tokenised document and its translations), and every sentence is
    translated."""
    report = _run(
        tmp_path, "--sentences", "20,2000", "--models", "recurrent", "--phases", "decode",
        "--repeats", "1",
    )  # fmt: skip
    results = _by_sentences(report, "recurrent", "decode")
    short, long = results[20], results[2000]
    assert long["sentences_translated"] == 2000 and long["empty_translations"] == 0
    assert long["calls"] == 100
    assert long["peak_rss_mb"] <= short["peak_rss_mb"] * 1.05 + 30, (short, long)
