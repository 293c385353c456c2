"""Search drivers shared by every model: settings, output limits, per-row and slot-by-slot search.

Models describe their decoder with flax methods (``encode``, ``init_cache``, ``decode_inputs``,
``decode_step``) and call the drivers here; only this module calls
:func:`~docnmt_jax.decoding.beam_search.beam_search`.

* :func:`search_rows`: one output sequence per row (a sentence, or a packed chunk). The cache
  comes from the module's own ``init_cache``; the per-example ``extra`` (cross-attention
  keys/values, masks, memory) is computed once and shared by the beams.
* Slot-by-slot search (models of layout ``SEQUENTIAL_CHUNKS``, e.g. FINAL): the sentences of
  a chunk are searched in order; sentence ``k`` of every chunk is searched with a per-example
  *memory* taken from the chosen hypothesis of sentence ``k-1`` (:func:`memory_from_best`:
  its decoder cache, kept by the search, with a mask of its real tokens). A model provides two
  hooks, ``search_inputs(params, batch, search) -> (slots, memory)`` (leaves of ``slots``
  ``[S, B, ...]``) and ``search_slot(params, memory, slot, search) -> BeamResult``;
  :func:`scan_slots` is the pure, jit-able form, :func:`compile_translate` the compiled one.
* :func:`compile_translate`: the one compiled ``(params, host batch) -> (ids, aux)`` that the
  Translator runs, for ``translate.py`` and dev BLEU alike, on one device or a mesh.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from docnmt_jax.data.tokenizer import PAD_ID
from docnmt_jax.decoding.beam_search import BeamResult, Sampling, beam_search, length_penalty

Array = jax.Array
PyTree = Any
TranslateFn = Callable[[PyTree, dict[str, Any]], tuple[Array, dict[str, Array]]]


@dataclasses.dataclass(frozen=True)
class SearchConfig:
    """Search settings; the papers decode with beam 5 and length penalty 0.6.

    A sentence's output is limited to ``min(max_len, floor(len_a * source_tokens + len_b))``
    tokens including EOS. ``nbest``: hypotheses reported per sentence (``aux["nbest_*"]``,
    :func:`sentence_outputs`; at most the beam). ``sample``: draw ``nbest`` samples per
    sentence instead of searching (``temperature``, ``top_k``, ``top_p``, ``seed``:
    :class:`~docnmt_jax.decoding.beam_search.Sampling`); the best-scoring one is the
    translation.
    """

    beam_size: int = 5
    alpha: float = 0.6
    len_a: float = 1.5
    len_b: int = 10
    max_len: int = 256
    nbest: int = 1
    sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.beam_size < 1:
            raise ValueError(f"beam size must be >= 1, got {self.beam_size}")
        if self.max_len < 1:
            raise ValueError(f"max_len must be >= 1, got {self.max_len}")
        if self.nbest < 1 or (not self.sample and self.nbest > self.beam_size):
            raise ValueError(
                f"nbest must be between 1 and the beam size {self.beam_size}, got {self.nbest}"
            )
        if self.temperature <= 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise ValueError(
                "sampling needs temperature > 0, 0 < top_p <= 1 and top_k >= 0; got "
                f"{self.temperature}, {self.top_p}, {self.top_k}"
            )

    @property
    def width(self) -> int:
        """Hypotheses the search keeps per sentence: the beam, or the samples drawn."""
        return self.nbest if self.sample else self.beam_size

    @property
    def sampling(self) -> Sampling | None:
        """The sampling rule of :func:`beam_search` (``None``: beam search)."""
        if not self.sample:
            return None
        return Sampling(self.temperature, self.top_k, self.top_p, self.seed)

    def output_len(self, source_len: int) -> int:
        """Static output length of a batch whose source sentences have ``source_len`` slots."""
        return int(max(1, min(self.max_len, np.floor(self.len_a * source_len + self.len_b))))


def source_length_limits(src_mask: Array, len_a: float, len_b: float, max_len: int) -> Array:
    """Per-example output limits ``clip(floor(len_a * source_tokens + len_b), 1, max_len)``;
    1 (EOS at once) for a row without source tokens: a batch's padding rows and sentence
    slots, whose outputs are dropped, never keep a search running."""
    src_len = jnp.sum(src_mask > 0, axis=-1).astype(jnp.float32)
    limits = jnp.clip(jnp.floor(len_a * src_len + len_b), 1, max_len).astype(jnp.int32)
    return jnp.where(src_len > 0, limits, 1)


def sentence_limits(src_mask: Array, search: SearchConfig) -> tuple[int, Array]:
    """(static output length, per-sentence limits shaped like ``src_mask[..., 0]``) of
    sentences ``src_mask [..., T]`` searched one per row."""
    max_len = search.output_len(src_mask.shape[-1])
    rows = src_mask.reshape((-1, src_mask.shape[-1]))
    limits = source_length_limits(rows, search.len_a, search.len_b, max_len)
    return max_len, limits.reshape(src_mask.shape[:-1])


def search_decoder(
    module: nn.Module,
    variables: PyTree,
    extra: dict[str, Any],
    search: SearchConfig,
    max_len: int,
    max_lengths: Array,
    **options: Any,
) -> BeamResult:
    """Beam search of ``module.decode_step`` from the module's own empty cache
    (``module.init_cache(rows, max_len)``), one row per row of ``extra`` (its
    ``decode_inputs``, holding ``src_mask``); ``options`` go to ``beam_search`` (e.g.
    ``keep_best_cache``, ``allow_bos``)."""

    def step_fn(cache: PyTree, tokens: Array, extra: dict[str, Any]) -> tuple[Array, PyTree]:
        return module.apply(variables, cache, tokens, extra, method=module.decode_step)

    rows = extra["src_mask"].shape[0]
    cache = module.apply(variables, rows, max_len, method=module.init_cache)
    return beam_search(
        step_fn,
        cache,
        extra,
        beam_size=search.width,
        alpha=search.alpha,
        max_len=max_len,
        max_lengths=max_lengths,
        sampling=search.sampling,
        **options,
    )


def nbest_outputs(result: BeamResult, search: SearchConfig) -> dict[str, Array]:
    """The ``search.nbest`` best hypotheses of every row of ``result``, best first:
    ``nbest_ids [N, n, L]``, ``nbest_scores [N, n]`` (length-normalised, the ranking) and
    ``nbest_log_probs [N, n]`` (``log p(y | x, context)``, the sum a teacher-forced
    :meth:`~docnmt_jax.models.contract.Model.score` gives); ``{}`` when ``nbest`` is 1. An
    empty slot (fewer hypotheses than asked) has score and log-probability ``-inf``."""
    n = search.nbest
    if n == 1:
        return {}
    scores = result.scores[:, :n]
    log_probs = scores * length_penalty(jnp.maximum(result.lengths[:, :n], 1), search.alpha)
    return {
        "nbest_ids": result.sequences[:, :n],
        "nbest_scores": scores,
        "nbest_log_probs": jnp.where(jnp.isfinite(scores), log_probs, -jnp.inf),
    }


def sentence_outputs(
    result: BeamResult, shape: tuple[int, ...], search: SearchConfig
) -> tuple[Array, dict[str, Array]]:
    """A sentence-per-row search's translation: the best hypothesis of every row as ids
    ``shape + (L,)`` (e.g. ``[B, S, L]``), and the aux of :func:`nbest_outputs` with its
    leading row axis reshaped to ``shape``."""
    ids = result.sequences[:, 0].reshape(shape + result.sequences.shape[-1:])
    aux = {k: v.reshape(shape + v.shape[1:]) for k, v in nbest_outputs(result, search).items()}
    return ids, aux


def search_rows(
    module: nn.Module,
    params: PyTree,
    src: Array,
    src_mask: Array,
    search: SearchConfig,
    max_len: int,
    max_lengths: Array,
    **options: Any,
) -> BeamResult:
    """Encodes ``src [N, Ts]`` once and beam-searches every row: the cache holds the decoder's
    self-attention keys/values (reordered with the beams); the per-example inputs
    (``decode_inputs``: cross-attention keys/values) are never tiled or reordered."""
    variables = {"params": params}
    encoded = module.apply(variables, src, src_mask, method=module.encode)
    extra = module.apply(variables, encoded, src_mask, method=module.decode_inputs)
    return search_decoder(module, variables, extra, search, max_len, max_lengths, **options)


def encode_in_groups(
    module: nn.Module, variables: PyTree, src: Array, src_mask: Array, max_tokens: int = 2048
) -> Array:
    """``module.encode`` of chunks ``src [B, S, T]``; on CPU in groups of chunks of at most
    ``max_tokens`` source slots (``lax.map``), whose activations stay in the CPU caches: at
    the batch sizes of sequential decoding this encodes ~1.6x faster
    (docs/log/2026-11-22-final.md). Accelerators encode the whole batch in one call."""
    B, S, T = src.shape
    groups = next((g for g in range(1, B + 1) if B % g == 0 and (B // g) * S * T <= max_tokens), B)
    if groups == 1 or jax.default_backend() != "cpu":
        return module.apply(variables, src, src_mask, method=module.encode)
    shape = (groups, B // groups, S, T)
    encoded = jax.lax.map(
        lambda xs: module.apply(variables, xs[0], xs[1], method=module.encode),
        (src.reshape(shape), src_mask.reshape(shape)),
    )
    return encoded.reshape((B,) + encoded.shape[2:])


# ------------------------------------------------------------------------- slot-by-slot search


def memory_from_best(result: BeamResult) -> dict[str, Array]:
    """The memory for the next sentence: the cache of each example's chosen hypothesis (the
    decoder states of its inputs BOS, y_1 .. y_{n-1}, kept by the search) and ``mask [B, L]``
    over its ``n`` real positions. Equal to a teacher-forced pass over the chosen
    translation (tests/test_final.py) without recomputing it."""
    max_len = result.sequences.shape[-1]
    mask = jnp.arange(max_len)[None] < result.lengths[:, :1]
    memory = {"mask": mask.astype(jnp.int32)}
    memory.update({k: v for k, v in result.best_cache.items() if k != "index"})
    return memory


def pad_empty_sentences(ids: Array, src_mask: Array) -> Array:
    """PAD rows for the padding sentences (no source token) of ids ``[B, S, L]``."""
    real = jnp.any(src_mask > 0, axis=-1)[..., None]
    return jnp.where(real, ids, PAD_ID)


def _slot_step(
    model: Any, params: PyTree, memory: PyTree, slot: PyTree, search: SearchConfig
) -> tuple[PyTree, tuple[Array, dict[str, Array]]]:
    result = model.search_slot(params, memory, slot, search)
    return memory_from_best(result), (result.sequences[:, 0], nbest_outputs(result, search))


def _slot_outputs(
    ids: Array, aux: dict[str, Array], src_mask: Array
) -> tuple[Array, dict[str, Array]]:
    """Per-slot outputs stacked ``[S, B, ...]`` -> ``[B, S, ...]``, padding sentences PAD."""
    aux = {k: v.swapaxes(0, 1) for k, v in aux.items()}
    return pad_empty_sentences(ids.swapaxes(0, 1), src_mask), aux


def scan_slots(
    model: Any, params: PyTree, batch: dict[str, Array], search: SearchConfig
) -> tuple[Array, dict[str, Array]]:
    """Slot-by-slot search as one pure, jit-able function (``lax.scan`` over the ``S``
    slots): ``(ids [B, S, L], aux)``, padding sentences PAD; ``aux`` as
    :func:`sentence_outputs`'s."""
    slots, memory = model.search_inputs(params, batch, search)
    step = functools.partial(_slot_step, model, params, search=search)
    _, (ids, aux) = jax.lax.scan(step, memory, slots)
    return _slot_outputs(ids, aux, batch["src_mask"])


