"""Beam search: exhaustive optimality on a toy model, cached decoding, greedy, batch isolation."""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from docnmt_jax.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from docnmt_jax.decoding import beam_search as bs  # the module
from docnmt_jax.decoding.search import source_length_limits
from docnmt_jax.models.transformer import Transformer, TransformerConfig

# --------------------------------------------------------------------------------------------
# Toy model: logits are a fixed random table indexed by an exact code of the whole prefix.

TOY_V = 5  # PAD, EOS, BOS + two content tokens (3, 4)
TOY_MAX_LEN = 5
TOY_ROWS = 4
TOY_TABLE = np.random.default_rng(0).normal(0.0, 2.0, (TOY_ROWS, TOY_V**TOY_MAX_LEN, TOY_V))
TOY_TABLE = TOY_TABLE.astype(np.float32)


def toy_step(cache, tokens, extra):
    code = cache["code"] * TOY_V + tokens  # unique per prefix (BOS, x1, ..., xt)
    hist = jax.lax.dynamic_update_slice_in_dim(cache["hist"], tokens[:, None], cache["index"], 1)
    # ``extra`` has one row per example; the beams of an example are contiguous.
    rows = jnp.repeat(extra["row"], tokens.shape[0] // extra["row"].shape[0])
    logits = jnp.asarray(TOY_TABLE)[rows, code]
    # ``hist`` must follow the beams: it re-derives the code and checks the cache reordering.
    weights = TOY_V ** jnp.arange(TOY_MAX_LEN - 1, -1, -1)
    rederived = jnp.sum(hist * weights[None] * (jnp.arange(TOY_MAX_LEN) <= cache["index"]), 1)
    rederived = rederived // TOY_V ** (TOY_MAX_LEN - 1 - cache["index"])
    logits = jnp.where((rederived == code)[:, None], logits, jnp.nan)
    return logits, {"code": code, "hist": hist, "index": cache["index"] + 1}


def toy_inputs(rows):
    rows = np.asarray(rows, np.int32)
    b = len(rows)
    cache = {
        "code": jnp.zeros((b,), jnp.int32),
        "hist": jnp.zeros((b, TOY_MAX_LEN), jnp.int32),
        "index": jnp.zeros((), jnp.int32),
    }
    return cache, {"row": jnp.asarray(rows)}


def log_softmax(x):
    x = np.asarray(x, np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def toy_all_hypotheses(row, limit, alpha):
    """Every EOS-terminated sequence of at most ``limit`` tokens with its normalised score."""
    out = []
    for n in range(limit):
        for body in itertools.product((3, 4), repeat=n):
            seq = (*body, EOS_ID)
            code, lp = 0, 0.0
            for prev, tok in zip((BOS_ID, *seq[:-1]), seq, strict=True):
                code = code * TOY_V + prev
                lp += log_softmax(TOY_TABLE[row, code])[tok]
            out.append((lp / ((5 + len(seq)) / 6) ** alpha, seq))
    return sorted(out, reverse=True)


def check_well_formed(result, limits):
    seqs, lengths = np.asarray(result.sequences), np.asarray(result.lengths)
    scores = np.asarray(result.scores)
    assert not np.isnan(scores).any()
    for b, k in itertools.product(range(seqs.shape[0]), range(seqs.shape[1])):
        n = lengths[b, k]
        if not np.isfinite(scores[b, k]):
            assert n == 0 and (seqs[b, k] == PAD_ID).all()
            continue
        assert 1 <= n <= limits[b]
        assert seqs[b, k, n - 1] == EOS_ID
        assert not np.isin(seqs[b, k, : n - 1], [PAD_ID, BOS_ID, EOS_ID]).any()
        assert (seqs[b, k, n:] == PAD_ID).all()
    assert (scores[:, :-1] >= scores[:, 1:]).all()  # best first, empty (-inf) slots last
    assert np.isfinite(scores[:, 0]).all()  # every example has a hypothesis


toy_search = jax.jit(
    functools.partial(bs.beam_search, toy_step, max_len=TOY_MAX_LEN),
    static_argnames=("beam_size", "early_stopping", "keep_best_cache"),
)  # alpha and max_lengths are traced: one compilation per beam size / flag


@pytest.mark.parametrize("beam, alpha", [(1, 0.0), (3, 0.6), (4, 1.0), (3, -0.5)])
def test_best_cache_is_the_cache_of_the_best_hypothesis(beam, alpha):
    """The toy cache records every input token (``hist``) and the prefix code: the returned
    ``best_cache`` must hold exactly [BOS, y_1 .. y_{n-1}] of ``sequences[:, 0]``, i.e. the
    state after the step that produced its EOS, whichever step and beam that was."""
    rows, limits = [3, 2, 1, 0, 2, 1], np.array([5, 5, 4, 2, 1, 3])
    kwargs = dict(beam_size=beam, alpha=alpha, max_lengths=jnp.asarray(limits))
    plain = toy_search(*toy_inputs(rows), **kwargs)
    kept = toy_search(*toy_inputs(rows), keep_best_cache=True, **kwargs)
    assert plain.best_cache is None
    for a, b in zip(plain[:3], kept[:3], strict=True):
        np.testing.assert_array_equal(a, b)  # keeping the cache changes no result
    lengths = np.asarray(kept.lengths[:, 0])
    assert len(set(lengths)) >= 2  # hypotheses end at different steps: the test can fail
    for b in range(len(rows)):
        n = lengths[b]
        inputs = [BOS_ID] + list(np.asarray(kept.sequences[b, 0, : n - 1]))
        np.testing.assert_array_equal(np.asarray(kept.best_cache["hist"][b, :n]), inputs)
        code = 0
        for token in inputs:
            code = code * TOY_V + token
        assert int(kept.best_cache["code"][b]) == code


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
def test_exhaustive_search_finds_the_exact_ranking(alpha):
    rows, limits = [0, 1, 2, 3], np.array([5, 3, 1, 4])
    beam = 32  # > all 31 hypotheses of length <= 5, and > candidates at every step
    result = toy_search(
        *toy_inputs(rows), beam_size=beam, alpha=alpha, max_lengths=jnp.asarray(limits)
    )
    check_well_formed(result, limits)
    for b, (row, limit) in enumerate(zip(rows, limits, strict=True)):
        expected = toy_all_hypotheses(row, limit, alpha)
        n = len(expected)
        assert np.isfinite(result.scores[b, :n]).all() and np.isinf(result.scores[b, n:]).all()
        got = [
            tuple(s[:length])
            for s, length in zip(result.sequences[b, :n], result.lengths[b, :n], strict=True)
        ]
        assert got == [seq for _, seq in expected]
        np.testing.assert_allclose(result.scores[b, :n], [s for s, _ in expected], atol=1e-5)


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0, -0.5])
def test_toy_early_stop_is_exact_and_scores_are_true(alpha):
    rows, limits = [3, 2, 1, 0, 2], np.array([5, 5, 4, 2, 1])
    kwargs = dict(beam_size=3, alpha=alpha, max_lengths=jnp.asarray(limits))
    early = toy_search(*toy_inputs(rows), **kwargs)
    full = toy_search(*toy_inputs(rows), early_stopping=False, **kwargs)
    for a, b in zip(early[:3], full[:3], strict=True):
        np.testing.assert_array_equal(a, b)
    check_well_formed(early, limits)
    for b, (row, limit) in enumerate(zip(rows, limits, strict=True)):
        truth = {seq: score for score, seq in toy_all_hypotheses(row, limit, alpha)}
        for k in range(min(3, len(truth))):
            seq = tuple(np.asarray(early.sequences[b, k, : early.lengths[b, k]]))
            np.testing.assert_allclose(early.scores[b, k], truth[seq], atol=1e-5)


