"""Doc2Doc (Zheng et al. 2020, Table 3): packing against naive loops, the loss against the plain
Transformer on hand-packed chunks, splitting of the output, BOS in beam search, end to end."""

import dataclasses
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import tiny_config

from docnmt_jax.data import readers
from docnmt_jax.data.spec import DataSpec, PipelineConfig
from docnmt_jax.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from docnmt_jax.decoding import beam_search as bs
from docnmt_jax.decoding.search import SearchConfig
from docnmt_jax.decoding.translator import Translator
from docnmt_jax.models import BatchLayout, build_model
from docnmt_jax.models.base import ModelError
from docnmt_jax.models.concat import (
    SEP_ID,
    Doc2DocConfig,
    Doc2DocModel,
    chunk_output_limits,
    pack_target,
    pack_tokens,
    split_sentences,
)
from docnmt_jax.models.transformer import Transformer, TransformerConfig
from docnmt_jax.training import restore, trainer

V = 19
CFG = Doc2DocConfig(
    vocab_size=V,
    d_model=16,
    num_heads=2,
    ffn_dim=24,
    num_encoder_layers=1,
    num_decoder_layers=1,
    max_len=64,
)
# Compile without XLA's expensive CPU passes (the test machine may be loaded).
FAST = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def _fast(fn, *args):
    return jax.jit(fn).lower(*args).compile(compiler_options=FAST)(*args)


def _batch(seed=0, T=5):
    """Chunks ``[4, 4, T]``: a full chunk, one with a padding sentence in the middle, one with
    a target that is only EOS, and an all-padding row. Sentences end with EOS."""
    rng = np.random.default_rng(seed)
    src_len = np.array([[5, 3, 4, 2], [2, 0, 5, 1], [4, 1, 0, 0], [0, 0, 0, 0]])
    tgt_len = np.array([[2, 5, 3, 4], [4, 0, 1, 3], [1, 5, 0, 0], [0, 0, 0, 0]])
    batch = {}
    for side, lengths in (("src", src_len), ("tgt", tgt_len)):
        ar = np.arange(T)
        mask = (ar < lengths[..., None]).astype(np.int32)
        ids = rng.integers(4, V, mask.shape).astype(np.int32) * mask
        ids = np.where(ar == lengths[..., None] - 1, EOS_ID, ids).astype(np.int32)
        batch[side], batch[f"{side}_mask"] = ids, mask
    return batch


def _naive_pack(ids, mask, separator=None):
    """Concatenates every row's real sentences; with ``separator``, every sentence but the
    last ends with it instead of its last token."""
    B, S, T = ids.shape
    packed = np.full((B, S * T), PAD_ID, np.int32)
    packed_mask = np.zeros((B, S * T), np.int32)
    for b in range(B):
        sentences = [list(ids[b, k][mask[b, k] > 0]) for k in range(S) if mask[b, k].any()]
        if separator is not None:
            for sentence in sentences[:-1]:
                sentence[-1] = separator
        tokens = [t for sentence in sentences for t in sentence]
        packed[b, : len(tokens)] = tokens
        packed_mask[b, : len(tokens)] = 1
    return packed, packed_mask


def _naive_split(seq, real):
    """One packed hypothesis -> ``[S, L]`` rows and the sentence count, by list operations."""
    S, L = len(real), len(seq)
    tokens = list(seq)
    body = tokens[: tokens.index(EOS_ID)] if EOS_ID in tokens else tokens
    sentences = [[]]
    for t in body:
        if t == SEP_ID:
            sentences.append([])
        else:
            sentences[-1].append(t)
    slots = [k for k in range(S) if real[k]]
    out = np.full((S, L), PAD_ID, np.int32)
    if not slots:
        return out, 0
    n = len(slots)
    merged = sentences[: n - 1] + [[t for s in sentences[n - 1 :] for t in s]]
    merged += [[] for _ in range(n - len(merged))]
    for slot, sentence in zip(slots, merged, strict=True):
        out[slot, : len(sentence) + 1] = sentence + [EOS_ID]
    return out, len(sentences)


# ---------------------------------------------------------------------------------------------
# Packing.


