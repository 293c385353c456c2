"""The Python API: load a trained run (or a release) and translate or score plain strings.

    import docnmt_jax
    model = docnmt_jax.load("runs/final")                 # a workdir, or an exported release
    model.translate([["Sentence one.", "Sentence two."], ["Another document."]], beam=5)
    # -> [["...", "..."], ["..."]]
    model.translate(docs, nbest=3)                        # lists of Hypothesis (text, scores)
    model.translate(docs, sample=True, temperature=0.8, top_p=0.9, seed=1)
    model.score([["Sentence one."]], [["Its translation."]])  # log p per sentence

A document is a sequence of sentence strings, a :class:`~docnmt_jax.data.documents.Document`,
or a single string (a one-sentence document); results keep the input's documents and order.

Sentence by sentence (``docnmt-translate --interactive``, the server): a
:class:`DocumentContext` holds a document's sentences so far, and
:meth:`TranslationModel.translate_next` translates the next sentence of several documents at
once with the context that exists at that moment: the earlier sentences of its document, none
after it. Models whose context also reads later sentences (FINAL's global layer, HM-GDC's
document context, Doc2Doc's chunk) see less than in a whole-document translation
(docs/usage.md measures the cost); an earlier sentence's translation is never revised. A
slot-by-slot model (FINAL) keeps each document's target memory, the decoder states of the
translation it gave the previous sentence (:mod:`docnmt_jax.decoding.incremental`); any other
model translates the document so far (the sentences its context can reach) and keeps the last
sentence's translation. Doc2Doc's target context is thus its own translation of the earlier
sentences *now*, which may differ from the one given before.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from docnmt_jax.data import builder
from docnmt_jax.data import pipeline as pipeline_lib
from docnmt_jax.data.documents import Document
from docnmt_jax.data.spec import PipelineConfig
from docnmt_jax.decoding.incremental import SlotSession
from docnmt_jax.decoding.search import SearchConfig
from docnmt_jax.decoding.translator import Hypothesis
from docnmt_jax.decoding.translator import Translator as SearchTranslator
from docnmt_jax.errors import InputMismatchError, UserError
from docnmt_jax.training import restore

DocumentLike = Document | Sequence[str] | str

__all__ = ["DocumentContext", "Hypothesis", "TranslationModel", "load"]


def as_documents(documents: Sequence[DocumentLike], name: str = "documents") -> list[Document]:
    """``documents`` as :class:`Document` (ids ``"0"``, ``"1"``, ... for plain sequences)."""
    if isinstance(documents, str | Document):
        raise UserError(f"{name}: expected a list of documents, got one {type(documents).__name__}")
    out = []
    for i, doc in enumerate(documents):
        if isinstance(doc, Document):
            out.append(doc)
            continue
        sentences = (doc,) if isinstance(doc, str) else tuple(doc)
        if not all(isinstance(s, str) for s in sentences):
            raise UserError(f"{name}[{i}]: a document is a list of sentence strings")
        out.append(Document(str(i), sentences, ("",) * len(sentences)))
    return out


@dataclasses.dataclass
class DocumentContext:
    """A document translated sentence by sentence: its source sentences and their
    translations so far (:meth:`TranslationModel.translate_next` appends to both)."""

    sources: list[str] = dataclasses.field(default_factory=list)
    translations: list[str] = dataclasses.field(default_factory=list)
    #: what a slot-by-slot model (FINAL) keeps of the last translation: its target memory
    memory: Any = None


class TranslationModel:
    """A trained model ready to translate and score strings (module docstring). Searches are
    compiled once per search setting and batch shape, and kept."""

    def __init__(
        self,
        path: str,
        checkpoint: str = "best",
        params: str = "auto",
        dtype: str = "",
        batch_tokens: int = 4096,
        mesh: Mapping[str, int] | None = None,
    ):
        self.path = path
        self._batch_tokens = batch_tokens
        search = SearchConfig()
        self._default, self.step = restore.load_translator(
            path, checkpoint, search, batch_tokens, mesh, params=params, dtype=dtype
        )
        self.config = restore.load_config(path)
        self._translators: dict[SearchConfig, SearchTranslator] = {search: self._default}
        self._scorer: Any = None
        self._sessions: dict[SearchConfig, SlotSession] = {}

    @property
    def model(self) -> Any:
        return self._default.model

    @property
    def tokenizer(self) -> Any:
        return self._default.tokenizer

    def translator(self, search: SearchConfig) -> SearchTranslator:
        """The library translator (:class:`~docnmt_jax.decoding.translator.Translator`) of
        ``search``, built once (same parameters, own compiled search)."""
        if search not in self._translators:
            base = self._default
            translator = SearchTranslator(
                base.model,
                base.params,
                base.tokenizer,
                search,
                batch_tokens=self._batch_tokens,
                max_sentences=base.pipeline_config.max_sentences,
                mesh=base.mesh,
                max_source_tokens=base.max_source_tokens,
            )
            self._translators[search] = translator
        return self._translators[search]

    def translate(
        self, documents: Sequence[DocumentLike], progress: str | None = None, **search: Any
    ) -> list[list[Any]]:
        """Every sentence of ``documents`` translated: ``[[str, ...], ...]``; with
        ``nbest > 1`` each sentence's list of :class:`Hypothesis` instead. ``search``:
        :class:`~docnmt_jax.decoding.search.SearchConfig` fields, with ``beam`` for
        ``beam_size`` (``beam=5, alpha=0.6``; ``sample=True, temperature, top_k, top_p,
        seed``; ``max_len``)."""
        config = search_config(**search)
        docs = as_documents(documents)
        if not docs:
            return []
        translator = self.translator(config)
        if config.nbest > 1:
            return translator.translate_nbest(docs, progress)
        return translator.translate(docs, progress)

    def translate_next(
        self,
        contexts: Sequence[DocumentContext],
        sentences: Sequence[str],
        **search: Any,
    ) -> list[str]:
        """The translation of ``sentences[i]`` as the next sentence of document
        ``contexts[i]``, for every ``i`` in one batched search; each context gets the
        sentence and its translation appended (module docstring: past-only context)."""
        if len(contexts) != len(sentences):
            raise InputMismatchError(f"{len(contexts)} contexts but {len(sentences)} sentences")
        if not contexts:
            return []
        translator = self.translator(search_config(**search))
        if self.model.layout.sequential:
            return self._next_with_memory(translator, contexts, sentences)
        windows = [
            self._context_window(ctx.sources) + [s]
            for ctx, s in zip(contexts, sentences, strict=True)
        ]
        prefixes = [Document(str(i), tuple(w), ("",) * len(w)) for i, w in enumerate(windows)]
        outputs = [hyps[-1] for hyps in translator.translate(prefixes)]
        for ctx, sentence, output in zip(contexts, sentences, outputs, strict=True):
            ctx.sources.append(sentence)
            ctx.translations.append(output)
        return outputs

    def _next_with_memory(
        self,
        translator: SearchTranslator,
        contexts: Sequence[DocumentContext],
        sentences: Sequence[str],
    ) -> list[str]:
        """:meth:`translate_next` of a slot-by-slot model: the kept target memory of each
        document (:class:`~docnmt_jax.decoding.incremental.SlotSession`)."""
        if translator.search not in self._sessions:
            self._sessions[translator.search] = SlotSession(translator)
        session = self._sessions[translator.search]
        sources = [ctx.sources + [s] for ctx, s in zip(contexts, sentences, strict=True)]
        outputs, memories = session.next_sentences(sources, [c.memory for c in contexts])
        for ctx, sentence, output, memory in zip(
            contexts, sentences, outputs, memories, strict=True
        ):
            ctx.sources.append(sentence)
            ctx.translations.append(output)
            ctx.memory = memory
        return outputs

    def _context_window(self, sources: list[str]) -> list[str]:
        """The sentences before the next one that its translation can depend on: none for a
        sentence model; all for whole-document models; else those of its chunk (chunks of
        ``S`` sentences from the document's start) and of the chunks its window of
        ``context_sentences`` reaches, so that cutting the document there changes no chunk."""
        model = self.model
        S = self._default.pipeline_config.sentences_per_chunk
        if model.whole_documents:
            return list(sources)
        if S == 1 and not model.context_sentences:
            return []
        n = len(sources)
        back = -(-model.context_sentences // S) * S
        return list(sources[max(0, (n // S) * S - back) :])

    def score(
        self, sources: Sequence[DocumentLike], targets: Sequence[DocumentLike]
    ) -> list[list[float]]:
        """``log p(target sentence | source, context)`` of every sentence pair, teacher-forced
        (the model's own ``score``); ``sources`` and ``targets`` aligned document by document
        and sentence by sentence."""
        src_docs, tgt_docs = as_documents(sources, "sources"), as_documents(targets, "targets")
        if len(src_docs) != len(tgt_docs) or any(
            len(s.src) != len(t.src) for s, t in zip(src_docs, tgt_docs, strict=False)
        ):
            raise InputMismatchError("sources and targets must align document by document")
        docs = [
            Document(str(i), s.src, t.src)
            for i, (s, t) in enumerate(zip(src_docs, tgt_docs, strict=True))
        ]
        out = [[float("nan")] * len(d.src) for d in docs]
        if self._scorer is None:
            self._scorer = jax.jit(self.model.score)
        for batch in pipeline_lib.numpy_batches(docs, self.tokenizer.encode_batch, self._scoring()):
            scores = np.asarray(self._scorer(self._default.params, batch))
            for row in np.flatnonzero(batch["doc_index"] >= 0):
                doc, offset = int(batch["doc_index"][row]), int(batch["sentence_offset"][row])
                for k in np.flatnonzero(batch["sentence_mask"][row]):
                    out[doc][offset + k] = float(scores[row, k])
        return out

    def _scoring(self) -> PipelineConfig:
        """The grid pipeline of the model's chunks with targets, nothing cut."""
        settings = PipelineConfig(
            max_sentences=self._default.pipeline_config.max_sentences,
            max_src_len=1 << 20,
            max_tgt_len=1 << 20,
            batch_src_tokens=self._batch_tokens,
            batch_tgt_tokens=self._batch_tokens,
            shuffle=False,
            num_epochs=1,
            pad_batch=True,
            on_long="error",
        )
        return builder.pipeline_config(self.model.data_spec(), settings)


def search_config(beam: int | None = None, **fields: Any) -> SearchConfig:
    """A :class:`SearchConfig` from keyword fields (``beam`` = ``beam_size``); an unknown
    field or a bad value is a one-line :class:`UserError`."""
    if beam is not None:
        fields["beam_size"] = beam
    names = {f.name for f in dataclasses.fields(SearchConfig)}
    unknown = sorted(set(fields) - names)
    if unknown:
        raise UserError(f"unknown search option(s) {unknown}; known: beam, {sorted(names)}")
    try:
        return SearchConfig(**fields)
    except ValueError as e:
        raise UserError(str(e)) from None


def load(
    path: str,
    checkpoint: str = "best",
    params: str = "auto",
    dtype: str = "",
    batch_tokens: int = 4096,
    mesh: Mapping[str, int] | None = None,
) -> TranslationModel:
    """The model of a training workdir or an exported release at ``path``: ``checkpoint``
    (``best``, ``latest``, ``averaged`` or a step), ``params`` (``auto``/``ema``/``raw``),
    ``dtype`` of the computation ('' keeps the run's), ``batch_tokens`` per batch, ``mesh``
    sizes to search on a device mesh."""
    return TranslationModel(path, checkpoint, params, dtype, batch_tokens, mesh)