def test_early_stop_bound_uses_the_length_limit():
    """A live beam that looks hopeless at its current length can still win at a longer one.

    After step 1 the finished ``[EOS]`` scores log(0.6) = -0.51; the live ``[3]`` has
    log(0.38) = -0.97, i.e. -0.71 normalised at length 2 (alpha 2), but ``[3, 3, 3, EOS]``
    reaches about -1.0 / ((5 + 4) / 6) ** 2 = -0.44 and wins: the bound must use the limit.
    """
    probs = np.full((TOY_MAX_LEN, TOY_V), 1e-3, np.float32)
    probs[0, [EOS_ID, 3, 4]] = [0.6, 0.38, 0.02]
    probs[1:3, 3], probs[1:3, EOS_ID] = 0.98, 0.01
    probs[3:, EOS_ID] = 0.98

    def step(cache, tokens, extra):
        logits = jnp.broadcast_to(jnp.log(probs)[cache["index"]], (tokens.shape[0], TOY_V))
        return logits, {"index": cache["index"] + 1, "row": cache["row"]}

    cache = {"index": jnp.zeros((), jnp.int32), "row": jnp.zeros((2,), jnp.int32)}
    for early in (True, False):
        result = bs.greedy_search(
            step, cache, None, alpha=2.0, max_len=TOY_MAX_LEN, early_stopping=early
        )
        np.testing.assert_array_equal(result.sequences[:, 0], [[3, 3, 3, EOS_ID, PAD_ID]] * 2)
        lp = log_softmax(np.log(probs))[np.arange(4), [3, 3, 3, EOS_ID]].sum()
        np.testing.assert_allclose(result.scores[:, 0], lp / 1.5**2, atol=1e-5)
    # With alpha = 0 beam 1 is argmax decoding: [EOS].
    result = bs.greedy_search(step, cache, None, max_len=TOY_MAX_LEN)
    np.testing.assert_array_equal(result.lengths[:, 0], [1, 1])


