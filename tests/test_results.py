"""The results table: rows, budget, speed parsing and the report's arithmetic,
each against an independent reference (a hand count, the plan's own batches, statistics by
hand). The whole pipeline runs in CI as ``make results-quick`` (``experiments/results.py
--quick``)."""

import dataclasses
import math
import os
import sys
import time

import numpy as np
import pytest
from conftest import ROOT

from docnmt_jax import files
from docnmt_jax.config_files import load_config
from docnmt_jax.data import builder
from docnmt_jax.data import pipeline as pipeline_lib
from docnmt_jax.data.tokenizer import get_or_train_tokenizer
from docnmt_jax.errors import ConfigError
from docnmt_jax.files import log_line, log_timestamp
from docnmt_jax.models import build_model
from docnmt_jax.training import budget as budget_lib
from docnmt_jax.training import data_setup, trainer

sys.path.insert(0, ROOT)

from experiments import results_report, results_rows, results_run, results_stages  # noqa: E402


def test_every_row_loads_and_names_are_unique(tmp_path):
    rows = results_rows.rows()
    names = [r.name for r in rows]
    assert len(names) == len(set(names))
    # Every model the papers compare, and the seeds of the Transformer and FINAL.
    for name in (
        "transformer",
        "doc2doc",
        "final",
        "doct",
        "hmgdc",
        "jean_cho",
        "jean_cho_margin",
        "final_finetuned",
        "transformer_seed1",
        "final_seed2",
    ):
        assert name in names
    settings = results_stages.quick_settings(str(tmp_path), "data/bible")
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        for row in rows:
            config = results_stages.row_config(row, settings, 10, "spm.model")
            assert config.train.num_steps == 10 and config.train.seed == row.seed
            assert config.model.get("d_model", 32) == 32
            for key, value in row.overrides:
                section, _, leaf = key.rpartition(".")
                node = config[section] if section else config
                assert node[leaf] == value
            if row.init_from:
                assert config.init_from == settings.row_dir(row.init_from)
    finally:
        os.chdir(cwd)


def test_a_lower_rate_row_scales_both_trainings_and_keeps_other_records(synthetic_dir, tmp_path):
    by_name = {r.name: r for r in results_rows.rows()}
    shared, half = by_name["hmgdc"], by_name["hmgdc_half_lr"]
    assert half.extra and half.lr_factor == 0.5 and shared.lr_factor == 1.0
    settings = results_stages.quick_settings(str(tmp_path), "data/bible")
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        assert (
            results_stages.row_config(shared, settings, 10, "spm.model").train.lr_scale
            == settings.lr_scale
        )
        assert results_stages.row_config(
            half, settings, 10, "spm.model"
        ).train.lr_scale == pytest.approx(settings.lr_scale / 2)
        rates = [
            results_stages.synthetic_config(r, settings, synthetic_dir).train.lr_scale
            for r in (shared, half)
        ]
        assert rates == [0.5, pytest.approx(0.25)]
        recipe = results_stages.stage_inputs("train", half, settings, 10)["recipe"]
        assert recipe["train.lr_scale"] == pytest.approx(settings.lr_scale / 2)
        assert recipe["train.warmup_steps"] == settings.warmup_steps
        # The full run trains with each config's own recipe (no private schedule), a row's
        # lr_factor scaling it, and a row's own override is never overwritten.
        full = results_stages.Settings(out=str(tmp_path), data_dir="data/bible")
        default = load_config("configs/hmgdc.py").train
        config = results_stages.row_config(half, full, 10, "spm.model")
        assert config.train.warmup_steps == default.warmup_steps
        assert config.train.lr_scale == pytest.approx(default.lr_scale / 2)
        assert config.train.learning_rate == default.learning_rate
    finally:
        os.chdir(cwd)
    assert results_stages.stage_inputs("synthetic", shared, settings, 10) == {
        "steps": settings.synthetic_steps
    }
    assert results_stages.stage_inputs("synthetic", half, settings, 10)["lr_factor"] == 0.5


def test_select_rows_adds_what_a_row_starts_from():
    picked = [r.name for r in results_rows.select_rows("final_finetuned", seeds=(0,))]
    assert picked == ["transformer", "final_finetuned"]
    picked = [r.name for r in results_rows.select_rows("doct", seeds=(0, 1))]
    assert picked == ["transformer", "doct"]
    with pytest.raises(ConfigError, match="unknown rows"):
        results_rows.select_rows("nope", seeds=(0,))


