"""Gradient accumulation, the parameter EMA and the absolute peak learning rate, each against an
independent reference: one batch of the micro-batches together, a float64 loop, the closed
form of the schedule; and exact resumes with both in the train state."""

import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from conftest import TINY_PAIRS, TINY_TRANSFORMER, tiny_config, tiny_pairs_batch

from docnmt_jax.models import build_model
from docnmt_jax.objectives import build_objective
from docnmt_jax.training import ema as ema_lib
from docnmt_jax.training import optim, restore, steps, supervision, trainer

PAIRS = TINY_PAIRS


def _grid_batch_and_model():
    """One [6, 1, T] grid batch of six different pairs and a tiny dropout-free Transformer."""
    full, vocab_size = tiny_pairs_batch()
    batch = _rows(full, 0, len(PAIRS))
    assert batch["src_mask"].sum(axis=(1, 2)).min() > 0  # six real pairs
    model = build_model(TINY_TRANSFORMER, vocab_size=vocab_size)
    params = nn.meta.unbox(model.init(jax.random.PRNGKey(0), batch)["params"])
    return batch, model, params


def _rows(batch, start, stop):
    return {k: v[start:stop] for k, v in batch.items()}


def _state(tx, params, accumulate=False, ema=False):
    state = {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": tx.init(params)}
    if accumulate:
        state["accum"] = steps.init_accumulator(params)
    if ema:
        state["ema"] = ema_lib.init(params)
    return jax.tree.map(jnp.array, state)


def test_accumulated_micro_batches_give_the_update_of_the_batches_together():
    batch, model, params = _grid_batch_and_model()
    objective = build_objective(None, model)
    # SGD: the update is the gradient itself, so the comparison is not blurred by Adam's
    # normalisation (whose first step is sign(g) for any scale of g).
    tx = optax.sgd(0.5)
    schedule = optax.constant_schedule(0.5)
    together, _ = steps.make_steps(objective, tx, schedule, seed=0)
    accumulated, _ = steps.make_steps(objective, tx, schedule, seed=0, accumulate_steps=3)
    # Micro-batches of unequal token counts: the loss is normalised over all of them.
    slices = [(0, 1), (1, 4), (4, 6)]
    reference = _state(tx, params)
    state = _state(tx, params, accumulate=True)
    for update in range(2):
        reference, _ = together(reference, batch)
        for i, (a, b) in enumerate(slices):
            state, metrics = accumulated(state, _rows(batch, a, b))
            assert int(state["step"]) == update + (i == len(slices) - 1)
            assert int(state["accum"]["micro"]) == (i + 1) % len(slices)
        assert float(state["accum"]["tokens"]) == 0.0  # reset after the update
        for got, want in zip(
            jax.tree.leaves(state["params"]), jax.tree.leaves(reference["params"]), strict=True
        ):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # The parameters did move (the comparison is not between two untouched trees).
    moved = max(
        float(jnp.max(jnp.abs(a - b)))
        for a, b in zip(jax.tree.leaves(state["params"]), jax.tree.leaves(params), strict=True)
    )
    assert moved > 1e-3


def test_ema_follows_the_ramped_average_of_a_float64_loop():
    batch, model, params = _grid_batch_and_model()
    objective = build_objective(None, model)
    tx, schedule = optim.make_optimizer(32, warmup_steps=4)
    train_step, _ = steps.make_steps(objective, tx, schedule, seed=0, ema_decay=0.8)
    state = _state(tx, params, ema=True)
    naive = jax.tree.map(lambda p: np.asarray(p, np.float64), params)
    for t in range(1, 7):
        state, _ = train_step(state, batch)
        d = min(0.8, (1 + t) / (10 + t))
        naive = jax.tree.map(
            lambda e, p, d=d: d * e + (1 - d) * np.asarray(p, np.float64), naive, state["params"]
        )
    for got, want in zip(jax.tree.leaves(state["ema"]), jax.tree.leaves(naive), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    differs = [
        float(np.max(np.abs(np.asarray(e) - np.asarray(p))))
        for e, p in zip(
            jax.tree.leaves(state["ema"]), jax.tree.leaves(state["params"]), strict=True
        )
    ]
    assert max(differs) > 1e-4  # the average is not the parameters


def test_absolute_peak_learning_rate_has_the_same_curve_shape():
    schedule = optim.inverse_sqrt_schedule(256, warmup_steps=100, scale=0.5, peak=2e-3)
    # Linear warm-up to scale * peak at step 100 (count 99), then peak * sqrt(100 / step).
    assert float(schedule(99)) == pytest.approx(1e-3, rel=1e-6)
    assert float(schedule(49)) == pytest.approx(0.5e-3, rel=1e-6)
    assert float(schedule(399)) == pytest.approx(1e-3 * (100 / 400) ** 0.5, rel=1e-6)
    paper = optim.inverse_sqrt_schedule(256, warmup_steps=100)
    assert float(paper(99)) == pytest.approx(256**-0.5 * 100**-0.5, rel=1e-6)
    with pytest.raises(Exception, match="learning_rate"):
        optim.inverse_sqrt_schedule(256, 100, peak=-1.0)


def _stop_at_call(monkeypatch, call: int):
    """The trainer's stop check answers 'sigterm' at its ``call``-th call (a signal that lands
    there: between micro-batches for the inner checks of an accumulation)."""
    calls = {"n": 0}
    real = supervision.stop_reason

    def stop_reason(flag, deadline, every_process):
        calls["n"] += 1
        return "sigterm" if calls["n"] == call else real(flag, deadline, every_process)

    monkeypatch.setattr(supervision, "stop_reason", stop_reason)


def _saved(workdir, step, tree):
    path = os.path.join(workdir, "checkpoints", str(step), "state")
    return jax.tree.map(np.asarray, ocp.StandardCheckpointer().restore(path)[tree])


def test_resume_in_the_middle_of_an_accumulation_is_exact(synthetic_dir, tmp_path, monkeypatch):
    def config(num_steps):
        cfg = tiny_config(synthetic_dir, num_steps=num_steps, accumulate_steps=3)
        cfg.train.ema_decay = 0.9
        cfg.train.checkpoint_every = 1
        return cfg

    straight = str(tmp_path / "straight")
    result = trainer.train_and_evaluate(config(3), straight, record_losses=True)
    assert result.step == 3
    resumed = str(tmp_path / "resumed")
    # Calls: update 1 (outer, 2 inner), update 2 (outer, then inner after micro-batch 1).
    _stop_at_call(monkeypatch, 5)
    stopped = trainer.train_and_evaluate(config(3), resumed, record_losses=True)
    assert stopped.step == 1 and stopped.stopped_by == "sigterm"
    # Checkpoints are numbered by micro-batches consumed: 3 (update 1) and 4 (mid-update 2).
    assert sorted(int(d) for d in os.listdir(os.path.join(resumed, "checkpoints"))) == [3, 4]
    assert int(_saved(resumed, 4, "accum")["micro"]) == 1
    monkeypatch.undo()
    finished = trainer.train_and_evaluate(config(3), resumed, record_losses=True)
    assert finished.step == 3
    # Update 2's recorded loss covers only the micro-batches each run saw; updates 1 and 3
    # are whole in both.
    np.testing.assert_allclose(stopped.losses[0], result.losses[0], rtol=1e-6)
    np.testing.assert_allclose(finished.losses[-1], result.losses[-1], rtol=1e-6)
    for tree in ("params", "ema", "opt_state"):
        a, b = _saved(straight, 9, tree), _saved(resumed, 9, tree)
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
            np.testing.assert_array_equal(x, y)
    log = open(os.path.join(resumed, "train.log")).read()
    assert "micro-batch 1 of 3" in log


def test_ema_is_checkpointed_and_read_by_translation(synthetic_dir, tmp_path):
    workdir = str(tmp_path / "run")
    cfg = tiny_config(synthetic_dir, num_steps=4, ema_decay=0.5)
    trainer.train_and_evaluate(cfg, workdir)
    saved_ema, saved_raw = _saved(workdir, 4, "ema"), _saved(workdir, 4, "params")
    model, tokenizer, _ = restore.load_model(workdir)
    for which, want in (("auto", saved_ema), ("ema", saved_ema), ("raw", saved_raw)):
        params, step = restore.load_params(model, workdir, "latest", params=which)
        assert step == 4
        for x, y in zip(jax.tree.leaves(params), jax.tree.leaves(want), strict=True):
            np.testing.assert_array_equal(x, y)
    # The dev loss of the run is the EMA's: the evaluation of the restored EMA gives it.
    meta = open(os.path.join(workdir, "train.log")).read()
    assert "dev_loss=" in meta
    plain = str(tmp_path / "plain")
    trainer.train_and_evaluate(tiny_config(synthetic_dir, num_steps=4), plain)
    with pytest.raises(Exception, match="kept no EMA"):
        restore.load_params(model, plain, "latest", params="ema")
