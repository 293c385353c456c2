"""translate.py -> evaluate.py round trip on the synthetic corpus, and the Translator's order."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT, tiny_config

from docnmt_jax.data import readers, translation_plan
from docnmt_jax.decoding import translator as translator_lib
from docnmt_jax.decoding.search import SearchConfig
from docnmt_jax.training import dev_eval, restore, trainer


@pytest.fixture(scope="module")
def trained_run(synthetic_dir, tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("run"))
    config = tiny_config(synthetic_dir, num_steps=30)
    config.train.dev_bleu = True
    config.train.best_metric = "dev_bleu"
    config.train.best_mode = "max"
    config.train.eval_every = 15
    result = trainer.train_and_evaluate(config, workdir, dev_hook=dev_eval.dev_bleu_hook(config))
    assert {"dev_bleu", "dev_dbleu", "dev_chrf"} <= set(result.dev_metrics)
    return workdir


def _run(script, *args, env=None):
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "launch", script), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout + out.stderr


def test_translate_then_evaluate_round_trip(trained_run, synthetic_dir, tmp_path):
    docs = readers.read_tsv(os.path.join(synthetic_dir, "test.tsv"))[:6]
    ref = tmp_path / "ref.tsv"
    from docnmt_jax.data.documents import write_tsv

    write_tsv(docs, ref)
    hyp = tmp_path / "hyp.tsv"
    log = _run(
        "translate.py",
        f"--workdir={trained_run}",
        f"--input={ref}",
        f"--output={hyp}",
        "--beam=3",
        "--block_documents=2",
    )
    assert "sentences/s" in log and "compilations" in log
    rows = hyp.read_text(encoding="utf-8").splitlines()
    assert rows[0] == "doc_id\thyp"
    expected_ids = [d.doc_id for d in docs for _ in d.src]
    assert [r.split("\t")[0] for r in rows[1:]] == expected_ids
    report = json.loads(_run("evaluate.py", f"--hyp={hyp}", f"--ref={ref}", "--json"))
    for key in ("s_bleu", "d_bleu", "chrf"):
        assert 0.0 <= report[key]["score"] <= 100.0
        assert "version" in report[key]["signature"]
    assert report["sentences"] == len(expected_ids)


def test_plain_text_input_and_single_sentence_documents(trained_run, tmp_path):
    text = tmp_path / "in.txt"
    text.write_text("tanu nopagu mata\n\nkada rumanu\npisa goguki\n", encoding="utf-8")
    hyp = tmp_path / "out.tsv"
    common = [f"--workdir={trained_run}", f"--input={text}"]
    _run("translate.py", *common, f"--output={hyp}", "--output_format=tsv")
    rows = hyp.read_text(encoding="utf-8").splitlines()[1:]
    assert [r.split("\t")[0] for r in rows] == ["in.txt:0", "in.txt:1", "in.txt:1"]
    plain = tmp_path / "out.txt"  # the input's own format, line for line
    _run("translate.py", *common, f"--output={plain}")
    lines = plain.read_text(encoding="utf-8").split("\n")
    assert lines[1] == "" and lines[4] == "" and len(lines) == 5
    assert [lines[0], lines[2], lines[3]] == [r.split("\t", 1)[1] for r in rows]


def test_streamed_blocks_equal_one_pass(trained_run, synthetic_dir):
    docs = readers.read_tsv(os.path.join(synthetic_dir, "dev.tsv"))[:5]
    translator, _ = restore.load_translator(trained_run, "latest", SearchConfig(beam_size=2))
    whole = translator.translate(docs)
    streamed = list(translator.translate_stream(((d.doc_id, list(d.src)) for d in docs), 2))
    assert [doc_id for doc_id, _ in streamed] == [d.doc_id for d in docs]
    assert [hyps for _, hyps in streamed] == whole
    # sentence-level batches: one compilation per length bucket and power-of-two row count
    config = translator.pipeline_config
    row_counts = int(np.log2(config.batch_size(1, max(config.t_buckets)))) + 2
    assert 1 <= translator.stats.compilations <= len(config.t_buckets) * row_counts


def test_progress_bar_counts_every_sentence_once(trained_run, synthetic_dir, monkeypatch):
    """The bar's total is the sentences given; each batch adds its real sentences (padding
    rows none), so it ends at the total after several batches; the output is unchanged."""
    docs = readers.read_tsv(os.path.join(synthetic_dir, "dev.tsv"))[:5]
    search = SearchConfig(beam_size=2)
    translator, _ = restore.load_translator(trained_run, "latest", search, batch_tokens=64)
    bars = []

    class Recorder:
        def __init__(self, total, unit, desc, disable):
            self.total, self.desc, self.disable, self.updates = total, desc, disable, []
            bars.append(self)

        def update(self, n):
            self.updates.append(n)

        def close(self):
            self.closed = True

    monkeypatch.setattr(translator_lib, "tqdm", Recorder)
    shown = translator.translate(docs, progress="test")
    hidden = translator.translate(docs)
    assert shown == hidden
    by_hand = sum(len(d.src) for d in docs)
    (bar, quiet) = bars
    assert (bar.desc, bar.disable, bar.total, bar.closed) == ("test", False, by_hand, True)
    assert quiet.disable and sum(quiet.updates) == by_hand
    assert len(bar.updates) == translator.stats.batches // 2 > 1 and sum(bar.updates) == by_hand


def test_small_inputs_translate_like_full_batches(trained_run, synthetic_dir, monkeypatch):
    """A small input searches fewer rows than the token budget's batch, same output."""
    docs = readers.read_tsv(os.path.join(synthetic_dir, "dev.tsv"))[:2]
    search = SearchConfig(beam_size=2)
    translator, _ = restore.load_translator(trained_run, "latest", search)
    shapes = []
    jitted = translator._search
    translator._search = lambda p, b: shapes.append(b["src"].shape) or jitted(p, b)
    small = translator.translate(docs)
    config = translator.pipeline_config
    assert shapes and all(rows < config.batch_size(s, t) for rows, s, t in shapes)
    monkeypatch.setattr(
        translation_plan.TranslationPlan,
        "_rows",
        lambda self, s, t, n: self.config.batch_size(s, t),
    )
    full, _ = restore.load_translator(trained_run, "latest", search)
    assert full.translate(docs) == small


def test_translate_on_a_device_mesh_equals_one_device(trained_run, synthetic_dir, tmp_path):
    """``--mesh`` searches sharded over 4 simulated CPU devices: the same translations."""
    src = os.path.join(synthetic_dir, "test.tsv")
    one, sharded = tmp_path / "one.tsv", tmp_path / "mesh.tsv"
    common = [f"--workdir={trained_run}", f"--input={src}", "--beam=2", "--block_documents=4"]
    _run("translate.py", *common, f"--output={one}")
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=4"
    env = dict(os.environ, XLA_FLAGS=flags.strip())
    _run("translate.py", *common, f"--output={sharded}", "--mesh=2,1,2", env=env)
    assert sharded.read_text(encoding="utf-8") == one.read_text(encoding="utf-8")
    bad = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "launch", "translate.py"),
            *common,
            f"--output={tmp_path / 'bad.tsv'}",
            "--mesh=2,2",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert bad.returncode != 0 and "DATA,FSDP,MODEL" in bad.stderr