def test_a_log_line_carries_the_time_train_speed_reads():
    before = time.time()
    line = log_line("step=50 train/tokens=1000")
    assert line.endswith(" step=50 train/tokens=1000\n")
    assert math.floor(before) <= log_timestamp(line) <= time.time()  # whole seconds
    assert log_timestamp("step=50 train/tokens=1000") is None


def test_train_speed_adds_windows_not_rates(tmp_path):
    log = tmp_path / "train.log"
    log.write_text(
        "2026-01-01 00:00:00 data: 9 train / 1 dev documents\n"
        "2026-01-01 00:00:00 model x: 10 parameters; starting at step 0\n"
        "2026-01-01 00:00:01 step=50 train/loss=3 train/tokens=1000 train/tokens_per_s=500\n"
        "2026-01-01 00:00:02 step=100 train/loss=2 train/tokens=3000 train/tokens_per_s=1000\n"
        "2026-01-01 00:00:03 step=100 dev_loss=2\n"
    )
    speed = budget_lib.train_speed(str(log))
    # 1000 tokens in 2 s, 3000 in 3 s: 4000 / 5 = 800 (the mean of the rates would be 750).
    assert speed["train_tokens"] == 4000
    assert speed["train_seconds"] == pytest.approx(5.0)
    assert speed["train_tokens_per_s"] == pytest.approx(800.0)
    assert speed["wall_seconds"] == pytest.approx(3.0)
    assert budget_lib.train_speed(str(tmp_path / "missing.log"))["train_tokens_per_s"] == 0.0
    # A run that lost its checkpoints starts again at step 0: the old windows go; one that
    # resumes at step 100 keeps the windows up to it, and the wall time adds both runs (not
    # the hour between them).
    with open(log, "a", encoding="utf-8") as f:
        f.write(
            "2026-01-01 01:00:00 data: 9 train / 1 dev documents\n"
            "2026-01-01 01:00:02 model x: 10 parameters; starting at step 100\n"
            "2026-01-01 01:00:03 step=150 train/loss=2 train/tokens=600 train/tokens_per_s=300\n"
        )
    assert budget_lib.train_speed(str(log))["train_tokens"] == 4600
    assert budget_lib.train_speed(str(log))["train_seconds"] == pytest.approx(7.0)
    assert budget_lib.train_speed(str(log))["wall_seconds"] == pytest.approx(6.0)
    with open(log, "a", encoding="utf-8") as f:
        f.write(
            "2026-01-01 02:00:00 data: 9 train / 1 dev documents\n"
            "2026-01-01 02:00:00 model x: 10 parameters; starting at step 0\n"
            "2026-01-01 02:00:01 step=50 train/loss=3 train/tokens=900 train/tokens_per_s=900\n"
        )
    assert budget_lib.train_speed(str(log))["train_tokens"] == 900
    assert budget_lib.train_speed(str(log))["train_seconds"] == pytest.approx(1.0)
    assert budget_lib.train_speed(str(log))["wall_seconds"] == pytest.approx(1.0)


def test_a_training_stopped_by_a_signal_leaves_no_record(synthetic_dir, tmp_path, monkeypatch):
    """SIGTERM mid-training: the checkpoint is the trainer's; the row gets no train record
    (which would mark it done at the step it stopped) and the run stops."""
    calls, stopped_by = [], ["sigterm"]

    def fake_train(config, workdir, dev_hook=None):
        calls.append(config.train.num_steps)
        return trainer.TrainResult(step=72, dev_metrics={}, losses=[], stopped_by=stopped_by[0])

    monkeypatch.setattr(trainer, "train_and_evaluate", fake_train)
    row = next(r for r in results_rows.rows() if r.name == "doc2doc")
    settings = results_stages.quick_settings(str(tmp_path), "data/bible")
    path = os.path.join(settings.row_dir(row.name), "train.json")
    with pytest.raises(KeyboardInterrupt, match="stopped at step 72"):
        results_stages.run_stage(
            "train",
            row,
            settings,
            lambda: results_stages.train_row(row, settings, 600, "spm.model"),
            {},
        )
    assert calls == [600] and not os.path.exists(path)
    # Early stopping on dev (the converged budget) is a finished training: it has a record.
    stopped_by[0] = "patience"
    record = results_stages.train_row(row, settings, 600, "spm.model")
    assert (record["steps"], record["stopped_by"]) == (72, "patience")
    # The synthetic stage's training likewise.
    from docnmt_jax.commands import context_proof

    monkeypatch.setattr(context_proof, "run", lambda *a, **k: {"step": 5, "accuracy": 0.3})
    with pytest.raises(KeyboardInterrupt, match="synthetic training stopped at 5"):
        results_stages.synthetic_row(row, settings, synthetic_dir)


