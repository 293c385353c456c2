"""Batched beam search as a pure, jit-able function over an explicit decoder-cache pytree.

The search is model-agnostic: it only calls ``step_fn(cache, tokens, extra) -> (logits,
cache)``. Models never call it directly: the drivers of :mod:`docnmt_jax.decoding.search`
encode the source once, build the model's cache and per-example inputs, then call
:func:`beam_search`.

Scoring: a hypothesis of ``len`` generated tokens (EOS included) and log-probability ``lp``
(sum of the model's ``log_softmax`` in float32) scores ``lp / ((5 + len) / 6) ** alpha``, the
length penalty of Wu et al. (2016), "Google's Neural Machine Translation System", eq. 14.
PAD is never generated, nor BOS unless ``allow_bos=True`` (models that use BOS as a separator
inside the output, e.g. the doc2doc baseline of ``models/concat.py``); at an example's length
limit only EOS is allowed (with its model log-probability, not renormalised), so every
hypothesis ends with EOS.

Each step keeps the best ``2 * beam`` candidates by raw log-probability (flax
``examples/wmt``): the best ``beam`` that do not end in EOS stay live (raw log-probability);
EOS candidates ranked within the first ``beam`` (fairseq's rule, which makes ``beam_size=1``
with ``alpha=0`` exactly argmax decoding) enter the finished pool with their normalised score.
An example is done when it has no live beam, or its pool is full and no live beam can reach
the worst finished score: with log-probabilities <= 0 a live beam's best future score is
``lp / max(lp_pen(len + 1), lp_pen(limit))``, so stopping early never changes the result.

Sampling (``sampling=``:class:`Sampling`) runs the same loop with ``beam`` independent samples
per example: each live sample draws its next token from the model's distribution over the
allowed tokens, reshaped by a temperature and truncated to the ``top_k`` tokens and/or the
nucleus of probability ``top_p`` (Holtzman et al. 2020); a sample's recorded log-probability
is the model's own (untempered ``log_softmax``, as a beam's and as teacher forcing score it),
and the finished samples are ranked by the same length-normalised score. Every sample runs to
its EOS (no early stop). Each example draws from ``PRNGKey(seed)`` folded with a hash of its
own ``extra`` (its encoded source and context) and with the step: an input draws the same
samples wherever it sits in a batch, and different inputs draw independently (a batch's
position never correlates them).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from docnmt_jax.data.tokenizer import BOS_ID, EOS_ID, PAD_ID

Array = jax.Array
Cache = Any
Extra = Any
StepFn = Callable[[Cache, Array, Extra], tuple[Array, Cache]]

NEG_INF = -1.0e9  # finite "impossible" log-probability: masked tokens never produce NaNs


class BeamResult(NamedTuple):
    """Search output, hypotheses best first (``beam`` slots per example).

    ``sequences [B, beam, max_len]``: generated tokens (no BOS), EOS included, PAD after.
    ``scores [B, beam]``: length-normalised log-probabilities; ``-inf`` for an empty slot
    (only when fewer than ``beam`` hypotheses exist, e.g. tiny vocabularies).
    ``lengths [B, beam]``: generated tokens including EOS (0 for an empty slot).
    ``num_steps``: int32 scalar, decoder steps run (< ``max_len`` when stopped early).
    ``best_cache``: with ``keep_best_cache``, the cache (leaves ``[B, ...]``) of each example's
    best hypothesis ``sequences[:, 0]`` after its last decoder step: the decoder states of the
    chosen translation, e.g. a document model's memory for the next sentence. Else ``None``.
    """

    sequences: Array
    scores: Array
    lengths: Array
    num_steps: Array
    best_cache: Cache = None


class BeamState(NamedTuple):
    """While-loop carry. ``step`` = tokens generated so far by every live beam (a scalar; or
    ``[B]``, one per example, in the continuous search of :mod:`.continuous`).

    Live beams: ``live_seqs [B, K, T]`` (PAD-filled), ``live_log_probs [B, K]`` (raw sum),
    ``live_valid [B, K]`` (False for empty beams), ``live_cache`` (leaves ``[B*K, ...]``, 0-d
    leaves shared). Finished pool (sorted best first): ``finished_seqs [B, K, T]``,
    ``finished_scores [B, K]`` (normalised), ``finished_lengths [B, K]``,
    ``finished_flags [B, K]`` (False for empty slots). With ``keep_best_cache``:
    ``best_cache`` (leaves ``[B, ...]``) and ``best_score [B]`` of the best finished hypothesis.
    """

    step: Array
    live_seqs: Array
    live_log_probs: Array
    live_valid: Array
    live_cache: Cache
    finished_seqs: Array
    finished_scores: Array
    finished_lengths: Array
    finished_flags: Array
    best_cache: Cache
    best_score: Array


class Sampling(NamedTuple):
    """Sampling settings: ``temperature`` (> 0) divides the logits; ``top_k`` (0: off) keeps
    the ``k`` most probable tokens; ``top_p`` (1: off) keeps the smallest set of most
    probable tokens whose probability reaches ``p`` (the most probable token always stays);
    ``seed`` seeds the draws."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0


