"""The benchmark harness runs end to end at its --quick size and its numbers are sane.

The ``test_quick_*`` tests run a few sections of ``launch/benchmark.py --quick`` in a
subprocess whose XLA skips the expensive LLVM passes (compile time dominates at this size; the
numbers checked here do not depend on it); ``test_quick_run_as_a_whole`` (slow) runs everything
as a user would. The pipeline section and the presets are called from ``docnmt_jax.benchmarking``.
"""

import argparse
import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys

import pytest
from conftest import FAST_XLA_FLAGS, ROOT

from docnmt_jax import benchmarking, flops
from docnmt_jax.benchmarking import pipeline, report
from docnmt_jax.data.schema import dummy_batch
from docnmt_jax.models import build_model, registered

QUICK_SHAPE = flops.BatchShape(chunks=2, sentences=3, src_len=6, tgt_len=6)  # --quick batch
QUICK_SIZE = dict(d_model=32, num_heads=2, ffn_dim=64, num_encoder_layers=1, num_decoder_layers=1)


def _run(tmp_path, *argv, fast=True):
    """``benchmark.py --quick ARGV --json FILE``: (results, stdout)."""
    out = tmp_path / "bench.json"
    env = dict(os.environ)  # the suite's fast-compile XLA_FLAGS (conftest)
    if not fast:  # XLA's defaults: the optimised path end to end
        env["XLA_FLAGS"] = env.get("XLA_FLAGS", "").replace(FAST_XLA_FLAGS, "").strip()
    script = os.path.join(ROOT, "launch", "benchmark.py")
    proc = subprocess.run(
        [sys.executable, script, "--quick", *argv, f"--json={out}"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text()), proc.stdout


def _positive(*values):
    return all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in values)


def _quick_train_flops(name):
    """The --quick size's train FLOPs of ``name``: the keys of QUICK_SIZE its config has (an
    RNN has layers and dimensions, no heads: ``num_layers``/``embed_dim``, as the benchmark
    sizes it)."""
    fields = {f.name for f in dataclasses.fields(registered()[name].config_class)}
    size = dict(QUICK_SIZE, embed_dim=QUICK_SIZE["d_model"], num_layers=1)
    config = {k: v for k, v in size.items() if k in fields}
    return flops.train_flops(build_model(dict(config, name=name), 64), QUICK_SHAPE)


def _check_train(result, models):
    assert _positive(result["peak"]["float32_gflops"], result["peak"]["bfloat16_gflops"])
    runs = {r["model"]: r for r in result["train"]["runs"]}
    assert sorted(runs) == sorted(models) and result["train"]["baseline"] == "transformer"
    for name, r in runs.items():
        assert r["batch"] == [2, 3, 6] and r["target_tokens"] == 36
        assert r["flops_per_step"] == _quick_train_flops(name)
        assert _positive(r["step_seconds"], r["compile_seconds"], r["tokens_per_s"], r["mfu"])
        assert _positive(r["xla_flops_per_step"], r["tokens_per_s_ratio"])
        assert _positive(r["memory_bytes"]["total"], r["memory_bytes"]["temp"])
        # Backward = 2x forward, less where an operand needs no gradient (FINAL's memory).
        assert 0.9 < r["jaxpr_over_analytic"] <= 1.0
        if name.startswith("rnnsearch"):
            # XLA's cost analysis counts a while loop's body once, not once per time step: the
            # GRU recurrences (lax.scan over the sentence) are undercounted.
            assert 0.0 < r["xla_over_analytic"] < 1.5
        else:
            assert 1.0 < r["xla_over_analytic"] < 1.5  # XLA also counts softmax, norms, Adam
    assert runs["transformer"]["tokens_per_s_ratio"] == 1.0


def test_quick_peak_and_train(tmp_path):
    result, stdout = _run(tmp_path, "--sections=peak,train", "--models=transformer,final")
    _check_train(result, ["transformer", "final"])
    assert "| final | 2x3x6 |" in stdout and "MFU" in stdout


