"""Fast version of the context proof: FINAL uses the context, the sentence
Transformer cannot. A denser, shorter variant of the synthetic task (pronouns only, antecedent
in the previous sentence, documents of 2-4 sentences) so a tiny model learns it in about a minute;
the full task and its numbers are in docs/log (``launch/context_proof.py``)."""

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT

from docnmt_jax.commands import context_proof
from docnmt_jax.config_files import load_config
from docnmt_jax.data import synthetic

FAST_TASK = dict(
    num_documents=2000,
    p_pronoun=1.0,
    p_topic=0.0,
    distances=(1,),
    min_sentences=2,
    max_sentences=4,
    seed=0,
)


@pytest.fixture(scope="module")
def fast_corpus(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("fast_context"))
    config = synthetic.SyntheticConfig(**FAST_TASK)
    synthetic.write_corpus(out, config, {"train": 2000, "dev": 50, "test": 150})
    return out


# Half the default learning-rate scale: at 1.0 the tiny FINAL's dev loss spikes during warm-up
# and whether it has found the antecedent by step 800 depends on the seed (0.62 and 0.70 seen);
# at 0.5 it has in every data/training seed pair measured (docs/log/2026-11-22-final.md, "Does
# FINAL use the context?").
FAST_TRAINING = dict(context_proof.TINY, num_steps=800, lr_scale=0.5)


def _run(name: str, data_dir: str, workdir: str) -> dict:
    config = context_proof.proof_config(
        load_config(os.path.join(ROOT, "configs", f"{name}.py")),
        data_dir,
        **FAST_TRAINING,
    )
    return context_proof.run(config, workdir, contrastive_split="test")


@pytest.mark.slow  # about 7 CPU minutes; `make test-slow` runs it
def test_final_uses_context_and_the_sentence_model_cannot(fast_corpus, tmp_path):
    labels = synthetic.read_labels(os.path.join(fast_corpus, "test.labels.jsonl"))
    chance = synthetic.chance_level(labels)
    assert abs(chance - 1 / 3) < 1e-9
    final = _run("final", fast_corpus, str(tmp_path / "final"))
    sentence = _run("transformer", fast_corpus, str(tmp_path / "transformer"))
    print(context_proof.markdown(final, "final"), context_proof.markdown(sentence, "transformer"))
    # Teacher-forced forced choice among the candidate forms, and the greedy translations.
    assert final["contrastive"]["accuracy"] >= 0.9, final["contrastive"]
    assert final["accuracy"] >= 0.8, final
    # The sentence model sees one sentence: at chance (1/3) up to sampling noise (~300 labels).
    assert sentence["contrastive"]["accuracy"] <= 0.45, sentence["contrastive"]
    assert sentence["accuracy"] <= 0.45, sentence


@pytest.mark.slow
def test_curriculum_stages_chain_and_tracking(tmp_path):
    """``launch/context_proof.py --curriculum_steps`` trains every stage from the previous
    one's parameters, then the default task from the last stage; ``--track`` logs the dev
    forced choice."""
    workdir = tmp_path / "proof"
    argv = [
        "--config",
        os.path.join(ROOT, "configs", "final.py"),
        "--workdir",
        str(workdir),
        "--tiny",
        "--train_docs",
        "40",
        "--test_docs",
        "4",
        "--curriculum_steps",
        "2,2",
        "--num_steps",
        "2",
        "--track",
    ]
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "launch", "context_proof.py"), *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "forced choice" in proc.stdout
    adjacent, short = (workdir / f"curriculum_{n}" for n in ("adjacent", "short"))
    short_config = json.loads((short / "model" / "config.json").read_text())
    main_config = json.loads((workdir / "model" / "config.json").read_text())
    assert short_config["init_from"] == str(adjacent / "model")
    assert main_config["init_from"] == str(short / "model")
    assert "ctx_acc" in (workdir / "model" / "train.log").read_text()


