"""Packed rows (several sentences or chunks per row, segment ids) train exactly what the
``[B, S, T]`` grid trains: the sentence Transformer and doc2doc, loss, gradients and logits
of every real target token, on the same documents laid out both ways (``schema.pack_grid``)."""

import jax
import numpy as np
import pytest

from docnmt_jax.data import schema
from docnmt_jax.data.tokenizer import BOS_ID
from docnmt_jax.models import layers
from docnmt_jax.models.base import ModelError, build_model
from docnmt_jax.models.concat import SEP_ID, mark_separators_packed

V = 29
TINY = dict(d_model=16, num_heads=2, ffn_dim=24, num_encoder_layers=2, num_decoder_layers=2)
FAST = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def _grid(seed: int = 0) -> schema.Batch:
    """Three chunks: mixed lengths, an empty slot, a one-sentence chunk, src >> tgt."""
    rng = np.random.default_rng(seed)
    src_len = np.array([[5, 3, 7], [2, 6, 0], [4, 0, 0]])
    tgt_len = np.array([[2, 5, 1], [4, 1, 0], [6, 0, 0]])
    ar = np.arange(7)
    src_mask, tgt_mask = (ar < src_len[..., None]), (ar < tgt_len[..., None])
    src = rng.integers(4, V, src_mask.shape) * src_mask
    tgt = rng.integers(4, V, tgt_mask.shape) * tgt_mask
    return schema.batch_from_grids(src, tgt, src_lengths=src_len, tgt_lengths=tgt_len)


def _model(name: str):
    model = build_model({"name": name, **TINY, "dropout_rate": 0.0}, V)
    grid = _grid()
    init = jax.jit(model.init).lower(jax.random.PRNGKey(0), grid).compile(FAST)
    params = jax.tree.map(np.asarray, layers.nn.meta.unbox(init(jax.random.PRNGKey(0), grid)))
    return model, params["params"]


def _loss_and_grads(model, params, batch):
    def value(p):
        loss, metrics = model.loss(p, batch, None, False)
        return loss, metrics["tokens"].total

    fn = jax.value_and_grad(value, has_aux=True)
    (loss, tokens), grads = jax.jit(fn).lower(params).compile(FAST)(params)
    return float(loss), float(tokens), grads


def _assert_same_training(model, params, grid, packed):
    loss, tokens, grads = _loss_and_grads(model, params, grid)
    p_loss, p_tokens, p_grads = _loss_and_grads(model, params, packed)
    assert p_tokens == tokens == grid["tgt_mask"].sum()
    np.testing.assert_allclose(p_loss, loss, rtol=1e-5, atol=1e-5)
    flat = jax.tree_util.tree_leaves_with_path(p_grads)
    for (path, g), ref in zip(flat, jax.tree.leaves(grads), strict=True):
        name = jax.tree_util.keystr(path)
        np.testing.assert_allclose(g, ref, atol=1e-5, rtol=1e-4, err_msg=name)
        assert np.abs(ref).max() > 0, f"{name} gets no gradient: the check would be vacuous"


@pytest.mark.parametrize("drift", [None, 1])
def test_transformer_on_packed_sentences_equals_the_grid(drift):
    model, params = _model("transformer")
    grid = _grid()
    # Every sentence its own unit: rows of two and three chunks' sentences, row 1 with gaps.
    packed, index = schema.pack_grid(grid, row_len=48, rows_of=[[0, 2], [1]], drift=drift)
    assert model.packing().unit == "sentence"
    _assert_same_training(model, params, grid, packed)

    logits, _, _ = model.forward(params, grid, None, False)  # [B*S, T, V]
    p_logits, _, _ = model.forward(params, packed, None, False)  # [B', L, V]
    real = index[..., 0] >= 0
    b, s, t = (index[..., i][real] for i in range(3))
    S = grid["src"].shape[1]
    np.testing.assert_allclose(p_logits[real], logits[b * S + s, t], atol=1e-5, rtol=1e-5)


def test_doc2doc_on_packed_chunks_equals_the_grid():
    model, params = _model("doc2doc")
    grid = _grid(1)
    packed, index = schema.pack_grid(grid, row_len=40, rows_of=[[0, 2], [1]])
    assert model.packing().unit == "chunk"
    _assert_same_training(model, params, grid, packed)

    logits, targets, _ = model.forward(params, grid, None, False)  # [B, S*T, V]
    p_logits, p_targets, _ = model.forward(params, packed, None, False)
    real = index[..., 0] >= 0
    b, col = index[..., 0][real], packed["tgt_chunk_positions"][real]
    np.testing.assert_array_equal(p_targets[real], targets[b, col])  # separators included
    np.testing.assert_allclose(p_logits[real], logits[b, col], atol=1e-5, rtol=1e-5)


def test_packed_separators_follow_chunks_across_gaps():
    """Two chunks in one row, the second with a gap between its sentences: every sentence's
    last token becomes SEP except each chunk's last, whose EOS stays."""
    E = 2
    tgt = np.array([[5, E, 6, 7, E, 8, E, 0, 9, E, 0, 0]])
    mask = (tgt > 0).astype(np.int32)
    chunk = np.array([[1, 1, 1, 1, 1, 2, 2, 0, 2, 2, 0, 0]])
    sidx = np.array([[0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 0, 0]])
    marked = np.asarray(mark_separators_packed(tgt, mask, sidx, chunk))
    want = np.array([[5, SEP_ID, 6, 7, E, 8, SEP_ID, 0, 9, E, 0, 0]])
    np.testing.assert_array_equal(marked, want)


def test_shift_right_restarts_every_segment():
    ids = np.array([[5, 6, 2, 7, 2, 0]])
    positions = np.array([[0, 1, 2, 0, 1, 0]])
    shifted = np.asarray(layers.shift_right_segments(ids, positions, BOS_ID))
    np.testing.assert_array_equal(shifted, [[BOS_ID, 5, 6, BOS_ID, 7, BOS_ID]])


def test_segment_mask_is_the_brute_force_relation():
    q = np.array([[1, 1, 2, 0, 3]])
    k = np.array([[2, 1, 0, 3]])
    mask = np.asarray(layers.segment_mask(q, k))[0, 0]
    want = [[qi == kj and qi > 0 for kj in k[0]] for qi in q[0]]
    np.testing.assert_array_equal(mask, want)


def test_grid_only_methods_refuse_packed_batches():
    model, params = _model("doc2doc")
    packed, _ = schema.pack_grid(_grid(), row_len=40)
    with pytest.raises(ModelError, match="grid batch"):
        model.score(params, packed)
    with pytest.raises(ModelError, match="grid batch"):
        model.with_random_context(packed, jax.random.PRNGKey(0))
