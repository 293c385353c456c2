"""The converged comparison's runner: rows seeded where it matters, finetune rows started from
a committed release (its tokenizer shared, its row never retrained), seed-paired controls,
Holm-corrected p-values and the converged goal in the report, each against a hand count."""

import argparse
import os
import sys

import numpy as np
import pytest
from conftest import ROOT

from docnmt_jax import files
from docnmt_jax.errors import ConfigError
from docnmt_jax.export import release as release_lib

sys.path.insert(0, ROOT)

from experiments import results, results_report, results_run, results_stages  # noqa: E402
from experiments.results_rows import CONVERGED_SEEDED, select_rows  # noqa: E402
from experiments.results_significance import control_of, significance_lines  # noqa: E402


def _release(directory, tokenizer_bytes=b"pieces"):
    os.makedirs(directory)
    release_lib.write_params(
        os.path.join(directory, release_lib.PARAMS_FILE), {"w": np.ones((2, 2), np.float32)}
    )
    with open(os.path.join(directory, release_lib.TOKENIZER_FILE), "wb") as f:
        f.write(tokenizer_bytes)
    release_lib.write_manifest(
        directory, {"model": "transformer", "source_step": 7, "parameter_set": "ema"}
    )
    return str(directory)


def _args(**kw):
    base = dict(
        quick=False, converged=True, init_release=None, continue_release="", rows="",
        seeds="0,1,2", doc=None,
        out=None, data_dir="data/bible", patience=3, eval_every_epochs=0.5, max_epochs=40.0,
        base_steps=None, beam=None, draws=None, synthetic_steps=None,
    )  # fmt: skip
    return argparse.Namespace(**{**base, **kw})


def test_the_converged_rows_seed_final_and_its_control_and_pair_them(tmp_path):
    args = _args(out=str(tmp_path / "out"), init_release="")
    row_list, _ = results.chosen_rows(args, results.settings_from(args))
    names = [r.name for r in row_list]
    assert names == [
        "transformer",
        "final_finetuned",
        "final_finetuned_seed1",
        "final_finetuned_seed2",
        "doct_two_step",
        "hmgdc_finetuned",
        "jean_cho_finetuned",
        "doc2doc_finetuned",
        "transformer_continued",
        "transformer_continued_seed1",
        "transformer_continued_seed2",
    ]
    assert {r.seed for r in row_list if r.name.startswith(CONVERGED_SEEDED)} == {0, 1, 2}
    controls = {r.name: control_of(r, names) for r in row_list}
    assert controls["final_finetuned_seed2"] == "transformer_continued_seed2"
    assert controls["final_finetuned"] == controls["doct_two_step"] == "transformer_continued"
    assert controls["transformer_continued_seed1"] is None
    # without the seeded controls a seed falls back to the seed-0 control
    assert control_of(row_list[2], ["final_finetuned_seed1", "transformer_continued"]) == (
        "transformer_continued"
    )


def test_finetune_rows_start_from_the_release_and_its_row_is_not_retrained(tmp_path):
    release = _release(tmp_path / "rel")
    args = _args(out=str(tmp_path / "out"), init_release=f"transformer={release}")
    settings = results.settings_from(args)
    assert settings.released == (("transformer", release),)
    rows = {r.name: r for r in select_rows("final_finetuned", (0,))}
    config = results_stages.row_config(rows["final_finetuned"], settings, 100, "spm.model", 10)
    assert (config.init_from, config.init_from_which, config.init_from_params) == (
        release,
        "best",
        "auto",
    )
    inputs = results_stages.stage_inputs("train", rows["final_finetuned"], settings, 100)
    params_sha = release_lib.sha256(os.path.join(release, release_lib.PARAMS_FILE))
    assert inputs["init_release"] == params_sha
    assert "init_release" not in results_stages.stage_inputs(
        "train", rows["transformer"], settings, 100
    )
    # The release's tokenizer becomes the run's shared one; another one there is refused.
    os.makedirs(settings.out)
    shared = os.path.join(settings.out, "spm.model")
    results_run.use_release_tokenizer(settings, shared)
    assert open(shared, "rb").read() == b"pieces"
    with open(shared, "wb") as f:
        f.write(b"other pieces")
    with pytest.raises(ConfigError, match="not the tokenizer of the releases"):
        results_run.use_release_tokenizer(settings, shared)
    # The released row is never run; its saved records are reported whatever their inputs.
    ran = []
    results_run.run_rows(
        [rows["transformer"]],
        settings,
        None,
        {"transformer": (10, 100.0)},
        ["train"],
        ran.append,
        lambda n: ran.append(n),
    )
    assert ran == [4]  # every stage counted as done, nothing trained or said
    os.makedirs(settings.row_dir("transformer"))
    files.write_record(
        os.path.join(settings.row_dir("transformer"), "train.json"),
        {"steps": 9, "inputs": {"from": "an older commit"}},
    )
    records = results_run.load_records([rows["transformer"]], settings, {"transformer": (10, 1)})
    assert records["transformer"]["train"]["steps"] == 9
    with pytest.raises(ConfigError, match="not ROW=DIR"):
        results.released_rows(_args(init_release="transformer"))
    with pytest.raises(ConfigError, match="is not a release"):
        results.released_rows(_args(init_release=f"transformer={tmp_path}"))


