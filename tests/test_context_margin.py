"""Jean & Cho 2019's context-aware margin objective."""

import math
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from conftest import tiny_final_config

from docnmt_jax.data.schema import batch_from_grids
from docnmt_jax.models.base import BatchLayout
from docnmt_jax.models.concat import Doc2DocConfig, Doc2DocModel
from docnmt_jax.models.final import FinalConfig, FinalModel
from docnmt_jax.models.transformer import TransformerConfig, TransformerModel
from docnmt_jax.objectives import ObjectiveError, build_objective
from docnmt_jax.objectives.context_margin import (
    ContextMarginOptions,
    deranged_batch,
    margin_regulariser,
)
from docnmt_jax.training import trainer

V = 19
SMALL = dict(vocab_size=V, d_model=16, num_heads=2, ffn_dim=24)
SMALL.update(num_encoder_layers=1, num_decoder_layers=1)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _batch(lengths, T=4, seed=0, doc_index=None):
    """Grid batch: ``lengths [B, S]`` target (and source) lengths, 0 = padding sentence."""
    lengths = np.asarray(lengths)
    rng = np.random.default_rng(seed)
    mask = np.arange(T) < lengths[..., None]
    src = (rng.integers(4, V, mask.shape) * mask).astype(np.int32)
    tgt = (rng.integers(4, V, mask.shape) * mask).astype(np.int32)
    kwargs = {} if doc_index is None else {"doc_index": np.asarray(doc_index, np.int32)}
    batch = batch_from_grids(src, tgt, src_lengths=lengths, tgt_lengths=lengths, **kwargs)
    return {k: jnp.asarray(v) for k, v in batch.items()}


# ------------------------------------------------------------------ hand computation (float64)


def _reference(true_tok, rand_tok, mask, use, o):
    """Eq. 3 by loops in float64, each context-less score a log-mean-exp over the M samples."""
    M, B, S, T = rand_tok.shape
    R_tok = R_sent = 0.0
    data_arg, any_use, delta, active_tok = 0.0, False, 0.0, 0
    for b in range(B):
        for s in range(S):
            n = int(mask[b, s].sum())
            if not use[b, s] or n == 0:
                continue
            any_use = True
            true_sent = sum(float(true_tok[b, s, t]) for t in range(T) if mask[b, s, t])
            sent_m = [
                sum(float(rand_tok[m, b, s, t]) for t in range(T) if mask[b, s, t])
                for m in range(M)
            ]
            rand_sent = math.log(sum(math.exp(x) for x in sent_m) / M)
            R_sent += max(0.0, n * o.margin_sentence - true_sent + rand_sent)
            data_arg += n * o.margin_data - true_sent + rand_sent
            delta += true_sent - rand_sent
            for t in range(T):
                if mask[b, s, t]:
                    p = sum(math.exp(float(rand_tok[m, b, s, t])) for m in range(M)) / M
                    arg = o.margin_token - float(true_tok[b, s, t]) + math.log(p)
                    R_tok += max(0.0, arg)
                    active_tok += arg > 0
    R_data = max(0.0, data_arg) if any_use else 0.0
    R = o.alpha_data * R_data + o.alpha_sentence * R_sent + o.alpha_token * R_tok
    return R, {"hinge_tok": R_tok, "hinge_sent": R_sent, "hinge_data": R_data, "delta": delta}