def loop_slots(model: Any, search: SearchConfig, jit: Callable[..., Any]) -> TranslateFn:
    """:func:`scan_slots` as a Python loop of one jitted search per slot, dispatched
    asynchronously (no host synchronisation between slots). On XLA:CPU the search loop nested
    in the scan ran 7% slower than the same searches as separate executions
    (docs/log/2026-11-22-performance.md); three compilations per batch shape instead of one."""
    prepare = jit(functools.partial(model.search_inputs, search=search))

    def slot_fn(params: PyTree, memory: PyTree, slots: PyTree, k: Array) -> Any:
        slot = jax.tree.map(lambda x: jax.lax.dynamic_index_in_dim(x, k, 0, False), slots)
        return _slot_step(model, params, memory, slot, search)

    search_slot = jit(slot_fn, donate_argnums=1)

    def stacked(outputs: list[Any], src_mask: Array) -> tuple[Array, dict[str, Array]]:
        ids, aux = jax.tree.map(lambda *xs: jnp.stack(xs), *outputs)
        return _slot_outputs(ids, aux, src_mask)

    finish = jit(stacked, out=True)

    def translate(params: PyTree, batch: dict[str, Any]) -> tuple[Array, dict[str, Array]]:
        slots, memory = prepare(params, batch)
        outputs = []
        for k in range(batch["src"].shape[1]):
            memory, output = search_slot(params, memory, slots, np.int32(k))
            outputs.append(output)
        return finish(outputs, batch["src_mask"])

    return translate


