"""Continuous search of documents: every row translates its chunk's sentences one after another
in a single loop, each at its own pace.

The slot-by-slot search (:func:`~docnmt_jax.decoding.search.scan_slots`) searches sentence
``k`` of ``B`` chunks together, so each slot runs to the longest of ``B`` sentences and slots
that are padding run too. Here a row whose sentence search is done (no live beam can change
its result: :func:`~docnmt_jax.decoding.beam_search._done_per_example`) hands its result over at
once: the best hypothesis' cache becomes the row's memory
(:func:`~docnmt_jax.decoding.search.memory_from_best`), the row restarts from BOS on its chunk's
next sentence in the same loop, and a row past its last real sentence idles. A chunk costs the
sum of its sentences' search steps, the batch the longest such sum.

Every sentence's search is the slot search's, step for step: the rows run
:func:`~docnmt_jax.decoding.beam_search._beam_step` with a per-row step counter (``BeamState.step``
``[B]``, the cache's ``index`` ``[B * beam]``), and a done row's pool and best cache would not
change in further steps, so taking them early changes nothing. Beam search only (sampling keeps
the slot search: its draws are keyed by the step of the whole batch).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from docnmt_jax.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from docnmt_jax.decoding.beam_search import (
    NEG_INF,
    BeamState,
    StepFn,
    _beam_step,
    _done_per_example,
    _initial_state,
    _result,
    _Rules,
    _where_rows,
)
from docnmt_jax.decoding.search import memory_from_best

Array = jax.Array
PyTree = Any
#: ``(sentence [B], memory) -> extra``: the per-example inputs of every row's current sentence
#: (``beam_search``'s ``extra``) with the row's memory.
SentenceInputs = Callable[[Array, PyTree], PyTree]


class DocumentState(NamedTuple):
    """Loop carry: the rows' searches (``beams.step [B]``), each row's current ``sentence
    [B]``, its ``memory`` (the chosen translation of the sentence before) and the results so
    far, ``sequences [B, S, n, L]``, ``scores [B, S, n]``, ``lengths [B, S, n]``; ``steps``:
    the decoder steps run (loop iterations)."""

    beams: BeamState
    sentence: Array
    memory: PyTree
    sequences: Array
    scores: Array
    lengths: Array
    steps: Array


def document_search(
    step_fn: StepFn,
    cache: PyTree,
    sentence_inputs: SentenceInputs,
    memory: PyTree,
    limits: Array,
    num_sentences: Array,
    *,
    beam_size: int,
    alpha: float,
    max_len: int,
    nbest: int = 1,
) -> DocumentState:
    """Beam search of sentences ``0 .. num_sentences[b] - 1`` of every row ``b``, in order, in
    one ``while_loop`` (module docstring).

    Args:
      step_fn: ``(cache, tokens [N], extra) -> (logits [N, V], cache)`` as for
        :func:`~docnmt_jax.decoding.beam_search.beam_search`, with ``cache["index"]`` one
        position per row ``[N]``.
      cache: the model's empty cache for ``B`` rows of ``max_len`` positions (its ``index``
        is replaced by per-row zeros).
      sentence_inputs: the ``extra`` of each row's sentence and memory (:data:`SentenceInputs`).
      memory: the memory of every row's first sentence.
      limits: output limits ``[B, S]`` of every sentence (EOS included).
      num_sentences: ``[B]`` sentences to search per row (0: the row idles).
      nbest: hypotheses kept per sentence (at most ``beam_size``).

    Returns:
      the final :class:`DocumentState`: sentence ``k`` of row ``b``'s ``nbest`` best
      hypotheses (``sequences``, ``scores``, ``lengths``, best first); the sentences not
      searched hold PAD, ``-inf`` and 0.
    """
    B, S = limits.shape
    rules = _Rules(beam_size, alpha, max_len, EOS_ID, BOS_ID, PAD_ID, True, False, True, None)
    cache = dict(cache, index=jnp.zeros((B,), jnp.int32))
    beams = _initial_state(cache, B, rules)._replace(step=jnp.zeros((B,), jnp.int32))
    state = DocumentState(
        beams=beams,
        sentence=jnp.zeros((B,), jnp.int32),
        memory=memory,
        sequences=jnp.full((B, S, nbest, max_len), PAD_ID, jnp.int32),
        scores=jnp.full((B, S, nbest), -jnp.inf, jnp.float32),
        lengths=jnp.zeros((B, S, nbest), jnp.int32),
        steps=jnp.zeros((), jnp.int32),
    )

    def row_limits(s: DocumentState) -> Array:  # an idle row's "sentence" ends at once
        current = jnp.take_along_axis(limits, jnp.minimum(s.sentence, S - 1)[:, None], 1)[:, 0]
        return jnp.where(s.sentence < num_sentences, current, 1)

    def body(s: DocumentState) -> DocumentState:
        limit = row_limits(s)
        extra = sentence_inputs(jnp.minimum(s.sentence, S - 1), s.memory)
        s = s._replace(beams=_beam_step(s.beams, step_fn, extra, limit, rules))
        done = _done_per_example(s.beams, limit, rules)
        ends = done & (s.sentence < num_sentences)
        s = jax.lax.cond(jnp.any(ends), functools.partial(_hand_over, rules=rules), _same, s, ends)
        return s._replace(beams=_restart(s.beams, done, rules), steps=s.steps + 1)

    def cond(s: DocumentState) -> Array:
        return jnp.any(s.sentence < num_sentences)

    return jax.lax.while_loop(cond, body, state)


def _same(s: DocumentState, ends: Array) -> DocumentState:
    return s


def _hand_over(s: DocumentState, ends: Array, rules: _Rules) -> DocumentState:
    """Rows ``ends [B]`` finished their sentence: its result is written at the row's sentence,
    its chosen hypothesis becomes the row's memory, the row moves to its next sentence."""
    result = _result(s.beams, rules)
    n, S = s.sequences.shape[2], s.sequences.shape[1]
    at = ends[:, None] & (jnp.arange(S)[None] == s.sentence[:, None])  # [B, S]

    def write(old: Array, new: Array) -> Array:  # new [B, n, ...] at [b, sentence_b]
        where = at.reshape(at.shape + (1,) * (old.ndim - 2))
        return jnp.where(where, new[:, None, :n], old)

    memory = jax.tree.map(
        lambda new, old: _where_rows(ends, new.astype(old.dtype), old),
        memory_from_best(result),
        s.memory,
    )
    return s._replace(
        sentence=s.sentence + ends,
        memory=memory,
        sequences=write(s.sequences, result.sequences),
        scores=write(s.scores, result.scores),
        lengths=write(s.lengths, result.lengths),
    )