def test_tile_and_gather_beams():
    tree = {"x": jnp.arange(6).reshape(2, 3), "i": jnp.array(7)}
    tiled = bs.tile_beams(tree, 2)
    np.testing.assert_array_equal(tiled["x"], [[0, 1, 2]] * 2 + [[3, 4, 5]] * 2)
    assert tiled["i"] == 7
    tiled = {"x": tiled["x"] + jnp.array([0, 10, 0, 10])[:, None], "i": tiled["i"]}
    out = bs.gather_beams(tiled, jnp.array([[1, 1, 0], [0, 1, 1]]), 2)
    np.testing.assert_array_equal(out["x"][:, 0], [10, 10, 0, 3, 13, 13])
    assert out["i"] == 7


# --------------------------------------------------------------------------------------------
# Tiny random Transformer.

CFG = TransformerConfig(
    vocab_size=12,
    d_model=32,
    num_heads=2,
    ffn_dim=64,
    num_encoder_layers=1,
    num_decoder_layers=2,
    deterministic=True,
)
MODEL = Transformer(CFG)
MAX_LEN = 9
EOS_RAMP = 0.6  # added to the EOS logit per position so that hypotheses end at varied lengths


@pytest.fixture(scope="module")
def params():
    ones = jnp.ones((2, 5), jnp.int32)
    return jax.jit(MODEL.init)(jax.random.PRNGKey(3), ones, ones, ones, ones)


def sources(lengths, width, seed=0):
    rng = np.random.default_rng(seed)
    src = np.zeros((len(lengths), width), np.int32)
    for i, n in enumerate(lengths):
        src[i, :n] = rng.integers(3, CFG.vocab_size, n)
    return src, (src > 0).astype(np.int32)


@jax.jit
def encode_and_cache(params, src, src_mask):
    """(empty self-attention cache, per-example decoder inputs) of the sources."""
    encoded = MODEL.apply(params, src, src_mask, method=MODEL.encode)
    cache = MODEL.apply(params, src.shape[0], MAX_LEN, method=MODEL.init_cache)
    return cache, MODEL.apply(params, encoded, src_mask, method=MODEL.decode_inputs)