@pytest.mark.parametrize("M", [1, 3])
@pytest.mark.parametrize(
    "options",
    [
        ContextMarginOptions(),  # Sec. 5 defaults
        ContextMarginOptions(
            alpha_data=0.7,
            alpha_sentence=1.3,
            alpha_token=0.4,
            margin_data=0.2,
            margin_sentence=0.5,
            margin_token=0.3,
        ),
    ],
)
def test_regulariser_matches_float64_loop(M, options):
    rng = np.random.default_rng(M)
    B, S, T = 3, 3, 4
    lengths = np.array([[4, 2, 3], [1, 4, 0], [3, 0, 0]])
    mask = np.arange(T) < lengths[..., None]
    use = np.array([[1, 1, 0], [1, 1, 0], [1, 0, 0]], bool)
    true_tok = np.log(rng.uniform(0.05, 1.0, (B, S, T))) * mask
    rand_tok = np.log(rng.uniform(0.05, 1.0, (M, B, S, T))) * mask
    R, metrics = margin_regulariser(
        jnp.asarray(true_tok, jnp.float32),
        jnp.asarray(rand_tok, jnp.float32),
        jnp.asarray(mask),
        jnp.asarray(use),
        options,
    )
    ref_R, ref = _reference(true_tok, rand_tok, mask, use, options)
    np.testing.assert_allclose(float(R), ref_R, rtol=1e-5, atol=1e-5)
    for name, value in ref.items():
        np.testing.assert_allclose(float(metrics[name].total), value, rtol=1e-5, atol=1e-5)
    n_tok = float((mask * use[..., None]).sum())
    assert float(metrics["hinge_tok"].weight) == n_tok == float(metrics["delta"].weight)
    assert 0.0 <= metrics["active_tok"].value() <= 1.0


def test_sample_estimate_is_log_mean_exp():
    """M samples: the token-level random score is log(mean_m p_m), computed stably."""
    lp = np.array([-1.0, -2.5, -0.3, -800.0])  # one tiny probability: exp underflows alone
    true_tok = jnp.zeros((1, 1, 1))
    rand = jnp.asarray(lp, jnp.float32).reshape(4, 1, 1, 1)
    options = ContextMarginOptions(alpha_data=0.0, alpha_token=1.0, margin_token=0.0)
    R, _ = margin_regulariser(true_tok, rand, jnp.ones((1, 1, 1)), jnp.ones((1, 1), bool), options)
    explicit = np.log(np.mean(np.exp(lp.astype(np.float64))))
    np.testing.assert_allclose(float(R), max(0.0, explicit), rtol=1e-6)
    R, m = margin_regulariser(
        true_tok, rand, jnp.ones((1, 1, 1)), jnp.ones((1, 1), bool), ContextMarginOptions()
    )
    np.testing.assert_allclose(float(m["delta"].total), -explicit, rtol=1e-6)


# ------------------------------------------------------------------------------ derangement


@pytest.mark.parametrize("seed", range(6))
def test_derangement_foreign_context_and_no_padding(seed):
    lengths = [[3, 2, 4], [2, 0, 0], [4, 3, 0], [1, 1, 1], [0, 0, 0], [2, 2, 0], [0, 0, 0]]
    doc_index = [0, 1, 2, 3, -1, 2, -1]  # rows 2 and 5: chunks of one document; 4, 6 padding
    batch = _batch(lengths, seed=seed, doc_index=doc_index)
    out, valid = jax.jit(deranged_batch)(batch, jax.random.PRNGKey(seed))
    origin, valid = np.asarray(out["origin_row"]), np.asarray(valid)
    real = np.asarray(lengths) > 0
    B, S = real.shape
    for k in range(S):  # every column a permutation of its real rows; padding stays
        assert sorted(origin[real[:, k], k]) == sorted(np.flatnonzero(real[:, k]))
        assert (origin[~real[:, k], k] == np.flatnonzero(~real[:, k])).all()
    for key in ("src", "tgt", "tgt_mask", "src_mask", "tgt_segment_ids"):
        np.testing.assert_array_equal(out[key], np.asarray(batch[key])[origin, np.arange(S)])
    assert (np.asarray(out["doc_index"]) == doc_index).all()  # row features stay
    docs = np.asarray(doc_index)
    for b in range(B):
        for k in range(S):
            if not valid[b, k]:
                continue
            assert real[b, k]
            own = docs[origin[b, k]]
            assert own != docs[b]
            assert all(docs[origin[b, j]] != own for j in range(S) if j != k and real[b, j])
    assert valid.sum() >= 6


def test_derangement_enough_documents_all_valid_and_one_document_skipped():
    batch = _batch(np.full((5, 3), 2))
    for seed in range(5):
        _, valid = jax.jit(deranged_batch)(batch, jax.random.PRNGKey(seed))
        assert np.asarray(valid).all()
    for lengths in ([[2, 3, 1]], [[2, 3, 1], [0, 0, 0]]):  # B = 1; one real document
        _, valid = deranged_batch(_batch(lengths), jax.random.PRNGKey(0))
        assert not np.asarray(valid).any()