def length_penalty(length: Array | int, alpha: float) -> Array:
    """Wu et al. (2016) length penalty ``((5 + length) / 6) ** alpha`` (float32)."""
    return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


def tile_beams(tree: Any, beam_size: int) -> Any:
    """Repeats every leaf ``[B, ...]`` to ``[B * beam_size, ...]`` (each example's copies
    contiguous); 0-d leaves are shared and returned unchanged."""

    def tile(x: Array) -> Array:
        x = jnp.asarray(x)
        if x.ndim == 0:
            return x
        x = jnp.broadcast_to(x[:, None], (x.shape[0], beam_size) + x.shape[1:])
        return x.reshape((-1,) + x.shape[2:])

    return jax.tree.map(tile, tree)


def gather_beams(tree: Any, beam_indices: Array, beam_size: int) -> Any:
    """Reorders flattened beams: leaves ``[B * beam_size, ...]`` -> ``[B * K, ...]`` with
    ``out[b, j] = in[b, beam_indices[b, j]]`` for ``beam_indices [B, K]``; 0-d leaves
    unchanged."""
    batch = beam_indices.shape[0]
    flat = (jnp.arange(batch)[:, None] * beam_size + beam_indices).reshape(-1)
    return jax.tree.map(lambda x: x if jnp.ndim(x) == 0 else jnp.take(x, flat, axis=0), tree)


def _take(x: Array, indices: Array) -> Array:
    """``out[b, j, ...] = x[b, indices[b, j], ...]`` for ``x [B, N, ...]``."""
    return x[jnp.arange(x.shape[0])[:, None], indices]


