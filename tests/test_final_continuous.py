"""FINAL's continuous search (docnmt_jax/decoding/continuous.py, models/final_decode.py)
translates as the slot search did, token for token, on a trained tiny FINAL: greedy and beam 5
with n-best lists, over chunks of mixed lengths with padding sentences (trailing, and one in
the middle of a chunk) and padding rows; and the search's own bookkeeping on a toy decoder
whose sentence lengths are known: a row costs the sum of its sentences' steps."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from docnmt_jax.data.tokenizer import EOS_ID, PAD_ID
from docnmt_jax.decoding.compiled import compile_translate
from docnmt_jax.decoding.continuous import document_search
from docnmt_jax.decoding.search import SearchConfig, loop_slots
from docnmt_jax.models import contract
from docnmt_jax.models.final import FinalConfig, FinalModel

V, S, T = 24, 4, 7
CFG = FinalConfig(
    vocab_size=V,
    d_model=32,
    num_heads=2,
    ffn_dim=64,
    num_encoder_layers=2,
    num_decoder_layers=2,
    dropout_rate=0.0,
    max_segments=S,
)
# Training compiles without XLA's expensive CPU passes (the checkpoint only has to be fixed).
FAST = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def _chunks(rng: np.random.Generator, B: int, empty_middle: bool = False) -> dict:
    """``B`` chunks of 1..S sentences of 1..5 words: the target maps each word with a shift
    that only the chunk's first sentence shows (its first word), sometimes repeating the
    last word (so the model's output lengths vary). ``empty_middle``: row 0's sentence 1 is
    empty (a padding sentence between real ones) and the last row is padding."""
    src, tgt = np.zeros((2, B, S, T), np.int32)
    for b in range(B - int(empty_middle)):
        shift = rng.integers(0, 2)
        for k in range(rng.integers(1, S + 1) if not (empty_middle and b == 0) else S):
            if empty_middle and b == 0 and k == 1:
                continue
            n = rng.integers(1, 6)
            x = rng.integers(6, V, n)
            x[0] = 4 + shift if k == 0 else x[0]
            y = (x - 4 + 3 * shift) % (V - 4) + 4
            y = np.concatenate([y, y[-1:]]) if rng.random() < 0.5 else y
            src[b, k, :n], src[b, k, n] = x, EOS_ID
            tgt[b, k, : len(y)], tgt[b, k, len(y)] = y, EOS_ID
    mask = lambda x: (x > 0).astype(np.int32)  # noqa: E731
    return {"src": src, "src_mask": mask(src), "tgt": tgt, "tgt_mask": mask(tgt)}


@pytest.fixture(scope="module")
def trained():
    """(task, params) of a tiny FINAL trained 300 Adam steps on :func:`_chunks`."""
    task, rng = FinalModel(CFG), np.random.default_rng(0)
    first = _chunks(rng, 16)
    key = jax.random.PRNGKey(0)
    init = jax.jit(task.init).lower(key, first).compile(compiler_options=FAST)
    params = nn.meta.unbox(init(key, first))["params"]
    opt = optax.adam(3e-3)

    def step(params, state, batch):
        loss = lambda p: task.loss(p, batch, None, False)[0]  # noqa: E731
        updates, state = opt.update(jax.grad(loss)(params), state, params)
        return optax.apply_updates(params, updates), state

    state = opt.init(params)
    compiled = jax.jit(step).lower(params, state, first).compile(compiler_options=FAST)
    for _ in range(300):
        params, state = compiled(params, state, _chunks(rng, 16))
    return task, params


def _slot_search(task, search):
    """Today's compiled driver: one jitted search per sentence slot."""
    return loop_slots(task, search, lambda fn, out=False, **kw: jax.jit(fn, **kw))


def _assert_searches_agree(task, params, search, batches):
    """The continuous search (through ``compile_translate``) and the slot search give the same
    ids for every sentence and the same n-best aux for every real one, bit for bit."""
    assert contract.searches_in_one_call(task, search)
    continuous = compile_translate(task, search)  # jits the continuous translate
    slots = _slot_search(task, search)
    for batch in batches:
        ids, aux = continuous(params, batch)
        want_ids, want_aux = slots(params, batch)
        np.testing.assert_array_equal(np.asarray(ids), np.asarray(want_ids))
        real = batch["src_mask"].any(-1)
        assert sorted(aux) == sorted(want_aux)
        for key in aux:
            np.testing.assert_array_equal(
                np.asarray(aux[key])[real], np.asarray(want_aux[key])[real]
            )
    return np.asarray(ids)


@pytest.mark.parametrize(
    "search",
    [
        SearchConfig(beam_size=5, alpha=0.6, len_a=1.0, len_b=3, nbest=3),
        pytest.param(
            SearchConfig(beam_size=1, alpha=0.0, len_a=1.0, len_b=3), marks=pytest.mark.slow
        ),
    ],
    ids=["beam5", "greedy"],
)
def test_continuous_search_equals_the_slot_search(trained, search):
    """On the trained model: ids of every sentence and the n-best ids, scores and
    log-probabilities of every real sentence equal the slot search's, bit for bit."""
    task, params = trained
    rng = np.random.default_rng(1)
    batch = _chunks(rng, 8, empty_middle=True)
    ids = _assert_searches_agree(task, params, search, [_chunks(rng, 8), batch])
    # The model learnt the task: most sentences start with the reference's word.
    real = batch["src_mask"].any(-1)
    assert np.mean(ids[..., 0][real] == batch["tgt"][..., 0][real]) > 0.6


@pytest.mark.slow
@pytest.mark.parametrize(
    "overrides",
    [{"pre_ln": True}, {"doc2sent": True, "doc2sent_cross_attention": "chunk"}],
    ids=["pre_ln", "doc2sent_chunk_xl"],
)
def test_variants_search_alike(overrides):
    """The same on a random FINAL (embeddings sharpened, so outputs depend on the inputs) of
    other decoder readings: pre-LN (normalised memory), and every sentence cross-attending to
    its whole chunk (one set of cross keys for all of a chunk's sentences)."""
    task = FinalModel(dataclasses.replace(CFG, **overrides))
    batch = _chunks(np.random.default_rng(2), 6, empty_middle=True)
    params = nn.meta.unbox(jax.jit(task.init)(jax.random.PRNGKey(1), batch))["params"]
    params = dict(params, embed={"embedding": params["embed"]["embedding"] * 6})
    search = SearchConfig(beam_size=3, alpha=0.6, len_a=1.0, len_b=3, nbest=2)
    _assert_searches_agree(task, params, search, [batch])


def test_sampling_keeps_the_slot_search(trained):
    task, _ = trained
    assert not contract.searches_in_one_call(task, SearchConfig(sample=True, nbest=2))


def _toy_search(words: np.ndarray, num_sentences: np.ndarray, max_len: int):
    """:func:`document_search` (greedy) of a toy decoder that writes token 5 until the length
    of the row's current sentence, then EOS: ``words[b, k]`` plus the length of the previous
    sentence's translation as its memory holds it (the real positions of its mask)."""
    B = words.shape[0]

    def step_fn(cache, tokens, extra):
        ends = cache["index"] + 1 >= jnp.repeat(extra["length"], tokens.shape[0] // B)
        logits = jnp.where(ends[:, None], jax.nn.one_hot(EOS_ID, V), jax.nn.one_hot(5, V))
        return 10.0 * logits, dict(cache, index=cache["index"] + 1)

    def with_memory(inputs, memory):
        return {"length": inputs["length"] + jnp.sum(memory["mask"], -1)}

    def run(limits, num_sentences):
        memory = {"mask": jnp.zeros((B, max_len), jnp.int32), "state": jnp.zeros((B, 1))}
        cache = {"index": jnp.zeros((), jnp.int32), "state": jnp.zeros((B, 1))}
        return document_search(
            step_fn,
            cache,
            {"length": jnp.asarray(words)},
            with_memory,
            memory,
            limits,
            num_sentences,
            beam_size=1,
            alpha=0.0,
            max_len=max_len,
        )

    return jax.jit(run)(np.full(words.shape, max_len, np.int32), num_sentences)


def test_rows_advance_through_their_sentences_independently():
    """Each row's sentences come out in order, sentence ``k`` as long as its words plus the
    length of the translation of ``k - 1`` (the memory handed over); the loop runs as many
    steps as the longest row's total, not S times the longest sentence; rows past their last
    sentence leave their results unwritten (PAD, -inf)."""
    words = np.array([[1, 1, 2, 1], [3, 3, 9, 9], [2, 2, 2, 9], [9, 9, 9, 9]], np.int32)
    num_sentences = np.array([4, 2, 3, 0], np.int32)
    max_len = 8
    state = _toy_search(words, num_sentences, max_len)
    searched = np.arange(S)[None] < num_sentences[:, None]
    lengths = np.cumsum(words, axis=1) * searched  # [[1, 2, 4, 5], [3, 6, 0, 0], ...]
    assert int(state.steps) == lengths.sum(-1).max() == 12  # slot by slot: 3 + 6 + 6 + 5
    seqs = np.asarray(state.sequences[:, :, 0])
    for b, k in zip(*np.nonzero(searched), strict=True):
        n = lengths[b, k]
        want = [5] * (n - 1) + [EOS_ID] + [PAD_ID] * (max_len - n)
        np.testing.assert_array_equal(seqs[b, k], want)
    assert (seqs[~searched] == PAD_ID).all()
    assert np.isneginf(np.asarray(state.scores)[~searched]).all()
    np.testing.assert_array_equal(np.asarray(state.lengths)[..., 0], lengths)
