"""The declared model interface: a model and an objective registered here, in the test file,
train, evaluate, score and translate through the unchanged trainer, translator and launch
scripts; frozen parameters; random context; one-line errors for unknown names."""

import dataclasses
import json
import os
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from conftest import ROOT, tiny_config, tiny_final_config

from docnmt_jax.data import readers
from docnmt_jax.data.schema import dummy_batch
from docnmt_jax.data.tokenizer import BOS_ID
from docnmt_jax.decoding.search import SearchConfig, search_rows, sentence_limits
from docnmt_jax.evaluation import contrastive
from docnmt_jax.models import (
    BaseModel,
    BatchLayout,
    Metric,
    Model,
    ModelError,
    build_model,
    layers,
    registered,
)
from docnmt_jax.models.base import random_context_batch, register
from docnmt_jax.models.transformer import sentence_rows
from docnmt_jax.objectives import Objective, ObjectiveError, build_objective, register_objective
from docnmt_jax.training import dev_eval, optim, restore, trainer
from docnmt_jax.training import state as train_state

# ---------------------------------------------------------------------------------------------
# A toy model and a toy objective, registered by this file only.


@dataclasses.dataclass(frozen=True)
class ToyConfig:
    """Bag-of-source-words decoder: logits = W (E[y_{t-1}] + mean_j E[x_j])."""

    vocab_size: int = 300
    d_model: int = 16
    deterministic: bool = False