@jax.jit
def biased_step(params, cache, tokens, extra):
    logits, new_cache = MODEL.apply(params, cache, tokens, extra, method=MODEL.decode_step)
    return logits.at[:, EOS_ID].add(EOS_RAMP * cache["index"].astype(jnp.float32)), new_cache


@functools.partial(jax.jit, static_argnames=("beam_size", "early"))
def translate(params, src, src_mask, limits, alpha, beam_size, early=True):
    """The recommended pattern: encode once, then search with params closed over."""
    cache, extra = encode_and_cache(params, src, src_mask)
    step = functools.partial(biased_step, params)
    return bs.beam_search(
        step,
        cache,
        extra,
        beam_size=beam_size,
        alpha=alpha,
        max_len=MAX_LEN,
        max_lengths=limits,
        early_stopping=early,
    )


def test_cached_decoder_matches_teacher_forcing(params):
    src, src_mask = sources([7, 4, 1], 7)
    tgt = np.random.default_rng(1).integers(3, CFG.vocab_size, (3, MAX_LEN)).astype(np.int32)
    tgt[:, -1] = EOS_ID
    full = jax.jit(MODEL.apply)(params, src, src_mask, tgt, np.ones_like(tgt))
    cache, extra = encode_and_cache(params, src, src_mask)
    step = jax.jit(functools.partial(MODEL.apply, method=MODEL.decode_step))
    for t in range(MAX_LEN):
        token = jnp.full((3,), BOS_ID) if t == 0 else tgt[:, t - 1]
        logits, cache = step(params, cache, token, extra)
        np.testing.assert_allclose(logits, full[:, t], atol=1e-5, rtol=1e-5)


GREEDY_SRC = sources([7, 5, 2, 6, 3], 7, seed=3)


def test_greedy_tokens_are_teacher_forced_argmax(params):
    src, src_mask = GREEDY_SRC
    limits = source_length_limits(src_mask, 1.0, 3, MAX_LEN)
    result = translate(params, src, src_mask, limits, 0.0, beam_size=1)
    check_well_formed(result, np.asarray(limits))
    seqs, lengths = np.asarray(result.sequences[:, 0]), np.asarray(result.lengths[:, 0])
    tgt_mask = (np.arange(MAX_LEN)[None] < lengths[:, None]).astype(np.int32)
    logits = np.array(jax.jit(MODEL.apply)(params, src, src_mask, seqs, tgt_mask))
    logits[..., EOS_ID] += EOS_RAMP * np.arange(MAX_LEN)
    lp = log_softmax(logits)
    lp[..., [PAD_ID, BOS_ID]] = -np.inf
    for b in range(len(src)):
        for t in range(lengths[b]):
            expected = EOS_ID if t + 1 == limits[b] else lp[b, t].argmax()
            assert seqs[b, t] == expected
        rescored = lp[b, np.arange(lengths[b]), seqs[b, : lengths[b]]].sum()
        np.testing.assert_allclose(result.scores[b, 0], rescored, atol=1e-5)


def python_greedy(params, src, src_mask, limits):
    """Plain argmax decoding, one row and one step at a time with ``decode_step``."""
    outputs = []
    for b in range(len(src)):
        cache, extra = encode_and_cache(params, src[b : b + 1], src_mask[b : b + 1])
        token, seq, score = BOS_ID, [], 0.0
        while not seq or seq[-1] != EOS_ID:
            logits, cache = biased_step(params, cache, jnp.array([token]), extra)
            lp = log_softmax(logits[0])
            lp[[PAD_ID, BOS_ID]] = -np.inf
            token = EOS_ID if len(seq) + 1 >= limits[b] else int(lp.argmax())
            seq.append(token)
            score += lp[token]
        outputs.append((seq, score))
    return outputs


