"""``make demo`` (launch/demo.py) end to end at a toy size: every step's command printed, the
run resumable, a summary table at the end. Needs the prepared Bible (``make data``)."""

import os

import pytest
from conftest import ROOT, run_launch

BIBLE = os.path.join(ROOT, "data", "bible", "test.tsv")


@pytest.mark.slow  # a few CPU minutes: two synthetic trainings, a Bible training, translations
@pytest.mark.skipif(not os.path.exists(BIBLE), reason="the Bible is not prepared (make data)")
def test_demo_runs_every_step_and_ends_with_the_summary(tmp_path):
    out = str(tmp_path / "demo")
    args = [
        "--out",
        out,
        "--train_minutes",
        "0.3",
        "--proof_steps",
        "30",
        "--proof_docs",
        "60",
        "--beam",
        "2",
        "--test_chapters",
        "3",
    ]
    first = run_launch("demo.py", *args, timeout=1800)
    assert first.returncode == 0, first.stderr[-3000:]
    for command in (
        "python -m docnmt_jax.data.synthetic",
        "python launch/context_proof.py",
        "python launch/train.py",
        "python launch/evaluate.py",
    ):
        assert f"$ {command}" in first.stdout
    assert "| synthetic task: labelled words right | distance 1 | distance 2 |" in first.stdout
    assert "| Δ_BLEU (Jean & Cho 2019) |" in first.stdout
    with open(os.path.join(out, "summary.md"), encoding="utf-8") as f:
        summary = f.read()
    assert summary.strip() in first.stdout
    # A second run finds every step done and prints the same table without training.
    second = run_launch("demo.py", *args, timeout=900)
    assert second.returncode == 0, second.stderr[-3000:]
    assert second.stdout.count("(done before:") == 5
    assert summary.strip() in second.stdout
