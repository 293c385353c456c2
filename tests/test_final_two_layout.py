"""FINAL's two-layout train step (docs/design/packed_final_and_beam_cache.md §1): aligned rows
(:mod:`docnmt_jax.data.two_layout_plan`) read in a sentence and a chunk layout
(:mod:`docnmt_jax.models.final_two_layout`) give the loss, gradients and logits of the grid
and of the banded packed rows, in float64."""

import dataclasses
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import TABLE3_SWITCHES
from test_final import _fast
from test_final_packed import CFG, ROWS_OF, TGT_LEN, _grid, _loss_grads_logits, _params

from docnmt_jax.data import schema
from docnmt_jax.data.pipeline import plan_batches
from docnmt_jax.data.spec import PackingConfig
from docnmt_jax.data.two_layout_plan import TwoLayoutPlan, align_grid, next_fit_spans
from docnmt_jax.models.final import FinalModel
from docnmt_jax.models.final_two_layout import blocks as blocks_of
from docnmt_jax.models.final_two_layout import chunk_layout, memory_rows, permute

ROW_LEN, M = 32, CFG.max_sentence_len  # 4 blocks of 8 slots a row
TWO = dataclasses.replace(CFG, packed_layout="two_layout")
CASES = dict(TABLE3_SWITCHES)
CASES["final+pre_ln"] = dict(TABLE3_SWITCHES["final"], pre_ln=True)
DEFAULT_CASES = ("final", "doc2sent_chunk")  # the XL memory, global layer; dense doc2sent


@pytest.fixture(scope="module")
def batches():
    """(grid, aligned rows and their index, banded rows and their index)."""
    grid = _grid()
    aligned = align_grid(grid, ROW_LEN, M, ROWS_OF)
    banded = schema.pack_grid(grid, ROW_LEN, rows_of=ROWS_OF, drift=CFG.packed_drift)
    return grid, aligned, banded


