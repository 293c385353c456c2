"""FINAL's search (Zheng et al. 2020, Sec. 4.2): the sentences of a chunk translated in order,
sentence ``k`` reading the decoder states of the translation chosen for ``k - 1`` as its
Transformer-XL memory ``SG(s^{l-1}_{k-1})`` (never the reference).

Two drivers give the same translations: the slot search (:func:`search_inputs`,
:func:`search_slot`, the hooks of :func:`~docnmt_jax.decoding.search.scan_slots`; the
incremental and the recurrent searches use them too), and the continuous search
(:func:`continuous_translate`, :mod:`docnmt_jax.decoding.continuous`), where each row moves to
its chunk's next sentence as soon as its sentence is done, in one compiled loop: a chunk
costs the sum of its sentences' search steps, not ``S`` times the batch's longest sentence.
Without the XL decoder every sentence of every chunk is searched at once, without memory.
The module's steps the search calls are :class:`FinalSearchSteps`.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from docnmt_jax.data.tokenizer import BOS_ID
from docnmt_jax.decoding.beam_search import BeamResult
from docnmt_jax.decoding.continuous import document_search
from docnmt_jax.decoding.search import (
    SearchConfig,
    encode_in_groups,
    pad_empty_sentences,
    scan_slots,
    search_decoder,
    sentence_limits,
    sentence_outputs,
)
from docnmt_jax.models import final_recurrence as recurrence
from docnmt_jax.models import layers, transformer
from docnmt_jax.models.base import BaseModel
from docnmt_jax.models.final_layers import FinalConfig
from docnmt_jax.models.xl import Cache, Memory, MemoryKV, memory_from_states

Array = jax.Array
Slots = tuple[Array, Array, Array]  # cross-attention inputs, their mask, the source mask


def search_inputs(
    model: BaseModel, params: Any, batch: dict[str, Array], search: SearchConfig
) -> tuple[Slots, MemoryKV]:
    """The chunks encoded once (:func:`~docnmt_jax.decoding.search.encode_in_groups`), per
    sentence slot: (what the sentence cross-attends to ``[S, B, Tk, D]`` and its mask
    ``[S, B, Tk]``, the sentence's source mask ``[S, B, T]``), and the empty memory of
    sentence 0 (the layout of a search cache). The cross-attention inputs are the
    training's (:meth:`~.final.Final.cross_memory`): the sentence's own ``h_k`` (``Tk = T``),
    or with ``cross_attends_chunk`` the whole chunk in every slot (``Tk = S*T``)."""
    module, variables = model.eval_module, {"params": params}
    src, src_mask = batch["src"], batch["src_mask"]
    encoded = encode_in_groups(module, variables, src, src_mask)
    max_len, _ = sentence_limits(src_mask, search)
    cache = module.apply(variables, src.shape[0], max_len, method=module.init_cache)
    memory = {k: v for k, v in cache.items() if k != "index"}
    memory["mask"] = jnp.zeros((src.shape[0], max_len), jnp.int32)  # sentence 0: none
    B, S, T, D = encoded.shape
    if model.config.cross_attends_chunk:
        cross = jnp.broadcast_to(encoded.reshape(1, B, S * T, D), (S, B, S * T, D))
        cross_mask = jnp.broadcast_to(src_mask.reshape(1, B, S * T), (S, B, S * T))
    else:
        cross, cross_mask = encoded.swapaxes(0, 1), src_mask.swapaxes(0, 1)
    return (cross, cross_mask, src_mask.swapaxes(0, 1)), memory


def search_slot(
    model: BaseModel, params: Any, memory: MemoryKV, slot: Slots, search: SearchConfig
) -> BeamResult:
    """Beam search of one sentence per row, ``slot`` = (cross-attention inputs, their mask,
    the sentence's source mask: its output limit), with the previous sentence's ``memory``;
    keeps the chosen hypothesis's cache."""
    module, variables = model.eval_module, {"params": params}
    encoded, cross_mask, src_mask = slot
    max_len, limits = sentence_limits(src_mask, search)
    extra = module.apply(variables, encoded, cross_mask, memory, method=module.decode_inputs)
    return search_decoder(
        module, variables, extra, search, max_len, limits, keep_best_cache=model.uses_memory
    )


def translate(
    model: BaseModel, params: Any, batch: dict[str, Array], search: SearchConfig
) -> tuple[Array, dict[str, Array]]:
    """Ids ``[B, S, L]`` (EOS, then PAD; padding sentences PAD) and the n-best aux: with the XL
    decoder the continuous search (sampling: slot by slot), else every sentence of every
    chunk searched at once, without memory."""
    if model.layout.sequential:
        if search.sample:
            return scan_slots(model, params, batch, search)
        return continuous_translate(model, params, batch, search)
    B, S = batch["src"].shape[:2]
    slots, _ = search_inputs(model, params, batch, search)
    rows = jax.tree.map(lambda x: x.reshape((B * S,) + x.shape[2:]), slots)
    empty = {"mask": jnp.zeros((B * S, 1), jnp.int32)}
    result = search_slot(model, params, empty, rows, search)
    ids, aux = sentence_outputs(result, (S, B), search)  # rows slot-major
    aux = {k: v.swapaxes(0, 1) for k, v in aux.items()}
    return pad_empty_sentences(ids.swapaxes(0, 1), batch["src_mask"]), aux


def continuous_translate(
    model: BaseModel, params: Any, batch: dict[str, Array], search: SearchConfig
) -> tuple[Array, dict[str, Array]]:
    """The slot search's translation (:func:`~docnmt_jax.decoding.search.scan_slots`) by the
    continuous search: every row searches its chunk's sentences up to its last real one in
    order, each sentence's memory the chosen translation of the one before."""
    module, variables = model.eval_module, {"params": params}
    src_mask = batch["src_mask"]
    B, S = src_mask.shape[:2]
    (cross, cross_mask, _), memory = search_inputs(model, params, batch, search)
    max_len, limits = sentence_limits(src_mask, search)
    real = jnp.any(src_mask > 0, axis=-1)
    num_sentences = jnp.max(jnp.where(real, jnp.arange(1, S + 1), 0), axis=-1)
    state = document_search(
        lambda c, t, e: module.apply(variables, c, t, e, method=module.decode_step),
        module.apply(variables, B, max_len, method=module.init_cache),
        _cross_inputs(model, params, cross, cross_mask),
        _with_memory,
        memory,
        limits,
        num_sentences,
        beam_size=search.width,
        alpha=search.alpha,
        max_len=max_len,
        nbest=search.nbest,
    )
    n = search.nbest
    result = BeamResult(
        state.sequences.reshape(B * S, n, max_len),
        state.scores.reshape(B * S, n),
        state.lengths.reshape(B * S, n),
        num_steps=jnp.zeros((), jnp.int32),
    )
    ids, aux = sentence_outputs(result, (B, S), search)
    return pad_empty_sentences(ids, src_mask), aux


def _cross_inputs(model: BaseModel, params: Any, cross: Array, cross_mask: Array) -> dict:
    """Every sentence's cross-attention keys/values and source mask (``decode_inputs``
    without memory), leaves ``[B, S', ...]``, computed slot by slot as the slot search computes
    them (the same products); ``S' = 1`` when every sentence reads its whole chunk."""
    module, variables = model.eval_module, {"params": params}
    if model.config.cross_attends_chunk:  # the same inputs in every slot
        cross, cross_mask = cross[:1], cross_mask[:1]
    empty = {"mask": jnp.zeros((cross.shape[1], 1), jnp.int32)}

    def one_slot(inputs: tuple[Array, Array]) -> dict:
        extra = module.apply(variables, *inputs, empty, method=module.decode_inputs)
        return {k: v for k, v in extra.items() if k != "memory_mask"}

    table = jax.lax.map(one_slot, (cross, cross_mask))
    return jax.tree.map(lambda x: x.swapaxes(0, 1), table)


def _with_memory(rows: dict[str, Any], memory: MemoryKV) -> dict[str, Any]:
    """``decode_inputs``' layout from a sentence's cross inputs and the row's memory: the
    memory mask, and every XL layer's memory keys/values beside its cross keys/values."""
    extra = dict(rows, memory_mask=memory["mask"])
    for name, kv in memory.items():
        if name != "mask":
            extra[name] = {**rows[name], **kv}
    return extra


class FinalSearchSteps(recurrence.RecurrentSteps):
    """What the search calls on :class:`~.final.Final`, one target sentence slot at a time
    (the memory of slot ``k`` is the states of the translation chosen for ``k-1``, Sec. 4.2);
    :class:`~.final.Final` provides ``decoder_layers``, ``uses_memory``, ``_decode_rows``,
    ``_embed_target`` and ``_output``."""

    config: FinalConfig

    def decode_sentence(
        self, encoded: Array, src_mask: Array, tgt: Array, tgt_mask: Array, memory: Memory
    ) -> tuple[Array, Memory]:
        """One sentence per row, teacher-forced on ``tgt [B, T]`` (not shifted) with the previous
        sentence's ``memory``: (logits ``[B, T, V]``, this sentence's memory for the next).
        ``encoded``/``src_mask``: what the sentence cross-attends to, its own ``h_k [B, Ts, D]``
        or with :attr:`FinalConfig.cross_attends_chunk` its chunk's ``[B, S*Ts, D]``."""
        y, inputs = self._decode_rows(
            encoded,
            src_mask,
            layers.shift_right(tgt, BOS_ID),
            tgt_mask,
            lambda i, _: (memory.get(f"layer_{i}"), memory["mask"]),
            self.config.num_decoder_layers,
        )
        return self._output(y), memory_from_states(inputs if self.uses_memory else [], tgt_mask)

    def sentence_memory(
        self, encoded: Array, src_mask: Array, tgt: Array, tgt_mask: Array, memory: Memory
    ) -> Memory:
        """The memory (decoder layer inputs ``s^0..s^{N-1}``) of target sentence ``tgt [B, T]``
        (e.g. the chosen hypothesis), computed teacher-forced with its own ``memory``."""
        if not self.uses_memory:
            return memory_from_states([], tgt_mask)
        # The last layer's output is not part of the memory: N-1 layers give s^0..s^{N-1}.
        last, inputs = self._decode_rows(
            encoded,
            src_mask,
            layers.shift_right(tgt, BOS_ID),
            tgt_mask,
            lambda i, _: (memory[f"layer_{i}"], memory["mask"]),
            self.config.num_decoder_layers - 1,
        )
        return memory_from_states(inputs + [last], tgt_mask)

    def init_cache(self, batch: int, max_len: int) -> Cache:
        """Empty cache for ``max_len`` positions of one sentence (self-attention keys/values)."""
        return transformer.empty_self_attention_cache(self.config, batch, max_len)

    def memory_kv(self, memory: Memory) -> MemoryKV:
        """The memory's self-attention keys/values: ``{"mask", "layer_i": {"key", "value"}}``
        (``[B, H, Tm, d]``, heads-major like the search cache that is the next sentence's
        memory), what the XL layers attend to when decoding."""
        memory_kv: MemoryKV = {"mask": memory["mask"]}
        for i, layer in enumerate(self.decoder_layers):
            kv = layer.memory_kv(memory.get(f"layer_{i}"))
            if kv is not None:
                k, v = (layers.heads_major(x) for x in kv)
                memory_kv[f"layer_{i}"] = {"key": k, "value": v}
        return memory_kv

    def decode_inputs(self, encoded: Array, src_mask: Array, memory: MemoryKV) -> dict[str, Any]:
        """Per-example inputs of :meth:`decode_step` (the ``extra`` of the search, one row per
        example, shared by its beams): the source mask, every layer's cross-attention
        keys/values (computed once) and the previous sentence's memory keys/values.
        ``encoded``/``src_mask``: what the sentence cross-attends to, as in training
        (:meth:`~.final.Final.cross_memory`: its ``h_k`` or its chunk's encoding)."""
        extra: dict[str, Any] = {"src_mask": src_mask, "memory_mask": memory["mask"]}
        for i, layer in enumerate(self.decoder_layers):
            k, v = layer.cross_kv(encoded)
            extra[f"layer_{i}"] = {"cross_key": k, "cross_value": v}
            extra[f"layer_{i}"].update(memory.get(f"layer_{i}", {}))
        return extra

    def decode_step(self, cache: Cache, token: Array, extra: dict[str, Any]) -> tuple[Array, Cache]:
        """One step: ``token [N]`` at ``cache['index']`` (shared, or one per row ``[N]``) ->
        (logits ``[N, V]``, new cache); ``cache`` has ``N`` rows (beams), ``extra``
        (:meth:`decode_inputs`) one per example."""
        index = cache["index"]
        y = self._embed_target(token[:, None], jnp.broadcast_to(index, token.shape)[:, None])
        cross_mask = (extra["src_mask"] > 0)[:, None, None, :]
        new_cache: Cache = {"index": index + 1}
        for i, layer in enumerate(self.decoder_layers):
            name = f"layer_{i}"
            y, new_cache[name] = layer.step(
                y, index, cache[name], extra[name], extra["memory_mask"], cross_mask
            )
        return self._output(y)[:, 0], new_cache
