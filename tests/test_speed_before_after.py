"""experiments/speed_before_after.py: ABBA order, each tree's own benchmark process, the
ratios read from the corpus section and their medians (hand-computed values)."""

import json
import os
import sys

import pytest
from conftest import ROOT

sys.path.insert(0, ROOT)

from experiments import speed_before_after as sba  # noqa: E402

# A stand-in benchmark: writes a corpus section whose FINAL runs at the tree's SPEED (a file
# in the tree) times the Transformer's, and records its working directory and argv.
FAKE_BENCHMARK = """
import json, os, sys
speed = float(open("SPEED").read())
argv = sys.argv[1:]
path = argv[argv.index("--json") + 1]
calls = len(os.listdir(os.environ["CALLS"]))
open(os.path.join(os.environ["CALLS"], f"{calls}"), "w").write(os.getcwd() + " " + " ".join(argv))
runs = [
    {"model": "transformer", "layout": "packed", "tokens_per_s": 1000.0},
    {"model": "transformer", "layout": "grid", "tokens_per_s": 700.0},
    {"model": "final", "layout": "packed", "tokens_per_s": 1000.0 * speed},
    {"model": "final", "layout": "grid", "tokens_per_s": 100.0},
]
translate = {"runs": [
    {"model": "transformer", "search": "beam 5", "sentences_per_s": 40.0},
    {"model": "final", "search": "beam 5", "sentences_per_s": 20.0 * speed},
]}
json.dump({"peak": {"float32_gflops": 150.0}, "corpus": {"runs": runs,
           "translate": translate}}, open(path, "w"))
"""


def fake_tree(path, speed: float) -> str:
    os.makedirs(path / "launch")
    (path / "launch" / "benchmark.py").write_text(FAKE_BENCHMARK)
    (path / "SPEED").write_text(str(speed))
    return str(path)


def test_rounds_alternate_abba():
    assert sba.order(3) == [
        (0, "before"), (0, "after"), (1, "after"), (1, "before"), (2, "before"), (2, "after"),
    ]  # fmt: skip


def test_ratios_take_each_models_fastest_layout_against_the_packed_transformer():
    result = {"corpus": {"runs": [
        {"model": "transformer", "layout": "packed", "tokens_per_s": 2000.0},
        {"model": "transformer", "layout": "grid", "tokens_per_s": 1500.0},
        {"model": "doct", "layout": "grid", "tokens_per_s": 500.0},
    ], "translate": {"runs": [
        {"model": "transformer", "search": "greedy", "sentences_per_s": 100.0},
        {"model": "transformer", "search": "beam 5", "sentences_per_s": 40.0},
        {"model": "doct", "search": "greedy", "sentences_per_s": 25.0},
        {"model": "doct", "search": "beam 5", "sentences_per_s": 30.0},
    ]}}}  # fmt: skip
    assert sba.ratios(result) == {
        "train transformer": 1.0,
        "train doct": 0.25,
        "greedy transformer": 1.0,
        "beam 5 transformer": 1.0,
        "greedy doct": 0.25,
        "beam 5 doct": 0.75,
    }


def test_each_tree_runs_its_own_code_and_a_finished_process_is_not_rerun(tmp_path, monkeypatch):
    before = fake_tree(tmp_path / "before", 0.4)
    after = fake_tree(tmp_path / "after", 0.7)
    calls = tmp_path / "calls"
    calls.mkdir()
    monkeypatch.setenv("CALLS", str(calls))
    out = str(tmp_path / "out")
    argv = ["--before", before, "--after", after, "--out", out, "--rounds", "2",
            "--after-models", "transformer,final:x=1", "--", "--size", "ted"]  # fmt: skip
    assert sba.main(argv) == 0
    made = [open(calls / str(i)).read().split() for i in range(4)]
    assert [m[0] for m in made] == [before, after, after, before]
    assert made[1][1:5] == ["--models", "transformer,final:x=1", "--size", "ted"]
    summary = json.load(open(os.path.join(out, "summary.json")))
    assert summary["medians"]["before"]["train final"] == pytest.approx(0.4)
    assert summary["after_over_before"]["train final"] == pytest.approx(0.7 / 0.4)
    assert summary["after_over_before"]["beam 5 final"] == pytest.approx(0.7 / 0.4)
    assert summary["peaks_gflops_float32"] == [150.0] * 4
    assert (
        "| train final | 0.400, 0.400 | 0.400 | 0.700, 0.700 | 0.700 | 1.75 |"
        in open(os.path.join(out, "summary.md")).read()
    )
    assert sba.main(argv) == 0  # every process's JSON is there: none runs again
    assert len(os.listdir(calls)) == 4


def test_a_tree_without_the_benchmark_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit):
        sba.main(["--before", str(tmp_path), "--after", str(tmp_path), "--out", str(tmp_path)])
    assert "no launch/benchmark.py there" in capsys.readouterr().err