class ToyModule(nn.Module):
    config: ToyConfig

    def setup(self) -> None:
        cfg = self.config
        self.embed = layers.SharedEmbedding(cfg.vocab_size, cfg.d_model)
        self.mix = nn.Dense(cfg.d_model)

    def encode(self, src, src_mask):
        weights = src_mask[..., None].astype(jnp.float32)
        total = jnp.sum(self.embed(src) * weights, axis=1, keepdims=True)
        return total / jnp.maximum(jnp.sum(weights, axis=1, keepdims=True), 1.0)  # [N, 1, D]

    def _logits(self, previous, context):
        return self.embed.attend(jnp.tanh(self.mix(self.embed(previous) + context)))

    def __call__(self, src, src_mask, tgt, tgt_mask):
        return self._logits(layers.shift_right(tgt, BOS_ID), self.encode(src, src_mask))

    def init_cache(self, batch, max_len):  # no state but the step count of every row
        return {"steps": jnp.zeros((batch,), jnp.int32)}

    def decode_inputs(self, encoded, src_mask):
        return {"src_mask": src_mask, "context": encoded}

    def decode_step(self, cache, token, extra):
        context = jnp.repeat(extra["context"], token.shape[0] // extra["context"].shape[0], 0)
        logits = self._logits(token[:, None], context)[:, 0]
        return logits, {"steps": cache["steps"] + 1}


@register("toy_bag_of_words", config=ToyConfig)
class ToyModel(BaseModel):
    module_class = ToyModule
    layout = BatchLayout.SENTENCES

    def rows(self, batch):
        return sentence_rows(batch)

    def translate(self, params, batch, search):
        rows = sentence_rows(batch)
        max_len, limits = sentence_limits(rows["src_mask"], search)
        result = search_rows(
            self.eval_module, params, rows["src"], rows["src_mask"], search, max_len, limits
        )
        return result.sequences[:, 0].reshape(batch["src"].shape[:2] + (max_len,)), {}


@dataclasses.dataclass(frozen=True)
class ScaledOptions:
    scale: float = 2.0


@register_objective("toy_scaled_likelihood")
class ScaledLikelihood(Objective):
    """The model's loss times ``scale``, reporting the scale as a metric."""

    options_class = ScaledOptions

    def loss(self, params, batch, rng, train):
        loss, metrics = self.model.loss(params, batch, rng, train)
        one = jnp.ones(())
        return self.options.scale * loss, dict(metrics, scale=Metric(self.options.scale * one, one))


@register_objective("toy_needs_context")
class NeedsContext(Objective):
    def check(self, model):
        if model.layout.sentence_level:
            raise ObjectiveError(f"toy_needs_context: model {model.name!r} has no context")


def _toy_config(data_dir, **train):
    config = tiny_config(data_dir, **train)
    config.model = ml_collections.ConfigDict({"name": "toy_bag_of_words", "d_model": 16})
    config.objective.name = "toy_scaled_likelihood"
    config.objective.scale = 3.0
    return config


# ---------------------------------------------------------------------------------------------


def test_every_registered_model_implements_the_protocol():
    for name, entry in registered().items():
        if name.startswith("test_"):
            continue
        config = entry.config_class(vocab_size=50) if name != "toy_bag_of_words" else ToyConfig()
        model = entry.model_class(config)
        assert isinstance(model, Model) and model.name == name
        assert isinstance(model.layout, BatchLayout)


def test_carried_state_is_read_from_the_declared_capability():
    """Only FINAL with its recurrent switch carries state; a model with the switch but not the
    CarriedState members does not (the capability, not an attribute, decides)."""
    from docnmt_jax.models import contract

    carrying = {
        name: contract.carries_state(entry.model_class(entry.config_class(vocab_size=50)))
        for name, entry in registered().items()
        if not name.startswith("test_") and name != "toy_bag_of_words"
    }
    assert not any(carrying.values())
    final = registered()["final"]
    recurrent = final.model_class(final.config_class(vocab_size=50, recurrent=True))
    assert contract.carries_state(recurrent)

    class SwitchOnly:
        carries_state = True

    assert not contract.carries_state(SwitchOnly())


def test_toy_model_and_objective_go_through_trainer_translator_and_scorer(synthetic_dir, tmp_path):
    workdir = str(tmp_path / "toy")
    config = _toy_config(synthetic_dir, num_steps=30)
    config.train.dev_bleu = True
    config.train.best_metric = "dev_scale"  # a metric only the toy objective computes
    result = trainer.train_and_evaluate(
        config, workdir, record_losses=True, dev_hook=dev_eval.dev_bleu_hook(config)
    )
    assert result.step == 30 and result.dev_metrics["dev_scale"] == pytest.approx(3.0)
    assert {"dev_loss", "dev_nll", "dev_ppl", "dev_bleu"} <= set(result.dev_metrics)
    assert result.losses[-1] < result.losses[0]
    log = open(os.path.join(workdir, "train.log"), encoding="utf-8").read()
    assert "model toy_bag_of_words (objective toy_scaled_likelihood)" in log
    assert "train/scale=3" in log
    # The objective's loss is what is trained: 3x the model's.
    model, _, _ = restore.load_model(workdir)
    params, _ = restore.load_params(model, workdir, "latest")
    batch = dummy_batch(1, 5, rows=2, vocab_size=300)
    objective = build_objective(config.objective, model)
    loss, _ = objective.loss(params, batch, None, False)
    np.testing.assert_allclose(loss, 3.0 * model.loss(params, batch, None, False)[0], rtol=1e-6)
    # Translate and score through the library.
    docs = readers.read_tsv(os.path.join(synthetic_dir, "dev.tsv"))[:2]
    translator, step = restore.load_translator(workdir, "latest", SearchConfig(beam_size=2))
    hyps = translator.translate(docs)
    assert step == 30 and [len(h) for h in hyps] == [len(d.src) for d in docs]
    scores = np.asarray(jax.jit(model.score)(params, batch))
    logits, targets, mask = model.forward(params, batch, None, False)
    logp = jax.nn.log_softmax(np.asarray(logits, np.float64), -1)
    naive = np.take_along_axis(logp, np.asarray(targets)[..., None], -1)[..., 0].sum(-1)
    np.testing.assert_allclose(scores.reshape(-1), naive, rtol=1e-5)
    assert contrastive.make_sentence_scorer(model)(params, batch).shape == (2, 1)


def _launch(script, *args, timeout=600):
    """Runs ``launch/SCRIPT`` unchanged in a process that imported this file first (so the toy
    model and objective are registered)."""
    code = (
        "import runpy, sys; sys.path.insert(0, 'tests'); import test_model_interface; "
        f"sys.argv = [{script!r}] + {list(args)!r}; "
        f"runpy.run_path('launch/{script}', run_name='__main__')"
    )
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=timeout
    )


