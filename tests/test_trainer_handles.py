"""The trainer's handles: early stopping (``train.patience``), decoupled weight decay
(``train.weight_decay``) and the refusal of float16 training."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import run_launch, tiny_config

from docnmt_jax import parallel
from docnmt_jax.errors import ConfigError
from docnmt_jax.models import Metric, build_model
from docnmt_jax.training import optim, trainer
from docnmt_jax.training import state as train_state
from docnmt_jax.training.run_checkpoints import Progress, RunCheckpoints
from docnmt_jax.training.run_log import RunLog

# --------------------------------------------------------------------------- patience


def _log(workdir: str) -> str:
    with open(os.path.join(workdir, "train.log"), encoding="utf-8") as f:
        return f.read()


def _checkpoint_meta(checkpoint: str) -> dict:
    with open(os.path.join(checkpoint, "meta", "metadata"), encoding="utf-8") as f:
        return json.load(f)


#: Scripted dev losses by step (eval_every 2): better at 2, 4 and 10; 6 and 8 are not (4.0 ties
#: the best), nor 12, 14 and 16. With patience 3 the run stops at step 16, having reset its
#: count at step 10.
SCRIPTED_DEV_LOSS = {2: 5.0, 4: 4.0, 6: 4.0, 8: 4.5, 10: 3.9, 12: 3.9, 14: 4.2, 16: 3.95}
SCRIPTED_DEV_LOSS.update({18: 3.9, 20: 4.0})  # a resume with patience 5 stops at 20


def _scripted_loop(config, workdir: str) -> tuple[trainer.TrainLoop, RunCheckpoints]:
    """A :class:`TrainLoop` on a toy state, whose train step counts and whose dev evaluation
    returns :data:`SCRIPTED_DEV_LOSS` (real checkpoints and log in ``workdir``)."""
    state = {"step": jnp.zeros((), jnp.int32), "params": {"w": jnp.ones((3,), jnp.float32)}}
    saved = RunCheckpoints(workdir, config)
    restored = saved.restore_latest(jax.eval_shape(lambda: state), warn=print)
    if restored is not None:
        state = restored[0]
    one = Metric(jnp.float32(1.0), jnp.float32(1.0))

    def train_step(state, batch):
        return dict(state, step=state["step"] + 1), {"loss": one, "lr": one}

    def evaluate(state, step):
        return {"dev_loss": SCRIPTED_DEV_LOSS[step]}

    batches = iter(lambda: {"x": np.zeros((1, 1), np.int32)}, None)
    layout = parallel.Layout(parallel.make_mesh({}))
    progress = Progress.of(state, 1)
    loop = trainer.TrainLoop(
        config, state, progress, train_step, batches, layout, evaluate, saved, RunLog(workdir)
    )
    return loop, saved


def test_patience_counts_evaluations_since_the_best_and_resumes_the_count(tmp_path):
    config = tiny_config("unused", num_steps=40, eval_every=2, patience=3, max_bad_steps=0)
    workdir = str(tmp_path / "run")
    os.makedirs(workdir)
    loop, _ = _scripted_loop(config, workdir)
    result = loop.run(train_plan=None, record_losses=False)
    assert (result.step, result.stopped_by) == (16, "patience")
    assert os.path.basename(result.checkpoint) == "16"
    meta = _checkpoint_meta(result.checkpoint)
    assert (meta["best_value"], meta["best_step"], meta["evals_without_improvement"]) == (
        3.9,
        10,
        3,
    )
    assert (
        "stopping at step 16: no improvement of dev_loss in 3 evaluations (best 3.9 at step 10)"
        in _log(workdir)
    )

    # Resumed: the count (3) and the best come back with the checkpoint, so patience 3 stops
    # at once, and patience 5 after two more evaluations (a count lost on resume: 5 more).
    loop, saved = _scripted_loop(config, workdir)
    assert (saved.evals_without_improvement, saved.best_step) == (3, 10)
    again = loop.run(train_plan=None, record_losses=False)
    assert (again.step, again.stopped_by) == (16, "patience")
    assert "not training past step 16" in _log(workdir)
    config.train.patience = 5
    loop, _ = _scripted_loop(config, workdir)
    more = loop.run(train_plan=None, record_losses=False)
    assert (more.step, more.stopped_by) == (20, "patience")


@pytest.mark.slow  # ~15 s of CPU: three runs compile a model; the scripted loop above is fast
def test_patience_stops_a_run_that_cannot_improve_and_its_count_survives_a_resume(
    synthetic_dir, tmp_path
):
    # Learning rate 0: the parameters never change, so every dev loss equals the first one
    # (at step 1, the best); an equal value is no improvement. With eval_every 1 and patience
    # 2 the evaluations at steps 2 and 3 do not improve: the run stops at 1 * (2 + 1) = 3.
    workdir = str(tmp_path / "run")
    config = tiny_config(
        synthetic_dir, num_steps=30, eval_every=1, patience=2, lr_scale=0.0, aot_compile=False
    )
    config.data.loader = "numpy"  # the same batches as tf.data, without importing TensorFlow
    result = trainer.train_and_evaluate(config, workdir)
    assert (result.step, result.stopped_by) == (3, "patience")
    assert os.path.basename(result.checkpoint) == "3"  # saved as at a normal end
    meta = _checkpoint_meta(result.checkpoint)
    assert (meta["best_step"], meta["evals_without_improvement"]) == (1, 2)
    best = meta["best_value"]
    assert best == result.dev_metrics["dev_loss"]  # unchanged parameters, the same loss
    line = f"stopping at step 3: no improvement of dev_loss in 2 evaluations (best {best:.4g} "
    assert line + "at step 1)" in _log(workdir)

    # Resumed as it is: its patience is spent, it trains nothing.
    again = trainer.train_and_evaluate(config, workdir)
    assert (again.step, again.stopped_by) == (3, "patience")
    assert "not training past step 3" in _log(workdir)

    # Resumed with patience 4: it counts on from 2, so it stops after two more evaluations
    # (a count lost on resume would run to step 7).
    config.train.patience = 4
    more = trainer.train_and_evaluate(config, workdir)
    assert (more.step, more.stopped_by) == (5, "patience")
    assert "stopping at step 5: no improvement of dev_loss in 4 evaluations" in _log(workdir)


def test_negative_patience_or_weight_decay_is_refused(synthetic_dir, tmp_path):
    for key, value in (("patience", -1), ("weight_decay", -0.1)):
        config = tiny_config(synthetic_dir, **{key: value})
        try:
            trainer.train_and_evaluate(config, str(tmp_path / key))
        except ConfigError as e:
            assert f"config.train.{key} must be" in str(e)
        else:
            raise AssertionError(f"train.{key}={value} was accepted")
        assert not os.path.exists(tmp_path / key)  # refused before the workdir is made


# --------------------------------------------------------------------------- weight decay


def _naive_lr(step: int, peak: float, warmup: int) -> float:
    """The inverse-sqrt schedule with an absolute peak at update ``step`` (1-based)."""
    return peak * warmup**0.5 * min(step**-0.5, step * warmup**-1.5)


def _toy_params() -> dict:
    rng = np.random.default_rng(0)
    return {
        "dense": {"kernel": rng.normal(size=(3, 4)), "bias": rng.normal(size=(4,))},
        "attention": {"kernel": rng.normal(size=(4, 2, 2)), "bias": rng.normal(size=(2, 2))},
        "norm": {"scale": 1.0 + rng.normal(size=(4,))},
        "embed": {"embedding": rng.normal(size=(5, 4))},
    }


def test_weight_decay_shrinks_weights_by_one_minus_lr_wd_and_leaves_norms_and_biases():
    peak, warmup, wd, steps = 0.1, 4, 0.5, 7
    params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), _toy_params())
    tx, _ = optim.make_optimizer(32, warmup, learning_rate=peak, weight_decay=wd)
    state, update = tx.init(params), jax.jit(tx.update)
    zeros = jax.tree.map(jnp.zeros_like, params)
    current = params
    for _ in range(steps):
        updates, state = update(zeros, state, current)
        current = optax.apply_updates(current, updates)

    factor = np.prod([1.0 - _naive_lr(t, peak, warmup) * wd for t in range(1, steps + 1)])
    assert factor < 0.9  # the decay is visible
    for group in ("dense", "attention"):
        np.testing.assert_allclose(
            current[group]["kernel"], factor * np.asarray(params[group]["kernel"]), rtol=1e-5
        )
        np.testing.assert_array_equal(current[group]["bias"], params[group]["bias"])
    np.testing.assert_allclose(
        current["embed"]["embedding"], factor * np.asarray(params["embed"]["embedding"]), rtol=1e-5
    )
    np.testing.assert_array_equal(current["norm"]["scale"], params["norm"]["scale"])


def test_weight_decay_equals_optax_adamw_with_the_mask_and_keeps_adams_state():
    peak, warmup, wd = 0.01, 3, 0.1
    params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), _toy_params())
    mask = {
        "dense": {"kernel": True, "bias": False},
        "attention": {"kernel": True, "bias": False},
        "norm": {"scale": False},
        "embed": {"embedding": True},
    }
    assert optim.decay_mask(params) == mask
    tx, schedule = optim.make_optimizer(32, warmup, learning_rate=peak, weight_decay=wd)
    reference = optax.adamw(schedule, b1=0.9, b2=0.98, eps=1e-9, weight_decay=wd, mask=mask)
    ours, ref_state, theirs = tx.init(params), reference.init(params), params
    current = params
    rng = np.random.default_rng(1)
    for _ in range(5):
        grads = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), p.dtype), current)
        updates, ours = tx.update(grads, ours, current)
        ref_updates, ref_state = reference.update(grads, ref_state, theirs)
        current = optax.apply_updates(current, updates)
        theirs = optax.apply_updates(theirs, ref_updates)
    for a, b in zip(jax.tree.leaves(current), jax.tree.leaves(theirs), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)

    # The state of plain Adam: a run can resume under another weight_decay.
    plain, _ = optim.make_optimizer(32, warmup, learning_rate=peak)
    assert jax.tree.structure(plain.init(params)) == jax.tree.structure(tx.init(params))


def test_train_weight_decay_reaches_the_optimizer_and_frozen_parameters_stay(synthetic_dir):
    config = tiny_config(synthetic_dir, weight_decay=0.25, freeze=("^encoder_layers_0/ffn/",))
    model = build_model(config.model, 300)
    layout = parallel.Layout(parallel.make_mesh({}))
    _, abstract, tx, schedule = train_state.build_optimizer_state(model, config, layout, print)
    rng = np.random.default_rng(0)
    params = jax.tree.map(
        lambda x: jnp.asarray(rng.normal(size=x.shape), x.dtype), abstract["params"]
    )
    zeros = jax.tree.map(jnp.zeros_like, params)
    updates, _ = jax.jit(tx.update)(zeros, tx.init(params), params)
    new = optax.apply_updates(params, updates)
    shrink = 1.0 - float(schedule(0)) * 0.25
    assert shrink < 1.0
    decoder, encoder = new["decoder_layers_0"], new["encoder_layers_0"]
    old_decoder, old_encoder = params["decoder_layers_0"], params["encoder_layers_0"]
    for got, start in (
        (new["embed"]["embedding"], params["embed"]["embedding"]),
        (decoder["ffn"]["wi"]["kernel"], old_decoder["ffn"]["wi"]["kernel"]),
    ):
        np.testing.assert_allclose(got, shrink * np.asarray(start), rtol=1e-6)
    query_bias = old_encoder["self_attention"]["query"]["bias"]
    assert query_bias.ndim == 2  # a 2-D bias: not decayed
    for got, start in (
        (encoder["ffn"]["wi"]["kernel"], old_encoder["ffn"]["wi"]["kernel"]),  # frozen
        (encoder["ffn_block"]["norm"]["scale"], old_encoder["ffn_block"]["norm"]["scale"]),
        (encoder["self_attention"]["query"]["bias"], query_bias),
    ):
        np.testing.assert_array_equal(got, start)


# --------------------------------------------------------------------------- float16


def test_float16_training_is_refused_with_one_line(tmp_path):
    workdir = tmp_path / "run"
    result = run_launch(
        "train.py",
        "--config=configs/transformer.py",
        "--config.model.dtype=float16",
        f"--workdir={workdir}",
        timeout=300,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert lines[-1] == (
        "train.py: error: config.model.dtype=float16 needs loss scaling, which docnmt_jax does "
        "not implement; use bfloat16 (same speed on accelerators, float32's range)"
    ), result.stderr[-2000:]
    assert not any("Traceback" in line for line in lines)
    assert not workdir.exists()
