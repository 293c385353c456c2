"""FINAL on packed rows (docs/design/packing_plan.md §1, §2.3-2.5): the same
documents as a ``[B, S, T]`` grid and as packed rows give the same loss, gradients and logits
for every Table 3 row; banded attention equals dense attention."""

import dataclasses

import flax.linen as nn
import jax
import numpy as np
import pytest
from conftest import TABLE3_SWITCHES
from test_final import _fast

from docnmt_jax.data import schema
from docnmt_jax.models import layers
from docnmt_jax.models.base import ModelError
from docnmt_jax.models.final import Final, FinalConfig, FinalModel
from docnmt_jax.models.xl import packed_decoder_attention

V = 23
ROW_LEN = 32
CFG = FinalConfig(
    vocab_size=V,
    d_model=16,
    num_heads=2,
    ffn_dim=24,
    num_encoder_layers=2,
    num_decoder_layers=2,
    deterministic=True,
    max_relative_distance=3,  # > S - 1: the grid slices gamma to S - 1, packed rows do not
    max_segments=4,
    packed_block=4,  # 8 blocks per row of 32: every band cuts
    packed_drift=1,
    max_sentence_len=8,
)
# Row 0: three sentences, src >> tgt in the first; row 1: two (an empty slot), tgt >> src in
# the first, src >> tgt in the second; row 2: a one-sentence chunk.
SRC_LEN = np.array([[8, 2, 6], [2, 7, 0], [7, 0, 0]])
TGT_LEN = np.array([[2, 7, 3], [5, 1, 0], [5, 0, 0]])
ROWS_OF = [[0, 1], [2]]  # two chunks in packed row 0

CASES = {name: switches for name, switches in TABLE3_SWITCHES.items()}
CASES["final+pre_ln"] = dict(TABLE3_SWITCHES["final"], pre_ln=True)
CASES["final+max_relative_distance=1"] = dict(TABLE3_SWITCHES["final"], max_relative_distance=1)


def _grid(seed=0):
    rng = np.random.default_rng(seed)
    shape = SRC_LEN.shape + (8,)
    src, tgt = (rng.integers(4, V, shape).astype(np.int32) for _ in range(2))
    return schema.batch_from_grids(src, tgt, src_lengths=SRC_LEN, tgt_lengths=TGT_LEN)


@pytest.fixture(scope="module")
def batches():
    """(grid, packed, index): the grid laid into rows of 32 with drift 1 (gaps)."""
    grid = _grid()
    packed, index = schema.pack_grid(grid, ROW_LEN, rows_of=ROWS_OF, drift=1)
    return grid, packed, index


def test_the_packed_rows_have_gaps_and_the_bands_cut(batches):
    _, packed, _ = batches
    for side in schema.SIDES:  # gaps inside row 0 on both sides (the drift rule)
        real = packed[f"{side}_mask"][0] > 0
        assert not real[: np.flatnonzero(real)[-1]].all()
    assert set(packed["tgt_chunk_ids"][0].tolist()) == {0, 1, 2}
    attention = packed_decoder_attention(
        packed, CFG.packed_block, CFG.max_sentence_len, CFG.packed_drift
    )
    for band in (attention.current, attention.memory, attention.cross):
        assert band.num_blocks == 8 and band.window < ROW_LEN


def test_band_windows_are_the_neighbouring_blocks():
    x = np.arange(2 * 12).reshape(2, 12) + 1
    band = layers.Band(12, 3, back=2, ahead=1)
    windows = np.asarray(band.windows(band.blocks(x)))  # [2 * 4, 4 * 3]
    padded = np.pad(x, [(0, 0), (6, 3)])
    for b in range(2):
        for i in range(4):
            np.testing.assert_array_equal(windows[b * 4 + i], padded[b, 3 * i : 3 * i + 12])
    assert np.asarray(layers.Band.dense(12).windows(x)).shape == (2, 12)
    with pytest.raises(ValueError, match="does not divide"):
        layers.Band(12, 5)


def test_init_on_grid_and_packed_rows_gives_one_tree(batches):
    grid, packed, _ = batches
    model = Final(CFG)
    segments = FinalModel(CFG).rows(packed)["segments"]
    key = jax.random.PRNGKey(0)
    trees = [
        jax.eval_shape(model.init, key, b["src"], b["src_mask"], b["tgt"], b["tgt_mask"], **kw)
        for b, kw in ((grid, {}), (packed, {"segments": segments}))
    ]
    shapes = [jax.tree.map(lambda x: (x.shape, x.dtype), t) for t in trees]
    assert shapes[0] == shapes[1]


def _params(cfg, grid):
    variables = _fast(
        Final(cfg).init,
        jax.random.PRNGKey(0),
        grid["src"],
        grid["src_mask"],
        grid["tgt"],
        grid["tgt_mask"],
    )
    return nn.meta.unbox(variables)["params"]


def _loss_grads_logits(model, params, batch):
    """(loss, tokens, gradients, logits) of ``model`` on ``batch`` (grid or packed)."""

    def loss(p):
        value, metrics = model.loss(p, batch, None, False)
        return value, metrics["tokens"].total

    (value, tokens), grads = jax.value_and_grad(loss, has_aux=True)(params)
    rows = model.rows(batch)
    extra = {"segments": rows["segments"]} if "segments" in rows else {}
    logits = model.eval_module.apply(
        {"params": params}, rows["src"], rows["src_mask"], rows["tgt"], rows["tgt_mask"], **extra
    )
    return value, tokens, grads, logits