def test_toy_model_through_the_launch_scripts(synthetic_dir, tmp_path):
    workdir = str(tmp_path / "toy_cli")
    args = [
        "--config=configs/transformer.py",
        f"--workdir={workdir}",
        "--config.model.name=toy_bag_of_words",
        f"--config.data.data_dir={synthetic_dir}",
        "--config.data.vocab_size=300",
        "--config.train.num_steps=6",
        "--config.train.dev_bleu=False",
        "--config.train.best_metric=dev_loss",
        "--config.train.best_mode=min",
    ]
    # The transformer config's model keys are not the toy's: a one-line error naming them.
    bad = _launch("train.py", *args)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "unknown keys" in bad.stderr and "ToyConfig" in bad.stderr
    config_path = tmp_path / "toy_config.py"
    config_path.write_text(
        "from docnmt_jax.config_files import load_config\n"
        "import ml_collections\n"
        "def get_config():\n"
        f"    config = load_config({os.path.join(ROOT, 'configs', 'transformer.py')!r})\n"
        "    config.model = ml_collections.ConfigDict({'name': 'toy_bag_of_words', "
        "'d_model': 16})\n"
        "    config.objective.name = 'toy_scaled_likelihood'\n"
        "    return config\n",
        encoding="utf-8",
    )
    args = [f"--config={config_path}"] + [a for a in args[1:] if "model.name" not in a]
    out = _launch("train.py", *args)
    assert out.returncode == 0, out.stderr[-3000:]
    src = os.path.join(synthetic_dir, "dev.tsv")
    hyp = str(tmp_path / "hyp.tsv")
    out = _launch("translate.py", f"--workdir={workdir}", f"--input={src}", f"--output={hyp}")
    assert out.returncode == 0, out.stderr[-3000:]
    out = _launch("evaluate.py", f"--hyp={hyp}", f"--ref={src}", "--json")
    assert out.returncode == 0 and 0 <= json.loads(out.stdout)["s_bleu"]["score"] <= 100


def test_unknown_model_objective_and_unpackable_data_are_one_line_errors(synthetic_dir, tmp_path):
    base = ["--config=configs/transformer.py", f"--workdir={tmp_path / 'x'}"]
    base.append(f"--config.data.data_dir={synthetic_dir}")
    for flag, words in [
        ("--config.model.name=nope", ["unknown model 'nope'", "'final'", "'transformer'"]),
        ("--config.objective.name=nope", ["unknown objective 'nope'", "maximum_likelihood"]),
        ("--config.objective.name=toy_needs_context", ["has no context"]),
        ("--config.data.packed_row_tokens=4", ["slots", "config.data.packed_row_tokens"]),
    ]:
        out = _launch("train.py", *base, flag, "--config.data.vocab_size=300")
        assert out.returncode == 2, out.stderr[-2000:]
        last = out.stderr.strip().splitlines()[-1]
        assert "Traceback" not in out.stderr and last.startswith("train.py: error: ")
        assert all(w in last for w in words), last
    with pytest.raises(ModelError, match="registered: .*'doc2doc'"):
        build_model({"name": "nope"}, 10)


# ---------------------------------------------------------------------------------------------
# Frozen parameters.


def _state(model, config, layout=None):
    from docnmt_jax import parallel

    layout = layout or parallel.Layout(parallel.make_mesh({}))
    notes = []
    shardings, _, tx, schedule = train_state.build_optimizer_state(
        model, config, layout, notes.append
    )
    return train_state.init_state(model, tx, shardings, seed=0), tx, schedule, notes