def test_derangement_context_window_rotated_with_sentences():
    batch = _batch(np.full((5, 2), 3))
    batch["context_src"] = jnp.arange(5 * 1 * 4, dtype=jnp.int32).reshape(5, 1, 4) + 100
    batch["context_src_mask"] = jnp.ones((5, 1, 4), jnp.int32)
    out, valid = deranged_batch(batch, jax.random.PRNGKey(1))
    assert out["context_src"].shape == (5, 1, 4)
    ctx_origin = (np.asarray(out["context_src"])[:, 0, 0] - 100) // 4
    assert (ctx_origin != np.arange(5)).all()
    origin = np.asarray(out["origin_row"])
    assert (origin != ctx_origin[:, None]).all() and np.asarray(valid).all()


# --------------------------------------------------------------------------------- objective


class ContextIgnoringModel(TransformerModel):
    """The sentence Transformer on chunk batches: every sentence alone, context ignored."""

    layout = BatchLayout.CHUNKS


def _init(model, batch):
    return model.init(jax.random.PRNGKey(0), batch)["params"]


def test_context_ignoring_model_has_zero_delta():
    model = ContextIgnoringModel(TransformerConfig(**SMALL), label_smoothing=0.1)
    objective = build_objective({"name": "context_margin", "samples": 2}, model)
    batch = _batch([[3, 2, 4], [2, 4, 0], [4, 3, 1], [1, 2, 0]])
    params = jax.tree_util.tree_map(lambda x: getattr(x, "value", x), _init(model, batch))
    loss, metrics = _compiled(lambda p: objective.loss(p, batch, None, False), params)(params)
    assert float(metrics["delta"].total) == 0.0
    assert float(metrics["hinge_tok"].total) == 0.0 and float(metrics["active_tok"].total) == 0
    tokens = float(metrics["margin_tokens"].total)
    np.testing.assert_allclose(float(metrics["hinge_data"].total), tokens * math.log(1.1), 1e-5)
    ml, _ = model.loss(params, batch, None, False)
    expected = float(ml) + tokens * math.log(1.1) / float(metrics["tokens"].total)
    np.testing.assert_allclose(float(loss), expected, rtol=1e-5)


def test_check_and_packed_batch_errors():
    with pytest.raises(ObjectiveError, match="needs random contexts"):
        build_objective({"name": "context_margin"}, TransformerModel(TransformerConfig(**SMALL)))
    model = ContextIgnoringModel(TransformerConfig(**SMALL))
    with pytest.raises(ObjectiveError, match="samples"):
        build_objective({"name": "context_margin", "samples": 0}, model)
    objective = build_objective({"name": "context_margin"}, model)
    with pytest.raises(ObjectiveError, match=r"needs \[B, S, T\] grid batches"):
        objective.loss({}, {"src_chunk_ids": jnp.zeros((1, 4))}, None, False)


# The machine running the tests may be loaded: compile without XLA's expensive CPU passes.
FAST = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def _compiled(fn, *args):
    return jax.jit(fn).lower(*args).compile(compiler_options=FAST)


def _unbox(params):
    from flax import linen as nn

    return nn.meta.unbox(params)