def test_aligned_rows_put_each_sentence_in_one_block(batches):
    """Both sides of a sentence in the same block; memory rows within their room; the
    previous sentence of a chunk is the previous segment; blocks hold several chunks."""
    _, (packed, index), _ = batches
    schema.check_packed_batch(packed)
    assert (index[..., 0] >= 0).sum() == TGT_LEN.sum()
    for r in range(packed["src"].shape[0]):
        segments = set(packed["tgt_segment_ids"][r].tolist()) - {0}
        for s in segments:
            where = {
                side: np.flatnonzero(packed[f"{side}_segment_ids"][r] == s)
                for side in "src tgt".split()
            }
            blocks = {side: set((w // M).tolist()) for side, w in where.items()}
            assert blocks["src"] == blocks["tgt"] and len(blocks["src"]) == 1
            assert np.all(np.diff(where["tgt"]) == 1)  # contiguous
            i = where["tgt"][0]
            if packed["tgt_sentence_index"][r, i] > 0:
                prev = packed["tgt_segment_ids"][r] == s - 1
                assert packed["tgt_chunk_ids"][r][prev][0] == packed["tgt_chunk_ids"][r, i]
    shared = [set(b.tolist()) - {0} for b in packed["tgt_chunk_ids"].reshape(-1, M)]
    assert max(map(len, shared)) == 2  # chunks share a block


def test_memory_rows_hold_the_previous_sentence(batches):
    """Every real query's memory slots hold exactly its chunk's previous sentence, at the
    grid's distances; ``inverse`` inverts ``index``."""
    _, (packed, _), _ = batches
    memory = jax.tree.map(np.asarray, memory_rows(packed, M))
    real = memory.index < ROW_LEN
    assert real.sum() == (TGT_LEN[:, :-1] * (TGT_LEN[:, 1:] > 0)).sum()  # sentences with a next
    rows, slots = np.nonzero(real)
    np.testing.assert_array_equal(memory.inverse[rows, memory.index[real]], slots)
    index, per_row = blocks_of(memory.index, M), ROW_LEN // M
    for n, i in zip(*np.nonzero(blocks_of(packed["tgt_mask"], M) > 0), strict=True):
        b, q = n // per_row, (n % per_row) * M + i  # row and slot of a real query
        keys = index[n][memory.mask[n, 0, i]]
        chunk, sidx, cpos = (
            packed[f"tgt_{k}"][b] for k in ("chunk_ids", "sentence_index", "chunk_positions")
        )
        prev = (chunk == chunk[q]) & (sidx == sidx[q] - 1)
        np.testing.assert_array_equal(np.sort(keys), np.flatnonzero(prev))
        np.testing.assert_array_equal(
            memory.distance[n, i][memory.mask[n, 0, i]], cpos[q] - cpos[keys]
        )


def test_permute_backward_is_the_inverse_gather():
    x = jnp.arange(12.0).reshape(4, 3) + 1  # two rows of 6 in blocks of 3
    index = jnp.array([[5, 6, 0, 6, 2, 6], [6, 1, 6, 6, 4, 3]])
    inverse = jnp.full((2, 6), 6).at[jnp.arange(2)[:, None], index].set(jnp.arange(6), mode="drop")
    weights = jnp.arange(12.0).reshape(4, 3)

    def plain(x):
        rows = jnp.concatenate([x.reshape(2, 6), jnp.zeros((2, 1))], axis=1)
        return jnp.sum(jnp.take_along_axis(rows, index, 1).reshape(4, 3) * weights)

    got = jax.grad(lambda x: jnp.sum(permute(x, index, inverse) * weights))(x)
    np.testing.assert_array_equal(got, jax.grad(plain)(x))
    np.testing.assert_array_equal(
        permute(x, index, inverse).reshape(2, 6)[1, 1], x.reshape(2, 6)[1, 1]
    )


def _float64(cfg):
    return dataclasses.replace(cfg, dtype=jnp.float64, param_dtype=jnp.float64)


def _compare(batches, name, banded, spans=1):
    """The two-layout step (global layer over ``spans`` chunk spans a row) against the grid,
    or with ``banded`` against the banded rows."""
    grid, (aligned, index), (banded_rows, banded_index) = batches
    with jax.enable_x64(True):
        cfg = _float64(dataclasses.replace(CFG, **CASES[name]))
        two = FinalModel(
            dataclasses.replace(cfg, packed_layout="two_layout", packed_chunk_spans=spans)
        )
        old = FinalModel(dataclasses.replace(cfg, packed_layout="banded"))
        params = jax.tree.map(lambda x: x.astype(jnp.float64), _params(cfg, grid))
        model, batch = (old, banded_rows) if banded else (two, grid)
        got, want = _fast(
            lambda p: [_loss_grads_logits(two, p, aligned), _loss_grads_logits(model, p, batch)],
            params,
        )
        _assert_close(got, want, index, banded_index if banded else None)


@pytest.mark.parametrize(
    "name",
    [n if n in DEFAULT_CASES else pytest.param(n, marks=pytest.mark.slow) for n in CASES],
)
def test_two_layout_equals_the_grid(batches, name):
    """Loss, token count, every gradient leaf and every real token's logits (x64)."""
    _compare(batches, name, banded=False)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_two_layout_equals_the_banded_rows(batches, name):
    """The same against today's banded packed rows (which equal the grid:
    ``tests/test_final_packed.py``)."""
    _compare(batches, name, banded=True)


def _assert_close(got, want, index, want_index, tol=1e-6):
    """Equal up to float32 rounding: the model keeps embeddings, attention logits and softmax,
    output logits and the loss in float32 whatever the dtype (under x64 the rest is
    float64); measured differences are ~1e-7."""
    loss, tokens, grads, logits = got
    ref_loss, ref_tokens, ref_grads, ref_logits = want
    assert float(tokens) == float(ref_tokens)
    np.testing.assert_allclose(float(loss), float(ref_loss), atol=tol, rtol=1e-6)
    assert jax.tree.structure(grads) == jax.tree.structure(ref_grads)
    for (path, g), ref in zip(
        jax.tree_util.tree_leaves_with_path(grads), jax.tree.leaves(ref_grads), strict=True
    ):
        np.testing.assert_allclose(g, ref, atol=tol, rtol=1e-5, err_msg=jax.tree_util.keystr(path))
    real = index[..., 0] >= 0
    b, s, t = index[real].T
    if want_index is None:
        want_logits = np.asarray(ref_logits)[b, s, t]
    else:  # the same grid token in the banded rows
        where = {tuple(x): i for i, x in enumerate(want_index.reshape(-1, 3).tolist())}
        flat = np.asarray(ref_logits).reshape(-1, ref_logits.shape[-1])
        want_logits = flat[[where[(x, y, z)] for x, y, z in zip(b, s, t, strict=True)]]
    np.testing.assert_allclose(np.asarray(logits)[real], want_logits, atol=tol, rtol=1e-5)


def test_the_switch_selects_aligned_rows():
    packing = FinalModel(TWO).packing()
    assert (packing.unit, packing.row_tokens, packing.drift, packing.block_tokens) == (
        "chunk",
        1024,
        None,
        M,
    )
    assert FinalModel(CFG).packing().block_tokens is None  # default: the banded rows
    with pytest.raises(ValueError, match="packed_layout='banded'"):  # streams: banded rows
        dataclasses.replace(TWO, recurrent=True)
    with pytest.raises(ValueError, match="packed_layout"):
        dataclasses.replace(CFG, packed_layout="diagonal")
    with pytest.raises(ValueError, match="block_tokens"):
        PackingConfig("chunk", 1024, drift=4, block_tokens=128)
    spans = FinalModel(dataclasses.replace(TWO, packed_chunk_spans=2)).packing()
    assert (spans.row_tokens, spans.chunk_spans) == (2048, 2)
    with pytest.raises(ValueError, match="packed_chunk_spans"):  # spans: two-layout rows only
        dataclasses.replace(CFG, packed_chunk_spans=2)
    with pytest.raises(ValueError, match="chunk_spans"):
        PackingConfig("chunk", 1024, chunk_spans=2)


def test_the_plan_materialises_aligned_rows():
    """:class:`TwoLayoutPlan` batches equal :func:`align_grid` of the same chunks, every chunk
    once per epoch."""
    sys.path.insert(0, "tests")
    from test_packed_plan import BASE, DOCS, all_batches, encode, grid_plan

    cfg = dataclasses.replace(
        BASE, packing=PackingConfig("chunk", 32, block_tokens=16), max_src_len=16, max_tgt_len=16
    )
    plan = plan_batches(DOCS, encode, cfg)
    assert isinstance(plan, TwoLayoutPlan) and 0 < plan.sentence_padding <= plan.padding_fraction
    grid, seen = grid_plan(plan), []
    for rows, t in all_batches(plan, 0):
        packed = plan.materialize(rows, 0, t)
        items, rows_of = [], []
        for r in rows.tolist():
            row_items = plan.item_rows[r] if r >= 0 else np.zeros(0, np.int64)
            rows_of.append(list(range(len(items), len(items) + row_items.size)))
            items.extend(row_items.tolist())
        seen += items
        grid_batch = grid.materialize(np.asarray(items, np.int64), cfg.max_sentences, 16)
        expected, _ = align_grid(grid_batch, t, 16, rows_of)
        for k in expected:
            np.testing.assert_array_equal(packed[k], expected[k], err_msg=k)
    assert sorted(seen) == list(range(plan.chunk_table["doc"].size))


@pytest.mark.slow
def test_the_trainer_trains_on_two_layout_rows(synthetic_dir, tmp_path):
    """The switch reaches the trainer through the model's data spec alone: aligned batches,
    compiled ahead for their shapes, a falling loss and a dev loss."""
    from conftest import tiny_final_config

    from docnmt_jax.training import trainer

    config = tiny_final_config(synthetic_dir, num_steps=20)
    config.model.packed_layout = "two_layout"
    result = trainer.train_and_evaluate(config, str(tmp_path), record_losses=True)
    losses = [float(x) for x in result.losses]
    assert len(losses) == 20 and np.mean(losses[-5:]) < np.mean(losses[:5]) - 1.0
    assert np.isfinite(result.dev_metrics["dev_loss"])


SPANS = 2


@pytest.fixture(scope="module")
def span_batches():
    """The grid, its aligned rows with two chunk spans a row, and the banded rows."""
    grid = _grid()
    aligned = align_grid(grid, ROW_LEN, M, ROWS_OF, chunk_spans=SPANS)
    banded = schema.pack_grid(grid, ROW_LEN, rows_of=ROWS_OF, drift=CFG.packed_drift)
    return grid, aligned, banded


@pytest.mark.parametrize("name", ["final", pytest.param("final+pre_ln", marks=pytest.mark.slow)])
def test_the_global_layer_over_chunk_spans_equals_the_grid(span_batches, name):
    """The global layer read in chunk spans (``packed_chunk_spans``): loss, gradients and
    logits of the grid (x64)."""
    _compare(span_batches, name, banded=False, spans=SPANS)


def test_chunk_layout_lays_chunks_next_fit_into_spans():
    """:func:`chunk_layout` on a plan's batches (``chunk_spans=3``) against the NumPy
    next-fit of each row's chunks: every source token at its chunk's span offset plus its
    chunk position, inside its span, and ``index`` the inverse of ``inverse``."""
    sys.path.insert(0, "tests")
    from test_packed_plan import BASE, DOCS, all_batches, encode

    packing = PackingConfig("chunk", 48, block_tokens=16, chunk_spans=3)
    cfg = dataclasses.replace(BASE, packing=packing, max_src_len=16, max_tgt_len=16)
    plan = plan_batches(DOCS, encode, cfg)
    rows_seen = 0
    for rows, t in all_batches(plan, 0):
        packed = plan.materialize(rows, 0, t)
        index, inverse = (np.asarray(x) for x in chunk_layout(packed, 3))
        for r in range(packed["src"].shape[0]):
            chunk, cpos = packed["src_chunk_ids"][r], packed["src_chunk_positions"][r]
            n = int(chunk.max())
            lengths = np.array([(chunk == c).sum() for c in range(1, n + 1)], np.int64)
            span, offset = next_fit_spans(lengths, t // 3)
            assert span.max(initial=0) < 3 and np.all(offset % (t // 3) + lengths <= t // 3)
            real = np.flatnonzero(chunk > 0)
            want = offset[chunk[real] - 1] + cpos[real]
            np.testing.assert_array_equal(inverse[r, real], want)
            assert np.all(inverse[r, chunk == 0] == t)
            np.testing.assert_array_equal(index[r, want], real)
            assert np.sum(index[r] < t) == real.size
            rows_seen += n > 1
    assert rows_seen > 0  # rows with several chunks were laid
