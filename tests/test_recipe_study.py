"""The recipe study runner (experiments/recipe_study.py) end to end with tiny models: a row is
trained for the study's budget in real target tokens, measured with its last and EMA
parameters, reported, and a rerun resumes (nothing is trained again)."""

import json
import os
import sys

import pytest
from conftest import ROOT

sys.path.insert(0, ROOT)

from experiments import recipe_rows, recipe_study  # noqa: E402


@pytest.mark.slow  # three tiny trainings and seven translated parameter sets: ~3 minutes
def test_quick_study_trains_measures_reports_and_resumes(synthetic_dir, tmp_path):
    out, doc = str(tmp_path / "study"), str(tmp_path / "doc" / "study.md")
    os.makedirs(os.path.dirname(doc))
    argv = ["--quick", "--out", out, "--data_dir", synthetic_dir, "--doc", doc]
    assert recipe_study.main(argv + ["--rows", "preln_b1024"]) == 0
    row = os.path.join(out, "rows", "preln_b1024")
    train = json.load(open(os.path.join(row, "train.json")))
    # Same real target tokens whatever the batch: steps x tokens per step ~ the budget.
    assert abs(train["steps"] * train["tokens_per_step"] - 6000) <= train["tokens_per_step"]
    measure = json.load(open(os.path.join(row, "measure.json")))
    assert set(measure) >= {"last", "ema"}  # the row keeps an EMA: both are measured
    for which in ("last", "ema"):
        m = measure[which]
        assert m["dev_ppl"] > 1 and 0 <= m["test"]["s_bleu"] <= 100
        assert set(m["source_probe"]) == {"drop_other", "drop_blank"}
    report = open(doc).read()
    assert report.count("**(chosen)**") == 1  # the best dev s-BLEU of the two sets
    assert "| preln_b1024 **(chosen)** |" in report
    assert "| preln_b1024 | ema |" in report or "| preln_b1024 | last |" in report
    rows = json.load(open(doc.replace(".md", ".json")))["rows"]
    measured = [(r["row"], r["params"]) for r in rows if r["measured"]]
    assert measured == [("preln_b1024", "last"), ("preln_b1024", "ema")]
    # The ~4-epoch row continues the row's last checkpoint and is also measured with the
    # average of its last 5 checkpoints.
    assert recipe_study.main(argv + ["--rows", "preln_b1024_4ep"]) == 0
    longer = os.path.join(out, "rows", "preln_b1024_4ep")
    log = open(os.path.join(longer, "train.log")).read()
    assert f"resumed from step {train['steps']}" in log
    assert json.load(open(os.path.join(longer, "train.json")))["steps"] >= 3 * train["steps"] - 1
    assert set(json.load(open(os.path.join(longer, "measure.json")))) >= {"last", "ema", "avg5"}
    # A rerun finds every stage done (the records are not rewritten).
    stamp = os.path.getmtime(os.path.join(row, "measure.json"))
    assert recipe_study.main(argv + ["--rows", "preln_b1024"]) == 0
    assert os.path.getmtime(os.path.join(row, "measure.json")) == stamp


def test_every_row_names_its_whole_recipe():
    keys = {"model.pre_ln", "train.warmup_steps", "train.learning_rate", "train.clip_norm"}
    names = [r.name for r in recipe_rows.RECIPES]
    assert len(names) == len(set(names))
    for recipe in recipe_rows.RECIPES:
        assert keys <= {k for k, _ in recipe.overrides}, recipe.name