def test_pack_tokens_equals_naive_loop():
    batch = _batch()
    for side in ("src", "tgt"):
        packed, mask = jax.jit(pack_tokens)(batch[side], batch[f"{side}_mask"])
        expected, expected_mask = _naive_pack(batch[side], batch[f"{side}_mask"])
        np.testing.assert_array_equal(packed, expected)
        np.testing.assert_array_equal(mask, expected_mask)
    # Random masks (not prefixes, holes anywhere) with random ids.
    rng = np.random.default_rng(3)
    ids = rng.integers(1, V, (5, 3, 6)).astype(np.int32)
    mask = (rng.random((5, 3, 6)) < 0.5).astype(np.int32)
    packed, packed_mask = jax.jit(pack_tokens)(ids, mask)
    expected, expected_mask = _naive_pack(ids, mask)
    np.testing.assert_array_equal(packed, expected)
    np.testing.assert_array_equal(packed_mask, expected_mask)


def test_target_separators():
    batch = _batch(1)
    tgt, mask = jax.jit(pack_target)(batch["tgt"], batch["tgt_mask"])
    tgt, mask = np.asarray(tgt), np.asarray(mask)
    expected, expected_mask = _naive_pack(batch["tgt"], batch["tgt_mask"], separator=SEP_ID)
    np.testing.assert_array_equal(tgt, expected)
    np.testing.assert_array_equal(mask, expected_mask)
    sentences = batch["tgt_mask"].any(-1).sum(-1)  # [3, 3, 2, 0]
    for b, n in enumerate(sentences):
        length = int(mask[b].sum())
        assert length == batch["tgt_mask"][b].sum()
        assert (tgt[b, :length] == SEP_ID).sum() == max(n - 1, 0)
        assert (tgt[b, :length] == EOS_ID).sum() == (n > 0)
        if n:
            assert tgt[b, length - 1] == EOS_ID
    # Row 2: the first target sentence is only EOS, so the packed target starts with SEP.
    assert tgt[2, 0] == SEP_ID


def test_chunk_output_limits_sum_the_sentence_budgets():
    batch = _batch()
    search = SearchConfig(len_a=1.5, len_b=2, max_len=8)
    max_len, limits = chunk_output_limits(jnp.asarray(batch["src_mask"]), search, cap=100)
    assert max_len == 4 * search.output_len(5)  # 4 sentences of min(8, 1.5 * 5 + 2) = 8
    lengths = batch["src_mask"].sum(-1)
    per_sentence = np.where(lengths > 0, np.minimum(np.floor(1.5 * lengths + 2), 8), 0)
    np.testing.assert_array_equal(limits, np.maximum(per_sentence.sum(-1), 1))
    capped, capped_limits = chunk_output_limits(jnp.asarray(batch["src_mask"]), search, cap=12)
    assert capped == 12 and (np.asarray(capped_limits) <= 12).all()


# ---------------------------------------------------------------------------------------------
# The model: the plain Transformer on packed chunks.


def test_logits_and_loss_equal_plain_transformer_on_hand_packed_chunks():
    batch = _batch(2)
    task = Doc2DocModel(CFG)
    plain_cfg = TransformerConfig(
        vocab_size=V,
        d_model=16,
        num_heads=2,
        ffn_dim=24,
        num_encoder_layers=1,
        num_decoder_layers=1,
    )
    src, src_mask = _naive_pack(batch["src"], batch["src_mask"])
    tgt, tgt_mask = _naive_pack(batch["tgt"], batch["tgt_mask"], separator=SEP_ID)

    def run(rng, batch):
        params = nn.meta.unbox(task.init(rng, batch))["params"]
        out = {}
        for train in (False, True):
            logits, targets, mask = task.forward(params, batch, rng, train)
            plain = Transformer(dataclasses.replace(plain_cfg, deterministic=not train))
            rngs = {"dropout": rng} if train else {}
            expected = plain.apply({"params": params}, src, src_mask, tgt, tgt_mask, rngs=rngs)
            out[train] = (logits, targets, mask, expected)
        return out

    out = _fast(run, jax.random.PRNGKey(0), batch)
    for logits, targets, mask, expected in out.values():
        assert logits.shape == (4, 20, V)
        np.testing.assert_array_equal(targets, tgt)
        np.testing.assert_array_equal(mask, tgt_mask)
        np.testing.assert_allclose(logits, expected, atol=1e-5)

        def nll(x):
            logp = jax.nn.log_softmax(np.asarray(x, np.float64), axis=-1)
            return -np.sum(np.take_along_axis(logp, tgt[..., None], -1)[..., 0] * tgt_mask)

        np.testing.assert_allclose(nll(logits), nll(expected), rtol=1e-6)
    assert not np.allclose(out[True][0], out[False][0])  # dropout was on in training


