"""Pretrain-then-finetune: mapped restore of a sentence-Transformer
checkpoint into FINAL (checked through a path map written out here, not the mapping code),
its errors, a restore onto 8 simulated devices, frozen-then-released stages with fresh Adam
moments and a restarted schedule, and resume winning over ``init_from``."""

import os
import subprocess
import sys

import flax.linen as nn
import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from conftest import ROOT, tiny_config, tiny_final_config
from etils import epath

from docnmt_jax import parallel
from docnmt_jax.data.readers import read_tsv
from docnmt_jax.data.schema import dummy_batch
from docnmt_jax.data.tokenizer import get_or_train_tokenizer, load_tokenizer
from docnmt_jax.errors import ConfigError
from docnmt_jax.models import ModelError, build_model
from docnmt_jax.objectives import build_objective
from docnmt_jax.training import optim, param_mapping, trainer
from docnmt_jax.training import state as train_state

SIZES = {"d_model": 32, "num_heads": 4, "ffn_dim": 64, "num_encoder_layers": 2}

# The FINAL <- Transformer map for N = 2 encoder layers and 1 decoder layer, written out.
ATT = [f"{m}/{w}" for m in ("query", "key", "value", "out") for w in ("kernel", "bias")]
NORM = ["norm/scale", "norm/bias"]
FFN = ["wi/kernel", "wi/bias", "wo/kernel", "wo/bias"]
ENCODER_LAYER = (
    [f"self_attention/{a}" for a in ATT]
    + [f"attention_block/{n}" for n in NORM]
    + [f"ffn/{f}" for f in FFN]
    + [f"ffn_block/{n}" for n in NORM]
)
SAME_DECODER = (
    [f"self_attention/{a}" for a in ATT]
    + [f"cross_attention/{a}" for a in ATT]
    + [f"cross_attention_block/{n}" for n in NORM]
    + [f"ffn/{f}" for f in FFN]
    + [f"ffn_block/{n}" for n in NORM]
)
FINAL_FROM_TRANSFORMER = {
    "embed/embedding": "embed/embedding",
    **{f"encoder_layers_0/{x}": f"encoder_layers_0/{x}" for x in ENCODER_LAYER},
    **{f"global_layer/segment_attention/{a}": f"encoder_layers_1/self_attention/{a}" for a in ATT},
    "global_layer/fusion_norm/scale": "encoder_layers_1/attention_block/norm/scale",
    "global_layer/fusion_norm/bias": "encoder_layers_1/attention_block/norm/bias",
    **{f"global_layer/ffn/{f}": f"encoder_layers_1/ffn/{f}" for f in FFN},
    **{f"global_layer/ffn_block/{n}": f"encoder_layers_1/ffn_block/{n}" for n in NORM},
    **{f"decoder_layers_0/{x}": f"decoder_layers_0/{x}" for x in SAME_DECODER},
    "decoder_layers_0/self_attention_norm/scale": "decoder_layers_0/self_attention_block/"
    "norm/scale",
    "decoder_layers_0/self_attention_norm/bias": "decoder_layers_0/self_attention_block/norm/bias",
}
FINAL_FRESH = {
    "segment_embedding",
    "global_layer/gate/kernel",
    "global_layer/gate/bias",
    "global_layer/segment_attention/relative_key",
    "global_layer/segment_attention/relative_value",
    "decoder_layers_0/self_attention/content_bias",
    "decoder_layers_0/self_attention/position_bias",
    "decoder_layers_0/self_attention/position/kernel",
}


def _sized(config, **train):
    config.model.update(SIZES)
    config.train.aot_compile = False
    config.train.update(train)
    return config


def _flat(tree, prefix=""):
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}/"))
        else:
            out[f"{prefix}{key}"] = np.asarray(value)
    return out


def _read_params(step_dir, which="params"):
    """Every parameter array of ``step_dir/state`` as numpy (orbax directly, any mesh);
    ``which="ema"``: their moving average."""
    state_dir = os.path.join(step_dir, "state")
    checkpointer = ocp.PyTreeCheckpointer()
    tree = ocp.PyTreeCheckpointHandler().metadata(epath.Path(state_dir)).tree
    args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
    state = checkpointer.restore(state_dir, args=ocp.args.PyTreeRestore(restore_args=args))
    return _flat(state[which])


def _only_step(directory):
    (step,) = os.listdir(directory)
    return os.path.join(directory, step)


