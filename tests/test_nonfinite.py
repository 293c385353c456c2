"""The non-finite guard (docs/reliability.md).

Faults are injected by the tests only: a batch gets a source token id beyond the vocabulary
(the embedding lookup fills such a row with NaN, so loss and gradients are NaN), the objective
gets a term whose value is 0 but whose gradient is Inf, or the restored parameters get a NaN.
References are runs without the fault: a skipped step must leave exactly the parameters and
optimiser state the clean run had before it.
"""

import json
import os
import re
import shutil
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from conftest import ROOT, tiny_config

from docnmt_jax.data import pipeline, readers
from docnmt_jax.data.schema import dummy_batch
from docnmt_jax.data.tokenizer import EOS_ID, get_or_train_tokenizer, load_tokenizer
from docnmt_jax.models import build_model
from docnmt_jax.objectives import build_objective
from docnmt_jax.training import checkpoints, optim, trainer

BAD_ID = 10**6  # a source token id far beyond any vocabulary


@pytest.fixture(scope="module")
def shared_tokenizer(synthetic_dir, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("spm") / "spm.model")
    get_or_train_tokenizer(path, _train_docs(synthetic_dir), vocab_size=300)
    return path


def _train_docs(synthetic_dir):
    return readers.read_tsv(os.path.join(synthetic_dir, "train.tsv"))


def _config(synthetic_dir, tokenizer, **train):
    config = tiny_config(synthetic_dir, log_every=1, keep_checkpoints=20, **train)
    config.data.tokenizer = tokenizer
    return config


def _poison(monkeypatch, steps, seen):
    """The batches of ``steps`` (1-based) get ``BAD_ID`` as their first source token; each one
    is recorded in ``seen`` (as the pipeline gave it) before that."""
    make_dataset = pipeline.make_dataset

    def poisoned(plan, start_step=0, **kwargs):
        dataset = make_dataset(plan, start_step=start_step, **kwargs)

        class Dataset:
            def as_numpy_iterator(self):
                for index, batch in enumerate(dataset.as_numpy_iterator(), start_step):
                    if index + 1 in steps:
                        seen[index + 1] = batch
                        src = batch["src"].copy()
                        src[(0,) * src.ndim] = BAD_ID
                        batch = dict(batch, src=src)
                    yield batch

        return Dataset()

    monkeypatch.setattr(pipeline, "make_dataset", poisoned)


def _read_state(workdir, step):
    path = os.path.join(workdir, "checkpoints", str(step), "state")
    return ocp.StandardCheckpointer().restore(path)