def _check_decode(result, models):
    runs = result["decode"]["runs"]
    assert {(r["model"], r["search"]) for r in runs} == {
        (m, s) for m in models for s in ("beam 5", "greedy")
    }
    for r in runs:
        # Every model translates 3 x 2 chunks of 3 sentences; FINAL searches a chunk's
        # sentences one after another, so it gets them in one call of 6 chunks (every search
        # step has the same rows as the sentence model's), the others in 3 calls of 2 chunks.
        sentences = 18
        assert r["sentences"] == sentences and r["output_tokens"] == sentences * 4
        assert r["calls"] == (1 if r["model"] == "final" else 3)
        # one per search (FINAL's continuous search too: one compiled call), none while timing
        assert r["compilations"] == 1
        assert r["recompilations"] == 0
        assert _positive(r["seconds"], r["sentences_per_s"], r["tokens_per_s"])
        assert _positive(r["sentences_per_s_ratio"])
        if r["model"] in ("transformer", "final"):  # fixed length: every sentence 4 tokens
            assert r["mean_output_len"] == 4.0


def test_quick_decode(tmp_path):
    result, stdout = _run(tmp_path, "--sections=decode", "--models=transformer,final")
    _check_decode(result, ["transformer", "final"])
    assert "| final | greedy | 18 |" in stdout


def _check_growth(result, models):
    sweeps, slopes = result["growth"]["sweeps"], result["growth"]["slopes"]
    for layout in ("grid", "packed"):
        grid = sweeps["sentences"]["grid"][models[0]]
        assert [p["sentences"] for p in sweeps["sentences"][layout][models[0]]] == [1, 3]
        assert [p["length"] for p in sweeps["length"][layout][models[0]]] == [6, 12]
        for name in models:
            for axis in ("sentences", "length"):
                points = sweeps[axis][layout][name]
                assert all(_positive(p["step_seconds"]) for p in points)
                assert all(p["layout"] == layout for p in points)
                assert math.isfinite(slopes[axis][layout][name]["time"])
        if "transformer" in models:  # the sentence model is linear in S
            assert slopes["sentences"][layout]["transformer"]["flops"] == pytest.approx(1.0)
    # Full packed rows, as many as the grid's 2 chunks x 3 sentences x 6 tokens need: one row
    # of 128 with 21 sentences of 6 (the Transformer), one of 1024 with 56 chunks of 18 (FINAL).
    assert grid[1]["batch"] == [2, 3, 6] and grid[1]["real_target_tokens"] == 36
    expected = {"transformer": ([1, 128], 126), "final": ([1, 1024], 1008)}
    for name in set(models) & set(expected):
        point = sweeps["sentences"]["packed"][name][1]
        assert (point["batch"], point["real_target_tokens"]) == expected[name]
        work = point["step_seconds"] * 36 / expected[name][1]
        assert point["work_seconds"] == pytest.approx(work)


def test_quick_growth_reuses_the_train_point(tmp_path):
    result, stdout = _run(
        tmp_path, "--sections=train,growth", "--models=transformer", "--growth-models=transformer"
    )
    _check_growth(result, ["transformer"])
    point = result["growth"]["sweeps"]["sentences"]["grid"]["transformer"][1]
    assert point["step_seconds"] == result["train"]["runs"][0]["step_seconds"]
    assert "fitted log-log slopes" in stdout


def test_quick_profile_writes_traces(tmp_path):
    trace_dir = tmp_path / "trace"
    result, _ = _run(
        tmp_path, "--sections=profile", f"--profile={trace_dir}", "--models=transformer"
    )
    assert list(result["profile"]["traces"]) == ["transformer"]
    files = [f for _, _, fs in os.walk(trace_dir / "transformer") for f in fs]
    assert any(f.endswith(".xplane.pb") for f in files)