def test_beam_one_is_greedy(params):
    src, src_mask = GREEDY_SRC
    limits = np.asarray(source_length_limits(src_mask, 1.0, 3, MAX_LEN))
    result = translate(params, src, src_mask, limits, 0.0, beam_size=1)
    step = functools.partial(biased_step, params)
    cache, extra = encode_and_cache(params, src, src_mask)
    greedy = bs.greedy_search(step, cache, extra, max_len=MAX_LEN, max_lengths=limits)
    for a, b in zip(result, greedy, strict=True):
        np.testing.assert_array_equal(a, b)
    expected = python_greedy(params, src, src_mask, limits)
    assert len({len(seq) for seq, _ in expected}) > 1  # varied lengths: the test can fail
    assert any(len(seq) < limits[b] for b, (seq, _) in enumerate(expected))  # EOS not forced
    for b, (seq, score) in enumerate(expected):
        assert result.lengths[b, 0] == len(seq)
        assert list(np.asarray(result.sequences[b, 0, : len(seq)])) == seq
        np.testing.assert_allclose(result.scores[b, 0], score, atol=1e-5)


def batch_with_neighbours():
    """Sentences 0-3, each alone and in one batch with other neighbours, an all-padding row
    and two extra padding columns; returns (sources, batch, row of sentence i in the batch)."""
    src, src_mask = sources([7, 4, 2, 6], 7, seed=6)
    other, _ = sources([5, 3], 7, seed=7)
    rows = [src[2], np.zeros(7, np.int32), src[0], other[0], src[3], other[1], src[1]]
    batch = np.pad(np.stack(rows), ((0, 0), (0, 2)))
    return (src, src_mask), (batch, (batch > 0).astype(np.int32)), {2: 0, 0: 2, 3: 4, 1: 6}


def test_batch_independence_and_padding(params):
    (src, src_mask), (batch, batch_mask), where = batch_with_neighbours()
    limits, batch_limits = (
        source_length_limits(m, 1.0, 4, MAX_LEN) for m in (src_mask, batch_mask)
    )
    batched = translate(params, batch, batch_mask, batch_limits, 0.6, beam_size=4)
    check_well_formed(batched, np.asarray(batch_limits))  # includes: no NaN, padding row too
    alone = [
        translate(params, src[i : i + 1], src_mask[i : i + 1], limits[i : i + 1], 0.6, beam_size=4)
        for i in range(4)
    ]
    assert len({int(a.lengths[0, 0]) for a in alone}) > 1
    for i, row in where.items():
        np.testing.assert_array_equal(batched.sequences[row], alone[i].sequences[0])
        np.testing.assert_array_equal(batched.lengths[row], alone[i].lengths[0])
        np.testing.assert_allclose(batched.scores[row], alone[i].scores[0], atol=1e-5)


def test_transformer_early_stop_is_exact(params):
    _, (batch, batch_mask), _ = batch_with_neighbours()
    limits = source_length_limits(batch_mask, 1.0, 4, MAX_LEN)
    steps = []
    for alpha in (0.0, 0.6, 1.0):
        early = translate(params, batch, batch_mask, limits, alpha, beam_size=4)
        full = translate(params, batch, batch_mask, limits, alpha, beam_size=4, early=False)
        check_well_formed(early, np.asarray(limits))
        for a, b in zip(early[:3], full[:3], strict=True):
            np.testing.assert_array_equal(a, b)
        assert int(full.num_steps) == int(jnp.max(limits))
        steps.append(int(early.num_steps))
    assert min(steps) < int(jnp.max(limits))  # the early stop did trigger


def test_output_limits_known_answers():
    """``floor(len_a * tokens + len_b)`` clipped to ``[1, max_len]``; 1 for an empty row."""
    src_mask = np.array([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]], np.int32)
    limits = np.asarray(source_length_limits(src_mask, 1.5, 2, 7))
    np.testing.assert_array_equal(limits, [6, 3, 1, 7])