# DocT (Zhang et al. 2018) with k = 2: antecedents 1 or 2 sentences back sit in its window.
# Learned by step 400 on chunks (dev forced choice 0.46 / 0.42 / 0.88 / 1.00 / 1.00 at steps
# 100-500, docs/log/2026-11-24-doct.md, "Does DocT use its context?"); sentence rows keep the
# batch shapes (compilations) few. Beyond the window it stays at chance: the full task's
# distance table.
DOCT_TASK = dict(FAST_TASK, distances=(1, 2))
DOCT_TRAINING = dict(context_proof.TINY, num_steps=500, lr_scale=0.5)


# Slow (157 s; the default suite passed 20 minutes with the notebooks):
# `make test-slow`. DocT's layers stay in the default suite through its naive reference.
@pytest.mark.slow
def test_doct_uses_the_two_sentences_of_its_window(tmp_path):
    data_dir = str(tmp_path / "data")
    synthetic.write_corpus(
        data_dir, synthetic.SyntheticConfig(**DOCT_TASK), {"train": 2000, "dev": 50, "test": 150}
    )
    config = context_proof.proof_config(
        load_config(os.path.join(ROOT, "configs", "doct.py")), data_dir, **DOCT_TRAINING
    )
    config.model.sentence_rows = True  # sentence rows: 2 batch shapes, little padding
    assert config.model.context_sentences == 2
    doct = context_proof.run(config, str(tmp_path / "doct"), contrastive_split="test")
    print(context_proof.markdown(doct, "doct"))
    for distance in (1, 2):
        forced = doct["contrastive"]["by_distance"][distance]
        assert forced["total"] >= 50 and forced["accuracy"] >= 0.95, (distance, forced)
        greedy = doct["by_distance"][distance]
        assert greedy["accuracy"] >= 0.9, (distance, greedy)


# HM-GDC (Tan et al. 2019): the context is the whole document, so the deciding sentence may be
# any number of sentences back. Pronouns and topics, distances 1-15 in documents of 2-16
# sentences (each distance about 50 times in the test split). From scratch the tiny model
# learns the translation but not the context within 800 steps (forced choice at chance), so
# the two curriculum stages come first (400 and 200 steps), as in the full proof; a quarter of
# the learning-rate scale keeps each stage's warm-up from undoing the last (docs/log/
# 2026-11-24-hmgdc.md, "Does HM-GDC use its context?"). The sentence model is at chance on these
# labels by construction (the labelled sentence says nothing about the class or topic;
# measured on the full task in FINAL's table).
HMGDC_TASK = dict(
    FAST_TASK, p_topic=1.0, distances=tuple(range(1, 16)), min_sentences=2, max_sentences=16
)
HMGDC_TRAINING = dict(context_proof.TINY, num_steps=500, lr_scale=0.25, warmup_steps=150)


@pytest.mark.slow  # about 4-5 CPU minutes; `make test-slow`
def test_hmgdc_uses_the_whole_document(tmp_path):
    data_dir = str(tmp_path / "data")
    synthetic.write_corpus(
        data_dir, synthetic.SyntheticConfig(**HMGDC_TASK), {"train": 2000, "dev": 50, "test": 300}
    )
    config = context_proof.proof_config(
        load_config(os.path.join(ROOT, "configs", "hmgdc.py")), data_dir, **HMGDC_TRAINING
    )
    labels = synthetic.read_labels(os.path.join(data_dir, "test.labels.jsonl"))
    assert abs(synthetic.chance_level(labels) - 1 / 3) < 1e-9
    workdir = str(tmp_path / "hmgdc")
    config = context_proof.warm_start(config, workdir, [400, 200])
    hmgdc = context_proof.run(config, os.path.join(workdir, "model"), contrastive_split="test")
    print(context_proof.markdown(hmgdc, "hmgdc"))
    for distance in range(1, 16):
        forced = hmgdc["contrastive"]["by_distance"][distance]
        assert forced["total"] >= 25 and forced["accuracy"] >= 0.9, (distance, forced)
    assert hmgdc["accuracy"] >= 0.9, hmgdc
