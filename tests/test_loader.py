"""The training loaders (tf.data and the prefetching NumPy iterator) give the same batches; the
TensorBoard events are written without TensorFlow; train/translate/evaluate run where
``import tensorflow`` fails."""

import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from conftest import ROOT, run_launch

from docnmt_jax.data import loader, pipeline
from docnmt_jax.data.documents import Document
from docnmt_jax.errors import ConfigError
from docnmt_jax.training.run_log import RunLog


def _documents(n_docs: int = 9) -> list[Document]:
    rng = np.random.default_rng(3)
    docs = []
    for d in range(n_docs):
        n = int(rng.integers(1, 7))
        src = tuple(
            " ".join(str(w) for w in rng.integers(3, 40, rng.integers(1, 12))) for _ in range(n)
        )
        tgt = tuple(
            " ".join(str(w) for w in rng.integers(3, 40, rng.integers(1, 12))) for _ in range(n)
        )
        docs.append(Document(f"d{d}", src, tgt))
    return docs


def _encode(texts: list[str]) -> list[list[int]]:
    return [[int(w) for w in text.split()] for text in texts]


def _plan(layout: str) -> pipeline.BatchPlan:
    packed = layout == "packed"
    config = pipeline.PipelineConfig(
        max_sentences=3,
        max_src_len=16,
        max_tgt_len=16,
        batch_src_tokens=96,
        batch_tgt_tokens=96,
        shuffle=True,
        num_epochs=None,
        seed=5,
        packing=pipeline.PackingConfig(unit="sentence", row_tokens=32) if packed else None,
        context_sentences=2 if layout == "grid_context" else 0,
    )
    return pipeline.plan_batches(_documents(), _encode, config)


def _take(iterator, n: int) -> list[dict]:
    return [next(iterator) for _ in range(n)]


def _assert_same(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert sorted(x) == sorted(y)
        for key in x:
            np.testing.assert_array_equal(np.asarray(x[key]), np.asarray(y[key]), err_msg=key)


@pytest.mark.parametrize("layout", ["grid", "grid_context", "packed"])
@pytest.mark.parametrize("start", [0, 7])
def test_numpy_loader_gives_tf_datas_batches(layout, start):
    """Element for element over more than an epoch, resumed mid-epoch too; the NumPy loader
    prefetches (a small queue, so the producer runs ahead and blocks)."""
    pytest.importorskip("tensorflow")
    plan = _plan(layout)
    n = 2 * plan.batches_per_epoch + 3
    tf_batches = _take(loader.train_batches(plan, start, loader="tf"), n)
    np_batches = _take(loader.train_batches(plan, start, loader="numpy", prefetch=2), n)
    _assert_same(tf_batches, np_batches)
    # ... and both equal the plain (unprefetched) iterator.
    _assert_same(np_batches, _take(pipeline.numpy_batches(plan, start_step=start), n))


def test_prefetch_keeps_order_under_a_slow_consumer():
    out = []
    for item in loader.prefetched(iter(range(50)), size=3):
        if item % 10 == 0:
            time.sleep(0.01)
        out.append(item)
    assert out == list(range(50))


def test_prefetch_raises_the_producers_error_at_its_batch():
    def broken():
        yield 1
        yield 2
        raise ValueError("bad batch 3")

    got = []
    with pytest.raises(ValueError, match="bad batch 3"):
        for item in loader.prefetched(broken(), size=4):
            got.append(item)
    assert got == [1, 2]


def test_closing_the_prefetcher_stops_its_thread():
    before = threading.active_count()
    stream = loader.prefetched(iter(range(10**9)), size=2)  # endless in practice
    assert next(stream) == 0
    stream.close()
    deadline = time.time() + 30
    while threading.active_count() > before and time.time() < deadline:
        time.sleep(0.05)
    assert threading.active_count() == before


def test_loader_names_are_checked():
    with pytest.raises(ConfigError, match=r"config\.data\.loader='grain'"):
        loader.resolve("grain")
    assert loader.resolve("numpy") == "numpy"
    assert loader.resolve("auto") in ("tf", "numpy")


def test_tensorboard_scalars_are_written_without_tensorflow(tmp_path):
    """The events carry the tags, steps and values written, as scalar-plugin summaries (what
    ``tf.summary.scalar`` writes), read back with TensorBoard's own reader."""
    from tensorboard.backend.event_processing import event_accumulator

    log = RunLog(str(tmp_path))
    log.write(5, {"loss": 2.5, "lr": 1e-3}, prefix="train/")
    log.write(10, {"loss": 2.25, "lr": 2e-3}, prefix="train/")
    log.write(10, {"dev_loss": 3.0})
    log.close()
    events = event_accumulator.EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert sorted(events.Tags()["tensors"]) == ["dev_loss", "train/loss", "train/lr"]
    got = {
        tag: [(e.step, float(e.tensor_proto.float_val[0])) for e in events.Tensors(tag)]
        for tag in events.Tags()["tensors"]
    }
    assert got == {
        "train/loss": [(5, 2.5), (10, 2.25)],
        "train/lr": [(5, pytest.approx(1e-3)), (10, pytest.approx(2e-3))],
        "dev_loss": [(10, 3.0)],
    }
    assert events.SummaryMetadata("train/loss").plugin_data.plugin_name == "scalars"
    assert "step=10 train/loss=2.25 train/lr=0.002" in (tmp_path / "train.log").read_text()


#: Makes ``import tensorflow`` fail in a subprocess (a package of that name that raises).
_NO_TF = "raise ImportError('tensorflow is blocked in this test')\n"


@pytest.fixture
def no_tensorflow_env(tmp_path):
    blocker = tmp_path / "blocker" / "tensorflow"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text(_NO_TF)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(blocker.parent), ROOT, env.get("PYTHONPATH", "")])
    return env


