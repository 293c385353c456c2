"""``make demo`` (launch/demo.py) end to end at a toy size: every step's command printed, the
run resumable, a summary table at the end. Needs the prepared Bible (``make data``)."""

import os

import pytest
from conftest import ROOT, run_launch

BIBLE = os.path.join(ROOT, "data", "bible", "test.tsv")


@pytest.mark.slow  # a few CPU minutes: two Bible trainings, two synthetic ones, translations
@pytest.mark.skipif(not os.path.exists(BIBLE), reason="the Bible is not prepared (make data)")
def test_demo_runs_every_step_and_ends_with_the_summary(tmp_path):
    out = str(tmp_path / "demo")
    args = [
        "--out",
        out,
        "--sentence_steps",
        "30",
        "--document_steps",
        "10",
        "--beam",
        "2",
        "--test_chapters",
        "3",
        "--examples",
        "2",
        "--proof",
        "--proof_steps",
        "30",
        "--proof_docs",
        "60",
    ]
    first = run_launch("demo.py", *args, timeout=2400)
    assert first.returncode == 0, first.stderr[-3000:]
    for command in (
        "python -m docnmt_jax.data.synthetic",
        "python launch/context_proof.py",
        "python launch/train.py --config configs/transformer.py",
        "python launch/train.py --config configs/final.py",
        "python launch/translate.py",
        "python launch/evaluate.py --workdir",
        "python launch/evaluate.py --hyp",
    ):
        assert f"$ {command}" in first.stdout, command
    assert "--config.init_from_rules=all" in first.stdout
    for row in ("| s-BLEU |", "| d-BLEU |", "| Δ_BLEU = true − random context |", "| p, paired"):
        assert row in first.stdout, row
    assert "| synthetic task: labelled words right | distance 1 | distance 2 |" in first.stdout
    assert "this host's budget" in first.stdout
    with open(os.path.join(out, "summary.md"), encoding="utf-8") as f:
        summary = f.read()
    assert summary.strip().splitlines()[0] in first.stdout
    # A second run finds every step done and prints the same tables without training.
    second = run_launch("demo.py", *args, timeout=900)
    assert second.returncode == 0, second.stderr[-3000:]
    assert second.stdout.count("(done before:") == 9
    table = summary.split("\n\nTime:")[0]
    assert table.strip() in second.stdout


def test_demo_refuses_a_non_positive_step_count():
    result = run_launch("demo.py", "--document_steps", "0", timeout=300)
    assert result.returncode == 2
    assert "--sentence_steps and --document_steps must be > 0" in result.stderr
    assert "Traceback" not in result.stderr
