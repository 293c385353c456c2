"""The benchmark harness runs end to end at a tiny size and its numbers are sane."""

import os

from conftest import ROOT

from docnmt_jax.training.restore import dummy_batch


def _benchmark():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "benchmark", os.path.join(ROOT, "launch", "benchmark.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_benchmark_sections_run_and_are_sane(synthetic_dir, tmp_path):
    out = tmp_path / "bench.json"
    results = _benchmark().main(
        [
            "--sections=peak,train,pipeline",
            "--peak-size=256",
            "--size=tiny",
            "--length=8",
            "--batch-tokens=256",
            "--vocab=100",
            "--steps=2",
            f"--tsv={os.path.join(synthetic_dir, 'train.tsv')}",
            "--num-batches=5",
            f"--json={out}",
        ]
    )
    assert out.exists()
    assert results["peak"]["float32_gflops"] > 0
    run = results["train"]["runs"][0]
    assert run["step_seconds"] > 0 and run["tokens_per_s"] > 0
    # 256 budget / 8 tokens = 32 sentences of 8 target tokens.
    assert run["batch"] == [32, 1, 8] and run["target_tokens"] == 256
    assert run["xla_flops_per_step"] > 0
    for r in results["pipeline"]["runs"]:
        assert r["batches"] == 5 and 0.0 <= r["padding_fraction"] < 1.0


def test_dummy_batch_has_no_padding_and_right_segments():
    batch = dummy_batch(3, 5, rows=2, vocab_size=50)
    assert batch["src"].shape == (2, 3, 5) and batch["src_mask"].all()
    assert (batch["src"] >= 4).all() and (batch["src"] < 50).all()
    assert batch["src_segment_ids"][1, :, 0].tolist() == [1, 2, 3]
    assert batch["src_positions"][0, 2].tolist() == [0, 1, 2, 3, 4]
