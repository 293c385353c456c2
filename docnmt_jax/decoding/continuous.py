"""Continuous search of documents: every row translates its chunk's sentences one after another
in a single loop, each at its own pace.

The slot-by-slot search (:func:`~docnmt_jax.decoding.search.scan_slots`) searches sentence
``k`` of ``B`` chunks together, so each slot runs to the longest of ``B`` sentences and slots
that are padding run too. Here a row whose sentence search is done (no live beam can change
its result: :func:`~docnmt_jax.decoding.beam_search._done_per_example`) hands its result over at
once: the best hypothesis' cache becomes the row's memory
(:func:`~docnmt_jax.decoding.search.memory_from_best`), the row restarts from BOS on its chunk's
next sentence in the same loop, and a row past its last real sentence idles. A chunk costs the
sum of its sentences' search steps, the batch the longest such sum. The hand-over moves one
row at a time (a loop over the rows that ended), so its copies cost what they move.

Every sentence's search is the slot search's, step for step: the rows run
:func:`~docnmt_jax.decoding.beam_search._beam_step` with a per-row step counter (``BeamState.step``
``[B]``, the cache's ``index`` ``[B * beam]``), and a done row's pool and best cache would not
change in further steps, so taking them early changes nothing. Beam search only (sampling keeps
the slot search: its draws are keyed by the step of the whole batch).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from docnmt_jax.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from docnmt_jax.decoding.beam_search import (
    NEG_INF,
    BeamResult,
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
#: ``(inputs, memory) -> extra``: a step's per-example inputs (``beam_search``'s ``extra``) from
#: the inputs of every row's current sentence (leaves ``[B, ...]``) and the rows' memories.
WithMemory = Callable[[PyTree, PyTree], PyTree]


class DocumentState(NamedTuple):
    """Loop carry: the rows' searches (``beams.step [B]``), each row's current ``sentence
    [B]``, that sentence's ``inputs`` (leaves ``[B, ...]``), the row's ``memory`` (the chosen
    translation of the sentence before) and the results so far, ``sequences [B, S, n, L]``,
    ``scores [B, S, n]``, ``lengths [B, S, n]``; ``steps``: the decoder steps run."""

    beams: BeamState
    sentence: Array
    inputs: PyTree
    memory: PyTree
    sequences: Array
    scores: Array
    lengths: Array
    steps: Array


def document_search(
    step_fn: StepFn,
    cache: PyTree,
    sentences: PyTree,
    with_memory: WithMemory,
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
      sentences: every sentence's inputs, leaves ``[B, S', ...]`` (``S' = 1``: the same for
        all of a row's sentences); a step reads ``with_memory(inputs, memory)``
        (:data:`WithMemory`).
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
    state = DocumentState(
        beams=_initial_state(cache, B, rules)._replace(step=jnp.zeros((B,), jnp.int32)),
        sentence=jnp.zeros((B,), jnp.int32),
        inputs=jax.tree.map(lambda x: x[:, 0], sentences),
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
        beams = _beam_step(s.beams, step_fn, with_memory(s.inputs, s.memory), limit, rules)
        done = _done_per_example(beams, limit, rules)
        ends = done & (s.sentence < num_sentences)
        s = _hand_over(beams, s._replace(beams=None), ends, sentences, rules)
        return s._replace(beams=_restart(beams, done, rules), steps=s.steps + 1)

    def cond(s: DocumentState) -> Array:
        return jnp.any(s.sentence < num_sentences)

    return jax.lax.while_loop(cond, body, state)


def _hand_over(
    beams: BeamState, s: DocumentState, ends: Array, sentences: PyTree, rules: _Rules
) -> DocumentState:
    """Rows ``ends [B]`` finished their sentence (``beams``, read only): each writes its
    result at its sentence, takes its chosen hypothesis as memory
    (:func:`~docnmt_jax.decoding.search.memory_from_best`) and the inputs of its next
    sentence; one row at a time, over the rows that ended."""
    K = rules.beam_size
    pool = _result(beams._replace(best_cache=None), rules._replace(keep_best_cache=False))
    fallback = ~jnp.any(beams.finished_flags, axis=1)  # not reachable: EOS is forced
    rows = jnp.nonzero(ends, size=ends.shape[0], fill_value=0)[0]

    def row(x: Array, b: Array) -> Array:  # x[b : b + 1]
        return jax.lax.dynamic_index_in_dim(x, b, 0, keepdims=True)

    def put(x: Array, value: Array, at: tuple[Array, ...]) -> Array:
        at = at + (0,) * (x.ndim - len(at))
        return jax.lax.dynamic_update_slice(x, value.astype(x.dtype), at)

    def one(i: Array, s: DocumentState) -> DocumentState:
        b = rows[i]
        k = s.sentence[b]
        best = jax.tree.map(
            lambda kept, live: jnp.where(fallback[b], row(live, b * K), row(kept, b)),
            beams.best_cache,
            beams.live_cache,
        )
        result = BeamResult(row(pool.sequences, b), None, row(pool.lengths, b), None, best)
        n = s.sequences.shape[2]

        def next_inputs(x: Array) -> Array:  # x[b, min(k + 1, S' - 1)] as [1, ...]
            at = (b, jnp.minimum(k + 1, x.shape[1] - 1)) + (0,) * (x.ndim - 2)
            return jax.lax.dynamic_slice(x, at, (1, 1) + x.shape[2:])[:, 0]

        return s._replace(
            sentence=s.sentence.at[b].add(1),
            inputs=jax.tree.map(lambda x, t: put(x, next_inputs(t), (b,)), s.inputs, sentences),
            memory=jax.tree.map(lambda x, m: put(x, m, (b,)), s.memory, memory_from_best(result)),
            sequences=put(s.sequences, row(pool.sequences, b)[:, None, :n], (b, k)),
            scores=put(s.scores, row(pool.scores, b)[:, None, :n], (b, k)),
            lengths=put(s.lengths, row(pool.lengths, b)[:, None, :n], (b, k)),
        )

    return jax.lax.fori_loop(0, jnp.sum(ends), one, s)


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