def beam_search(
    step_fn: StepFn,
    cache: Cache,
    extra: Extra,
    *,
    beam_size: int = 5,
    alpha: float = 0.6,
    max_len: int,
    max_lengths: Array | None = None,
    eos_id: int = EOS_ID,
    bos_id: int = BOS_ID,
    pad_id: int = PAD_ID,
    early_stopping: bool = True,
    allow_bos: bool = False,
    keep_best_cache: bool = False,
    sampling: Sampling | None = None,
) -> BeamResult:
    """Beam search for a batch of ``B`` examples; pure and jit-able (see the module docstring).

    Args:
      step_fn: ``(cache, tokens [N], extra) -> (logits [N, V], cache)`` with ``N = B * beam``;
        ``tokens`` are the previous tokens (BOS at the first step).
      cache: decoder state; leaves ``[B, ...]`` are tiled to ``[B * beam, ...]`` and reordered
        with the beams, 0-d leaves (e.g. the step index) are shared.
      extra: per-example inputs ``[B, ...]`` (e.g. ``src_mask``, cross-attention keys), passed
        to every ``step_fn`` call as they are, never tiled or reordered: ``step_fn`` sees
        ``B * beam`` rows of tokens and cache against ``B`` rows of ``extra`` (each example's
        beams contiguous), so shared inputs are read once per example, not once per beam.
      beam_size: hypotheses kept per example (1: greedy, see :func:`greedy_search`).
      alpha: length-penalty exponent, score = ``lp / ((5 + len) / 6) ** alpha``.
      max_len: static limit on generated tokens (EOS included).
      max_lengths: optional per-example limits ``[B]`` (clipped to ``[1, max_len]``); EOS is
        forced when a hypothesis reaches its limit.
      early_stopping: stop once no live beam can improve any example's finished pool (never
        changes the result; False runs until every beam has ended).
      allow_bos: let ``bos_id`` be generated like any other token (default: never).
      keep_best_cache: also return the cache of each example's best hypothesis
        (``BeamResult.best_cache``). Whenever a finished hypothesis beats its example's best so
        far (strictly: the earlier one wins ties, as in the pool's order), its parent beam's
        updated cache is copied, only on steps where some example improves.
      sampling: draw ``beam_size`` independent samples per example instead of searching
        (module docstring); ``early_stopping`` is then off.

    Returns:
      :class:`BeamResult`; every example has at least one hypothesis.
    """
    if beam_size < 1 or max_len < 1:
        raise ValueError(f"beam_size and max_len must be >= 1, got {beam_size}, {max_len}")
    batch = _batch_size(cache, extra)
    if max_lengths is None:
        limits = jnp.full((batch,), max_len, jnp.int32)
    else:
        limits = jnp.clip(jnp.asarray(max_lengths, jnp.int32), 1, max_len)
    rules = _Rules(
        beam_size, alpha, max_len, eos_id, bos_id, pad_id,
        early_stopping and sampling is None, allow_bos, keep_best_cache, sampling,
    )  # fmt: skip
    state = _initial_state(cache, batch, rules)
    keys = None if sampling is None else row_keys(extra, batch, sampling.seed)

    def cond(s: BeamState) -> Array:
        return (s.step < max_len) & ~jnp.all(_done_per_example(s, limits, rules))

    def body(s: BeamState) -> BeamState:
        return _beam_step(s, step_fn, extra, limits, rules, keys)

    return _result(jax.lax.while_loop(cond, body, state), rules)


class _Rules(NamedTuple):
    """The static settings of one search (:func:`beam_search`'s arguments)."""

    beam_size: int
    alpha: float
    max_len: int
    eos_id: int
    bos_id: int
    pad_id: int
    early_stopping: bool
    allow_bos: bool
    keep_best_cache: bool
    sampling: Sampling | None = None


def _batch_size(cache: Cache, extra: Extra) -> int:
    """The leading dimension every non-scalar leaf of ``cache`` and ``extra`` shares."""
    leaves = [x for x in jax.tree.leaves(cache) if jnp.ndim(x) > 0]
    if not leaves:
        raise ValueError("cache needs at least one leaf with a leading batch dimension")
    batch = leaves[0].shape[0]
    for x in leaves + [x for x in jax.tree.leaves(extra) if jnp.ndim(x) > 0]:
        if x.shape[0] != batch:
            raise ValueError(f"leaf of shape {x.shape} has no leading batch dimension {batch}")
    return batch


def _initial_state(cache: Cache, batch: int, rules: _Rules) -> BeamState:
    """One live beam per example (the others invalid), an empty finished pool."""
    K, max_len, pad_id = rules.beam_size, rules.max_len, rules.pad_id
    return BeamState(
        step=jnp.zeros((), jnp.int32),
        live_seqs=jnp.full((batch, K, max_len), pad_id, jnp.int32),
        live_log_probs=jnp.zeros((batch, K), jnp.float32),
        # a search starts from one beam; every sample is live from the start
        live_valid=jnp.broadcast_to(
            (jnp.arange(K) == 0) | (rules.sampling is not None), (batch, K)
        ),
        live_cache=tile_beams(cache, K),
        finished_seqs=jnp.full((batch, K, max_len), pad_id, jnp.int32),
        finished_scores=jnp.full((batch, K), NEG_INF, jnp.float32),
        finished_lengths=jnp.zeros((batch, K), jnp.int32),
        finished_flags=jnp.zeros((batch, K), bool),
        best_cache=cache if rules.keep_best_cache else None,
        best_score=jnp.full((batch,), -jnp.inf, jnp.float32),
    )


