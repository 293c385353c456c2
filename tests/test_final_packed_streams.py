"""Recurrent FINAL on packed document streams (docnmt_jax/data/packed_stream_plan.py,
docnmt_jax/models/final_packed_streams.py; docs/papers/final.md, "Training on document streams").

Equality first: a step of packed stream rows gives the loss, token count, every gradient leaf
and the carried state (where its masks are set) of the grid step on the same streams (one grid
row per stream, :class:`~docnmt_jax.data.stream_plan.StreamPlan`'s materialisation), step after
step with each layout's own carry, float32 within 1e-5; ``bptt_chunks = 2`` windows likewise
(``make test-slow``). The plan against a brute-force reference: every chunk once per epoch, a
document's chunks in consecutive steps of one stream, each row within its slots and lanes, the
materialised rows holding exactly the corpus's sentences where the drift and memory bands need
them, the padding fraction counted token by token; the epochs' walk (:meth:`locate`) against a
running sum.
"""

import dataclasses

import flax.linen as nn
import jax
import numpy as np
import pytest
from test_final import _fast, _fast_jit

from docnmt_jax.data import builder
from docnmt_jax.data import pipeline as pipeline_lib
from docnmt_jax.data.documents import Document
from docnmt_jax.data.packed_stream_plan import PackedStreamPlan
from docnmt_jax.data.spec import DataSpec, PackingConfig, PipelineConfig
from docnmt_jax.data.stream_plan import StreamPlan
from docnmt_jax.models import build_model
from docnmt_jax.models import final_recurrence as recurrence

V = 30
S, T, DRIFT, ROW = 3, 8, 2, 32
TINY = dict(
    name="final",
    d_model=16,
    num_heads=2,
    ffn_dim=32,
    num_encoder_layers=2,
    num_decoder_layers=2,
    dropout_rate=0.0,
    recurrent=True,
    max_segments=4,
    max_sentence_len=T,
    max_relative_distance=3,
    packed_block=8,  # rows of 32: the bands cut
    packed_drift=DRIFT,
)
LENGTHS = [7, 2, 10, 4, 1, 9, 3, 6, 5]


def _documents(lengths=LENGTHS, seed=0):
    rng = np.random.default_rng(seed)

    def side(letter, n):
        return tuple(f"{letter} " * int(rng.integers(1, T)) for _ in range(n))

    return [Document(f"d{i}", side("a", n), side("b", n)) for i, n in enumerate(lengths)]


def _encode(texts):
    """Distinct ids per word position (so a misplaced token shows), EOS-free like the test
    encoders; the pipeline appends EOS."""
    return [[4 + (7 * i + len(t)) % (V - 4) for i in range(len(t.split()))] for t in texts]


def _plan(window=1, budget=64, shuffle=True, process_count=1, process_index=0, lengths=LENGTHS):
    config = PipelineConfig(
        max_sentences=S,
        max_src_len=T,
        max_tgt_len=T,
        batch_src_tokens=budget,
        batch_tgt_tokens=budget,
        seed=1,
        shuffle=shuffle,
        process_count=process_count,
        process_index=process_index,
    )
    spec = DataSpec(
        rows="sequential_chunks",
        context="chunk",
        streams=True,
        stream_window=window,
        packing=PackingConfig("chunk", ROW, DRIFT),
    )
    return builder.build_plan(spec, config, _documents(lengths), _encode, packed=True)


# ------------------------------------------------------------------------- equality with the grid


def _grid_batch(plan, grid_plan, w):
    """The grid window of batch ``w``: stream ``b``'s chunk of step ``k*w + i`` at row
    ``b*k + i`` (-1: a padding row), the stream plan's materialisation."""
    k, steps = plan.window, plan.streams(0)
    rows = [
        steps[k * w + i] if k * w + i < steps.shape[0] else -np.ones(steps.shape[1])
        for i in range(k)
    ]
    return grid_plan.materialize(np.stack(rows, 1).reshape(-1).astype(np.int64), S, T)


def _params(model, batch):
    params = nn.meta.unbox(_fast(model.init, jax.random.PRNGKey(0), batch))["params"]
    noise = np.random.default_rng(2)  # away from init: every path carries weight
    return jax.tree.map(lambda a: a + 0.1 * noise.normal(size=a.shape).astype(a.dtype), params)