def test_frozen_parameters_are_unchanged_and_hold_no_moments(synthetic_dir):
    config = tiny_config(synthetic_dir)
    config.train.freeze = (r"^encoder_layers_0/", r"embed/embedding$")
    model = build_model(config.model, 300, 0.1)
    state, tx, schedule, notes = _state(model, config)
    params = jax.device_get(state["params"])
    flat = {optim.parameter_path(p): x for p, x in jax.tree_util.tree_leaves_with_path(params)}
    frozen = {k for k in flat if k.startswith("encoder_layers_0/") or k == "embed/embedding"}
    frozen_size = sum(flat[k].size for k in frozen)
    total = sum(x.size for x in flat.values())
    assert notes[0] == f"parameters: {total - frozen_size:,} trainable, {frozen_size:,} frozen" + (
        f" (train.freeze={config.train.freeze!r})"
    )
    # No optimiser moments for frozen parameters: Adam's mu and nu hold trainable ones only.
    moments = sum(x.size for x in jax.tree.leaves(state["opt_state"]) if np.ndim(x) > 0)
    assert moments == 2 * (total - frozen_size)
    train_step, _ = trainer.make_steps(build_objective(None, model), tx, schedule, seed=0)
    batch = dummy_batch(1, 6, rows=4, vocab_size=300)
    for _ in range(3):
        state, _ = train_step(state, batch)
    after = {
        optim.parameter_path(p): np.asarray(x)
        for p, x in jax.tree_util.tree_leaves_with_path(jax.device_get(state["params"]))
    }
    for key, before in flat.items():
        changed = not np.array_equal(before, after[key])
        assert changed == (key not in frozen), key


def test_freeze_pattern_errors_name_the_pattern(synthetic_dir):
    config = tiny_config(synthetic_dir)
    model = build_model(config.model, 300)
    for pattern, words in [("^nothing_here/", "matches no parameter"), ("(", "not a regular")]:
        config.train.freeze = (pattern,)
        with pytest.raises(ModelError, match=words) as info:
            _state(model, config)
        assert repr(pattern) in str(info.value)


# ---------------------------------------------------------------------------------------------
# Random context.


def test_random_context_moves_every_sentence_once_to_foreign_rows():
    B, S, T = 6, 4, 3
    rng = np.random.default_rng(0)
    batch = dummy_batch(S, T, rows=B, vocab_size=1000)
    batch["src"] = rng.integers(4, 1000, (B, S, T)).astype(np.int32)  # every sentence unique
    out = jax.device_get(random_context_batch(batch, jax.random.PRNGKey(3)))
    origin = out["origin_row"]
    for k in range(S):
        assert sorted(origin[:, k]) == list(range(B))  # a permutation per slot
        for b in range(B):
            np.testing.assert_array_equal(out["src"][b, k], batch["src"][origin[b, k], k])
            np.testing.assert_array_equal(out["tgt_mask"][b, k], batch["tgt_mask"][origin[b, k], k])
    # B >= S: the sentences sharing a row come from S different input rows.
    assert all(len(set(origin[b])) == S for b in range(B))
    np.testing.assert_array_equal(out["doc_index"], batch["doc_index"])
    sentence_model = build_model({"name": "transformer", "d_model": 8, "num_heads": 2}, 20)
    with pytest.raises(ModelError, match="no context"):
        sentence_model.with_random_context(batch, jax.random.PRNGKey(0))
    for name in ("final", "doc2doc"):
        model = build_model({"name": name, "d_model": 8, "num_heads": 2}, 20)
        moved = model.with_random_context(batch, jax.random.PRNGKey(3))
        np.testing.assert_array_equal(moved["src"], out["src"])


# ---------------------------------------------------------------------------------------------
# One decode path: dev BLEU during training = translate.py, for FINAL.


# Slow (the default suite passed 20 minutes): `make test-slow`.
@pytest.mark.slow
def test_dev_translations_equal_translate_py_for_final(synthetic_dir, tmp_path):
    workdir = str(tmp_path / "final")
    config = tiny_final_config(synthetic_dir, num_steps=20)
    config.train.dev_bleu = True  # greedy: dev_bleu_beam 1, alpha 0
    config.train.eval_every = 20
    trainer.train_and_evaluate(config, workdir, dev_hook=dev_eval.dev_bleu_hook(config))
    dev_file = os.path.join(workdir, "dev_translations", "step_20.tsv")
    out = str(tmp_path / "dev.hyp.tsv")
    src = os.path.join(synthetic_dir, "dev.tsv")
    run = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "launch", "translate.py"),
            f"--workdir={workdir}",
            "--checkpoint=20",
            f"--input={src}",
            f"--output={out}",
            "--beam=1",
            "--alpha=0",
            f"--batch_tokens={config.data.eval_batch_tokens}",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    dev = open(dev_file, encoding="utf-8").read()
    assert dev == open(out, encoding="utf-8").read()
    assert len(dev.splitlines()) == 1 + sum(len(d.src) for d in readers.read_tsv(src))