def _done_per_example(s: BeamState, limits: Array, rules: _Rules) -> Array:
    """``[B]``: no live beam left, or (early stopping) none can beat the finished pool."""
    any_live = jnp.any(s.live_valid, axis=1)
    if not rules.early_stopping:
        return ~any_live
    # Best reachable normalised score of a live beam (lp <= 0; penalty monotone in len).
    alpha = rules.alpha
    pen = jnp.maximum(length_penalty(s.step + 1, alpha), length_penalty(limits, alpha))
    best_live = jnp.max(jnp.where(s.live_valid, s.live_log_probs, -jnp.inf), axis=1) / pen
    worst_finished = jnp.min(jnp.where(s.finished_flags, s.finished_scores, -jnp.inf), axis=1)
    return ~any_live | (worst_finished > best_live)


def _beam_step(
    s: BeamState,
    step_fn: StepFn,
    extra: Extra,
    limits: Array,
    rules: _Rules,
    keys: Array | None = None,
) -> BeamState:
    """One token for every live beam: the best ``2K`` candidates, the best ``K`` non-EOS of
    them live on, EOS candidates ranked within the first ``K`` join the finished pool."""
    t, K = s.step, rules.beam_size
    batch, max_len = s.live_seqs.shape[0], s.live_seqs.shape[2]
    tb = jnp.reshape(t, (-1, 1))  # the step, shared ([1, 1]) or per example ([B, 1])
    prev = jnp.take_along_axis(s.live_seqs, jnp.maximum(tb - 1, 0)[..., None], axis=2)[..., 0]
    tokens = jnp.where(tb == 0, rules.bos_id, prev)  # [B, K]
    logits, new_cache = step_fn(s.live_cache, tokens.reshape(-1), extra)
    banned = (rules.pad_id,) if rules.allow_bos else (rules.pad_id, rules.bos_id)
    logits = logits.reshape(batch, K, -1)
    if rules.sampling is not None:
        top_lp, top_valid, parent, token = _sampled_candidates(
            logits, s, t + 1 >= limits, banned, rules, keys
        )
    else:
        cand_lp, cand_valid, cand_token = _beam_candidates(
            logits, s.live_log_probs, s.live_valid, t + 1 >= limits, banned, rules.eos_id
        )
        width = cand_lp.shape[-1] // K
        _, top = jax.lax.top_k(jnp.where(cand_valid, cand_lp, -jnp.inf), 2 * K)  # [B, 2K]
        top_lp, top_valid = _take(cand_lp, top), _take(cand_valid, top)
        parent, token = top // width, _take(cand_token, top)
    at_t = jnp.arange(max_len) == tb[..., None]  # [B | 1, 1, max_len]
    top_seqs = jnp.where(at_t, token[:, :, None], _take(s.live_seqs, parent))
    is_eos = token == rules.eos_id

    # Live: the best K non-EOS candidates (there are >= K valid ones unless the example ends).
    _, live_pos = jax.lax.top_k(jnp.where(top_valid & ~is_eos, top_lp, -jnp.inf), K)
    live_valid = _take(top_valid & ~is_eos, live_pos)
    live_cache = gather_beams(new_cache, _take(parent, live_pos), K)

    # Finished: merge EOS candidates ranked within the first K into the pool.
    new_flags = top_valid & is_eos & (jnp.arange(2 * K) < K)
    scores = jnp.concatenate([s.finished_scores, top_lp / length_penalty(tb + 1, rules.alpha)], 1)
    flags = jnp.concatenate([s.finished_flags, new_flags], 1)
    lengths = jnp.concatenate([s.finished_lengths, jnp.broadcast_to(tb + 1, (batch, 2 * K))], 1)
    _, keep = jax.lax.top_k(jnp.where(flags, scores, -jnp.inf), K)
    best_cache, best_score = s.best_cache, s.best_score
    if rules.keep_best_cache:
        new_scores = jnp.where(new_flags, scores[:, K:], -jnp.inf)
        best_cache, best_score = _keep_best_cache(s, new_cache, new_scores, parent, K)
    return BeamState(
        step=t + 1,
        live_seqs=_take(top_seqs, live_pos),
        live_log_probs=_take(top_lp, live_pos),
        live_valid=live_valid,
        live_cache=live_cache,
        finished_seqs=_take(jnp.concatenate([s.finished_seqs, top_seqs], 1), keep),
        finished_scores=_take(scores, keep),
        finished_lengths=_take(lengths, keep),
        finished_flags=_take(flags, keep),
        best_cache=best_cache,
        best_score=best_score,
    )