@pytest.fixture(scope="module")
def pretrained(synthetic_dir, tmp_path_factory):
    """A sentence Transformer (2 encoder layers, 1 decoder layer) trained 2 steps on 1 device."""
    workdir = str(tmp_path_factory.mktemp("pretrain") / "run")
    trainer.train_and_evaluate(_sized(tiny_config(synthetic_dir), num_steps=2), workdir)
    return workdir


def _final_model(synthetic_dir, pretrained, vocab_extra=0):
    config = _sized(tiny_final_config(synthetic_dir))
    config.data.tokenizer = os.path.join(pretrained, "spm.model")
    vocab = load_tokenizer(config.data.tokenizer).vocab_size + vocab_extra
    model = build_model(config.model, vocab)
    params = nn.meta.unbox(model.init(jax.random.PRNGKey(0), dummy_batch())["params"])
    config.init_from = pretrained
    return config, model, params


def test_presets_fill_final_from_a_transformer_as_the_written_map(
    synthetic_dir, pretrained, monkeypatch
):
    config, model, fresh = _final_model(synthetic_dir, pretrained)
    saved = _read_params(_only_step(os.path.join(pretrained, "best")))
    fresh_flat = _flat(fresh)
    assert set(fresh_flat) == set(FINAL_FROM_TRANSFORMER) | FINAL_FRESH
    requested = []
    restore = ocp.PyTreeCheckpointer.restore

    def spy(self, directory, *args, **kwargs):
        requested.append(kwargs["args"].item)
        return restore(self, directory, *args, **kwargs)

    monkeypatch.setattr(ocp.PyTreeCheckpointer, "restore", spy)
    for preset in ("all", "source"):
        expected = {
            k: v
            for k, v in FINAL_FROM_TRANSFORMER.items()
            if preset == "all" or not k.startswith("decoder_layers_")
        }
        config.init_from_rules = preset
        params, rows, _ = param_mapping.init_from_checkpoint(config, model, fresh)
        got = _flat(jax.device_get(params))
        for path, source in expected.items():
            np.testing.assert_array_equal(got[path], saved[source], err_msg=path)
        for path in set(got) - set(expected):
            np.testing.assert_array_equal(got[path], fresh_flat[path], err_msg=path)
        # Only the parameters it maps are read: no optimiser array, no unused parameter.
        assert list(requested[-1]) == ["params"]
        assert set(_flat(requested[-1]["params"])) == set(expected.values())
        status = {(r.parameter, r.source): r.status for r in rows}
        assert status == {
            **{(k, v): "loaded" if k == v else "renamed" for k, v in expected.items()},
            **{(k, ""): "fresh" for k in set(got) - set(expected)},
            **{("", k): "unused" for k in set(saved) - set(expected.values())},
        }
    # "source" leaves the whole Transformer decoder unused.
    unused = {source for (_, source), s in status.items() if s == "unused"}
    assert unused == {k for k in saved if k.startswith("decoder_layers_")}


def test_init_from_params_ema_reads_the_moving_average(synthetic_dir, pretrained, tmp_path):
    config, model, fresh = _final_model(synthetic_dir, pretrained)
    with_ema = str(tmp_path / "with_ema")
    run = _sized(tiny_config(synthetic_dir), num_steps=3, ema_decay=0.999)
    run.data.tokenizer = config.data.tokenizer
    trainer.train_and_evaluate(run, with_ema)
    config.init_from = with_ema
    step_dir = _only_step(os.path.join(with_ema, "best"))
    raw, ema = _read_params(step_dir), _read_params(step_dir, "ema")
    assert any(not np.array_equal(raw[k], ema[k]) for k in raw)  # else the test proves nothing
    config.init_from_rules = "all"
    for which, expected in (("params", raw), ("ema", ema), ("auto", ema)):
        config.init_from_params = which
        params, _, _ = param_mapping.init_from_checkpoint(config, model, fresh)
        got = _flat(jax.device_get(params))
        for path, source in FINAL_FROM_TRANSFORMER.items():
            np.testing.assert_array_equal(got[path], expected[source], err_msg=f"{which} {path}")
    # A run without an EMA (the pretrained fixture: the paper recipe keeps none): "auto"
    # reads its parameters, "ema" is a one-line config error.
    config.init_from = pretrained
    config.init_from_params = "auto"
    params, _, _ = param_mapping.init_from_checkpoint(config, model, fresh)
    plain = _read_params(_only_step(os.path.join(pretrained, "best")))
    got = _flat(jax.device_get(params))
    np.testing.assert_array_equal(got["embed/embedding"], plain["embed/embedding"])
    config.init_from_params = "ema"
    with pytest.raises(ConfigError, match="keeps no EMA"):
        param_mapping.init_from_checkpoint(config, model, fresh)