def _corpus_copy(synthetic_dir, tmp_path):
    """The synthetic training TSV copied to ``tmp_path`` (the corpus section caches its
    tokenizer next to the TSV)."""
    tsv = tmp_path / "train.tsv"
    shutil.copy(os.path.join(synthetic_dir, "train.tsv"), tsv)
    return str(tsv)


def _test_tsv(synthetic_dir):
    return "--corpus-test-tsv=" + os.path.join(synthetic_dir, "test.tsv")


def _test_sentences(synthetic_dir, documents=4):
    """Sentences of the first ``documents`` test documents (``--quick``: 4)."""
    from docnmt_jax.data.readers import read_tsv

    docs = read_tsv(os.path.join(synthetic_dir, "test.tsv"))[:documents]
    return sum(len(d) for d in docs)


# Slow (the default suite passed 20 minutes): `make test-slow`.
@pytest.mark.slow
def test_quick_corpus_trains_and_translates_each_model_on_the_real_plan(synthetic_dir, tmp_path):
    tsv = _corpus_copy(synthetic_dir, tmp_path)
    models = "transformer,doc2doc,final"
    result, stdout = _run(
        tmp_path,
        "--sections=corpus",
        f"--tsv={tsv}",
        f"--models={models}",
        _test_tsv(synthetic_dir),
    )
    _check_corpus(result, models.split(","), _test_sentences(synthetic_dir))
    assert (tmp_path / "spm_300.model").exists()  # trained once, reused by the next run
    assert "| doc2doc | packed |" in stdout
    assert "| final | greedy | random, EOS never |" in stdout


@pytest.mark.slow
def test_quick_corpus_times_recurrent_final_on_packed_streams(synthetic_dir, tmp_path):
    """Recurrent FINAL is timed on both its layouts: packed document streams (the carry one
    row per stream of the plan) and grid streams; packing removes most of the padding."""
    tsv = _corpus_copy(synthetic_dir, tmp_path)
    model = "final:recurrent=True"
    result, _ = _run(
        tmp_path, "--sections=corpus", f"--tsv={tsv}", f"--models={model}", "--corpus-test-tsv="
    )
    runs = {r["layout"]: r for r in result["corpus"]["runs"] if r["model"] == model}
    assert set(runs) == {"packed", "grid"}
    for r in runs.values():
        assert r["steps"] == 2 and _positive(r["tokens_per_s"], r["real_target_tokens"])
    assert runs["packed"]["plan_shapes"] == runs["packed"]["compilations"] == 1
    assert runs["packed"]["padding_fraction"] < 0.5 * runs["grid"]["padding_fraction"]


def _check_corpus(result, models, test_sentences):
    corpus = result["corpus"]
    runs = {(r["model"], r["layout"]): r for r in corpus["runs"]}
    for name in models:
        grid = runs[(name, "grid")]
        assert grid["ratio_to_grid"] == pytest.approx(1.0)
        layouts = [grid] + ([runs[(name, "packed")]] if (name, "packed") in runs else [])
        for r in layouts:
            assert r["steps"] == corpus["timed_steps"] == 2
            assert _positive(r["tokens_per_s"], r["real_target_tokens"], r["compile_seconds"])
            # At the epoch's fill: the corpus's target tokens over the epoch's batches.
            epoch = corpus["corpus"]["tgt_tokens"] / r["batches_per_epoch"]
            assert r["epoch_tokens_per_step"] == pytest.approx(epoch)
            mean_step = r["seconds"] / r["steps"]
            assert r["epoch_tokens_per_s"] == pytest.approx(epoch / mean_step)
            assert 1 <= r["compilations"] <= r["plan_shapes"]
            assert 0.0 < r["padding_fraction"] < 1.0
    packed = runs[("transformer", "packed")]
    assert packed["plan_shapes"] == 1 and packed["ratio_to_transformer"] == pytest.approx(1.0)
    # Packing removes most of the grid's padding.
    assert packed["padding_fraction"] < runs[("transformer", "grid")]["padding_fraction"]
    assert (
        runs[("doc2doc", "packed")]["padding_fraction"]
        < 0.5 * runs[("doc2doc", "grid")]["padding_fraction"]
    )
    _check_corpus_translate(corpus["translate"], models, test_sentences)