def _keep_best_cache(
    s: BeamState, new_cache: Cache, new_scores: Array, parent: Array, K: int
) -> tuple[Cache, Array]:
    """Each example's best cache and score after a step whose new finished hypotheses score
    ``new_scores [B, 2K]``: an example whose best new one strictly beats its best so far takes
    that hypothesis' parent beam's updated cache (copied only on steps where some example
    improves)."""
    candidate = jnp.argmax(new_scores, axis=1)[:, None]  # [B, 1]
    improved = _take(new_scores, candidate)[:, 0] > s.best_score

    def copy_improved(old: Cache) -> Cache:
        rows = gather_beams(new_cache, _take(parent, candidate), K)
        return jax.tree.map(
            lambda o, n: o if jnp.ndim(o) == 0 else _where_rows(improved, n, o), old, rows
        )

    best_cache = jax.lax.cond(jnp.any(improved), copy_improved, lambda c: c, s.best_cache)
    best_score = jnp.where(improved, _take(new_scores, candidate)[:, 0], s.best_score)
    return best_cache, best_score


def _result(s: BeamState, rules: _Rules) -> BeamResult:
    """The finished pool of the final state; examples without any finished hypothesis (not
    reachable with forced EOS, kept for safety) fall back to their live beams."""
    fallback = ~jnp.any(s.finished_flags, axis=1)

    def pick(fin: Array, live: Array) -> Array:
        return _where_rows(fallback, live, fin)

    flags = pick(s.finished_flags, s.live_valid)
    step = jnp.reshape(s.step, (-1, 1))  # shared or per example
    scores = pick(s.finished_scores, s.live_log_probs / length_penalty(step, rules.alpha))
    lengths = pick(s.finished_lengths, jnp.broadcast_to(step, s.finished_lengths.shape))
    best_cache = None
    if rules.keep_best_cache:  # fallback examples: the cache of their first live beam
        batch = s.live_seqs.shape[0]
        first = gather_beams(s.live_cache, jnp.zeros((batch, 1), jnp.int32), rules.beam_size)
        best_cache = jax.tree.map(
            lambda b, live: b if jnp.ndim(b) == 0 else _where_rows(fallback, live, b),
            s.best_cache,
            first,
        )
    return BeamResult(
        sequences=pick(s.finished_seqs, s.live_seqs),
        scores=jnp.where(flags, scores, -jnp.inf),
        lengths=jnp.where(flags, lengths, 0),
        num_steps=s.step,
        best_cache=best_cache,
    )


