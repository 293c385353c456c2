"""Translating documents with a trained model: batching, the compiled search, detokenisation,
order.

The model-specific part is the model's search (:meth:`~docnmt_jax.models.base.Model.translate`,
compiled by :func:`~docnmt_jax.decoding.search.compile_translate`: ``(params, batch) -> (ids
[B, S, L], aux)``); this module feeds it fixed-shape batches from the document pipeline laid
out as the model declares (``model.layout``), so it compiles once per shape, puts the
detokenised sentences back in input order, and streams long inputs block by block so memory
does not grow with the input. ``translate.py`` and dev BLEU during training run this same
class, on one device or on a mesh (``mesh``: batch rows split over ``data x fsdp``).

``aux`` holds per-chunk arrays ``[B]``. Known key: ``"sentence_counts"``, the number of
sentences the model produced for each chunk (models that translate a chunk as one sequence,
e.g. ``models/concat.py``); the translator counts the chunks where it differs from the
source's (:class:`TranslationStats`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import jax
import numpy as np

from docnmt_jax import parallel
from docnmt_jax.data import pipeline as pipeline_lib
from docnmt_jax.data.documents import Document
from docnmt_jax.data.tokenizer import Tokenizer
from docnmt_jax.decoding.search import SearchConfig, compile_translate
from docnmt_jax.models.base import Model


@dataclasses.dataclass
class TranslationStats:
    """Counters of a translation run (sentences, tokens, chunks, batches, compilations, seconds).

    ``sentence_count_mismatches``: chunks whose translation has a different number of sentences
    than the source (``None`` unless the model reports ``aux["sentence_counts"]``).
    """

    documents: int = 0
    sentences: int = 0
    output_tokens: int = 0
    chunks: int = 0
    batches: int = 0
    seconds: float = 0.0
    shapes: set[tuple[int, ...]] = dataclasses.field(default_factory=set)
    sentence_count_mismatches: int | None = None

    @property
    def compilations(self) -> int:
        return len(self.shapes)

    def summary(self) -> str:
        secs = max(self.seconds, 1e-9)
        text = (
            f"{self.documents} documents, {self.sentences} sentences in {self.seconds:.1f} s: "
            f"{self.sentences / secs:.1f} sentences/s, {self.output_tokens / secs:.0f} "
            f"tokens/s; {self.batches} batches, {self.compilations} compilations"
        )
        if self.sentence_count_mismatches is not None:
            rate = 100.0 * self.sentence_count_mismatches / max(self.chunks, 1)
            text += (
                f"; sentence count differs from the source in {self.sentence_count_mismatches}"
                f"/{self.chunks} chunks ({rate:.1f}%)"
            )
        return text


def trim_padding_rows(batch: dict[str, np.ndarray], multiple: int = 1) -> dict[str, np.ndarray]:
    """``batch`` cut to the smallest power-of-two multiple of ``multiple`` rows (at least
    ``multiple``) that holds every real row (``doc_index >= 0``), when that is fewer rows.

    The pipeline pads a bucket's last batch to the full row count; a search costs the same
    for padding rows as for real ones, so a small input (a few sentences; FINAL's batches have
    S times more rows) would cost a whole batch. Powers of two bound the extra compilations
    at ``log2(rows)`` per bucket shape.
    """
    real = np.flatnonzero(batch["doc_index"] >= 0)
    rows = batch["doc_index"].shape[0]
    needed = int(real[-1]) + 1 if real.size else 1
    target = multiple
    while target < needed:
        target *= 2
    if target >= rows:
        return batch
    return {key: value[:target] for key, value in batch.items()}


class Translator:
    """Translates documents with ``model`` and ``params`` on the pipeline's fixed shapes; with
    ``mesh`` on that device mesh (``params`` must then carry their shardings)."""

    def __init__(
        self,
        model: Model,
        params: Any,
        tokenizer: Tokenizer,
        search: SearchConfig,
        batch_tokens: int = 4096,
        max_src_len: int = 256,
        max_sentences: int = 20,
        mesh: parallel.Layout | None = None,
    ):
        self.model = model
        self.params = params
        self.tokenizer = tokenizer
        self.search = search
        self.pipeline_config = pipeline_lib.PipelineConfig(
            max_sentences=max_sentences,
            max_src_len=max_src_len,
            max_tgt_len=1,
            batch_src_tokens=batch_tokens,
            batch_tgt_tokens=batch_tokens,
            sentence_level=model.layout.sentence_level,
            shuffle=False,
            num_epochs=1,
            pad_batch=True,
            # A model that searches a chunk's sentences one after another (FINAL's memory) gets
            # as many chunks as a sentence model gets sentences: same rows per search step.
            sequential_sentences=model.layout.sequential,
            context_sentences=model.context_sentences,
            whole_documents=model.whole_documents,
            batch_multiple=mesh.batch_shards if mesh is not None else 1,
        )
        self.stats = TranslationStats()
        self._search = compile_translate(model, search, mesh)

    def translate(self, documents: Sequence[Document]) -> list[list[str]]:
        """The translation of every sentence of ``documents``, document by document."""
        start = time.perf_counter()
        out: list[list[str | None]] = [[None] * len(doc) for doc in documents]
        # Only the source matters; references (if any) are not looked at.
        sources = [Document(d.doc_id, d.src, ("",) * len(d)) for d in documents]
        plan = pipeline_lib.plan_batches(sources, self.tokenizer.encode_batch, self.pipeline_config)
        for batch in pipeline_lib.numpy_batches(plan):
            batch = trim_padding_rows(batch, self.pipeline_config.batch_multiple)
            self.stats.shapes.add(tuple(batch["src"].shape))
            ids, aux = self._search(self.params, batch)
            ids = np.asarray(jax.device_get(ids))
            counts = aux.get("sentence_counts")
            if counts is not None:
                counts = np.asarray(jax.device_get(counts))
                real_rows = batch["doc_index"] >= 0
                real_counts = np.sum(batch["sentence_mask"] > 0, axis=-1)
                mismatches = int(np.sum(real_rows & (counts != real_counts)))
                self.stats.sentence_count_mismatches = (
                    self.stats.sentence_count_mismatches or 0
                ) + mismatches
            self.stats.batches += 1
            for row, doc in enumerate(batch["doc_index"]):
                if doc < 0:
                    continue
                self.stats.chunks += 1
                offset = int(batch["sentence_offset"][row])
                for k in np.flatnonzero(batch["sentence_mask"][row]):
                    tokens = ids[row, k]
                    self.stats.output_tokens += int(np.sum(tokens > 0))
                    out[doc][offset + k] = self.tokenizer.decode(tokens)
        missing = [
            (documents[d].doc_id, k)
            for d, hyps in enumerate(out)
            for k, h in enumerate(hyps)
            if h is None
        ]
        if missing:
            raise RuntimeError(f"sentences without a translation (a pipeline bug): {missing[:5]}")
        self.stats.documents += len(documents)
        self.stats.sentences += sum(len(doc) for doc in documents)
        self.stats.seconds += time.perf_counter() - start
        return out  # type: ignore[return-value]

    def translate_stream(
        self, documents: Iterable[tuple[str, list[str]]], block_documents: int = 256
    ) -> Iterator[tuple[str, list[str]]]:
        """Yields ``(doc_id, translations)`` in input order, ``block_documents`` at a time."""
        block: list[Document] = []
        for doc_id, sentences in documents:
            block.append(Document(doc_id, tuple(sentences), ("",) * len(sentences)))
            if len(block) >= block_documents:
                yield from zip((d.doc_id for d in block), self.translate(block), strict=True)
                block = []
        if block:
            yield from zip((d.doc_id for d in block), self.translate(block), strict=True)