def _loss_and_grads(model):
    def run(params, batch, carry):
        def loss(p):
            value, metrics, new = model.loss_with_carry(p, batch, carry, None, False)
            return value, (metrics["tokens"].total, new)

        (value, (tokens, new)), grads = jax.value_and_grad(loss, has_aux=True)(params)
        return value, tokens, grads, new

    return _fast_jit(run)


def _assert_carries_equal(got, want):
    """The carried state of every stream: summaries and masks everywhere (the grid zeroes
    empty slots), the target memory where its mask is set (the grid keeps its padding
    positions' states there, never read)."""
    assert set(got) == set(want)
    np.testing.assert_array_equal(got["source_mask"], want["source_mask"])
    np.testing.assert_array_equal(got["target_mask"], want["target_mask"])
    np.testing.assert_allclose(got["source"], want["source"], atol=1e-5)
    real = np.asarray(want["target_mask"])[..., None] > 0
    for name in want:
        if name.startswith("target_layer_"):
            np.testing.assert_allclose(
                np.where(real, got[name], 0), np.where(real, want[name], 0), atol=1e-5
            )


def _check_equal_to_grid(window, batches, **switches):
    """``batches`` consecutive batches of the packed stream plan against the grid's."""
    plan = _plan(window)
    grid_plan = StreamPlan(plan.corpus, dataclasses.replace(plan.config, packing=None))
    model = build_model(dict(TINY, bptt_chunks=window, **switches), V)
    epoch = plan.epoch(0)
    params = _params(model, _grid_batch(plan, grid_plan, 0))
    step = _loss_and_grads(model)
    carry_grid = carry_packed = recurrence.initial_carry(model.config, plan.stream_rows)
    continuing = 0
    for w in range(batches):
        grid = _grid_batch(plan, grid_plan, w)
        packed = plan.materialize(epoch.batch(w), int(epoch.s[w]), int(epoch.t[w]))
        want = step(params, grid, carry_grid)
        got = step(params, packed, carry_packed)
        assert float(got[1]) == float(want[1]) == grid["tgt_mask"].sum() > 0
        np.testing.assert_allclose(float(got[0]), float(want[0]), atol=1e-5, rtol=0)
        for (path, g), ref in zip(
            jax.tree_util.tree_leaves_with_path(got[2]), jax.tree.leaves(want[2]), strict=True
        ):
            np.testing.assert_allclose(
                g, ref, atol=1e-5, rtol=1e-4, err_msg=jax.tree_util.keystr(path)
            )
        _assert_carries_equal(got[3], want[3])
        carry_grid, carry_packed = want[3], got[3]
        continuing += int(np.sum(grid["chunk_index"] > 0))
    assert continuing >= 3  # the carried state was read
    return plan, model, params, step


def test_packed_stream_steps_equal_the_grid_steps():
    """Three consecutive steps, each layout carrying its own state on: the same loss, token
    count, gradients and carried state; and the carry matters (an empty one changes the loss
    of a step whose chunks continue)."""
    plan, model, params, step = _check_equal_to_grid(1, 3)
    epoch = plan.epoch(0)
    packed = [plan.materialize(epoch.batch(w), 0, int(epoch.t[w])) for w in (0, 1)]
    empty = recurrence.initial_carry(model.config, plan.stream_rows)
    carried = step(params, packed[0], empty)[3]
    assert (
        abs(float(step(params, packed[1], carried)[0]) - float(step(params, packed[1], empty)[0]))
        > 1e-4
    )


def test_packed_stream_windows_equal_the_grid_windows():
    """``bptt_chunks = 2``: gradients cross the chunk boundary inside a window, in both."""
    _check_equal_to_grid(2, 3)


def test_packed_stream_steps_equal_the_grid_steps_pre_ln():
    _check_equal_to_grid(1, 3, pre_ln=True)


def test_processes_materialise_their_own_streams():
    """Two processes: each materialises its rows, whose streams are its own; the rows side by
    side are the one-process plan's rows of the same global batch."""
    one = _plan(budget=128, process_count=1)
    halves = [_plan(budget=128, process_count=2, process_index=i) for i in range(2)]
    assert one.rows % 2 == 0 and one.shapes == halves[0].shapes
    for w in range(3):
        whole = one.epoch(0)
        want = one.materialize(whole.batch(w), 0, int(whole.t[w]))
        parts = []
        for i, plan in enumerate(halves):
            local = plan.epoch(0).local(i, 2)
            parts.append(plan.materialize(local.batch(w), 0, int(local.t[w])))
        for name, value in want.items():
            np.testing.assert_array_equal(np.concatenate([p[name] for p in parts]), value)


