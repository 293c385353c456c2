"""Next-sentence search of slot-by-slot models (FINAL's memory, ``SEQUENTIAL_CHUNKS``), keeping
each document's target memory between calls.

A document translated sentence by sentence (``docnmt-translate --interactive``, the server)
holds, besides its sentences, the memory its last translation left: the decoder cache of the
chosen hypothesis (:func:`~docnmt_jax.decoding.search.memory_from_best`), computed when that
sentence was translated. The next sentence ``k`` of a chunk (chunks of ``S`` sentences from
the document's start, as in whole-document translation) is searched in slot ``k`` of its
chunk encoded with the sentences so far (the global layer reads no later sentence: there is
none yet), with that kept memory; sentence 0 of a chunk starts with the empty memory. So the
target memory is the one of the translation the user received, never a re-translation; one
slot is searched per call whatever the document's length.

Memories of different calls have different lengths (each search's output length); a batch's
memories are padded with masked positions to a common length rounded up to
:data:`MEMORY_MULTIPLE` (one compilation per length and batch shape). Keys and values are
the search cache's ``[B, H, L, d]`` (length on axis -2) and the mask ``[B, L]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from docnmt_jax.data.documents import Document
from docnmt_jax.decoding.search import memory_from_best

#: Memory lengths of a batch are padded to a multiple of this (few compilations).
MEMORY_MULTIPLE = 16

PyTree = Any


def _length_axis(leaf: np.ndarray) -> int:
    """The position axis of a memory leaf: 1 for the mask ``[B, L]``, -2 for keys/values."""
    return 1 if leaf.ndim == 2 else leaf.ndim - 2


def _padded(memory: PyTree, length: int) -> PyTree:
    """``memory`` (leaves without the batch axis) with masked zeros up to ``length``."""

    def pad(leaf: np.ndarray) -> np.ndarray:
        axis = _length_axis(leaf[None]) - 1
        widths = [(0, 0)] * leaf.ndim
        widths[axis] = (0, length - leaf.shape[axis])
        return np.pad(leaf, widths)

    return jax.tree.map(pad, memory)


class SlotSession:
    """Searches the next sentence of several documents at once with a slot-by-slot model
    (module docstring). ``translator``: a
    :class:`~docnmt_jax.decoding.translator.Translator` of the model (its batching,
    tokenizer, parameters and search settings)."""

    def __init__(self, translator: Any):
        self.translator = translator
        model, search = translator.model, translator.search
        self.sentences_per_chunk = translator.pipeline_config.sentences_per_chunk

        def step(params: PyTree, batch: dict[str, Any], memory: PyTree, slot_index: Any) -> Any:
            slots, empty = model.search_inputs(params, batch, search)
            rows = jnp.arange(slot_index.shape[0])
            slot = jax.tree.map(lambda x: x[slot_index, rows], slots)
            if memory is None:  # every row starts its chunk
                memory = empty
            result = model.search_slot(params, memory, slot, search)
            return result.sequences[:, 0], memory_from_best(result)

        self._step = jax.jit(step)

    def next_sentences(
        self, sources: Sequence[list[str]], memories: Sequence[PyTree | None]
    ) -> tuple[list[str], list[PyTree]]:
        """The translations of the last sentence of each document ``sources[i]`` (its
        sentences so far) given ``memories[i]`` (the memory its previous sentence left;
        ``None`` for a document's first sentence), and the memories they leave."""
        S = self.sentences_per_chunk
        current = [src[(len(src) - 1) // S * S :] for src in sources]  # the chunk so far
        chunks = [Document(str(i), tuple(c), ("",) * len(c)) for i, c in enumerate(current)]
        texts: list[str | None] = [None] * len(sources)
        left: list[PyTree] = [None] * len(sources)
        translator = self.translator
        for batch in translator.batches(chunks):
            real = np.flatnonzero(batch["doc_index"] >= 0)
            docs = batch["doc_index"][real]
            slot_index = np.zeros(batch["src"].shape[0], np.int32)
            slot_index[real] = [len(chunks[d].src) - 1 for d in docs]
            kept = [memories[d] if len(chunks[d].src) > 1 else None for d in docs]
            memory = self._batch_memory(kept, real, batch["src"].shape[0])
            ids, new_memory = jax.device_get(
                self._step(translator.params, batch, memory, slot_index)
            )
            translator.stats.batches += 1
            translator.stats.shapes.add(("slot",) + tuple(batch["src"].shape))
            for row, d in zip(real, docs, strict=True):
                texts[d] = translator.tokenizer.decode(ids[row])
                left[d] = jax.tree.map(lambda x, r=row: np.asarray(x[r]), new_memory)
        return texts, left  # type: ignore[return-value]

    def _batch_memory(
        self, kept: list[PyTree | None], real: np.ndarray, rows: int
    ) -> PyTree | None:
        """The memories of a batch's rows ``[rows, ...]``: each real row's kept memory
        (``None``: the empty one), padded to a common length; ``None`` when no row has one."""
        present = [m for m in kept if m is not None]
        if not present:
            return None
        longest = max(m["mask"].shape[0] for m in present)
        length = -(-longest // MEMORY_MULTIPLE) * MEMORY_MULTIPLE
        template = jax.tree.map(np.zeros_like, _padded(present[0], length))
        per_row = [template] * rows
        for row, memory in zip(real, kept, strict=True):
            if memory is not None:
                per_row[row] = _padded(memory, length)
        return jax.tree.map(lambda *xs: np.stack(xs), *per_row)