def test_mapping_mistakes_are_init_from_errors_naming_paths_and_shapes(
    synthetic_dir, pretrained, tmp_path
):
    config, model, fresh = _final_model(synthetic_dir, pretrained)

    def fails(rules, *words, init_from=pretrained, target=model, params=fresh):
        config.init_from, config.init_from_rules = init_from, rules
        with pytest.raises(param_mapping.InitFromError) as info:
            param_mapping.init_from_checkpoint(config, target, params)
        message = str(info.value)
        assert "\n" not in message and all(w in message for w in words), message
        assert isinstance(info.value, ModelError)

    fails(r"nothing/(.*) -> \1; all", "'nothing/(.*)'", "matches no parameter")
    fails("everything", "'everything'", "preset")
    fails("segment_embedding -> nope/table; all", "segment_embedding <- nope/table")
    wrong = "encoder_layers_0/ffn/wi/kernel -> encoder_layers_0/ffn/wo/kernel"
    fails(f"{wrong}; all", "encoder_layers_0/ffn/wi/kernel (32, 64)", "wo/kernel (64, 32)")
    fails("all", "no such file", init_from=str(tmp_path / "nowhere"))
    # Without rules: identical paths only (the old behaviour), every gap listed.
    fails("", "missing from checkpoint", "decoder_layers_0/self_attention/content_bias (4, 8)")
    # A checkpoint of another vocabulary: named, with both sizes.
    _, bigger, bigger_params = _final_model(synthetic_dir, pretrained, vocab_extra=8)
    vocab = load_tokenizer(config.data.tokenizer).vocab_size
    fails(
        "all",
        f"vocabulary sizes differ (model {vocab + 8}, checkpoint {vocab})",
        f"embed/embedding ({vocab + 8}, 32) <- embed/embedding ({vocab}, 32)",
        target=bigger,
        params=bigger_params,
    )
    # A skip rule before the mismatch keeps that parameter fresh.
    config.init_from_rules = f"encoder_layers_0/ffn/wi/kernel -> skip; {wrong}; all"
    params, rows, _ = param_mapping.init_from_checkpoint(config, model, fresh)
    kernel = "encoder_layers_0/ffn/wi/kernel"
    np.testing.assert_array_equal(_flat(params)[kernel], _flat(fresh)[kernel])
    assert [r.status for r in rows if r.parameter == kernel] == ["fresh"]


def _train_py(*args, devices=1):
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}"
    env = dict(os.environ, XLA_FLAGS=flags.strip())
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, "launch", "train.py"), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=600,
    )


def _tiny_flags(synthetic_dir, workdir):
    return [
        f"--workdir={workdir}",
        f"--config.data.data_dir={synthetic_dir}",
        "--config.data.vocab_size=300",
        "--config.data.batch_src_tokens=256",
        "--config.data.batch_tgt_tokens=256",
        "--config.data.eval_batch_tokens=512",
        *[f"--config.model.{k}={v}" for k, v in SIZES.items()],
        "--config.model.num_decoder_layers=1",
        "--config.train.num_steps=1",
        "--config.train.dev_bleu=False",
        "--config.train.best_metric=dev_loss",
        "--config.train.best_mode=min",
        "--config.train.aot_compile=False",
    ]