def _run(env, script, *args):
    out = run_launch(script, *args, timeout=900, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def test_train_translate_evaluate_run_without_tensorflow(
    no_tensorflow_env, synthetic_dir, tmp_path
):
    env = no_tensorflow_env
    check = subprocess.run(
        [sys.executable, "-c", "import tensorflow"], env=env, capture_output=True, text=True
    )
    assert check.returncode != 0 and "blocked" in check.stderr
    workdir = str(tmp_path / "run")
    tiny = {
        "data.data_dir": synthetic_dir,
        "data.vocab_size": 300,
        "data.batch_src_tokens": 256,
        "data.batch_tgt_tokens": 256,
        "model.d_model": 32,
        "model.num_heads": 2,
        "model.ffn_dim": 64,
        "model.num_encoder_layers": 1,
        "model.num_decoder_layers": 1,
        "train.num_steps": 4,
        "train.log_every": 2,
        "train.eval_every": 4,
        "train.checkpoint_every": 4,
        "train.dev_bleu_beam": 1,  # dev BLEU (sacreBLEU, the translator) runs too
    }
    flags = [f"--config.{k}={v}" for k, v in tiny.items()]
    _run(env, "train.py", "--config", "configs/transformer.py", "--workdir", workdir, *flags)
    log = open(os.path.join(workdir, "train.log")).read()
    assert "loader numpy" in log and "step=4" in log
    assert any(f.startswith("events") for f in os.listdir(os.path.join(workdir, "tensorboard")))
    hyp = str(tmp_path / "test.hyp.tsv")
    test = os.path.join(synthetic_dir, "test.tsv")
    _run(
        env,
        "translate.py",
        "--workdir",
        workdir,
        "--input",
        test,
        "--output",
        hyp,
        "--beam",
        "2",
        "--checkpoint",
        "latest",
    )
    scores = json.loads(_run(env, "evaluate.py", "--hyp", hyp, "--ref", test, "--json").stdout)
    assert 0 <= scores["s_bleu"]["score"] <= 100