def _check_corpus_translate(result, models, test_sentences):
    runs = {(r["model"], r["search"]): r for r in result["runs"]}
    assert set(runs) == {(m, s) for m in models for s in ("beam 5", "greedy")}
    assert result["documents"] == 4 and result["sentences"] == test_sentences
    assert result["baseline"] == "transformer" and result["decode_len"] == 4
    for (name, _), r in runs.items():
        assert r["sentences"] == test_sentences  # every test sentence translated
        assert _positive(r["seconds"], r["sentences_per_s"], r["tokens_per_s"])
        assert _positive(r["compile_seconds"], r["sentences_per_s_ratio"])
        assert 1 <= r["shapes"] <= r["batches"] and r["compilations"] >= r["shapes"]
        assert r["recompilations"] == 0 and 0.0 <= r["src_padding_fraction"] < 1.0
        assert r["params"] == "random, EOS never" and r["forced_len"] == 4
        assert r["output_tokens"] == 4 * test_sentences  # decoder steps: 4 per sentence
        if name != "doc2doc":  # (Doc2Doc cuts a chunk's n x 4 steps at its separators)
            assert r["min_output_len"] == r["max_output_len"] == 4  # forced, EOS last
    for search in ("beam 5", "greedy"):
        assert runs[("transformer", search)]["sentences_per_s_ratio"] == 1.0


def test_corpus_translates_with_a_trained_checkpoint(synthetic_dir, tmp_path):
    """``--corpus-checkpoint MODEL=WORKDIR``: the run's model, tokenizer and best checkpoint
    restored as translate.py restores them; real EOS, so lengths are the model's own."""
    from conftest import tiny_config

    from docnmt_jax.benchmarking import corpus
    from docnmt_jax.benchmarking.workload import UsageError
    from docnmt_jax.training import trainer

    workdir = str(tmp_path / "run")
    trainer.train_and_evaluate(tiny_config(synthetic_dir, num_steps=2), workdir)
    args = argparse.Namespace(
        corpus_test_tsv=os.path.join(synthetic_dir, "test.tsv"),
        corpus_test_docs=2,
        corpus_checkpoint=[f"transformer={workdir}"],
        beam=2,
        decode_len=4,
        decode_repeats=1,
        corpus_translate_tokens=4096,
        max_sentences=20,
        max_len=128,
    )
    # the tasks and tokenizer are those of random-init models: unused with a checkpoint
    result = corpus.translate_test(args, {"transformer": None}, None)
    sentences = _test_sentences(synthetic_dir, documents=2)
    assert [r["search"] for r in result["runs"]] == ["beam 2", "greedy"]
    for r in result["runs"]:
        assert r["params"].startswith(workdir) and r["forced_len"] is None
        assert r["sentences"] == sentences and r["recompilations"] == 0
        assert r["output_tokens"] == round(r["mean_output_len"] * sentences)
        assert 1 <= r["min_output_len"] <= r["max_output_len"]
        assert _positive(r["sentences_per_s"], r["tokens_per_s"], r["compile_seconds"])
        assert r["sentences_per_s_ratio"] == 1.0
    with pytest.raises(UsageError, match="not in --models"):
        corpus.translate_test(args, {"final": None}, None)
    args.corpus_checkpoint = [f"final={workdir}"]
    with pytest.raises(UsageError, match="trained transformer, not final"):
        corpus.translate_test(args, {"final": None}, None)