def _assert_equal(got, want, index):
    """``got``/``want``: (loss, tokens, grads, logits); the packed logits ``[B', L, V]`` of
    real target tokens (``index >= 0``) against ``want``'s: the grid's ``[B, S, T, V]`` at
    ``index``, or packed ones at the same place. Returns the real-token mask."""
    loss, tokens, grads, logits = got
    ref_loss, ref_tokens, ref_grads, ref_logits = want
    assert float(tokens) == float(ref_tokens)
    np.testing.assert_allclose(float(loss), float(ref_loss), atol=1e-5, rtol=0)
    flat, ref_flat = jax.tree_util.tree_leaves_with_path(grads), jax.tree.leaves(ref_grads)
    assert jax.tree.structure(grads) == jax.tree.structure(ref_grads)
    for (path, g), ref in zip(flat, ref_flat, strict=True):
        np.testing.assert_allclose(g, ref, atol=1e-5, rtol=1e-4, err_msg=jax.tree_util.keystr(path))
    logits, ref_logits = np.asarray(logits), np.asarray(ref_logits)
    real = index[..., 0] >= 0
    b, s, t = index[real].T
    want_logits = ref_logits[b, s, t] if ref_logits.ndim == 4 else ref_logits[real]
    np.testing.assert_allclose(logits[real], want_logits, atol=1e-5, rtol=1e-5)
    return real


def _assert_not_vacuous(cfg, grads):
    """The parameters that only context reaches get gradient, so equality is not 0 == 0."""
    checked = [grads["embed"]["embedding"]]
    if cfg.segment_embedding:
        checked.append(grads["segment_embedding"])
    if cfg.segment_relative_attention:
        attention = grads["global_layer"]["segment_attention"]
        checked += [attention["relative_key"], attention["relative_value"]]
        if cfg.context_fusion_gate:
            checked.append(grads["global_layer"]["gate"]["kernel"])
    if cfg.xl_decoder:
        for i in range(cfg.num_decoder_layers):
            attention = grads[f"decoder_layers_{i}"]["self_attention"]
            checked += [attention["content_bias"], attention["position_bias"]]
    for g in checked:
        assert np.abs(np.asarray(g)).max() > 1e-6


# The default suite checks the rows that reach every packed code path (dense doc2sent layers,
# chunk-wide cross-attention, the global layer with gate and clipping, pre-LN, the XL and the
# sentence decoder); the other Table 3 rows, each a subset of these switches (``doc2sent``'s
# own-slice cross-attention is ``final``'s), run with ``make test-slow``.
DEFAULT_CASES = (
    "final",
    "doc2sent_chunk",
    "sent2doc_xl",
    "final+pre_ln",
    "final+max_relative_distance=1",
)


@pytest.mark.parametrize(
    "name",
    [n if n in DEFAULT_CASES else pytest.param(n, marks=pytest.mark.slow) for n in CASES],
)
def test_packed_rows_equal_the_grid(batches, name):
    """Loss, token count, every gradient leaf and every real token's logits."""
    grid, packed, index = batches
    cfg = dataclasses.replace(CFG, **CASES[name])
    model = FinalModel(cfg)
    params = _params(cfg, grid)
    got, want = _fast(
        lambda p: (_loss_grads_logits(model, p, packed), _loss_grads_logits(model, p, grid)),
        params,
    )
    real = _assert_equal(got, want, index)
    assert real.sum() == TGT_LEN.sum()
    _assert_not_vacuous(cfg, got[2])


@pytest.mark.parametrize("name", ["final", "+context_fusion_gate"])
def test_banded_attention_equals_dense(batches, name):
    """``packed_block=4`` (windows of 3-5 blocks of 4) equals one block of the whole row."""
    grid, packed, index = batches
    cfg = dataclasses.replace(CFG, **TABLE3_SWITCHES[name])
    banded, dense = FinalModel(cfg), FinalModel(dataclasses.replace(cfg, packed_block=ROW_LEN))
    params = _params(cfg, grid)
    got, want = _fast(
        lambda p: (_loss_grads_logits(banded, p, packed), _loss_grads_logits(dense, p, packed)),
        params,
    )
    _assert_equal(got, want, index)  # padding logits differ: a fully masked row averages


def test_packing_is_chunks_with_the_configured_drift(batches):
    model = FinalModel(CFG)
    packing = model.packing()
    assert (packing.unit, packing.row_tokens, packing.drift) == ("chunk", 1024, 1)
    for method in (model.sentence_attention, model.score):  # grid only
        with pytest.raises(ModelError, match="grid"):
            method(None, batches[1])


def test_packed_config_is_validated():
    for key, value in (("packed_block", 0), ("packed_drift", -1), ("max_sentence_len", 0)):
        with pytest.raises(ValueError, match=key):
            dataclasses.replace(CFG, **{key: value})


def test_data_limits_beyond_the_windows_are_refused():
    """Sentences longer than ``max_sentence_len`` (or chunks beyond ``max_segments``) would
    fall outside the bands: the trainer's check names the keys to change."""
    from docnmt_jax.data.spec import PipelineConfig

    model = FinalModel(dataclasses.replace(CFG, max_sentence_len=64, max_segments=20))
    packed = PipelineConfig(max_src_len=64, max_tgt_len=64, packing=model.packing())
    model.check_data(packed)
    with pytest.raises(ModelError, match=r"max_src_len/max_tgt_len \(65\).*max_sentence_len"):
        model.check_data(dataclasses.replace(packed, max_tgt_len=65))
    model.check_data(dataclasses.replace(packed, max_tgt_len=128, packing=None))  # grid: fine
    with pytest.raises(ModelError, match="max_sentences .21. > config.model.max_segments"):
        model.check_data(dataclasses.replace(packed, max_sentences=21))