def _script(name, folder="experiments"):
    """``FOLDER/NAME.py``, a command, loaded as a module."""
    import importlib.util

    path = os.path.join(ROOT, folder, name + ".py")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_restore_keeps_what_a_new_machine_can_use(tmp_path):
    """A committed report seeds a new machine's run: records with matching inputs come back,
    except the training of a row that still needs its (uncommitted) checkpoints: the base of a
    finetune row still to run, and a row whose measure or params stage is still to run."""
    import json

    settings = results_stages.quick_settings(str(tmp_path / "out"), "d")
    row_list = results_rows.select_rows("transformer,final,doc2doc,final_finetuned", (0,))
    budget = {r.name: (10, 100.0) for r in row_list}

    def rec(row, stage, steps=10):
        return {"value": stage, "inputs": results_stages.stage_inputs(stage, row, settings, steps)}

    by = {r.name: r for r in row_list}
    saved = {
        "transformer": {s: rec(by["transformer"], s) for s in ("train", "measure", "params")},
        "final": {s: rec(by["final"], s) for s in ("train", "measure", "params")},
        # params still to run: it needs the checkpoints
        "doc2doc": {s: rec(by["doc2doc"], s) for s in ("train", "measure")},
    }
    saved["final"]["measure"] = rec(by["final"], "measure", steps=99)  # other inputs
    doc = tmp_path / "results.md"
    (tmp_path / "results.json").write_text(
        json.dumps({"rows": [{"name": n, "records": r} for n, r in saved.items()]})
    )
    count = results_run.restore_records(str(doc), row_list, settings, budget)

    def there(row, stage):
        return os.path.exists(os.path.join(settings.row_dir(row), f"{stage}.json"))

    # final_finetuned (no params record) still needs the Transformer's checkpoints.
    assert not there("transformer", "train") and there("transformer", "measure")
    assert there("final", "train") and not there("final", "measure")  # inputs differ
    assert there("final", "params") and not there("doc2doc", "train")
    assert there("doc2doc", "measure") and count == 5


def _epoch_target_tokens(config, docs, tokenizer) -> tuple[int, int]:
    """Reference: one epoch of ``config``'s training plan, batch by batch, target mask summed;
    returns (real target tokens, batches)."""
    model = build_model(config.model, tokenizer.vocab_size)
    cfg = builder.pipeline_config(
        model.data_spec(),
        data_setup.data_settings(config.data, config.train.seed, True),
        packed=True,
        row_tokens=config.data.get("packed_row_tokens", 0),
    )
    plan = pipeline_lib.plan_batches(
        docs, tokenizer.encode_batch, dataclasses.replace(cfg, num_epochs=1)
    )
    batches = list(pipeline_lib.numpy_batches(plan))
    return sum(int(np.sum(b["tgt_mask"])) for b in batches), len(batches)


def test_tokens_per_step_counts_the_plans_real_target_tokens(synthetic_dir, tmp_path):
    row = next(r for r in results_rows.rows() if r.name == "final")
    settings = results_stages.quick_settings(str(tmp_path), synthetic_dir)
    docs = data_setup.load_documents(
        __import__("ml_collections").ConfigDict({"data_dir": synthetic_dir}), "train"
    )
    tokenizer = get_or_train_tokenizer(str(tmp_path / "spm.model"), docs, vocab_size=320)
    config = results_stages.row_config(row, settings, 1, tokenizer.model_path)
    per_step, epoch = budget_lib.tokens_per_step(config, tokenizer)
    docs = data_setup.load_documents(config.data, "train")  # the row's view (FINAL: cuts too)
    real, batches = _epoch_target_tokens(config, docs, tokenizer)
    # Every target token of the training documents, each sentence with its EOS.
    by_hand = sum(len(ids) + 1 for d in docs for ids in tokenizer.encode_batch(list(d.tgt)))
    assert epoch == real == by_hand
    assert per_step == pytest.approx(real / batches)


