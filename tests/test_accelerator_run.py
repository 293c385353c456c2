"""The prepared accelerator run (experiments/accelerator_run.py): its ``--smoke`` dry run on
CPU goes through every stage and writes every result file; a failing stage does not stop the
others. The default suite runs the quick stages; the whole dry run (its train stage trains and
decodes four rows) is slow, and ``make test-jax-next`` runs it on the accelerator's stack."""

import csv
import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT

sys.path.insert(0, ROOT)

from experiments import accelerator_run  # noqa: E402


def run_smoke(data_dir: str, tmp_path, *stage_args: str):
    """``accelerator_run.py --smoke`` in a subprocess; returns its output folder."""
    out, work = tmp_path / "out", tmp_path / "work"
    command = [sys.executable, os.path.join(ROOT, "experiments", "accelerator_run.py")]
    command += ["--smoke", "--out", str(out), "--work", str(work), "--data_dir", data_dir]
    done = subprocess.run(
        command + list(stage_args), capture_output=True, text=True, cwd=ROOT, timeout=1800
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def assert_quick_stages_written(out) -> None:
    versions = json.load(open(out / "versions.json"))
    assert versions["backend"] == "cpu" and versions["packages"]["jax"]
    assert versions["importable"]["ml_collections"] is True
    assert json.load(open(out / "tests.json"))["rc"] in (0, 5)  # 5: collected, none selected
    bench = json.load(open(out / "bench_tiny_float32.json"))
    assert bench  # the benchmark's own JSON, written by launch/benchmark.py


def test_smoke_run_of_the_quick_stages(synthetic_dir, tmp_path):
    out = run_smoke(synthetic_dir, tmp_path, "--stages", "versions,tests,benchmark")
    assert_quick_stages_written(out)
    summary = open(out / "summary.md").read()
    for stage in ("versions", "tests", "benchmark"):
        assert f"- {stage}" in summary
    assert "- train" not in summary and "FAILED" not in summary


@pytest.mark.device_stack
def test_smoke_run_writes_every_stage(synthetic_dir, tmp_path):
    out = run_smoke(synthetic_dir, tmp_path)
    assert_quick_stages_written(out)
    with open(os.path.join(synthetic_dir, "test.tsv"), encoding="utf-8") as f:
        doc_ids = [r[0] for r in list(csv.reader(f, delimiter="\t"))[1:]]
    first_two = list(dict.fromkeys(doc_ids))[:2]  # --smoke translates two test documents
    test_sentences = sum(d in first_two for d in doc_ids)
    for name in accelerator_run.TRAIN_ROWS:
        record = json.load(open(out / f"{name}.json"))
        assert record["steps"] == 3, name
        assert set(record["test"]) == {"s_bleu", "d_bleu", "chrf", "length_ratio"}, name
        assert ("delta_bleu" in record) == (name in accelerator_run.DOCUMENT_ROWS), name
        lines = open(out / f"{name}.test.hyp.tsv", encoding="utf-8").read().splitlines()
        assert len(lines) == 1 + test_sentences, name
    agreement = json.load(open(out / "transformer.json"))["bf16_decode"]
    f32 = open(out / "transformer.test.hyp.tsv", encoding="utf-8").read().splitlines()[1:]
    bf16 = open(out / "transformer.test.bfloat16.hyp.tsv", encoding="utf-8").read().splitlines()
    assert len(bf16) == 1 + test_sentences
    same = sum(a == b for a, b in zip(f32, bf16[1:], strict=True))  # counted from the files
    assert agreement["sentences"] == test_sentences
    assert abs(agreement["identical"] - same / test_sentences) < 1e-12
    summary = open(out / "summary.md").read()
    assert "bf16 decode" in summary
    for stage in accelerator_run.STAGES:
        assert f"- {stage}" in summary
    assert "FAILED" not in summary


def test_a_failing_stage_is_recorded_and_the_next_runs(tmp_path, monkeypatch):
    def broken(settings):
        raise RuntimeError("no device")

    monkeypatch.setitem(accelerator_run.STAGE_FUNCTIONS, "versions", broken)
    monkeypatch.setitem(accelerator_run.STAGE_FUNCTIONS, "tests", lambda s: {"rc": 0})
    out = tmp_path / "out"
    argv = ["--out", str(out), "--work", str(tmp_path / "w"), "--stages", "versions,tests"]
    assert accelerator_run.main(argv) == 1
    assert "RuntimeError: no device" in open(out / "versions.error").read()
    assert json.load(open(out / "tests.json"))["rc"] == 0
    summary = open(out / "summary.md").read()
    assert "- versions: FAILED" in summary and "- tests (" in summary
    assert accelerator_run.main(["--out", str(out), "--stages", "bogus"]) == 2