def _restart(beams: BeamState, done: Array, rules: _Rules) -> BeamState:
    """The searches of rows ``done [B]`` start again from BOS (a new sentence, or an idle
    row's next empty one): one live beam, an empty pool, step and cache index 0. The cache's
    keys and values stay: positions past the index are masked until written again."""
    K, L = rules.beam_size, rules.max_len

    def fresh(old: Array, value: Array) -> Array:
        return _where_rows(done, jnp.broadcast_to(value, old.shape).astype(old.dtype), old)

    cache = dict(beams.live_cache)
    cache["index"] = jnp.where(jnp.repeat(done, K), 0, cache["index"])
    return beams._replace(
        step=jnp.where(done, 0, beams.step),
        live_seqs=fresh(beams.live_seqs, jnp.full((K, L), PAD_ID)),
        live_log_probs=fresh(beams.live_log_probs, jnp.zeros((K,))),
        live_valid=fresh(beams.live_valid, jnp.arange(K) == 0),
        live_cache=cache,
        finished_seqs=fresh(beams.finished_seqs, jnp.full((K, L), PAD_ID)),
        finished_scores=fresh(beams.finished_scores, jnp.full((K,), NEG_INF)),
        finished_lengths=fresh(beams.finished_lengths, jnp.zeros((K,))),
        finished_flags=fresh(beams.finished_flags, jnp.zeros((K,), bool)),
        best_score=jnp.where(done, -jnp.inf, beams.best_score),
    )