def test_steps_for_tokens_cli_uses_the_budget_measure(synthetic_dir, tmp_path, capsys):
    """``experiments/steps_for_tokens.py`` (the shell recipes' budget) gives a model the steps whose
    real target tokens match the reference's (smaller batches: more steps)."""
    module = _script("steps_for_tokens")
    docs = data_setup.load_documents(
        __import__("ml_collections").ConfigDict({"data_dir": synthetic_dir}), "train"
    )
    tokenizer = get_or_train_tokenizer(str(tmp_path / "spm.model"), docs, vocab_size=320)
    config = tmp_path / "reference.py"  # the Transformer on the synthetic corpus
    config.write_text(
        "from docnmt_jax.config_files import load_config\n"
        "def get_config():\n"
        f"    config = load_config({os.path.join(ROOT, 'configs/transformer.py')!r})\n"
        f"    config.data.data_dir = {synthetic_dir!r}\n"
        "    return config\n"
    )
    half = ["data.batch_src_tokens=512", "data.batch_tgt_tokens=512"]
    argv = ["--config", str(config), "--reference", str(config), "--reference_steps", "40"]
    argv += ["--tokenizer", tokenizer.model_path]
    for item in half:
        argv += ["--set", item]
    module.main(argv)
    steps = int(capsys.readouterr().out.strip())

    def per_step(sets):
        cfg = load_config(str(config))
        for item in sets:
            key, _, value = item.partition("=")
            section, _, name = key.partition(".")
            cfg[section][name] = int(value)
        real, batches = _epoch_target_tokens(cfg, docs, tokenizer)
        return real / batches

    reference, smaller = per_step([]), per_step(half)
    assert steps > 40  # smaller batches: more steps for the same tokens
    assert steps == round(40 * reference / smaller)


def _record(s_bleu, d_bleu, delta=None, params=1000, tok_s=100.0, sent_s=10.0):
    scores = {
        "s_bleu": {"score": s_bleu, "signature": "BLEU|sig"},
        "d_bleu": {"score": d_bleu, "signature": "BLEU|sig"},
        "chrf": {"score": 30.0, "signature": "chrF|sig"},
    }
    context = (
        None
        if delta is None
        else {"context_marginalised_bleu": s_bleu - delta, "delta_bleu": delta}
    )
    return {
        "train": {"steps": 10, "epochs": 0.5, "wall_seconds": 60, "train_tokens_per_s": tok_s},
        "measure": {
            "scores": scores,
            "context": context,
            "single_sentence": {"score": 1.0},
            "pronouns": {"f1": 0.5},
            "decode": {"sentences_per_s": sent_s},
        },
        "synthetic": {"accuracy": 0.9},
        "params": {"params": params},
    }


def test_report_ratios_spread_and_goals(tmp_path):
    rows = results_rows.select_rows(
        "transformer,transformer_seed1,transformer_seed2,final,final_seed1,"
        "final_seed2,final_finetuned,jean_cho,jean_cho_margin",
        (0, 1, 2),
    )
    records = {
        "transformer": _record(10.0, 12.0, params=1000, tok_s=200.0, sent_s=20.0),
        "transformer_seed1": _record(11.0, 13.0),
        "transformer_seed2": _record(12.0, 14.0),
        "final": _record(13.0, 15.0, delta=0.5, params=1300, tok_s=100.0, sent_s=5.0),
        "final_seed1": _record(13.0, 15.0, delta=0.2),
        "final_seed2": _record(13.0, 15.0, delta=0.1),
        "jean_cho": _record(9.0, 10.0, delta=0.3),
        "jean_cho_margin": _record(9.0, 10.0, delta=-0.1),
    }
    settings = results_stages.quick_settings(str(tmp_path), "d")
    text, payload = results_report.report(rows, records, settings, "# header")
    numbers = {r["name"]: r["numbers"] for r in payload["rows"]}
    assert numbers["final"]["train_ratio"] == pytest.approx(0.5)
    assert numbers["final"]["decode_ratio"] == pytest.approx(0.25)
    assert numbers["final"]["delta_params"] == 300
    # final_finetuned has no record of its own: its synthetic accuracy is FINAL's.
    assert numbers["final_finetuned"]["synthetic"] == pytest.approx(0.9)
    # Transformer s-BLEU 10, 11, 12: mean 11, sample sd 1.
    mean, sd = results_report.seed_spread(numbers, "transformer", "s_bleu")
    assert (mean, sd) == (pytest.approx(11.0), pytest.approx(1.0))
    assert "transformer (3 seeds): s-BLEU 11.00 ± 1.00" in text
    # FINAL - Transformer: +2.00 s-BLEU (the goal holds at exactly 2), +2.00 d-BLEU (missed by 0.5).
    assert "+2.00 — holds" in text
    assert "missed by 0.50" in text
    assert "every document model's Δ_BLEU > 0: 4 of 5 rows; not: jean_cho_margin -0.10" in text
    assert "(jean_cho_margin against jean_cho): -0.10 against +0.30 — does not hold" in text
    assert "Paired significance against the same-token control" in text
    assert "not measured yet (a row and its control need their test translations)" in text
    assert "Rows not yet complete: final_finetuned." in text
    assert "BLEU|sig" in text and "chrF|sig" in text
    assert math.isclose(numbers["jean_cho"]["random_bleu"], 8.7)
    # One seed each: no spread (not a spread of 0), so no difference is said to exceed it.
    one_seed = {k: v for k, v in records.items() if "_seed" not in k}
    text, _ = results_report.report(rows, one_seed, settings, "# header")
    assert "transformer (1 seed): s-BLEU 10.00 ± –" in text


