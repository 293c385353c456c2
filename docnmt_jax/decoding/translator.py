"""Translating documents with a trained model: batching, the compiled search, detokenisation,
order.

The model-specific part is the model's search (the search capability,
:meth:`~docnmt_jax.models.contract.Searchable.translate`, compiled by
:func:`~docnmt_jax.decoding.compiled.compile_translate`: ``(params, batch) -> (ids [B, S, L],
aux)``; a model without it is a one-line :class:`~docnmt_jax.errors.CapabilityError`); this
module feeds it fixed-shape batches of the model's chunks (``model.layout``), grouped by length
in at most four shapes (:class:`~docnmt_jax.data.translation_plan.TranslationPlan`), so it
compiles once per shape, puts the detokenised sentences back in
input order, and streams long inputs block by block so memory does not grow with the input.
``translate.py`` and dev BLEU during training run this same class, on one device or on a mesh
(``mesh``: batch rows split over ``data x fsdp``).

``aux`` holds per-chunk arrays ``[B]``. Known keys: ``"sentence_counts"``, the number of
sentences the model produced for each chunk (models that translate a chunk as one sequence,
e.g. ``models/concat.py``); the translator counts the chunks where it differs from the
source's (:class:`TranslationStats`). ``"output_capped"``: whether the chunk's translation
stopped at an absolute cap (below).

Nothing is truncated. Sources: every block of documents is tokenised whole;
when its longest sentence (EOS included) is longer than ``max_src_len`` (256 by default), the
block's source limit doubles until it holds it (``256 -> 512 -> 1024 ...``, each doubling a new
length bucket, so compilations stay few), up to what the model takes
(:meth:`~docnmt_jax.models.base.BaseModel.max_source_len`: no limit but for Doc2Doc, whose
chunks of ``S`` sentences of ``T`` slots must fit ``model.max_len``). A longer sentence stops
the run with a one-line :class:`~docnmt_jax.errors.TextTooLongError` naming the document, the
sentence and, when :attr:`Translator.source_file` is set (``translate.py`` sets it), the file
and line. Outputs: a sentence's output limit stays ``min(max_len, floor(len_a * source tokens +
len_b))``, except that batches in a grown bucket of ``T`` slots get the cap ``max(max_len,
floor(len_a * T + len_b))`` (the default cap is sized for the default bucket). A translation that
stops at the cap below its ``len_a * tokens + len_b`` budget (it may be cut) is counted
(``TranslationStats.output_capped``) and named in the summary; so is every sentence translated in
a grown bucket.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import jax
import numpy as np
from tqdm.auto import tqdm

from docnmt_jax import parallel
from docnmt_jax.data import builder, readers
from docnmt_jax.data import pipeline as pipeline_lib
from docnmt_jax.data.documents import Document
from docnmt_jax.data.stream_plan import StreamPlan, stream_rows
from docnmt_jax.data.tokenized import LongSentencesError, TokenizedCorpus
from docnmt_jax.data.tokenizer import PAD_ID, Tokenizer
from docnmt_jax.data.translation_plan import TranslationPlan
from docnmt_jax.decoding.compiled import compile_translate
from docnmt_jax.decoding.search import SearchConfig, TranslateFn
from docnmt_jax.errors import CapabilityError, TextTooLongError
from docnmt_jax.models import contract
from docnmt_jax.models.contract import Searchable, SlotSearch, require

#: The source limit used to tokenise a block for a model without one (nothing is cut).
UNLIMITED = 2**31 - 1
#: The default ceiling on a source sentence's tokens (EOS included), whatever the model takes:
#: beyond it decoding memory and time (quadratic in the length) exceed a machine's, so such a
#: sentence is an error naming its line, not a crash (``translate.py --max_source_tokens``).
MAX_SOURCE_TOKENS = 1024


@dataclasses.dataclass
class TranslationStats:
    """Counters of a translation run (sentences, tokens, chunks, batches, compilations, seconds).

    ``sentence_count_mismatches``: chunks whose translation has a different number of sentences
    than the source (``None`` unless the model reports ``aux["sentence_counts"]``).
    ``long_sentences``: sentences longer than the default source limit ``default_source_len``,
    translated in grown buckets of up to ``largest_source_bucket`` slots. ``output_capped``:
    translations (sentences; chunks for models that report ``aux["output_capped"]``) that
    stopped at the absolute output cap ``output_cap`` below their ``len_a * tokens + len_b``
    budget.
    """

    documents: int = 0
    sentences: int = 0
    output_tokens: int = 0
    chunks: int = 0
    batches: int = 0
    seconds: float = 0.0
    shapes: set[tuple[int, ...]] = dataclasses.field(default_factory=set)
    sentence_count_mismatches: int | None = None
    default_source_len: int = 0
    long_sentences: int = 0
    largest_source_bucket: int = 0
    output_cap: int = 0
    output_capped: int = 0

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
        if self.long_sentences:
            text += (
                f"; {self.long_sentences} sentences longer than {self.default_source_len} "
                f"source tokens translated whole in buckets of up to "
                f"{self.largest_source_bucket} tokens"
            )
        if self.output_capped:
            text += (
                f"; WARNING: {self.output_capped} translations stopped at the output cap "
                f"max_len={self.output_cap} below their len_a * source + len_b budget (they may "
                "be cut: raise --max_len)"
            )
        return text


def count_capped(
    batch: dict[str, np.ndarray], ids: np.ndarray, aux: dict[str, Any], search: SearchConfig
) -> int:
    """Translations of the real rows of ``batch`` that stopped at an absolute output cap below
    their ``len_a * tokens + len_b`` budget: the chunks flagged by ``aux["output_capped"]``
    when the model reports it, else (models searching each sentence with
    :func:`~docnmt_jax.decoding.search.sentence_limits`) the sentences whose output fills all
    ``L = ids.shape[-1]`` slots while their budget is larger."""
    real = batch["doc_index"] >= 0
    if "output_capped" in aux:
        return int(np.sum(np.asarray(jax.device_get(aux["output_capped"])) & real))
    tokens = np.sum(batch["src_mask"] > 0, axis=-1)
    budget = np.floor(search.len_a * tokens + search.len_b)
    produced = np.sum(ids != PAD_ID, axis=-1)
    sentences = (batch["sentence_mask"] > 0) & real[:, None]
    limit = ids.shape[-1]
    return int(np.sum(sentences & (produced >= limit) & (budget > limit)))


@dataclasses.dataclass(frozen=True)
class Hypothesis:
    """One entry of an n-best list: the detokenised ``text``, ``log_prob`` = ``log p(y | x,
    context)`` (the model's sum over its tokens, EOS included: what teacher-forced scoring
    gives), ``score`` = ``log_prob`` normalised by the length penalty (the search's ranking),
    ``tokens`` = its length in tokens (EOS included), ``ids`` = those tokens."""

    text: str
    log_prob: float
    score: float
    tokens: int
    ids: tuple[int, ...] = ()


class Translator:
    """Translates documents with ``model`` and ``params`` on the pipeline's fixed shapes; with
    ``mesh`` on that device mesh (``params`` must then carry their shardings).

    ``max_src_len`` is the default source limit; a block with a longer sentence gets a larger
    one (module docstring). ``source_file``: the file the documents come from, if any; a
    sentence too long for the model is then reported with its line there."""

    def __init__(
        self,
        model: Searchable,
        params: Any,
        tokenizer: Tokenizer,
        search: SearchConfig,
        batch_tokens: int = 4096,
        max_src_len: int = 256,
        max_sentences: int = 20,
        mesh: parallel.Layout | None = None,
        max_source_tokens: int | None = MAX_SOURCE_TOKENS,
    ):
        require(model, Searchable, "translate")
        if model.layout.sequential:
            require(model, SlotSearch, "translate slot by slot (its layout)")
        self.model = model
        self.params = params
        self.tokenizer = tokenizer
        self.search = search
        self.mesh = mesh
        self.source_file: str | None = None
        self.max_source_tokens = max_source_tokens
        settings = pipeline_lib.PipelineConfig(
            max_sentences=max_sentences,
            max_src_len=max_src_len,
            max_tgt_len=1,
            batch_src_tokens=batch_tokens,
            batch_tgt_tokens=batch_tokens,
            shuffle=False,
            num_epochs=1,
            pad_batch=True,
            batch_multiple=mesh.batch_shards if mesh is not None else 1,
        )
        # The model's rows, window and whole documents; a model that searches a chunk's
        # sentences one after another (FINAL's memory) gets as many chunks as a sentence model
        # gets sentences: same rows per search step.
        self.pipeline_config = builder.pipeline_config(model.data_spec(), settings, decoding=True)
        self.stats = TranslationStats(default_source_len=max_src_len, output_cap=search.max_len)
        self._carried: dict[str, Any] = {}  # state across chunks (every output cap's search)
        self._search = compile_translate(model, search, mesh, self._carried)
        self._grown_searches: dict[int, TranslateFn] = {}

    def translate(
        self, documents: Sequence[Document], progress: str | None = None
    ) -> list[list[str]]:
        """The translation of every sentence of ``documents``, document by document; with
        ``progress`` (its description) a bar counts the sentences translated."""
        return self._translate(documents, progress, nbest=False)  # type: ignore[return-value]

    def translate_nbest(
        self, documents: Sequence[Document], progress: str | None = None
    ) -> list[list[list[Hypothesis]]]:
        """The ``search.nbest`` best :class:`Hypothesis` of every sentence of ``documents``
        (best first; the first is :meth:`translate`'s). A model whose search reports no
        n-best list (``aux["nbest_ids"]``, e.g. Doc2Doc's one sequence per chunk) raises a
        one-line :class:`~docnmt_jax.errors.CapabilityError`."""
        return self._translate(documents, progress, nbest=True)  # type: ignore[return-value]

    def _translate(
        self, documents: Sequence[Document], progress: str | None, nbest: bool
    ) -> list[list[Any]]:
        start = time.perf_counter()
        bar = tqdm(
            total=sum(len(d) for d in documents),
            unit="sent",
            desc=progress,
            disable=progress is None,
        )
        out: list[list[Any]] = [[None] * len(doc) for doc in documents]
        # Only the source matters; references (if any) are not looked at.
        sources = [Document(d.doc_id, d.src, ("",) * len(d)) for d in documents]
        for batch in self.batches(sources):
            ids, aux = self._search_batch(batch)
            if nbest and "nbest_ids" not in aux:
                raise CapabilityError(
                    f"model {self.model.name!r} reports no n-best list (its search keeps one "
                    "sequence per chunk): translate with nbest=1"
                )
            real = batch["doc_index"] >= 0
            bar.update(int(np.sum(batch["sentence_mask"][real] > 0)))
            for row, doc in enumerate(batch["doc_index"]):
                if doc < 0:
                    continue
                self.stats.chunks += 1
                offset = int(batch["sentence_offset"][row])
                for k in np.flatnonzero(batch["sentence_mask"][row]):
                    tokens = ids[row, k]
                    self.stats.output_tokens += int(np.sum(tokens > 0))
                    out[doc][offset + k] = (
                        self._hypotheses(aux, row, k) if nbest else self.tokenizer.decode(tokens)
                    )
        missing = [
            (documents[d].doc_id, k)
            for d, hyps in enumerate(out)
            for k, h in enumerate(hyps)
            if h is None
        ]
        bar.close()
        if missing:
            raise RuntimeError(f"sentences without a translation (a pipeline bug): {missing[:5]}")
        self.stats.documents += len(documents)
        self.stats.sentences += sum(len(doc) for doc in documents)
        self.stats.seconds += time.perf_counter() - start
        return out

    def _search_batch(self, batch: dict[str, np.ndarray]) -> tuple[np.ndarray, dict[str, Any]]:
        """Ids ``[B, S, L]`` and aux (on the host) of one batch, its counters updated."""
        self.stats.shapes.add(tuple(batch["src"].shape))
        search, translate = self._search_for(batch["src"].shape[-1])
        ids, aux = translate(self.params, batch)
        ids = np.asarray(jax.device_get(ids))
        aux = {k: np.asarray(v) for k, v in jax.device_get(aux).items()}
        counts = aux.get("sentence_counts")
        if counts is not None:
            real_rows = batch["doc_index"] >= 0
            real_counts = np.sum(batch["sentence_mask"] > 0, axis=-1)
            mismatches = int(np.sum(real_rows & (counts != real_counts)))
            self.stats.sentence_count_mismatches = (
                self.stats.sentence_count_mismatches or 0
            ) + mismatches
        self.stats.output_capped += count_capped(batch, ids, aux, search)
        self.stats.batches += 1
        return ids, aux

    def _hypotheses(self, aux: dict[str, np.ndarray], row: int, k: int) -> list[Hypothesis]:
        """Sentence ``k`` of chunk ``row``'s n-best list (empty slots left out)."""
        hyps = []
        for ids, log_prob, score in zip(
            aux["nbest_ids"][row, k],
            aux["nbest_log_probs"][row, k],
            aux["nbest_scores"][row, k],
            strict=True,
        ):
            if np.isfinite(score):
                tokens = int(np.sum(ids != PAD_ID))
                text = self.tokenizer.decode(ids)
                kept = tuple(int(i) for i in ids[:tokens])
                hyps.append(Hypothesis(text, float(log_prob), float(score), tokens, kept))
        return hyps

    def batches(self, sources: Sequence[Document]) -> Iterator[dict[str, np.ndarray]]:
        """The batches that translate ``sources``: a :class:`TranslationPlan` of the model's
        chunks (at most four shapes, chunks grouped by length; one compiled search per
        shape)."""
        corpus = self._tokenize(sources)
        if contract.carries_state(self.model):  # one chunk of every stream a batch
            rows = stream_rows(corpus, corpus.config)
            config = dataclasses.replace(corpus.config, streams=True)
            config = dataclasses.replace(config, stream_rows=max(1, min(rows, len(sources))))
            corpus = dataclasses.replace(corpus, config=config)
            yield from pipeline_lib.numpy_batches(StreamPlan(corpus, config))
            return
        yield from pipeline_lib.numpy_batches(TranslationPlan(corpus, corpus.config))

    def _tokenize(self, sources: Sequence[Document]) -> TokenizedCorpus:
        """``sources`` tokenised whole, under the source limit that holds their longest
        sentence (the default doubled as needed, at most the model's); a sentence longer than
        the model takes raises :class:`TextTooLongError`."""
        config = self.pipeline_config
        model_limit = self.source_limit()
        whole = dataclasses.replace(config, max_src_len=model_limit or UNLIMITED, on_long="error")
        try:
            corpus = pipeline_lib.tokenize_corpus(sources, self.tokenizer.encode_batch, whole)
        except LongSentencesError as e:
            raise self._too_long(e, sources) from None
        limit, buckets = config.max_src_len, list(config.length_buckets)
        while limit < corpus.src.longest:
            limit *= 2
            buckets.append(limit)
        if model_limit is not None:
            limit = min(limit, model_limit)
        grown = corpus.src.lengths > config.max_src_len
        if grown.any():
            self.stats.long_sentences += int(grown.sum())
            self.stats.largest_source_bucket = max(self.stats.largest_source_bucket, limit)
        block = dataclasses.replace(config, max_src_len=limit, length_buckets=tuple(buckets))
        # Nothing was cut (every sentence is within ``limit``): the corpus under the block's
        # limit is the same tokens.
        src = dataclasses.replace(corpus.src, max_len=limit)
        return dataclasses.replace(corpus, src=src, config=block)

    def source_limit(self) -> int | None:
        """The most source tokens (EOS included) a sentence may have: the model's limit
        (:meth:`~docnmt_jax.models.base.BaseModel.max_source_len`) and ``max_source_tokens``,
        whichever is smaller (``None``: no limit)."""
        limits = [
            self.model.max_source_len(self.pipeline_config.sentences_per_chunk),
            self.max_source_tokens,
        ]
        return min((x for x in limits if x is not None), default=None)

    def _too_long(self, error: LongSentencesError, sources: Sequence[Document]) -> TextTooLongError:
        """The one-line error for a sentence longer than the model takes, with its file and
        line when :attr:`source_file` is set."""
        doc = sources[error.doc_index]
        where = ""
        if self.source_file is not None:
            line = readers.find_source_line(self.source_file, doc.doc_id, doc.src[error.sentence])
            where = f"{self.source_file}:{line}: " if line else f"{self.source_file}: "
        model_limit = self.model.max_source_len(self.pipeline_config.sentences_per_chunk)
        if model_limit is not None and error.limit == model_limit:
            limit = (
                f"the model takes at most {error.limit} in chunks of "
                f"{self.pipeline_config.sentences_per_chunk} sentences"
            )
        else:
            limit = (
                f"the limit is max_source_tokens={error.limit} (translate.py "
                "--max_source_tokens; decoding memory grows with the square of the length)"
            )
        return TextTooLongError(
            f"{where}document {doc.doc_id!r} sentence {error.sentence + 1} has {error.tokens} "
            f"source tokens (EOS included); {limit}"
        )

    def _search_for(self, source_len: int) -> tuple[SearchConfig, TranslateFn]:
        """The search settings and compiled search of batches of ``source_len`` source slots:
        the translator's own, or for a bucket beyond the default source limit the same with
        the cap ``max(max_len, floor(len_a * source_len + len_b))``."""
        search = self.search
        if source_len > self.pipeline_config.max_src_len:
            wanted = int(np.floor(search.len_a * source_len + search.len_b))
            search = dataclasses.replace(search, max_len=max(search.max_len, wanted))
        if search.max_len == self.search.max_len:
            return self.search, self._search
        if search.max_len not in self._grown_searches:
            self._grown_searches[search.max_len] = compile_translate(
                self.model, search, self.mesh, self._carried
            )
        return search, self._grown_searches[search.max_len]

    def translate_stream(
        self,
        documents: Iterable[tuple[str, list[str]]],
        block_documents: int = 256,
        nbest: bool = False,
    ) -> Iterator[tuple[str, list[Any]]]:
        """Yields ``(doc_id, translations)`` in input order, ``block_documents`` at a time;
        with ``nbest`` each translation is its list of :class:`Hypothesis`."""
        translate = self.translate_nbest if nbest else self.translate
        block: list[Document] = []
        for doc_id, sentences in documents:
            block.append(Document(doc_id, tuple(sentences), ("",) * len(sentences)))
            if len(block) >= block_documents:
                yield from zip((d.doc_id for d in block), translate(block), strict=True)
                block = []
        if block:
            yield from zip((d.doc_id for d in block), translate(block), strict=True)