@pytest.mark.slow
def test_quick_run_as_a_whole(synthetic_dir, tmp_path):
    """``python launch/benchmark.py --quick --json FILE``, every default section and model."""
    tsv = _corpus_copy(synthetic_dir, tmp_path)
    result, stdout = _run(tmp_path, f"--tsv={tsv}", _test_tsv(synthetic_dir), fast=False)
    models = [r["model"] for r in result["train"]["runs"]]
    # Every registered model with a FLOP counter (test modules may register toy models
    # without one), the sentence Transformer first (the reference of the ratios).
    assert models[0] == "transformer"
    assert sorted(models) == sorted(n for n, e in registered().items() if e.flops is not None)
    assert {"transformer", "doc2doc", "final"} <= set(models)
    _check_train(result, models)
    _check_decode(result, models)
    _check_growth(result, ["transformer", "final"])
    _check_corpus(result, models, _test_sentences(synthetic_dir))
    assert stdout.count("\n| ") > 10


def test_pipeline_section(synthetic_dir, capsys):
    tsv = os.path.join(synthetic_dir, "train.tsv")
    args = argparse.Namespace(
        tsv=tsv,
        spm=None,
        modes="document,sentence",
        num_batches=5,
        max_sentences=20,
        max_len=128,
        batch_tokens=2048,
    )
    result = pipeline.pipeline_section(args, {})
    assert [(r["mode"], r["iterator"]) for r in result["runs"]] == [
        (m, i) for m in ("document", "sentence") for i in ("numpy", "numpy loader", "tf.data")
    ]
    for r in result["runs"]:
        assert r["batches"] == 5 and 0.0 <= r["padding_fraction"] < 1.0
    report.print_pipeline(result)
    assert "| document | tf.data |" in capsys.readouterr().out


def test_presets_fill_only_what_the_command_line_leaves_unset():
    unset = {key: None for key in benchmarking.PRESETS["full"]}
    args = argparse.Namespace(**dict(unset, quick=True, profile="trace", modes="document"))
    args.steps = 7
    benchmarking.apply_presets(args)
    assert args.size == "tiny" and args.steps == 7
    assert args.sections == "peak,train,corpus,decode,growth,profile"
    with pytest.raises(ValueError, match="unknown sections"):
        benchmarking.apply_presets(
            argparse.Namespace(
                **dict(unset, quick=False, profile=None, modes="document", sections="x")
            )
        )


def test_dummy_batch_has_no_padding_and_right_segments():
    batch = dummy_batch(3, 5, rows=2, vocab_size=50)
    assert batch["src"].shape == (2, 3, 5) and batch["src_mask"].all()
    assert (batch["src"] >= 4).all() and (batch["src"] < 50).all()
    assert batch["src_segment_ids"][1, :, 0].tolist() == [1, 2, 3]
    assert batch["src_positions"][0, 2].tolist() == [0, 1, 2, 3, 4]


def test_a_models_entry_sets_a_config_field_of_the_model():
    """``--models NAME:SWITCH`` turns a boolean on, ``NAME:FIELD=VALUE`` sets a field (values
    read as bools and numbers where they are; several joined by ``+``), an unknown field is a
    usage error."""
    from docnmt_jax.benchmarking import workload

    args = argparse.Namespace(size="tiny", dtype="float32", vocab=64)
    final = workload.build("final:xl_decoder=false", args, sentences=3)
    assert final.config.xl_decoder is False
    assert (
        workload.build("final:max_relative_distance=3", args, 3).config.max_relative_distance == 3
    )
    assert workload.build("final:recurrent", args, 3).config.recurrent is True
    several = workload.build("final:packed_layout=two_layout+packed_chunk_spans=2", args, 3)
    assert (several.config.packed_layout, several.config.packed_chunk_spans) == ("two_layout", 2)
    assert workload.field_value("two_layout") == "two_layout"
    assert workload.field_value("0.5") == 0.5
    with pytest.raises(Exception, match="has no field 'nonsense'"):
        workload.build("final:nonsense=1", args, 3)