def padded_memory(memory: PyTree, length: int) -> PyTree:
    """A slot memory (``mask [B, L]``, keys/values ``[B, H, L, d]``) with masked positions up
    to ``length`` (never cut)."""

    def pad(x: Array) -> Array:
        axis = 1 if x.ndim == 2 else x.ndim - 2
        widths = [(0, 0)] * x.ndim
        widths[axis] = (0, max(length - x.shape[axis], 0))
        return jnp.pad(x, widths)

    return jax.tree.map(pad, memory)


def stream_translate(
    model: Any, search: SearchConfig, jit: Callable[..., Any], held: dict[str, PyTree]
) -> TranslateFn:
    """Translation of consecutive document-stream batches
    (:class:`~docnmt_jax.data.stream_plan.StreamPlan`: each row continues its document, one
    chunk a call) by a model that carries state across chunks (recurrent FINAL,
    :mod:`docnmt_jax.models.final_recurrence`): ``(params, batch) -> (ids [B, S, L], aux)``
    as :func:`loop_slots`, every chunk read with what the row's previous chunk left (the
    summaries of its encoding, the chosen translation's decoder states of its last sentence);
    rows with ``chunk_index == 0`` read none. That state stays on the device in ``held``
    between calls (shared by the translator's searches of every output cap; empty whenever
    the number of rows changes or no row continues): a document of ``n`` sentences costs
    ``n / S`` calls of fixed shapes, time linear in ``n``, memory independent of it. The
    carried target memory is padded to the output cap ``search.max_len``, so slot 0's search
    compiles once per cap, not once per previous chunk's length."""
    prepare = jit(functools.partial(model.carried_search_inputs, search=search))

    def slot_fn(params: PyTree, memory: PyTree, slots: PyTree, k: Array) -> Any:
        slot = jax.tree.map(lambda x: jax.lax.dynamic_index_in_dim(x, k, 0, False), slots)
        return _slot_step(model, params, memory, slot, search)

    search_slot = jit(slot_fn, donate_argnums=1)
    first_slot = jit(slot_fn)  # the carried memory's length is not the output's: no donation

    def stacked(outputs: list[Any], src_mask: Array) -> tuple[Array, dict[str, Array]]:
        ids, aux = jax.tree.map(lambda *xs: jnp.stack(xs), *outputs)
        return _slot_outputs(ids, aux, src_mask)

    finish = jit(stacked, out=True)
    to_cap = jit(functools.partial(padded_memory, length=search.max_len))

    def translate(params: PyTree, batch: dict[str, Any]) -> tuple[Array, dict[str, Array]]:
        rows = batch["src"].shape[0]
        carry = held.get("carry")
        starts = not np.any(np.asarray(batch["chunk_index"]) > 0)  # no row reads a carry
        if carry is None or carry["source"].shape[0] != rows or starts:
            carry = model.initial_decode_carry(rows)
            carry["target"] = to_cap(carry["target"])  # one shape whatever the batch
        slots, memory, (summaries, summary_mask) = prepare(params, batch, carry)
        outputs = []
        for k in range(batch["src"].shape[1]):
            memory, output = (search_slot if k else first_slot)(params, memory, slots, np.int32(k))
            outputs.append(output)
        target = to_cap(memory)
        held["carry"] = {"source": summaries, "source_mask": summary_mask, "target": target}
        return finish(outputs, batch["src_mask"])

    return translate