def _paired(ds, dd, p_s, p_d, control="transformer_continued"):
    def test(delta, p):
        return {"system": 20.0 + delta, "baseline": 20.0, "p_value": p}

    both = {"s_bleu": test(ds, p_s), "d_bleu": test(dd, p_d)}
    return {"control": control, "bs": both, "ar": both, "sentences": 10, "documents": 2}


def test_holm_over_the_document_rows_and_the_converged_goal(tmp_path):
    paired = {
        "final_finetuned": _paired(1.2, 1.6, 0.001, 0.01),
        "final_finetuned_seed1": _paired(1.1, 2.0, 0.004, 0.02, "transformer_continued_seed1"),
        "doct_two_step": _paired(-0.5, 0.1, 0.3, 0.4),
    }
    lines = "\n".join(significance_lines(paired))
    # s-BLEU p sorted 0.001, 0.004, 0.3 -> x3, x2, x1 = 0.003, 0.008, 0.3 (by hand)
    assert paired["final_finetuned_seed1"]["holm"]["bs"]["s_bleu"] == pytest.approx(0.008)
    assert "0.0010 (0.0030)" in lines and "0.3000 (0.3000)" in lines
    # d-BLEU p 0.01, 0.02, 0.4 -> 0.03, 0.04, 0.4
    assert paired["final_finetuned"]["holm"]["ar"]["d_bleu"] == pytest.approx(0.03)
    goals = "\n".join(results_report.converged_goals({}, paired))
    assert "final_finetuned ≥ +1.0 s-BLEU and ≥ +1.5 d-BLEU over its control" in goals
    assert "in each of 2 seed pair(s): holds" in goals
    assert "doct_two_step" in goals and "1 seed pair(s): does not hold" in goals
    paired["final_finetuned_seed1"]["bs"]["d_bleu"]["system"] = 21.4  # +1.4 < 1.5
    assert "2 seed pair(s): does not hold" in "\n".join(results_report.converged_goals({}, paired))


def test_the_report_reads_a_rows_context_use_results(tmp_path):
    """``experiments/context_use.py``'s results (the files ``docnmt-evaluate`` writes in a
    row's ``contrastive/``) become the row's context-use numbers."""
    from experiments.context_use import read_context_use, result_paths

    workdir = str(tmp_path / "rows" / "final_finetuned")
    pronouns, cxmi = result_paths(workdir, "data/bible/test.pronouns.jsonl", "data/bible/test.tsv")
    assert pronouns.endswith("contrastive/pronouns.test.pronouns.json")
    assert read_context_use(workdir, "x/test.pronouns.jsonl", "x/test.tsv") == {}
    os.makedirs(os.path.dirname(pronouns))
    only = {"accuracy": 0.75, "correct": 3, "total": 4}
    files.write_record(
        pronouns,
        {
            "system": {"true": {"context_only_subset": only}, "random": {}},
            "mcnemar": {"true": {"context_only": {"p_value": 0.125}}},
        },
    )
    files.write_record(cxmi, {"cxmi": 0.0123, "delta_d": 0.01})
    numbers = read_context_use(workdir, "x/test.pronouns.jsonl", "x/test.tsv")
    assert numbers == {
        "pronoun_only_true": 0.75,
        "pronoun_only_random": None,
        "pronoun_mcnemar_p": 0.125,
        "cxmi": 0.0123,
        "delta_d": 0.01,
    }
    row = results_report.row_numbers({"context_use": numbers})
    assert (row["pronoun_only_true"], row["cxmi"]) == (0.75, 0.0123)
