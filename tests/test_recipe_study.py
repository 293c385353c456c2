"""The recipe study runner (experiments/recipe_study.py) end to end with tiny models: a row is
trained for the study's budget in real target tokens, measured with its last and EMA
parameters, reported, and a rerun resumes (nothing is trained again)."""

import json
import os
import sys

import pytest
from conftest import ROOT

sys.path.insert(0, ROOT)

from experiments import recipe_report, recipe_rows, recipe_study  # noqa: E402


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
    # A divergence check keeps the config's defaults and translates the test books once,
    # with the run's default (EMA) parameters; the report gives its verdict.
    assert recipe_study.main(argv + ["--rows", "defaults_doct"]) == 0
    check = json.load(open(os.path.join(out, "rows", "defaults_doct", "measure.json")))
    assert set(check) == {"beam", "alpha", "ema", "inputs"} and set(check["ema"]) >= {"test"}
    report = open(doc).read()
    assert "| defaults_doct | ema |" in report
    # A rerun finds every stage done (the records are not rewritten).
    stamp = os.path.getmtime(os.path.join(row, "measure.json"))
    assert recipe_study.main(argv + ["--rows", "preln_b1024"]) == 0
    assert os.path.getmtime(os.path.join(row, "measure.json")) == stamp


def test_every_row_names_its_whole_recipe():
    keys = {"model.pre_ln", "train.warmup_steps", "train.learning_rate", "train.clip_norm"}
    names = [r.name for r in recipe_rows.RECIPES]
    assert len(names) == len(set(names))
    for recipe in recipe_rows.RECIPES:
        if recipe.check:  # a divergence check keeps the config's defaults on purpose
            assert not keys & {k for k, _ in recipe.overrides}, recipe.name
            continue
        assert keys <= {k for k, _ in recipe.overrides}, recipe.name


def test_every_document_model_has_a_divergence_check():
    checked = {r.config for r in recipe_rows.RECIPES if r.check} | {recipe_rows.FINAL}
    for name in ("doc2doc", "doct", "hmgdc", "jean_cho", "final"):
        assert f"configs/{name}.py" in checked
    margin = next(r for r in recipe_rows.RECIPES if r.name == "defaults_jean_cho_margin")
    assert ("objective.name", "context_margin") in margin.overrides


def _hyps(path, lines):
    path.write_text("doc_id\thyp\n" + "".join(f"d\t{h}\n" for h in lines))
    return str(path)


def test_output_stats_count_empty_distinct_and_the_most_frequent(tmp_path):
    stats = recipe_report.output_stats(_hyps(tmp_path / "h.tsv", ["a b", "", "a b", "c", " "]))
    # 5 outputs: 2 empty (one only a space), distinct non-empty {"a b", "c"}, "a b" twice.
    assert stats == {"outputs": 5, "empty": 2, "distinct_share": 0.4, "top_share": 0.4}
    assert recipe_report.output_stats(str(tmp_path / "missing.tsv")) is None


def test_loss_curve_reads_the_logged_losses_and_bad_steps(tmp_path):
    log = tmp_path / "train.log"
    log.write_text(
        "2026-01-01 00:00:00 data: 3 train documents\n"
        "2026-01-01 00:00:01 step=50 train/bad_steps=0 train/loss=7.5 train/lr=1e-3\n"
        "2026-01-01 00:00:02 step=100 train/bad_steps=2 train/loss=4.25 train/lr=1e-3\n"
        "2026-01-01 00:00:03 step=100 dev_loss=4.0 dev_ppl=55\n"
        "2026-01-01 00:00:04 step=150 train/bad_steps=1 train/loss=4.5 train/lr=1e-3\n"
    )
    curve = recipe_report.loss_curve(str(log))
    assert curve == {"first": 7.5, "lowest": 4.25, "last": 4.5, "bad_steps": 3}
    assert recipe_report.loss_curve(str(tmp_path / "none.log")) == {}


def test_verdict_names_divergence_and_collapse():
    fine = {"outputs": 100, "empty": 2, "distinct_share": 0.95, "top_share": 0.03}
    curve = {"first": 7.0, "lowest": 3.0, "last": 3.2, "bad_steps": 0}
    assert recipe_report.verdict(curve, fine) == "trains"
    assert recipe_report.verdict({**curve, "last": 4.1}, fine).startswith("diverged")
    assert recipe_report.verdict({**curve, "last": float("nan")}, fine).startswith("diverged")
    repeated = {**fine, "top_share": 0.5}
    assert recipe_report.verdict(curve, repeated).startswith("collapsed")
    assert recipe_report.verdict(curve, {**fine, "empty": 11}).startswith("collapsed")
    assert recipe_report.verdict({}, fine) == "not measured yet"