# ------------------------------------------------------------------------- the plan, by brute force


def _reference_chunks(lengths=LENGTHS):
    """Chunks (document, index, first global sentence, sentences) of the documents, in order."""
    chunks, first = [], 0
    for d, n in enumerate(lengths):
        for i, start in enumerate(range(0, n, S)):
            chunks.append((d, i, first + start, min(S, n - start)))
        first += n
    return chunks


def _footprint(corpus, chunk):
    """Slots of a chunk laid with the drift rule after its carried memory (a loop)."""
    d, index, start, count = chunk
    tgt = corpus.tgt.lengths
    end_s, end_t = 0, int(tgt[start - 1]) if index > 0 else 0
    for k in range(start, start + count):
        s_at, t_at = max(end_s, end_t - DRIFT), max(end_t, end_s - DRIFT)
        end_s, end_t = s_at + int(corpus.src.lengths[k]), t_at + int(tgt[k])
    return max(end_s, end_t)


@pytest.mark.parametrize("window", [1, 2])
def test_every_chunk_once_a_document_in_consecutive_steps_of_one_stream(window):
    plan = _plan(window)
    chunks = _reference_chunks()
    C, G = plan.row_len, plan.lanes
    assert C == ROW * 2 ** int(
        np.ceil(np.log2(max(_footprint(plan.corpus, c) for c in chunks) / ROW))
    )
    orders = []
    for e in range(3):
        steps = plan.streams(e)
        assert sorted(steps[steps >= 0].tolist()) == list(range(len(chunks)))
        for column in steps.T:
            for n, c in enumerate(column.tolist()):
                if c < 0:
                    continue
                d, index = chunks[c][:2]
                if index > 0:  # continues: its predecessor one step before, same stream
                    assert n > 0 and column[n - 1] == c - 1
                if c + 1 < len(chunks) and chunks[c + 1][0] == d:  # the document goes on
                    assert n + 1 < column.size and column[n + 1] == c + 1
        for n in range(steps.shape[0]):
            for r in range(plan.rows):
                held = [c for c in steps[n, r * G : (r + 1) * G].tolist() if c >= 0]
                assert sum(_footprint(plan.corpus, chunks[c]) for c in held) <= C
        ep = plan.epoch(e)
        assert len(ep) == -(-steps.shape[0] // window) == plan.epoch_batches(e)
        for w in range(len(ep)):
            ids = ep.batch(w).reshape(plan.rows, G, window)
            for i in range(window):
                n = window * w + i
                want = steps[n] if n < steps.shape[0] else np.full(steps.shape[1], -1)
                np.testing.assert_array_equal(ids[:, :, i].reshape(-1), want)
        orders.append([chunks[c][0] for c in steps[steps >= 0] if chunks[c][1] == 0])
    assert orders[0] != orders[1]  # shuffled per epoch


def _rows_of(batch, corpus, plan):
    """Per row and chunk id: (stream, source sentences, target sentences, memory slots) read
    back from the materialised features, token by token."""
    out = {}
    B, L = batch["src"].shape
    for r in range(B):
        for side in ("src", "tgt"):
            for p in range(L):
                chunk = int(batch[f"{side}_chunk_ids"][r, p])
                if chunk == 0:
                    continue
                entry = out.setdefault(
                    (r, chunk), {"src": {}, "tgt": {}, "memory": [], "stream": set()}
                )
                entry["stream"].add(int(batch[f"{side}_stream"][r, p]))
                if side == "tgt" and batch["tgt_sentence_index"][r, p] < 0:
                    assert batch["tgt_mask"][r, p] == 0 and batch["tgt_segment_ids"][r, p] == 0
                    entry["memory"].append(
                        (
                            p,
                            int(batch["tgt_positions"][r, p]),
                            int(batch["tgt_chunk_positions"][r, p]),
                        )
                    )
                    continue
                assert batch[f"{side}_mask"][r, p] == 1
                k = int(batch[f"{side}_sentence_index"][r, p])
                entry[side].setdefault(k, []).append((p, int(batch[side][r, p])))
    return out


def test_materialised_rows_hold_the_corpus_where_the_bands_need_it():
    """Every chunk of a batch, read back token by token: its sentences' tokens in order, each
    sentence's sides within ``drift`` slots, sentence ``k - 1`` (the carried memory for
    ``k = 0``) starting at most ``M`` target slots before sentence ``k``, the memory the
    previous chunk's last target sentence's length with positions ``0..m-1`` and chunk
    positions ``-m..-1``, the stream one of the row's lanes and the step's."""
    plan = _plan(1, budget=128)
    corpus, chunks = plan.corpus, _reference_chunks()
    steps, ep = plan.streams(0), plan.epoch(0)
    for w in range(len(ep)):
        batch = plan.materialize(ep.batch(w), 0, int(ep.t[w]))
        found = _rows_of(batch, corpus, plan)
        held = {c: s for s, c in enumerate(steps[w].tolist()) if c >= 0}
        assert len(found) == len(held)
        for (r, _), entry in found.items():
            (stream,) = entry["stream"]
            c = int(steps[w, stream - 1])
            assert (stream - 1) // plan.lanes == r and held.pop(c) == stream - 1
            d, index, start, count = chunks[c]
            starts = {}
            for side, tokenized in (("src", corpus.src), ("tgt", corpus.tgt)):
                assert sorted(entry[side]) == list(range(count))
                for k in range(count):
                    places = [p for p, _ in entry[side][k]]
                    ids = tokenized.tokens[tokenized.offsets[start + k] :][
                        : tokenized.lengths[start + k]
                    ]
                    assert [x for _, x in entry[side][k]] == ids.tolist()
                    assert places == list(range(places[0], places[0] + len(places)))
                    starts[side, k] = places[0]
            for k in range(count):
                assert abs(starts["src", k] - starts["tgt", k]) <= DRIFT
                before = (
                    starts["tgt", k - 1]
                    if k
                    else (entry["memory"][0][0] if entry["memory"] else None)
                )
                if before is not None:
                    assert 0 < starts["tgt", k] - before <= T
            m = int(corpus.tgt.lengths[start - 1]) if index > 0 else 0
            assert [(pos, cpos) for _, pos, cpos in entry["memory"]] == [
                (j, j - m) for j in range(m)
            ]
            if m:
                assert entry["memory"][-1][0] + 1 == starts["tgt", 0]


def test_padding_fraction_counted_token_by_token():
    for window in (1, 2):
        plan = _plan(window)
        real = slots = 0
        for batch in pipeline_lib.numpy_batches(plan, start_step=0):
            if slots >= 2 * plan.batches_per_epoch * batch["src"].size:
                break
            real += int(batch["src_mask"].sum() + batch["tgt_mask"].sum())
            slots += 2 * batch["src"].size
        assert real == int(plan.corpus.src.lengths.sum() + plan.corpus.tgt.lengths.sum())
        assert plan.stats.padding_fraction == pytest.approx(1 - real / slots, abs=1e-12)


def test_steps_walk_epochs_of_different_lengths():
    """``locate`` against a running sum of the epochs' lengths; a resumed iteration is the
    straight one's tail, across epoch boundaries."""
    plan = _plan(1, lengths=[7, 2, 10, 4, 1, 9, 3, 6, 5, 11, 2, 2, 8])
    lengths = [len(plan.epoch(e)) for e in range(4)]
    assert len(set(lengths)) > 1 and lengths[0] == plan.batches_per_epoch
    bounds = np.cumsum([0] + lengths)
    for n in range(bounds[-1]):
        e = int(np.searchsorted(bounds, n, side="right") - 1)
        assert plan.locate(n) == (e, n - bounds[e])
    straight = [b for _, b in zip(range(bounds[3]), pipeline_lib.numpy_batches(plan), strict=False)]
    for start in (bounds[1] - 1, bounds[2] + 1):
        resumed = next(iter(pipeline_lib.numpy_batches(plan, start_step=int(start))))
        for name, value in straight[start].items():
            np.testing.assert_array_equal(resumed[name], value)


def test_the_recurrent_model_declares_packed_streams():
    """Recurrent FINAL's data: packed streams by default (the builder's
    :class:`PackedStreamPlan`), the grid streams with ``packed=False``; its config refuses the
    two-layout rows (packed streams are banded)."""
    model = build_model(TINY, V)
    spec = model.data_spec()
    assert spec.streams and spec.packing.drift == DRIFT and spec.packing.unit == "chunk"
    config = PipelineConfig(max_sentences=S, max_src_len=T, max_tgt_len=T)
    docs = _documents()
    assert isinstance(
        builder.build_plan(spec, config, docs, _encode, packed=True), PackedStreamPlan
    )
    assert isinstance(builder.build_plan(spec, config, docs, _encode), StreamPlan)
    with pytest.raises(ValueError, match="packed_layout='banded'"):
        build_model(dict(TINY, packed_layout="two_layout"), V)
