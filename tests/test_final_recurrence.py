"""Recurrent FINAL (docnmt_jax/models/final_recurrence.py): context across the chunk boundary.

Each piece against an independent reference: the global layer's attention over the carried
summaries against a float64 loop over Eq. (1); the summaries against a loop; the carried target
memory against the same sentences decoded as one long chunk (the in-chunk memory rule); the
document streams against their definition. ``slow`` (a tiny run trained for 6 steps):
training resumes with the carried state exactly; greedy stream translation against the
training path's teacher-forced argmax, chunk by chunk with the carried state; a document's
translation does not depend on what shares its batch.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import tiny_final_config

from docnmt_jax.data import builder
from docnmt_jax.data.documents import Document
from docnmt_jax.data.spec import DataSpec, PipelineConfig
from docnmt_jax.data.tokenizer import BOS_ID
from docnmt_jax.models import build_model
from docnmt_jax.models import final_recurrence as recurrence
from docnmt_jax.models.final_layers import FinalConfig, SegmentRelativeAttention

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
    max_sentence_len=16,
    max_relative_distance=3,
)


def _grid(rng, B, S, T, vocab=30):
    lengths = rng.integers(2, T + 1, (B, S))
    real = np.arange(T) < lengths[..., None]
    src = np.where(real, rng.integers(4, vocab, (B, S, T)), 0).astype(np.int32)
    tgt = np.where(real, rng.integers(4, vocab, (B, S, T)), 0).astype(np.int32)
    return {
        "src": src,
        "src_mask": (src > 0).astype(np.int32),
        "tgt": tgt,
        "tgt_mask": (tgt > 0).astype(np.int32),
    }


# ------------------------------------------------------------------------- the global layer


def test_attention_over_the_summaries_matches_a_float64_loop_over_eq1():
    cfg = FinalConfig(**{k: v for k, v in TINY.items() if k != "name"}, vocab_size=30)
    B, S, T, M, D, H = 2, 3, 4, 4, cfg.d_model, cfg.num_heads
    rng = np.random.default_rng(0)
    x = rng.normal(size=(B, S * T, D)).astype(np.float32)
    mask = (rng.random((B, S * T)) < 0.8).astype(np.int32)
    mask[:, 0] = 1
    memory = rng.normal(size=(B, M, D)).astype(np.float32)
    memory_mask = np.array([[0, 1, 1, 1], [1, 1, 1, 1]], np.int32)
    layer = SegmentRelativeAttention(cfg)
    params = layer.init(jax.random.PRNGKey(1), x, mask, S, None, (memory, memory_mask))["params"]
    noise = np.random.default_rng(2)
    params = jax.tree.map(lambda a: a + 0.3 * noise.normal(size=a.shape), nn.meta.unbox(params))
    out, _ = layer.apply({"params": params}, x, mask, S, None, (memory, memory_mask))

    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    dh, R = D // H, cfg.max_relative_distance

    def proj(name, v):
        return np.einsum("...d,dhk->...hk", v, p[name]["kernel"]) + p[name]["bias"]

    expected = np.zeros((B, S * T, H, dh))
    for b in range(B):
        tokens = [(x[b, j], j // T, mask[b, j]) for j in range(S * T)]
        summaries = [(memory[b, j], j - M, memory_mask[b, j]) for j in range(M)]
        keys = [
            (proj("key", v), proj("value", v), kappa, real) for v, kappa, real in tokens + summaries
        ]
        for i in range(S * T):
            q, k_sent = proj("query", x[b, i]), i // T
            logits, values = [], []
            for key, value, kappa, real in keys:
                r = int(np.clip(k_sent - kappa, -R, R)) + R
                score = np.sum(q * (key + p["relative_key"][r]), -1) / np.sqrt(dh)
                logits.append(np.where(real, score, -np.inf))
                values.append(value + p["relative_value"][r])
            logits = np.stack(logits)  # [K, H]
            w = np.exp(logits - logits.max(0))
            w /= w.sum(0)
            expected[b, i] = np.einsum("kh,khd->hd", w, np.stack(values))
    expected = np.einsum("bqhd,hdo->bqo", expected, p["out"]["kernel"]) + p["out"]["bias"]
    np.testing.assert_allclose(out, expected, atol=2e-4)


def test_summaries_are_right_aligned_sentence_means():
    rng = np.random.default_rng(3)
    h = rng.normal(size=(2, 3, 4, 5)).astype(np.float32)
    src_mask = np.array(
        [[[1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 0, 0]], [[1, 1, 1, 1], [0, 0, 0, 0], [0, 0, 0, 0]]]
    )
    summaries, mask = recurrence.sentence_summaries(jnp.asarray(h), jnp.asarray(src_mask), 4)
    for b, count in enumerate([3, 1]):
        for slot in range(4):
            sentence = slot - 4 + count
            assert mask[b, slot] == (sentence >= 0)
            want = h[b, sentence][src_mask[b, sentence] > 0].mean(0) if sentence >= 0 else 0.0
            np.testing.assert_allclose(summaries[b, slot], want, atol=1e-6)


# ------------------------------------------------------------------------- the target memory


def test_carried_target_memory_equals_the_same_sentences_as_one_long_chunk():
    """Sentences 0..5 decoded as one chunk of 6 (sentence k's memory is k-1) equal chunks of
    0..2 and 3..5 with the first chunk's last sentence carried into the second."""
    model = build_model(dict(TINY, max_segments=6), 30)
    rng = np.random.default_rng(4)
    batch = _grid(rng, 2, 6, 5)
    params = nn.meta.unbox(model.init(jax.random.PRNGKey(0), batch)["params"])
    module = model.eval_module
    encoded = rng.normal(size=(2, 6, 5, 16)).astype(np.float32)
    tgt_in = np.pad(batch["tgt"][..., :-1], [(0, 0), (0, 0), (1, 0)], constant_values=BOS_ID)

    def decode(sl, first=None):
        return module.apply(
            {"params": params},
            encoded[:, sl],
            batch["src_mask"][:, sl],
            tgt_in[:, sl],
            batch["tgt_mask"][:, sl],
            first,
            method=module.decode_with_states,
        )

    whole, _ = decode(slice(0, 6))
    first_logits, inputs = decode(slice(0, 3))
    carried = ([x[:, 2] for x in inputs], batch["tgt_mask"][:, 2])
    second_logits, _ = decode(slice(3, 6), carried)
    real = batch["tgt_mask"][..., None] > 0
    got = np.concatenate([first_logits, second_logits], axis=1)
    np.testing.assert_allclose(np.where(real, got, 0), np.where(real, whole, 0), atol=2e-5)


# ------------------------------------------------------------------------- document streams


def _stream_plan(lengths, rows, shuffle=True, max_sentences=4, window=1):
    docs = [
        Document(
            f"d{i}",
            tuple("a " * (1 + (i + k) % 5) for k in range(n)),
            tuple("b " * (1 + (i * k) % 7) for k in range(n)),
        )
        for i, n in enumerate(lengths)
    ]
    config = PipelineConfig(max_sentences=max_sentences, stream_rows=rows, shuffle=shuffle)
    spec = DataSpec(rows="sequential_chunks", context="chunk", streams=True, stream_window=window)
    return builder.build_plan(spec, config, docs, lambda ts: [[5] * len(t.split()) for t in ts])


def test_streams_deal_every_chunk_once_in_document_order():
    lengths = [3, 9, 1, 17, 4, 8, 2, 12]
    plan = _stream_plan(lengths, rows=3)
    chunks = plan.chunk_table
    for epoch in (0, 1):
        grid = plan.streams(epoch)
        assert grid.shape == (plan.batches_per_epoch, 3)
        assert sorted(grid[grid >= 0].tolist()) == list(range(chunks["doc"].size))
        for column in grid.T:
            for before, after in zip(column[:-1], column[1:], strict=True):
                if after >= 0 and chunks["index"][after] > 0:  # continues: the next chunk
                    assert before == after - 1
                    assert chunks["doc"][before] == chunks["doc"][after]
    assert not np.array_equal(plan.streams(0), plan.streams(1))  # shuffled per epoch
    ep = plan.epoch(0)
    batch = plan.materialize(ep.batch(1), int(ep.s[1]), int(ep.t[1]))
    assert batch["src"].shape[0] == 3


def test_evaluation_streams_have_no_padding_steps_at_the_end():
    plan = _stream_plan([5, 40, 3], rows=2, shuffle=False)
    grid = plan.streams(0)
    assert (grid[-1] >= 0).any() and plan.batches_per_epoch == 10  # the 40-sentence stream


def test_a_window_holds_consecutive_chunks_of_every_stream():
    """With ``stream_window = 2`` batch ``w`` holds the one-chunk plan's steps ``2w`` and
    ``2w + 1`` of every stream, stream ``b``'s at rows ``2b`` and ``2b + 1``; an odd last step
    is padded with an empty one."""
    lengths = [3, 9, 1, 17, 4, 8, 2, 12]
    one, two = _stream_plan(lengths, rows=3), _stream_plan(lengths, rows=3, window=2)
    steps = one.streams(0)
    assert two.batches_per_epoch == -(-steps.shape[0] // 2)
    ep = two.epoch(0)
    for w in range(two.batches_per_epoch):
        rows = ep.batch(w).reshape(3, 2)
        for i in range(2):
            expected = steps[2 * w + i] if 2 * w + i < steps.shape[0] else np.full(3, -1)
            np.testing.assert_array_equal(rows[:, i], expected)
    assert set(ep.sizes.tolist()) == {6}


def _window(rng, B, S, T, k):
    """``k`` random chunks of ``B`` streams as one window batch (stream ``b``'s chunk ``i`` at
    row ``b * k + i``), and the chunks themselves."""
    chunks = [dict(_grid(rng, B, S, T), chunk_index=np.array([i, i + 1])) for i in range(k)]
    window = {
        key: np.stack([c[key] for c in chunks], axis=1).reshape(B * k, *chunks[0][key].shape[1:])
        for key in chunks[0]
    }
    return window, chunks


def _random_carry(model, rng, rows):
    carry = recurrence.initial_carry(model.config, rows)
    out = {n: rng.normal(size=v.shape).astype(np.float32) for n, v in carry.items()}
    out["source_mask"] = np.ones(carry["source_mask"].shape, np.int32)
    out["target_mask"] = (np.arange(carry["target_mask"].shape[1]) < 3)[None].repeat(rows, 0)
    out["target_mask"] = out["target_mask"].astype(np.int32)
    return out


@pytest.mark.slow  # ~75 s: three compiled FINAL backward passes
def test_bptt_window_gradient_equals_the_chunks_unrolled_by_hand():
    """``bptt_chunks = 2``: the loss and gradient of a window equal those of its two chunks
    decoded one after the other by hand, the second reading the state the first wrote without
    a stop-gradient, the loss the token-weighted mean NLL computed here; and they differ from
    the stop-gradient chain (so the window really trains how the state is written)."""
    model = build_model(dict(TINY, bptt_chunks=2), 30)
    rng = np.random.default_rng(7)
    window, chunks = _window(rng, 2, 3, 5, 2)
    carry = _random_carry(model, rng, 2)
    params = nn.meta.unbox(model.init(jax.random.PRNGKey(0), chunks[0])["params"])
    module = model.eval_module

    def by_hand(params, detach):
        state, nll, count = carry, 0.0, 0.0
        for chunk in chunks:
            logits, state = module.apply(
                {"params": params},
                chunk["src"],
                chunk["src_mask"],
                chunk["tgt"],
                chunk["tgt_mask"],
                state,
                chunk["chunk_index"] > 0,
                False,
                method=module.forward_carried,
            )
            if detach:
                state = jax.lax.stop_gradient(state)
            logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
            picked = jnp.take_along_axis(logp, chunk["tgt"][..., None], axis=-1)[..., 0]
            nll -= jnp.sum(picked * chunk["tgt_mask"])
            count += jnp.sum(chunk["tgt_mask"])
        return nll / count

    def windowed(params):
        return model.loss_with_carry(params, window, carry, None, False)[0]

    loss, got = jax.jit(jax.value_and_grad(windowed))(params)
    hand_loss, want = jax.jit(jax.value_and_grad(lambda p: by_hand(p, False)))(params)
    detached = jax.jit(jax.grad(lambda p: by_hand(p, True)))(params)
    np.testing.assert_allclose(loss, hand_loss, rtol=1e-6)
    flat_got = jax.tree_util.tree_leaves(got)
    flat_want = jax.tree_util.tree_leaves(want)
    flat_detached = jax.tree_util.tree_leaves(detached)
    for g, w in zip(flat_got, flat_want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6)
    moved = max(float(np.abs(g - d).max()) for g, d in zip(flat_got, flat_detached, strict=True))
    assert moved > 1e-4


# ------------------------------------------------------------------------- training and decoding


@pytest.fixture(scope="module")
def recurrent_run(synthetic_dir, tmp_path_factory):
    from docnmt_jax.training import trainer

    config = tiny_final_config(synthetic_dir, num_steps=6, checkpoint_every=3, log_every=1)
    config.model.recurrent = True
    config.model.packed_layout = "banded"  # streams are banded rows
    config.data.train_as = "documents"
    config.data.stream_rows = 4
    workdir = str(tmp_path_factory.mktemp("recurrent"))
    result = trainer.train_and_evaluate(config, workdir, record_losses=True)
    return config, workdir, result


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["packed", "grid"])
def test_training_resumes_exactly_with_the_carried_state(recurrent_run, tmp_path, layout):
    """3 steps, a checkpoint, 3 more from it: the 6 losses of the straight run, on packed
    streams (the default; the carry one row per stream) and on the grid (``data.packed``
    False). Chunks of step 4 continue their documents, so a resume without the carried state
    would differ."""
    from docnmt_jax.training import trainer

    config, _, reference = recurrent_run
    if layout == "grid":
        config = _with_steps(config, 6)
        config.data.packed = False
        straight = str(tmp_path / "straight")
        reference = trainer.train_and_evaluate(config, straight, record_losses=True)
    resumed = str(tmp_path / "resumed")
    first = trainer.train_and_evaluate(_with_steps(config, 3), resumed, record_losses=True)
    second = trainer.train_and_evaluate(config, resumed, record_losses=True)
    assert len(first.losses) == 3 and len(second.losses) == 3
    np.testing.assert_allclose(first.losses + second.losses, reference.losses, rtol=1e-6)


def _with_steps(config, steps):
    copy = config.copy_and_resolve_references()
    copy.train.num_steps = steps
    return copy


def _translator(workdir, batch_tokens=256):
    from docnmt_jax.decoding.search import SearchConfig
    from docnmt_jax.training import restore

    search = SearchConfig(beam_size=1, max_len=24)
    return restore.load_translator(workdir, "latest", search, batch_tokens=batch_tokens)[0]


@pytest.mark.slow
def test_greedy_stream_translation_is_the_teacher_forced_argmax_chunk_by_chunk(
    recurrent_run, synthetic_dir
):
    """Every token the search picks (KV caches, the carried memory of the chosen translation,
    the carried summaries) is the argmax of the training path's logits given the picked
    tokens before it, computed from scratch chunk by chunk with the training path's carry."""
    from docnmt_jax.data.readers import read_tsv

    _, workdir, _ = recurrent_run
    translator = _translator(workdir)
    model, params = translator.model, translator.params
    longest = sorted(read_tsv(f"{synthetic_dir}/test.tsv"), key=len)[-3:]  # 3+ chunks each
    docs = [Document(d.doc_id, d.src, ("",) * len(d)) for d in longest]
    carry, checked, continuing = None, 0, 0
    for batch in translator.batches(docs):
        ids, _ = translator._search_batch(batch)
        ids = np.asarray(ids)
        if carry is None:
            carry = model.initial_carry(ids.shape[0])
        forced = dict(batch, tgt=ids, tgt_mask=(ids > 0).astype(np.int32))
        loss_batch = {k: forced[k] for k in ("src", "src_mask", "tgt", "tgt_mask", "chunk_index")}
        module = model.eval_module
        logits, carry = module.apply(
            {"params": params},
            *(loss_batch[k] for k in ("src", "src_mask", "tgt", "tgt_mask")),
            carry,
            loss_batch["chunk_index"] > 0,
            method=module.forward_carried,
        )
        real = forced["tgt_mask"] > 0
        real[..., -1] = False  # the output cap's forced EOS (an untrained model writes to it)
        np.testing.assert_array_equal(np.argmax(logits, -1)[real], ids[real])
        checked += int(real.sum())
        continuing += int(np.sum(batch["chunk_index"] > 0))
    assert continuing >= 3 and checked > 100


@pytest.mark.slow
def test_a_documents_translation_does_not_depend_on_its_batch(recurrent_run, synthetic_dir):
    from docnmt_jax.data.readers import read_tsv

    _, workdir, _ = recurrent_run
    docs = read_tsv(f"{synthetic_dir}/test.tsv")[:8]
    together = _translator(workdir, batch_tokens=256).translate(docs)
    alone = [_translator(workdir, batch_tokens=256).translate([doc])[0] for doc in docs[:3]]
    assert together[:3] == alone