def test_config_guards_packed_length():
    task = build_model({"name": "doc2doc", "d_model": 16, "num_heads": 2, "max_len": 19}, V)
    assert isinstance(task, Doc2DocModel) and task.layout is BatchLayout.CHUNKS
    with pytest.raises(ValueError, match="max_len=19"):
        jax.eval_shape(task.init, jax.random.PRNGKey(0), _batch())  # 4 * 5 = 20 slots
    with pytest.raises(ValueError, match="max_len"):
        Doc2DocConfig(max_len=0)
    # Packed training rows: the data's chunk bound is checked before training.
    packed = PipelineConfig(max_sentences=4, max_src_len=5, max_tgt_len=4, packing=task.packing())
    with pytest.raises(ModelError, match=r"up to 20 tokens .*max_len=19"):
        task.check_data(packed)
    task.check_data(dataclasses.replace(packed, max_src_len=4))  # 16 slots fit


def test_score_is_the_per_sentence_sum_of_the_packed_log_likelihood():
    """``score [B, S]`` against a naive loop over the hand-packed target: each sentence owns
    its tokens and the separator (or final EOS) after them."""
    batch = _batch(3)
    task = Doc2DocModel(CFG)
    params = nn.meta.unbox(task.init(jax.random.PRNGKey(2), batch))["params"]
    scores = np.asarray(jax.jit(task.score)(params, batch))
    logits, _, _ = task.forward(params, batch, None, False)
    logp = jax.nn.log_softmax(np.asarray(logits, np.float64), axis=-1)
    tgt, tgt_mask = _naive_pack(batch["tgt"], batch["tgt_mask"], separator=SEP_ID)
    B, S, _ = batch["tgt"].shape
    expected = np.zeros((B, S))
    for b in range(B):
        position = 0
        for k in range(S):
            for _ in range(int(batch["tgt_mask"][b, k].sum())):
                expected[b, k] += logp[b, position, tgt[b, position]]
                position += 1
        assert position == tgt_mask[b].sum()
    np.testing.assert_allclose(scores, expected, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# Splitting the output into sentences.


def test_split_sentences_equals_naive_splitter():
    L, S = 9, 4
    E, P, X = EOS_ID, PAD_ID, SEP_ID
    seqs = [
        [5, X, 6, 7, X, 8, E, P, P],  # 3 sentences
        [5, X, 6, X, 7, X, 8, E, P],  # 4 sentences for 2 real rows: 6, 7, 8 join in row 2
        [5, 6, E, P, P, P, P, P, P],  # 1 sentence for 3 real rows: rows 2, 3 empty
        [X, X, 5, E, P, P, P, P, P],  # leading and double separators: empty sentences
        [5, X, 6, E, P, P, P, P, P],  # a padding row (no real sentence): all PAD
        [X, 4, X, 5, X, 6, X, 7, E],  # 5 sentences for 1 real row: everything in it
    ]
    reals = [[1, 1, 1, 0], [1, 0, 1, 0], [1, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0], [0, 0, 1, 0]]
    rng = np.random.default_rng(0)
    for _ in range(40):  # random sentences, separators and (not necessarily prefix) rows
        m = rng.integers(0, L)
        body = np.where(rng.random(m) < 0.35, SEP_ID, rng.integers(4, V, m))
        seqs.append(list(body) + [EOS_ID] + [PAD_ID] * (L - m - 1))
        reals.append(list((rng.random(S) < 0.6).astype(int)))
    seqs, reals = np.asarray(seqs, np.int32), np.asarray(reals, np.int32)
    ids, counts = jax.jit(split_sentences)(seqs, reals)
    ids, counts = np.asarray(ids), np.asarray(counts)
    assert ids.shape == (len(seqs), S, L)
    for b in range(len(seqs)):
        expected, count = _naive_split(seqs[b], reals[b])
        np.testing.assert_array_equal(ids[b], expected, err_msg=f"row {b}: {seqs[b]}")
        assert counts[b] == count
        if reals[b].any():  # nothing dropped: every content token is in some sentence
            content = seqs[b][(seqs[b] > 3)]
            np.testing.assert_array_equal(ids[b][ids[b] > 3], content)
    np.testing.assert_array_equal(ids[1, 2], [6, 7, 8, E, P, P, P, P, P])
    np.testing.assert_array_equal(ids[2, 1:3, :2], [[E, P], [E, P]])
    np.testing.assert_array_equal(ids[5, 2], [4, 5, 6, 7, E, P, P, P, P])
    np.testing.assert_array_equal(counts[:6], [3, 4, 1, 3, 0, 5])


# ---------------------------------------------------------------------------------------------
# Decoding.


def test_beam_search_generates_bos_only_when_allowed():
    """BOS is the most probable token at steps 0-1 after PAD, EOS after: banned by default,
    kept with ``allow_bos``; PAD stays banned either way."""
    logits = np.zeros((4, 5), np.float32)
    logits[:2, [PAD_ID, EOS_ID, BOS_ID, 3]] = [9.0, -5.0, 5.0, 4.0]
    logits[2:, EOS_ID] = 5.0

    def step(cache, tokens, extra):
        out = jnp.broadcast_to(jnp.asarray(logits)[cache["index"]], (tokens.shape[0], 5))
        return out, {"index": cache["index"] + 1, "row": cache["row"]}

    cache = {"index": jnp.zeros((), jnp.int32), "row": jnp.zeros((2,), jnp.int32)}
    search = jax.jit(
        lambda c, allow: bs.beam_search(
            step, c, None, beam_size=3, alpha=0.0, max_len=4, allow_bos=allow
        ),
        static_argnums=1,
    )
    default = search(cache, False)
    np.testing.assert_array_equal(default.sequences[:, 0], [[3, 3, EOS_ID, PAD_ID]] * 2)
    allowed = search(cache, True)
    np.testing.assert_array_equal(allowed.sequences[:, 0], [[BOS_ID, BOS_ID, EOS_ID, PAD_ID]] * 2)
    greedy = bs.greedy_search(step, cache, None, max_len=4, allow_bos=True)
    np.testing.assert_array_equal(greedy.sequences[:, 0], [[BOS_ID, BOS_ID, EOS_ID, PAD_ID]] * 2)


def test_translate_is_the_split_search_over_packed_chunks():
    """``translate`` = beam search of the plain Transformer on the hand-packed source
    (BOS allowed, the summed sentence budgets) followed by the naive splitter."""
    batch = _batch(4)
    task = Doc2DocModel(CFG)
    search = SearchConfig(beam_size=2, alpha=0.6, len_a=1.0, len_b=1, max_len=6)
    src, src_mask = _naive_pack(batch["src"], batch["src_mask"])
    max_len, limits = chunk_output_limits(jnp.asarray(batch["src_mask"]), search, CFG.max_len)
    model = Transformer(dataclasses.replace(CFG, deterministic=True))

    def run(rng, batch):
        params = nn.meta.unbox(task.init(rng, batch))["params"]
        # Sharper, less uniform output distributions (separators do occur).
        params = dict(params, embed={"embedding": params["embed"]["embedding"] * 6})
        ids, aux = task.translate(params, batch, search)
        variables = {"params": params}
        encoded = model.apply(variables, src, src_mask, method=model.encode)
        cache = model.apply(variables, src.shape[0], max_len, method=model.init_cache)
        extra = model.apply(variables, encoded, src_mask, method=model.decode_inputs)

        def step(c, tokens, extra):
            return model.apply(variables, c, tokens, extra, method=model.decode_step)

        result = bs.beam_search(
            step,
            cache,
            extra,
            beam_size=2,
            alpha=0.6,
            max_len=max_len,
            max_lengths=limits,
            allow_bos=True,
        )
        return ids, aux, result.sequences[:, 0]

    ids, aux, best = _fast(run, jax.random.PRNGKey(1), batch)
    ids, best = np.asarray(ids), np.asarray(best)
    real = batch["src_mask"].any(-1)
    assert ids.shape == (4, 4, max_len) and max_len == 4 * search.output_len(5)
    for b in range(4):
        expected, count = _naive_split(best[b], real[b])
        np.testing.assert_array_equal(ids[b], expected)
        assert aux["sentence_counts"][b] == count
    assert (ids[~real] == PAD_ID).all() and ((ids[real] == EOS_ID).sum(-1) == 1).all()


# ---------------------------------------------------------------------------------------------
# End to end: training, checkpoint, Translator.


@pytest.fixture(scope="module")
def doc2doc_run(synthetic_dir, tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("doc2doc"))
    config = tiny_config(synthetic_dir, num_steps=4)
    config.model.name = "doc2doc"
    config.model.max_len = 512
    config.data.max_sentences = 4
    result = trainer.train_and_evaluate(config, workdir)
    assert result.step == 4 and np.isfinite(result.dev_metrics["dev_loss"])
    return workdir


def test_train_then_translate_one_output_per_sentence(doc2doc_run, synthetic_dir):
    docs = readers.read_tsv(os.path.join(synthetic_dir, "dev.tsv"))[:2]
    search = SearchConfig(beam_size=2, alpha=0.6, len_a=1.0, len_b=2)
    translator, step = restore.load_translator(doc2doc_run, "latest", search)
    assert step == 4 and isinstance(translator.model, Doc2DocModel)
    hyps = translator.translate(docs)
    assert [len(h) for h in hyps] == [len(d.src) for d in docs]
    assert all(isinstance(s, str) for h in hyps for s in h)
    stats = translator.stats
    assert stats.chunks == sum(-(-len(d.src) // 4) for d in docs)
    assert stats.sentence_count_mismatches is not None
    assert 0 <= stats.sentence_count_mismatches <= stats.chunks
    assert "sentence count differs from the source in" in stats.summary()


class _FakeModel:
    """Translates every sentence to the empty string; reports ``doc_index % 2`` extra
    sentences per chunk (with ``counts``) or no aux (without)."""

    name = "fake_chunks"
    config = None  # no hyper-parameters
    layout = BatchLayout.CHUNKS
    context_sentences = 0  # no context window before the chunks (Model protocol)
    whole_documents = False  # chunks of max_sentences (Model protocol)
    uses_context = True  # the sentences of a chunk

    def __init__(self, counts: bool):
        self.counts = counts

    def data_spec(self):
        return DataSpec(rows="chunks", context="chunk")  # chunks of max_sentences, the grid

    def max_source_len(self, sentences_per_chunk):
        return None  # no source limit (Model protocol)

    def translate(self, params, batch, search):
        ids = jnp.zeros(batch["src"].shape[:2] + (3,), jnp.int32).at[..., 0].set(EOS_ID)
        if not self.counts:
            return ids, {}
        real = jnp.sum(batch["sentence_mask"], axis=-1)
        return ids, {"sentence_counts": real + batch["doc_index"] % 2}


def test_translator_counts_sentence_mismatches_from_aux(doc2doc_run, synthetic_dir):
    docs = readers.read_tsv(os.path.join(synthetic_dir, "dev.tsv"))[:5]
    tokenizer = restore.load_run_tokenizer(restore.load_config(doc2doc_run), doc2doc_run)
    chunks = sum(-(-len(d.src) // 4) for d in docs)
    odd = sum(-(-len(d.src) // 4) for i, d in enumerate(docs) if i % 2)
    for counts in (True, False):
        translator = Translator(_FakeModel(counts), None, tokenizer, SearchConfig(), 512, 64, 4)
        hyps = translator.translate(docs)
        assert hyps == [[""] * len(d.src) for d in docs]
        assert translator.stats.chunks == chunks
        if counts:
            assert translator.stats.sentence_count_mismatches == odd > 0
            assert f"in {odd}/{chunks} chunks" in translator.stats.summary()
        else:
            assert translator.stats.sentence_count_mismatches is None
            assert "sentence count" not in translator.stats.summary()