def _assert_same(got, want):
    leaves = jax.tree_util.tree_leaves
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    for a, b in zip(leaves(got), leaves(want), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.fixture(scope="module")
def reference(synthetic_dir, shared_tokenizer, tmp_path_factory):
    """The clean run: 8 steps, a checkpoint after every one."""
    workdir = str(tmp_path_factory.mktemp("reference"))
    config = _config(synthetic_dir, shared_tokenizer, num_steps=8, checkpoint_every=1)
    result = trainer.train_and_evaluate(config, workdir, record_losses=True)
    assert result.step == 8 and all(np.isfinite(result.losses))
    return workdir, result.losses


# ---------------------------------------------------------------------------------------------
# The jitted step.


def test_the_step_skips_a_nonfinite_gradient_with_a_finite_loss():
    """An objective term worth 0 whose gradient is Inf on marked batches: the loss stays finite,
    the gradient norm does not; the step keeps parameters and moments and counts one bad step.
    On unmarked batches the term adds exactly 0 to value and gradient: the step is the plain
    one (compared with the plain objective's step)."""
    model = build_model(
        {
            "d_model": 16,
            "num_heads": 2,
            "ffn_dim": 32,
            "num_encoder_layers": 1,
            "num_decoder_layers": 1,
        },
        vocab_size=40,
    )
    plain = build_objective(None, model)

    class InfGradient:
        def __getattr__(self, name):
            return getattr(plain, name)

        def loss(self, params, batch, rng, train):
            loss, metrics = plain.loss(params, batch, rng, train)
            marked = jnp.any(batch["src"] == 39)
            leaf = jax.tree_util.tree_leaves(params)[0]
            zero = leaf - jax.lax.stop_gradient(leaf)  # value 0, derivative 1
            term = jnp.sqrt(zero + jnp.where(marked, 0.0, 1.0)) * jnp.where(marked, 1.0, 0.0)
            return loss + jnp.sum(term), metrics

    batch = dummy_batch(sentences=1, length=6, rows=2, vocab_size=39)
    marked = dict(batch, src=np.where(batch["src"] > 0, 39, 0).astype(batch["src"].dtype))
    params = model.init(jax.random.PRNGKey(0), batch)["params"]
    params = jax.tree_util.tree_map(np.asarray, nn.meta.unbox(params))
    tx, schedule = optim.make_optimizer(16, warmup_steps=4, lr_scale=1.0)

    def fresh():
        return {
            "step": jnp.zeros((), jnp.int32),
            "params": jax.tree_util.tree_map(jnp.asarray, params),
            "opt_state": tx.init(params),
        }

    guarded_step, _ = trainer.make_steps(InfGradient(), tx, schedule, seed=0)
    plain_step, _ = trainer.make_steps(plain, tx, schedule, seed=0)
    before = jax.tree_util.tree_map(np.asarray, fresh())
    state, metrics = guarded_step(fresh(), marked)
    assert np.isfinite(float(metrics["loss"].value()))
    assert not np.isfinite(float(metrics["grad_norm"].total))
    assert float(metrics["bad_steps"].total) == 1.0
    assert int(state["step"]) == 1
    _assert_same(state["params"], before["params"])
    _assert_same(state["opt_state"], before["opt_state"])
    # Unmarked: the same step as the plain objective's, and not counted.
    got, got_metrics = guarded_step(fresh(), batch)
    want, _ = plain_step(fresh(), batch)
    assert float(got_metrics["bad_steps"].total) == 0.0
    _assert_same(got, want)


# ---------------------------------------------------------------------------------------------
# Training runs.


def test_bad_batches_change_nothing_and_training_goes_on(
    synthetic_dir, shared_tokenizer, reference, tmp_path, monkeypatch
):
    """Steps 3 and 4 get NaN: their checkpoints hold the clean run's step-2 parameters and
    optimiser state exactly; steps 5 and 6 train again (finite, parameters moving)."""
    ref_dir, ref_losses = reference
    workdir = str(tmp_path / "run")
    _poison(monkeypatch, {3, 4}, {})
    config = _config(
        synthetic_dir, shared_tokenizer, num_steps=6, checkpoint_every=1, max_bad_steps=3
    )
    result = trainer.train_and_evaluate(config, workdir, record_losses=True)
    assert result.step == 6
    losses = np.asarray(result.losses)
    assert np.isnan(losses[2:4]).all() and np.isfinite(losses[[0, 1, 4, 5]]).all()
    np.testing.assert_allclose(losses[:2], ref_losses[:2], rtol=1e-5)
    clean = _read_state(ref_dir, 2)
    for step in (2, 3, 4):
        state = _read_state(workdir, step)
        assert int(state["step"]) == step
        _assert_same(state["params"], clean["params"])
        _assert_same(state["opt_state"], clean["opt_state"])
    fifth = _read_state(workdir, 5)["params"]
    moved = [
        not np.array_equal(a, b)
        for a, b in zip(
            jax.tree_util.tree_leaves(fifth),
            jax.tree_util.tree_leaves(clean["params"]),
            strict=True,
        )
    ]
    assert any(moved)
    assert all(np.isfinite(x).all() for x in jax.tree_util.tree_leaves(_read_state(workdir, 6)))
    log = open(os.path.join(workdir, "train.log")).read()
    counts = dict(re.findall(r" step=(\d+) train/bad_steps=(\S+) ", log))
    assert counts == {"1": "0", "2": "0", "3": "1", "4": "1", "5": "0", "6": "0"}


def _doc_ids_of_grid_batch(batch, docs):
    order = dict.fromkeys(int(d) for d in batch["doc_index"].ravel() if d >= 0)
    return [docs[d].doc_id for d in order]


def _doc_ids_of_packed_batch(batch, docs, tokenizer):
    """Documents of a packed batch found by its source sentences' tokens (each segment of a row
    is one sentence ending with EOS), looked up among the tokenised training sentences."""
    owner: dict[tuple[int, ...], set[str]] = {}
    for doc in docs:
        for ids in tokenizer.encode_batch(list(doc.src)):
            owner.setdefault((*ids, EOS_ID), set()).add(doc.doc_id)
    found = []
    for row, segments in zip(batch["src"], batch["src_segment_ids"], strict=True):
        for segment in dict.fromkeys(int(s) for s in segments if s > 0):
            sentence = tuple(int(t) for t in row[segments == segment])
            candidates = owner[sentence]
            assert len(candidates) == 1, (sentence, candidates)
            found.append(next(iter(candidates)))
    return list(dict.fromkeys(found))


@pytest.mark.parametrize(
    "packed", [True, pytest.param(False, marks=pytest.mark.slow)], ids=["packed", "grid"]
)
def test_consecutive_bad_steps_stop_naming_step_documents_and_checkpoint(
    synthetic_dir, shared_tokenizer, tmp_path, monkeypatch, packed
):
    """From step 5 on every batch is poisoned; with max_bad_steps=3 the run stops at step 7
    with one line naming the steps, the documents of step 7's batch (found here from the batch
    itself) and checkpoint 4; nothing is saved after it."""
    workdir = str(tmp_path / "run")
    seen = {}
    _poison(monkeypatch, set(range(5, 100)), seen)
    config = _config(
        synthetic_dir, shared_tokenizer, num_steps=20, checkpoint_every=4, max_bad_steps=3
    )
    config.data.packed = packed
    with pytest.raises(checkpoints.NonFiniteError) as error:
        trainer.train_and_evaluate(config, workdir)
    message = str(error.value)
    assert "\n" not in message
    docs = _train_docs(synthetic_dir)
    if packed:
        named = _doc_ids_of_packed_batch(seen[7], docs, load_tokenizer(shared_tokenizer))
    else:
        named = _doc_ids_of_grid_batch(seen[7], docs)
    assert named
    more = f" and {len(named) - 12} more" if len(named) > 12 else ""
    checkpoint = os.path.join(workdir, "checkpoints", "4")
    assert message == (
        "3 consecutive steps with a non-finite loss or gradient norm (train.max_bad_steps=3), "
        "steps 5-7: training stopped at step 7 (loss nan, gradient norm nan; parameters "
        f"unchanged since step 4); the batch of step 7 holds documents "
        f"{', '.join(named[:12])}{more}; last good checkpoint: {checkpoint} (step 4)"
    )
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["4"]
    assert f"stopped: {message}" in open(os.path.join(workdir, "train.log")).read()


def test_a_nonfinite_state_is_never_saved_and_the_last_good_one_resumes(
    synthetic_dir, shared_tokenizer, reference, tmp_path, monkeypatch
):
    """Resuming the clean run's step 4 with a NaN put into one parameter (max_bad_steps=0: the
    guard skips, never stops): the save of step 6 is refused naming that array and checkpoint
    4. Resumed without the fault, the run goes on from 4 with the clean run's losses."""
    ref_dir, ref_losses = reference
    workdir = tmp_path / "run"
    for step in (2, 4):
        shutil.copytree(
            os.path.join(ref_dir, "checkpoints", str(step)), workdir / "checkpoints" / str(step)
        )
    restore = checkpoints.Checkpointer.restore
    poisoned_path = []

    def poisoned(self, which, target, **kwargs):
        state, meta = restore(self, which, target, **kwargs)
        flat = jax.tree_util.tree_flatten_with_path(state["params"])
        (path, leaf), *_ = flat[0]
        poisoned_path.append("/".join(k.key for k in path))
        leaves = [leaf.at[(0,) * leaf.ndim].set(jnp.nan)] + [x for _, x in flat[0][1:]]
        params = jax.tree_util.tree_unflatten(flat[1], leaves)
        return dict(state, params=params), meta

    config = _config(
        synthetic_dir, shared_tokenizer, num_steps=8, checkpoint_every=2, max_bad_steps=0
    )
    with monkeypatch.context() as patch:
        patch.setattr(checkpoints.Checkpointer, "restore", poisoned)
        with pytest.raises(checkpoints.NonFiniteError) as error:
            trainer.train_and_evaluate(config, str(workdir))
    assert str(error.value) == (
        f"training stopped: step 6: the train state holds NaN or Inf in 1 arrays "
        f"(params/{poisoned_path[0]}); not saved; last good checkpoint: "
        f"{workdir / 'checkpoints' / '4'} (step 4)"
    )
    assert sorted(os.listdir(workdir / "checkpoints")) == ["2", "4"]
    config.train.num_steps = 6
    result = trainer.train_and_evaluate(config, str(workdir), record_losses=True)
    assert "resumed from step 4 " in (workdir / "train.log").read_text()
    np.testing.assert_allclose(result.losses, ref_losses[4:6], rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_train_py_stops_a_diverged_run_with_one_line(
    synthetic_dir, shared_tokenizer, reference, tmp_path
):
    """Through the command line: parameters initialised (``init_from``) from a checkpoint with a
    NaN make every step bad; train.py exits 1 with a one-line error naming step 3, its
    documents and that no checkpoint was saved."""
    ref_dir, _ = reference
    state = jax.tree_util.tree_map(np.array, _read_state(ref_dir, 2))
    kernel = jax.tree_util.tree_leaves(state["params"])[0]
    kernel[(0,) * kernel.ndim] = np.nan
    writer = ocp.StandardCheckpointer()
    writer.save(str(tmp_path / "nan" / "2" / "state"), state)
    writer.wait_until_finished()
    config = _config(
        synthetic_dir, shared_tokenizer, num_steps=50, checkpoint_every=1000, max_bad_steps=3
    )
    config.init_from = str(tmp_path / "nan" / "2")
    (tmp_path / "config.json").write_text(config.to_json())
    config_file = tmp_path / "config_from_json.py"
    source = str(tmp_path / "config.json")
    config_file.write_text(
        "import json\nimport ml_collections\n\n\ndef get_config():\n"
        f"    return ml_collections.ConfigDict(json.load(open({source!r})))\n"
    )
    workdir = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "launch", "train.py"),
            f"--config={config_file}",
            f"--workdir={workdir}",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-4000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("train.py: error:")]
    assert len(errors) == 1, proc.stderr[-4000:]
    assert re.fullmatch(
        r"train\.py: error: 3 consecutive steps with a non-finite loss or gradient norm "
        r"\(train\.max_bad_steps=3\), steps 1-3: training stopped at step 3 \(loss nan, gradient "
        r"norm nan; parameters unchanged since step 0\); the batch of step 3 holds documents "
        r"train-\d+(, train-\d+)*( and \d+ more)?; last good checkpoint: none saved yet",
        errors[0],
    ), errors[0]
    assert not os.listdir(workdir / "checkpoints")
    assert json.loads((workdir / "config.json").read_text())["init_from"] == config.init_from