def test_a_finetune_row_is_compared_with_the_transformer_trained_as_long(tmp_path):
    rows = results_rows.select_rows("hmgdc_finetuned,transformer_continued", (0,))
    assert [r.name for r in rows] == ["transformer", "hmgdc_finetuned", "transformer_continued"]
    control = {r.name: r for r in rows}["transformer_continued"]
    assert control.extra and control.init_from == "transformer"
    assert dict(control.overrides)["init_from_rules"] == "all"
    records = {
        "transformer": _record(10.0, 12.0),
        "hmgdc_finetuned": _record(13.25, 14.0, delta=0.1),
    }
    settings = results_stages.quick_settings(str(tmp_path), "d")
    text, _ = results_report.report(rows, records, settings, "# header")
    assert "its like-for-like control, `transformer_continued`, is not run yet" in text
    records["transformer_continued"] = _record(12.5, 15.5)
    text, _ = results_report.report(rows, records, settings, "# header")
    # 13.25 - 12.5 and 14.0 - 15.5, by hand; the control is a sentence model: no Δ_BLEU.
    assert "hmgdc_finetuned against `transformer_continued` (the same tokens in all): " in text
    assert "s-BLEU +0.75, d-BLEU -1.50" in text
    assert "every document model's Δ_BLEU > 0: 1 of 1 rows" in text


def test_document_rows_are_tested_against_their_same_token_controls(tmp_path):
    from docnmt_jax.data.documents import Document
    from docnmt_jax.evaluation import significance
    from experiments.results_significance import control_of, paired_rows

    rows = results_rows.select_rows(
        "transformer,transformer_seed1,final,final_seed1,final_finetuned,transformer_continued,"
        "rnnsearch,rnnsearch_hmgdc",
        (0, 1),
    )
    names = [r.name for r in rows]
    controls = {r.name: control_of(r, names) for r in rows}
    assert controls == {
        "transformer": None,
        "transformer_seed1": None,
        "final": "transformer",
        "final_seed1": "transformer_seed1",
        "final_finetuned": "transformer_continued",
        "transformer_continued": None,
        "rnnsearch": None,
        "rnnsearch_hmgdc": "rnnsearch",
    }
    words = "in the beginning god created the heaven and the earth".split()

    def sentence(start, n):
        return " ".join(words[(start + j) % len(words)] for j in range(n))

    refs = [
        Document(
            f"Gen.{c}",
            tuple(sentence(c + i, 6) for i in range(5)),
            tuple(sentence(c * i, 7) for i in range(5)),
        )
        for c in range(1, 5)
    ]
    row_dir = lambda name: str(tmp_path / name)  # noqa: E731

    def write(name, drop):
        os.makedirs(row_dir(name), exist_ok=True)
        with open(os.path.join(row_dir(name), "test.hyp.tsv"), "w") as f:
            f.write("doc_id\thyp\n")
            for d in refs:
                for i, t in enumerate(d.tgt):
                    f.write(
                        d.doc_id
                        + "\t"
                        + " ".join(t.split()[: len(t.split()) - drop - i % 2])
                        + "\n"
                    )

    write("transformer", 3)
    write("final", 1)
    write("final_finetuned", 2)  # its control has no translations: not tested
    paired = paired_rows(rows, row_dir, refs, files.read_record, files.write_record)
    assert set(paired) == {"final"}
    want = significance.paired_documents(
        *[
            [
                [
                    ln.split("\t")[1]
                    for ln in open(os.path.join(row_dir(n), "test.hyp.tsv")).read().splitlines()[1:]
                    if ln.startswith(d.doc_id + "\t")
                ]
                for d in refs
            ]
            for n in ("final", "transformer")
        ],
        [list(d.tgt) for d in refs],
    )
    assert paired["final"]["bs"]["s_bleu"]["p_value"] == want["bs"]["s_bleu"]["p_value"]
    assert paired["final"]["ar"]["d_bleu"]["p_value"] == want["ar"]["d_bleu"]["p_value"]
    assert paired["final"]["documents"] == 4 and paired["final"]["sentences"] == 20
    # Cached by content: a second call reads paired.json; a changed hypothesis file recomputes.
    stamp = os.path.getmtime(os.path.join(row_dir("final"), "paired.json"))
    paired_rows(rows, row_dir, refs, files.read_record, files.write_record)
    assert os.path.getmtime(os.path.join(row_dir("final"), "paired.json")) == stamp
    text, payload = results_report.report(
        rows, {}, results_stages.quick_settings(str(tmp_path), "d"), "# h", paired
    )
    assert "1 comparisons" in text and "| `final` | `transformer` |" in text
    assert next(r for r in payload["rows"] if r["name"] == "final")["paired"]["control"] == (
        "transformer"
    )