def _beam_candidates(
    logits: Array,
    live_log_probs: Array,
    live_valid: Array,
    forced: Array,
    banned: tuple[int, ...],
    eos_id: int,
) -> tuple[Array, Array, Array]:
    """The candidates of one step, a few per beam, holding every example's best ``2K``.

    ``logits [B, K, V]``: each beam's ``top_k`` of ``2K + len(banned)`` tokens by logit (its
    best ``2K`` allowed tokens are among them, since at most the banned ones precede them),
    with log-softmax computed for those alone, then one EOS candidate valid only where
    ``forced [B]`` (the example's length limit: only EOS may follow, all else invalid).
    Flattened parent-major, ``top_k`` of the result ranks them as ``top_k`` over the full
    ``[B, K*V]`` candidate matrix would, ties to the lower (parent, token), without writing
    that matrix (XLA:CPU spent ~20% of beam-5 time on its elementwise passes).

    Returns ``[B, K * (width + 1)]`` log-probabilities (the beam's plus the token's),
    validity and token ids.
    """
    batch, K, V = logits.shape
    logits = logits.astype(jnp.float32)
    row_max = jnp.max(logits, axis=-1, keepdims=True)
    log_norm = jnp.log(jnp.sum(jnp.exp(logits - row_max), axis=-1, keepdims=True))
    values, tokens = jax.lax.top_k(logits, min(2 * K + len(banned), V))
    eos_logit = jax.lax.dynamic_slice_in_dim(logits, eos_id, 1, axis=-1)
    values = jnp.concatenate([values, eos_logit], axis=-1)
    tokens = jnp.concatenate([tokens, jnp.full((batch, K, 1), eos_id, tokens.dtype)], axis=-1)
    log_probs = (values - row_max) - log_norm  # as jax.nn.log_softmax computes it
    allowed = ~functools.reduce(jnp.logical_or, [tokens == b for b in banned])
    is_forced_slot = jnp.arange(tokens.shape[-1]) == tokens.shape[-1] - 1
    allowed = allowed & (is_forced_slot == forced[:, None, None])
    valid = live_valid[:, :, None] & allowed
    cand_lp = live_log_probs[:, :, None] + jnp.where(allowed, log_probs, NEG_INF)
    return cand_lp.reshape(batch, -1), valid.reshape(batch, -1), tokens.reshape(batch, -1)


def row_keys(extra: Extra, batch: int, seed: int) -> Array:
    """One PRNG key per example ``[B, 2]``: ``PRNGKey(seed)`` folded with a hash of the
    example's rows of ``extra`` (bits of every leaf ``[B, ...]``, summed with wrap-around),
    or with its index when ``extra`` holds none."""
    hashes = jnp.zeros((batch,), jnp.uint32)
    for i, leaf in enumerate(jax.tree.leaves(extra)):
        if jnp.ndim(leaf) == 0 or leaf.shape[0] != batch:
            continue
        flat = jnp.asarray(leaf).reshape(batch, -1)
        if jnp.issubdtype(flat.dtype, jnp.floating):
            bits = jax.lax.bitcast_convert_type(flat.astype(jnp.float32), jnp.uint32)
        else:
            bits = flat.astype(jnp.uint32)
        weights = jnp.arange(1, flat.shape[1] + 1, dtype=jnp.uint32) * jnp.uint32(2654435761)
        hashes = hashes * jnp.uint32(31 + 2 * i) + jnp.sum(bits * weights, axis=1)
    if not jax.tree.leaves(extra):
        hashes = jnp.arange(batch, dtype=jnp.uint32)
    base = jax.random.PRNGKey(seed)
    return jax.vmap(lambda h: jax.random.fold_in(base, h))(hashes)


