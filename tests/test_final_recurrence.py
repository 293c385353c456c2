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


def _stream_plan(lengths, rows, shuffle=True, max_sentences=4):
    docs = [
        Document(
            f"d{i}",
            tuple("a " * (1 + (i + k) % 5) for k in range(n)),
            tuple("b " * (1 + (i * k) % 7) for k in range(n)),
        )
        for i, n in enumerate(lengths)
    ]
    config = PipelineConfig(max_sentences=max_sentences, stream_rows=rows, shuffle=shuffle)
    spec = DataSpec(rows="sequential_chunks", context="chunk", streams=True)
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


# ------------------------------------------------------------------------- training and decoding


@pytest.fixture(scope="module")
def recurrent_run(synthetic_dir, tmp_path_factory):
    from docnmt_jax.training import trainer

    config = tiny_final_config(synthetic_dir, num_steps=6, checkpoint_every=3, log_every=1)
    config.model.recurrent = True
    config.data.train_as = "documents"
    config.data.stream_rows = 4
    workdir = str(tmp_path_factory.mktemp("recurrent"))
    result = trainer.train_and_evaluate(config, workdir, record_losses=True)
    return config, workdir, result


@pytest.mark.slow
def test_training_resumes_exactly_with_the_carried_state(recurrent_run, tmp_path):
    """3 steps, a checkpoint, 3 more from it: the 6 losses of the straight run. Rows of step 4
    continue their documents, so a resume without the carried state would differ."""
    from docnmt_jax.training import trainer

    config, _, reference = recurrent_run
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