def test_make_and_the_recipes_name_scripts_that_exist():
    """``make results``, ``make results-quick`` and the shell recipes call their scripts by path
    from the repository root: every path they name exists."""
    import glob
    import re

    with open(os.path.join(ROOT, "Makefile"), encoding="utf-8") as f:
        makefile = f.read()
    assert "$(BIN)/python experiments/results.py $(ARGS)" in makefile
    assert "$(BIN)/python experiments/results.py --quick " in makefile
    texts = [makefile]
    for path in glob.glob(os.path.join(ROOT, "experiments", "recipes", "*.sh")):
        with open(path, encoding="utf-8") as f:
            texts.append(f.read())
    named = {p for t in texts for p in re.findall(r"\b(?:launch|experiments)/[\w/]+\.(?:py|sh)", t)}
    assert "experiments/steps_for_tokens.py" in named
    assert sorted(p for p in named if not os.path.exists(os.path.join(ROOT, p))) == []


def test_the_converged_budget_stops_on_dev_bleu_and_its_control_matches_tokens(tmp_path):
    settings = results_stages.Settings(out=str(tmp_path), data_dir="data/bible", patience=3)
    by_name = {r.name: r for r in results_rows.rows((0,))}
    finetuned, control = by_name["final_finetuned"], by_name["transformer_continued"]
    config = results_stages.row_config(finetuned, settings, 4000, "spm.model", eval_every=550)
    train = config.train
    assert (train.dev_bleu, train.best_metric, train.best_mode) == (True, "dev_bleu", "max")
    assert (train.patience, train.eval_every, train.checkpoint_every) == (3, 550, 550)
    assert (config.init_from_which, config.init_from_params) == ("best", "auto")
    assert settings.checkpoint == "best"
    # the control trains for a fixed number of tokens: no early stopping
    assert results_stages.row_config(control, settings, 900, "", eval_every=550).train.patience == 0
    inputs = results_stages.stage_inputs("train", finetuned, settings, 4000)
    assert inputs["patience"] == 3
    # The control's steps hold the most tokens any FINAL finetune seed trained: seeds of 1,000
    # and 2,500 real tokens a step trained 300 and 200 steps (300,000 and 500,000 tokens), so
    # at 1,024 tokens a step the control needs ceil(500,000 / 1,024) = 489 steps.
    assert results_run.same_token_steps(control, settings, 1024.0) == 0  # none trained yet
    for name, steps, per_step in (
        ("final_finetuned", 300, 1000.0),
        ("final_finetuned_seed1", 200, 2500.0),
        ("doct_two_step", 900, 2500.0),  # not a FINAL row: the control does not match it
    ):
        os.makedirs(settings.row_dir(name))
        files.write_record(
            os.path.join(settings.row_dir(name), "train.json"),
            {"steps": steps, "tokens_per_step": per_step},
        )
    assert results_run.same_token_steps(control, settings, 1024.0) == 489
    # The token budget keeps its rules: no dev BLEU, the latest checkpoint.
    budget = results_stages.Settings(out=str(tmp_path), data_dir="data/bible")
    config = results_stages.row_config(finetuned, budget, 600, "spm.model")
    assert (config.train.dev_bleu, config.train.patience, budget.checkpoint) == (
        False,
        0,
        "latest",
    )
    assert "patience" not in results_stages.stage_inputs("train", finetuned, budget, 600)