def _sampled_candidates(
    logits: Array,
    s: BeamState,
    forced: Array,
    banned: tuple[int, ...],
    rules: _Rules,
    row_keys: Array,
) -> tuple[Array, Array, Array, Array]:
    """One drawn token per live sample, laid out as a search step's ``2K`` candidates (the
    ``K`` draws in their samples' order, then ``K`` invalid slots): log-probabilities,
    validity, parent and token ``[B, 2K]``. At an example's limit (``forced [B]``) the
    token is EOS."""
    rule = rules.sampling
    batch, K, V = logits.shape
    logits = logits.astype(jnp.float32)
    log_probs = jax.nn.log_softmax(logits, axis=-1)  # the model's, for the score
    allowed = jnp.ones((V,), bool).at[jnp.asarray(banned)].set(False)
    shaped = jnp.where(allowed, logits / rule.temperature, -jnp.inf)
    shaped = _truncated(shaped, rule.top_k, rule.top_p)
    keys = jax.vmap(lambda k: jax.random.fold_in(k, s.step))(row_keys)
    drawn = jax.vmap(lambda k, x: jax.random.categorical(k, x, axis=-1))(keys, shaped)
    drawn = drawn.astype(jnp.int32)  # [B, K]
    token = jnp.where(forced[:, None], rules.eos_id, drawn)
    token_lp = jnp.take_along_axis(log_probs, token[..., None], axis=-1)[..., 0]
    pad = jnp.zeros((batch, K), bool)
    return (
        jnp.concatenate([s.live_log_probs + token_lp, jnp.full((batch, K), NEG_INF)], 1),
        jnp.concatenate([s.live_valid, pad], 1),
        jnp.concatenate([jnp.broadcast_to(jnp.arange(K), (batch, K)), pad.astype(jnp.int32)], 1),
        jnp.concatenate([token, jnp.full((batch, K), rules.pad_id, jnp.int32)], 1),
    )


def _truncated(logits: Array, top_k: int, top_p: float) -> Array:
    """``logits [..., V]`` with every token outside the ``top_k`` most probable (``0``: no
    limit) or outside the nucleus of probability ``top_p`` (``1``: no limit) set to
    ``-inf``; the nucleus is the smallest prefix of the tokens sorted by probability whose
    mass reaches ``top_p``."""
    if top_k <= 0 and top_p >= 1.0:
        return logits
    order = jnp.argsort(-logits, axis=-1)
    ranked = jnp.take_along_axis(logits, order, axis=-1)
    keep = jnp.ones(ranked.shape, bool)
    if top_k > 0:
        keep &= jnp.arange(ranked.shape[-1]) < top_k
    if top_p < 1.0:
        probs = jax.nn.softmax(ranked, axis=-1)
        mass_before = jnp.cumsum(probs, axis=-1) - probs
        keep &= mass_before < top_p
    kept = jnp.where(keep, ranked, -jnp.inf)
    inverse = jnp.argsort(order, axis=-1)
    return jnp.take_along_axis(kept, inverse, axis=-1)


def _where_rows(condition: Array, x: Array, y: Array) -> Array:
    """``x`` where ``condition [B]`` holds, else ``y`` (leaves ``[B, ...]``)."""
    return jnp.where(condition.reshape((-1,) + (1,) * (x.ndim - 1)), x, y)


def greedy_search(
    step_fn: StepFn,
    cache: Cache,
    extra: Extra,
    *,
    max_len: int,
    max_lengths: Array | None = None,
    alpha: float = 0.0,
    eos_id: int = EOS_ID,
    bos_id: int = BOS_ID,
    pad_id: int = PAD_ID,
    early_stopping: bool = True,
    allow_bos: bool = False,
) -> BeamResult:
    """:func:`beam_search` with ``beam_size=1`` (identical results by construction).

    With ``alpha=0`` (the default) this is argmax decoding: the most probable non-PAD/BOS
    token (BOS allowed with ``allow_bos``) each step until EOS (forced at the limit). With
    ``alpha > 0`` the single live beam may continue past an argmax EOS when a longer
    hypothesis can score better.
    """
    return beam_search(
        step_fn,
        cache,
        extra,
        beam_size=1,
        alpha=alpha,
        max_len=max_len,
        max_lengths=max_lengths,
        eos_id=eos_id,
        bos_id=bos_id,
        pad_id=pad_id,
        early_stopping=early_stopping,
        allow_bos=allow_bos,
    )
