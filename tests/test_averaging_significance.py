"""Checkpoint averaging against the mean of the parameter trees, and the paired significance of
``evaluate.py --baseline`` against sacreBLEU's own command line on fixed files."""

import json
import os
import random
import re
import subprocess
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from conftest import ROOT, tiny_config

from docnmt_jax.evaluation import significance
from docnmt_jax.training import averaging, restore, trainer


@pytest.fixture(scope="module")
def three_checkpoints(synthetic_dir, tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("averaging") / "run")
    config = tiny_config(synthetic_dir, num_steps=4, checkpoint_every=1, keep_checkpoints=3)
    trainer.train_and_evaluate(config, workdir)
    return workdir


def _average(workdir, last):
    """``launch/average_checkpoints.py --workdir WORKDIR --last N`` in a subprocess."""
    script = os.path.join(ROOT, "launch", "average_checkpoints.py")
    cmd = [sys.executable, script, "--workdir", workdir, "--last", str(last)]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600)


def test_average_is_the_mean_of_the_last_checkpoints(three_checkpoints):
    workdir = three_checkpoints
    out = _average(workdir, 3)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "averaged steps 2, 3, 4" in out.stdout
    trees = []
    for step in (2, 3, 4):
        path = os.path.join(workdir, "checkpoints", str(step), "state")
        trees.append(ocp.StandardCheckpointer().restore(path)["params"])
    model, _, _ = restore.load_model(workdir)
    params, step = restore.load_params(model, workdir, "averaged")
    assert step == 4
    leaves = [jax.tree.leaves(t) for t in trees]
    for k, got in enumerate(jax.tree.leaves(params)):
        want = np.mean([np.asarray(ls[k], np.float64) for ls in leaves], axis=0)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
        assert not np.array_equal(np.asarray(leaves[0][k]), np.asarray(leaves[2][k])) or (
            np.ptp(want) == 0
        )
    # Averaging again replaces the average (one averaged/ step).
    averaging.average_run(workdir, 2)
    assert os.listdir(os.path.join(workdir, "averaged")) == ["4"]


def test_averaging_more_than_kept_is_a_one_line_error(three_checkpoints):
    out = _average(three_checkpoints, 5)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "keep_checkpoints" in lines[0] and "holds 3 steps" in lines[0]


WORDS = "the lord said unto moses go down and speak to the people of israel that they may know"


def _fixed_files(tmp_path):
    """Six documents of references, a baseline and a system that drop words at close rates
    (p-values away from the floor), as TSV for evaluate.py and as plain lines for sacreBLEU."""
    rng = random.Random(0)
    words = WORDS.split()
    docs = [
        [" ".join(rng.choice(words) for _ in range(rng.randint(5, 15))) for _ in range(12)]
        for _ in range(6)
    ]

    def drop(sentence, p):
        return " ".join(w for w in sentence.split() if rng.random() > p)

    sides = {"ref": docs}
    sides["base"] = [[drop(s, 0.30) for s in d] for d in docs]
    sides["sys"] = [[drop(s, 0.26) for s in d] for d in docs]
    paths = {}
    for name, side in sides.items():
        tsv = tmp_path / f"{name}.tsv"
        tsv.write_text(
            "".join(f"doc{i}\t{s}\n" for i, d in enumerate(side) for s in d), encoding="utf-8"
        )
        (tmp_path / f"{name}.sent.txt").write_text("".join(f"{s}\n" for d in side for s in d))
        (tmp_path / f"{name}.doc.txt").write_text("".join(" ".join(d) + "\n" for d in side))
        paths[name] = str(tsv)
    return paths


def _sacrebleu_cli(tmp_path, level, test, metrics):
    """p-values and scores from sacreBLEU's CLI: AR as JSON, bootstrap from its text table."""
    cmd = [
        sys.executable,
        "-m",
        "sacrebleu",
        str(tmp_path / f"ref.{level}.txt"),
        "-i",
        str(tmp_path / f"base.{level}.txt"),
        str(tmp_path / f"sys.{level}.txt"),
        "-m",
        *metrics,
        f"--paired-{test}",
    ]
    if test == "ar":
        rows = json.loads(
            subprocess.run(cmd + ["-f", "json"], capture_output=True, text=True, check=True).stdout
        )
        return {m: rows[1][m]["p_value"] for m in rows[1] if m != "system"}
    text = subprocess.run(cmd + ["-f", "text"], capture_output=True, text=True, check=True).stdout
    return [float(p) for p in re.findall(r"p = ([0-9.]+)", text)]


def test_paired_tests_match_sacrebleus_command_line(tmp_path):
    paths = _fixed_files(tmp_path)
    ours = significance.paired_files(paths["sys"], paths["base"], paths["ref"])
    ar = _sacrebleu_cli(tmp_path, "sent", "ar", ["bleu", "chrf"])
    assert ours["ar"]["s_bleu"]["p_value"] == pytest.approx(ar["BLEU"], abs=1e-12)
    assert ours["ar"]["chrf"]["p_value"] == pytest.approx(ar["chrF2"], abs=1e-12)
    ar_doc = _sacrebleu_cli(tmp_path, "doc", "ar", ["bleu"])
    assert ours["ar"]["d_bleu"]["p_value"] == pytest.approx(ar_doc["BLEU"], abs=1e-12)
    bs = _sacrebleu_cli(tmp_path, "sent", "bs", ["bleu", "chrf"])
    assert [round(ours["bs"][k]["p_value"], 4) for k in ("s_bleu", "chrf")] == bs
    bs_doc = _sacrebleu_cli(tmp_path, "doc", "bs", ["bleu"])
    assert [round(ours["bs"]["d_bleu"]["p_value"], 4)] == bs_doc
    # Not at the floor (1 / (n + 1)): the test compares real p-values.
    assert 0.002 < ours["bs"]["s_bleu"]["p_value"] < 0.9
    assert "seed:12345" in ours["bs"]["s_bleu"]["signature"]


def test_evaluate_reports_the_paired_tests(tmp_path):
    paths = _fixed_files(tmp_path)
    cmd = [
        sys.executable,
        os.path.join(ROOT, "launch", "evaluate.py"),
        "--hyp",
        paths["sys"],
        "--ref",
        paths["ref"],
        "--baseline",
        paths["base"],
        "--paired",
        "bs",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "paired bootstrap resampling" in out.stdout and "p = " in out.stdout
    assert "approximate randomisation" not in out.stdout
    out = subprocess.run(cmd[:-2] + ["--json"], capture_output=True, text=True, cwd=ROOT)
    result = json.loads(out.stdout)
    assert set(result["paired"]) >= {"bs", "ar"}
    assert result["paired"]["documents"] == 6 and result["paired"]["sentences"] == 72