# Slow (the default suite passed 20 minutes): `make test-slow`.
@pytest.mark.slow
def test_transformer_checkpoint_fills_final_on_eight_devices(synthetic_dir, pretrained, tmp_path):
    """Pretrained on 1 device, finetuned on 8 (data 2 x model 4) through train.py; the learning
    rate is 0, so the finetune's checkpoint holds the restored parameters. FINAL's ``paper``
    variant: post-LN like the pretrained tiny Transformer (no final encoder/decoder norms)."""
    workdir = str(tmp_path / "final")
    out = _train_py(
        "--config=configs/final.py:paper",
        *_tiny_flags(synthetic_dir, workdir),
        "--config.data.max_sentences=4",
        f"--config.data.tokenizer={os.path.join(pretrained, 'spm.model')}",
        "--config.train.lr_scale=0.0",
        "--config.mesh.model=4",
        f"--config.init_from={pretrained}",
        "--config.init_from_rules=all",
        devices=8,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "'model': 4" in out.stdout and "over 8 devices" in out.stdout
    assert "init_from" in out.stdout and "global_layer/fusion_norm/scale" in out.stdout
    table = open(os.path.join(workdir, "init_from.tsv"), encoding="utf-8").read().splitlines()
    assert table[0] == "parameter\tsource\tstatus\tshape\tcheckpoint_shape"
    assert "global_layer/ffn/wi/kernel\tencoder_layers_1/ffn/wi/kernel\trenamed\t32x64\t32x64" in (
        table
    )
    assert len(table) == 1 + len(FINAL_FROM_TRANSFORMER) + len(FINAL_FRESH)
    saved = _read_params(_only_step(os.path.join(pretrained, "best")))
    got = _read_params(os.path.join(workdir, "checkpoints", "1"))
    for path, source in FINAL_FROM_TRANSFORMER.items():
        np.testing.assert_array_equal(got[path], saved[source], err_msg=path)


def test_user_mistakes_are_one_line_errors_of_train_py(synthetic_dir, pretrained, tmp_path):
    tokenizer = f"--config.data.tokenizer={os.path.join(pretrained, 'spm.model')}"
    nowhere = str(tmp_path / "nowhere")
    other = str(tmp_path / "other_spm.model")  # a tokenizer of another size than the pretrain's
    get_or_train_tokenizer(other, read_tsv(os.path.join(synthetic_dir, "train.tsv")), 320)
    for case, (flags, words) in enumerate(
        [
            ([f"--config.init_from={nowhere}", tokenizer], [nowhere, "no such file"]),
            (
                [
                    f"--config.init_from={pretrained}",
                    r"--config.init_from_rules=nothing/(.*) -> \1",
                    tokenizer,
                ],
                ["'nothing/(.*)'", "matches no parameter"],
            ),
            (
                [f"--config.init_from={pretrained}", f"--config.data.tokenizer={other}"],
                ["vocabulary sizes differ", "embed/embedding"],
            ),
            (
                ["--config.train.freeze=('^nothing/',)", tokenizer],
                ["config.train.freeze", "'^nothing/'", "matches no parameter"],
            ),
        ]
    ):
        base = _tiny_flags(synthetic_dir, tmp_path / str(case))
        out = _train_py("--config=configs/transformer.py", *base, *flags)
        assert out.returncode == 2, out.stderr[-2000:]
        last = out.stderr.strip().splitlines()[-1]
        assert "Traceback" not in out.stderr and last.startswith("train.py: error: ")
        assert all(w in last for w in words), last


def _lr(step, d_model, warmup, offset):
    count = step - offset if offset and step >= offset else step
    return d_model**-0.5 * min((count + 1) ** -0.5, (count + 1) * warmup**-1.5)


def test_schedule_offset_restarts_the_warm_up():
    tx, schedule = optim.make_optimizer(32, warmup_steps=4, schedule_offset=3)
    for step in range(8):
        np.testing.assert_allclose(schedule(step), _lr(step, 32, 4, 3), rtol=1e-6)
    with pytest.raises(ModelError, match="unfreeze_at_step needs frozen parameters"):
        optim.make_optimizer(32, unfreeze_at_step=2)


def test_released_parameters_train_from_fresh_adam_moments(synthetic_dir):
    """Frozen for 2 steps, released at step 2 (schedule restarted there), clipping on: every
    parameter after every step equals Adam computed by hand, the released parameters' moments
    starting from zero at the release."""
    k, clip, b1, b2, eps = 2, 0.5, 0.9, 0.98, 1e-9
    config = tiny_config(synthetic_dir, warmup_steps=4, clip_norm=clip)
    config.model.dropout_rate = 0.0
    config.train.freeze = (r"^encoder_layers_0/",)
    config.train.unfreeze_at_step = k
    config.train.schedule_offset = k
    model = build_model(config.model, 300, 0.1)
    objective = build_objective(None, model)
    layout = parallel.Layout(parallel.make_mesh({}))
    shardings, _, tx, schedule = train_state.build_optimizer_state(model, config, layout, print)
    state = train_state.init_state(model, tx, shardings, seed=0)
    train_step, _ = trainer.make_steps(objective, tx, schedule, seed=0)
    batch = dummy_batch(1, 6, rows=4, vocab_size=300)

    def flat(tree):
        return {
            optim.parameter_path(p): np.asarray(x, np.float32)
            for p, x in jax.tree_util.tree_leaves_with_path(jax.device_get(tree))
        }

    grad = jax.jit(jax.grad(lambda p: objective.loss(p, batch, jax.random.PRNGKey(0), True)[0]))
    ref = flat(state["params"])
    frozen = {p for p in ref if p.startswith("encoder_layers_0/")}
    initial = {p: ref[p].copy() for p in frozen}
    mu = {p: np.zeros_like(x) for p, x in ref.items()}
    nu = {p: np.zeros_like(x) for p, x in ref.items()}
    for step in range(4):
        g = flat(grad(state["params"]))  # where the run is; the Adam arithmetic is by hand
        live = [p for p in ref if step >= k or p not in frozen]
        norm = np.sqrt(sum(np.sum(np.square(g[p])) for p in live))
        scale = min(1.0, clip / norm)
        lr = _lr(step, config.model.d_model, 4, k)
        for p in live:
            t = step + 1 - (k if p in frozen else 0)  # released: a fresh count from the release
            gp = g[p] * scale
            mu[p] = (1 - b1) * gp + b1 * mu[p]
            nu[p] = (1 - b2) * gp * gp + b2 * nu[p]
            mhat, vhat = mu[p] / (1 - b1**t), nu[p] / (1 - b2**t)
            ref[p] = ref[p] - lr * mhat / (np.sqrt(vhat) + eps)
        state, metrics = train_step(state, batch)
        np.testing.assert_allclose(float(metrics["lr"].total), lr, rtol=1e-6)
        got = flat(state["params"])
        for p in ref:
            if p.endswith("key/bias"):  # softmax ignores it: its gradient is rounding noise
                continue
            np.testing.assert_allclose(got[p], ref[p], rtol=1e-4, atol=1e-6, err_msg=f"{step} {p}")
        for p in frozen:
            assert np.array_equal(got[p], initial[p]) == (step < k), (step, p)
    # The released group's moments are those started from zero at the release.
    leaves = jax.tree_util.tree_leaves_with_path(jax.device_get(state["opt_state"]))
    released = {
        (name, optim.parameter_path(path[-len(p.split("/")) :])): np.asarray(x)
        for path, x in leaves
        for name in ("mu", "nu")
        for p in frozen
        if "frozen" in jax.tree_util.keystr(path)
        and f".{name}" in jax.tree_util.keystr(path)
        and jax.tree_util.keystr(path).endswith("".join(f"['{n}']" for n in p.split("/")))
    }
    assert len(released) == 2 * len(frozen)
    for (name, p), value in released.items():
        if p.endswith("key/bias"):
            continue
        np.testing.assert_allclose(value, (mu if name == "mu" else nu)[p], rtol=1e-4, atol=1e-9)


def test_resuming_a_finetune_never_applies_init_from_again(
    synthetic_dir, pretrained, tmp_path, monkeypatch
):
    calls = []
    mapped = param_mapping.init_from_checkpoint

    def spy(*args, **kwargs):
        calls.append(args[0].init_from)
        return mapped(*args, **kwargs)

    monkeypatch.setattr(param_mapping, "init_from_checkpoint", spy)
    config = _sized(tiny_config(synthetic_dir), num_steps=2)
    config.init_from, config.init_from_rules = pretrained, "all"
    workdir = str(tmp_path / "finetune")
    trainer.train_and_evaluate(config, workdir)
    assert calls == [pretrained]
    # Without data.tokenizer the finetune keeps the pretraining's pieces: a copy of its model.
    with open(os.path.join(workdir, "spm.model"), "rb") as mine:
        assert mine.read() == open(os.path.join(pretrained, "spm.model"), "rb").read()
    own = _read_params(os.path.join(workdir, "checkpoints", "2"))
    # Again, one step further at learning rate 0: the step-3 parameters are those it resumed.
    config.train.num_steps, config.train.lr_scale = 3, 0.0
    seen = {}

    def hook(params, step):
        seen.update(_flat(jax.device_get(params)))
        return {}

    result = trainer.train_and_evaluate(config, workdir, eval_hooks=(hook,))
    assert result.step == 3 and calls == [pretrained]
    assert "resumed from step 2" in open(os.path.join(workdir, "train.log")).read()
    pretrain = _read_params(_only_step(os.path.join(pretrained, "best")))
    assert set(seen) == set(own)
    for path, value in own.items():
        np.testing.assert_array_equal(seen[path], value, err_msg=path)
    assert not np.array_equal(seen["embed/embedding"], pretrain["embed/embedding"])


def test_init_from_a_release_reads_the_parameters_the_checkpoint_holds(
    synthetic_dir, pretrained, tmp_path
):
    """A release of the pretrained run (``docnmt-export``) initialises FINAL exactly as the
    run's checkpoint does, read directly with Orbax; its tokenizer is the release's own, a
    parameter set it does not hold and ``init_from_which`` are one-line errors, and a
    corrupted ``params.npz`` is refused by its sha256."""
    from docnmt_jax.commands import export as export_command
    from docnmt_jax.export import release

    out = str(tmp_path / "release")
    record = tmp_path / "training.json"
    record.write_text('{"commit": "abc123", "steps": 2}')
    export_command.main(["--workdir", pretrained, "--out", out, "--training_record", str(record)])
    manifest = release.read_manifest(out)
    assert manifest["parameter_set"] == "raw"
    assert manifest["training"] == {"commit": "abc123", "steps": 2}
    config, model, fresh = _final_model(synthetic_dir, pretrained)
    saved = _read_params(_only_step(os.path.join(pretrained, "best")))
    config.init_from, config.init_from_rules = out, "all"
    for which in ("auto", "params"):
        config.init_from_params = which
        params, rows, state_dir = param_mapping.init_from_checkpoint(config, model, fresh)
        got = _flat(jax.device_get(params))
        for path, source in FINAL_FROM_TRANSFORMER.items():
            np.testing.assert_array_equal(got[path], saved[source], err_msg=f"{which} {path}")
        assert state_dir == os.path.abspath(out)
    assert param_mapping.checkpoint_dir(config) == os.path.abspath(out)
    assert param_mapping.source_tokenizer(out) == os.path.join(out, "spm.model")
    config.init_from_params = "ema"
    with pytest.raises(ConfigError, match="holds only its params"):
        param_mapping.init_from_checkpoint(config, model, fresh)
    config.init_from_params, config.init_from_which = "auto", "latest"
    with pytest.raises(param_mapping.InitFromError, match="applies to a workdir only"):
        param_mapping.checkpoint_dir(config)
    config.init_from_which = "best"
    with open(os.path.join(out, "params.npz"), "r+b") as f:
        f.seek(-64, os.SEEK_END)
        f.write(b"\0" * 64)
    with pytest.raises(Exception, match="sha256"):
        param_mapping.init_from_checkpoint(config, model, fresh)


def test_release_row_exports_a_results_row_with_its_training_record(pretrained, tmp_path):
    """``experiments/release_row.py`` on a results row (the pretrained run as its workdir):
    the manifest records the commit, steps, tokens, the dev metrics train.log logged at the
    best step and the test scores of the row's measure record; too large a release is
    refused and removed."""
    import shutil

    sys.path.insert(0, ROOT)
    from docnmt_jax.errors import UserError
    from docnmt_jax.export import release
    from docnmt_jax.files import write_record
    from experiments import release_row

    workdir = tmp_path / "run" / "rows" / "transformer"
    shutil.copytree(pretrained, workdir)
    write_record(
        str(workdir / "train.json"),
        {"steps": 2, "tokens_per_step": 100.5, "stopped_by": "patience", "code": "abc"},
    )
    write_record(
        str(workdir / "measure.json"),
        {"scores": {"s_bleu": {"score": 25.5, "signature": "sig"}}, "inputs": {"beam": 5}},
    )
    out = str(tmp_path / "releases" / "tiny")
    release_row.main(["--run_dir", str(tmp_path / "run"), "--row", "transformer", "--out", out])
    training = release.read_manifest(out)["training"]
    step = int(os.listdir(workdir / "best")[0])
    logged = [ln for ln in open(workdir / "train.log") if f" step={step} dev_loss=" in ln]
    dev_loss = float(logged[-1].split("dev_loss=")[1].split()[0])
    assert training["dev_at_chosen_step"]["dev_loss"] == pytest.approx(dev_loss)
    assert (training["commit"], training["chosen_step"], training["steps_trained"]) == (
        "abc",
        step,
        2,
    )
    assert training["target_tokens_trained"] == 201 and training["test"]["s_bleu"] == 25.5
    with pytest.raises(UserError, match="over --max_mib"):
        release_row.main(
            ["--run_dir", str(tmp_path / "run"), "--row", "transformer", "--out", out + "2"]
            + ["--max_mib", "0.01"]
        )
    assert not os.path.exists(out + "2")