@pytest.mark.parametrize("name", ["doc2doc", "final"])
def test_gradient_matches_finite_differences(name):
    batch = _batch([[3, 2, 4], [2, 4, 0], [4, 3, 1], [1, 2, 0]])
    if name == "doc2doc":
        model = Doc2DocModel(Doc2DocConfig(**SMALL, max_len=16), label_smoothing=0.1)
    else:
        # without the XL decoder: its memory is stop-gradient by design (FD would disagree)
        cfg = FinalConfig(**SMALL, max_relative_distance=1, max_segments=8, xl_decoder=False)
        model = FinalModel(cfg, label_smoothing=0.1)
    # margins far from the scores' differences: no hinge sits on its kink within +-eps
    options = {"alpha_sentence": 0.5, "margin_sentence": 2.0, "margin_token": 3.0}
    objective = build_objective({"name": "context_margin", **options}, model)
    params = _unbox(_init(model, batch))

    def loss(p):
        return objective.loss(p, batch, None, False)

    (_, metrics), grad = _compiled(jax.value_and_grad(loss, has_aux=True), params)(params)
    f = _compiled(lambda p: loss(p)[0], params)
    leaves, tree = jax.tree_util.tree_flatten(params)
    keys = jax.random.split(jax.random.PRNGKey(3), len(leaves))
    direction = [jax.random.normal(k, x.shape, x.dtype) for k, x in zip(keys, leaves, strict=True)]
    norm = math.sqrt(sum(float(jnp.sum(d * d)) for d in direction))
    direction = jax.tree_util.tree_unflatten(tree, [d / norm for d in direction])
    eps = 1e-2

    def at(step):
        return f(jax.tree_util.tree_map(lambda p, d: p + step * d, params, direction))

    numeric = (float(at(eps)) - float(at(-eps))) / (2 * eps)
    analytic = sum(
        float(jnp.sum(g * d))
        for g, d in zip(
            jax.tree_util.tree_leaves(grad), jax.tree_util.tree_leaves(direction), strict=True
        )
    )
    np.testing.assert_allclose(analytic, numeric, rtol=2e-2, atol=2e-4)
    assert float(metrics["margin_skipped"].total) == 0.0
    assert float(metrics["margin_reg"].total) > 0.0


@pytest.mark.slow  # FINAL's grid shapes compile twice over (true and random context)
def test_the_trainer_builds_the_grid_for_the_objective(synthetic_dir, tmp_path):
    """FINAL (packed rows by default) trains with ``context_margin``: the trainer plans the
    ``[B, S, T]`` grid and logs the margin metrics."""
    config = tiny_final_config(synthetic_dir, num_steps=2, log_every=1)
    config.objective = ml_collections.ConfigDict({"name": "context_margin"})
    workdir = str(tmp_path / "final_margin")
    trainer.train_and_evaluate(config, workdir)
    log = open(os.path.join(workdir, "train.log"), encoding="utf-8").read()
    assert "[B, S, T] grid" in log and "objective context_margin" in log
    assert "train/hinge_data=" in log and "train/margin_reg=" in log


def test_options_from_the_config_section_of_the_named_objective():
    import subprocess
    import sys

    from docnmt_jax.config_files import load_config

    model = ContextIgnoringModel(TransformerConfig(**SMALL))
    config = load_config(os.path.join(ROOT, "configs", "jean_cho.py"))
    # every config carries the paper's defaults (Sec. 5) under objective.context_margin
    section = dict(config.objective.context_margin)
    assert section["alpha_token"] == section["alpha_data"] == 1.0
    assert section["alpha_sentence"] == 0.0 and section["samples"] == 1
    assert section["margin_data"] == pytest.approx(math.log(1.1))
    assert section["margin_token"] == section["margin_sentence"] == 0.0
    # the configs' sections are the objectives' own defaults (the config file writes them out)
    from docnmt_jax.objectives import option_sections

    written = {k: dict(v) for k, v in config.objective.items() if hasattr(v, "items")}
    expected = {k: v for k, v in option_sections().items() if not k.startswith("toy_")}
    assert written == expected
    # the named objective reads its section; other sections (registered or not) are ignored
    values = {
        "name": "context_margin",
        "context_margin": {**section, "samples": 3},
        "random_context": {"seed": 9},
        "not_registered_here": {"x": 1},
    }
    assert build_objective(values, model).options.samples == 3
    assert build_objective({**values, "samples": 2}, model).options.samples == 2  # plain key wins
    with pytest.raises(ObjectiveError, match="unknown keys"):
        build_objective({**values, "context_margin": {"alpha": 1.0}}, model)
    # and the command line reaches it (train.py's flags)
    code = (
        "import sys; from absl import flags; from ml_collections import config_flags; "
        "f = config_flags.DEFINE_config_file('config'); flags.FLAGS(sys.argv); "
        "print(f.value.objective.context_margin.alpha_data, f.value.objective.name)"
    )
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            "--config",
            os.path.join(ROOT, "configs", "final.py"),
            "--config.objective.name=context_margin",
            "--config.objective.context_margin.alpha_data=2",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-1500:]
    assert out.stdout.split() == ["2.0", "context_margin"]
