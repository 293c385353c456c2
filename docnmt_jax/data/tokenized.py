"""Stage 1 of the document pipeline (:mod:`docnmt_jax.data.pipeline`): the tokenised corpus
(flat int32 token arrays with per-sentence offsets, EOS appended) and the chunk table that cuts
its documents into runs of at most ``S`` sentences; the settings are a
:class:`~docnmt_jax.data.spec.PipelineConfig`.

A sentence longer than ``max_src_len`` / ``max_tgt_len`` (EOS included) is handled as
``PipelineConfig.on_long`` says (training: ``config.data.on_long``, default ``error``):

* ``error``: :class:`LongSentencesError` names the first such sentence (file and line when the
  reader recorded them, :class:`~docnmt_jax.data.documents.Origin`; the document id; its number
  in the document, 1-based) and how many sentence pairs are over the limits on each side.
* ``skip``: the pairs with either side over the limit are removed, and their document is split
  there: the sentences after a removed one start a new document (id ``DOC~2``, ``DOC~3``, ...),
  so no model sees a context that was not next to it in the file. Counted in the stats.
* ``truncate`` (the library default, for the measurement tools): the first ``max_len - 1``
  tokens + EOS are kept, with a logged warning; counted in the stats.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from docnmt_jax.data.documents import Document
from docnmt_jax.data.spec import PipelineConfig
from docnmt_jax.data.tokenizer import EOS_ID
from docnmt_jax.errors import TextTooLongError

Encode = Callable[[Sequence[str]], list[list[int]]]

logger = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------
# Statistics.


@dataclasses.dataclass(frozen=True)
class PipelineStats:
    """Corpus and plan counts. Token counts include EOS and are after truncation/skipping;
    ``*_truncated`` count the sentences cut (``on_long="truncate"``), ``skipped_pairs`` the
    sentence pairs removed (``"skip"``) and ``*_skipped`` those of them over the limit on that
    side."""

    documents: int
    chunks: int
    sentences: int
    src_tokens: int
    tgt_tokens: int
    src_truncated: int
    tgt_truncated: int
    src_longest: int  # before truncation or skipping, including EOS
    tgt_longest: int
    skipped_pairs: int = 0
    src_skipped: int = 0
    tgt_skipped: int = 0
    dropped_chunks_per_epoch: int = 0
    promoted_chunks_per_epoch: int = 0
    batches_per_epoch: int = 0
    # Packed plans: the fraction of the token slots (both sides, empty rows included) of an
    # epoch's batches that are padding (0.0 for the grid's BatchPlan).
    padding_fraction: float = 0.0


# ---------------------------------------------------------------------------------------------
# Tokenisation.


@dataclasses.dataclass(frozen=True)
class TokenizedSide:
    """All sentences of one side, flat: sentence ``k`` is ``tokens[offsets[k]:][:lengths[k]]``."""

    tokens: np.ndarray  # int32 [total tokens], EOS included
    offsets: np.ndarray  # int64 [sentences]
    lengths: np.ndarray  # int32 [sentences], <= max_len
    max_len: int
    truncated: int
    longest: int  # before truncation or skipping, including EOS (0 for an empty corpus)
    skipped: int = 0  # sentences of this side over max_len whose pair was skipped

    def sentence(self, k: int) -> np.ndarray:
        return self.tokens[self.offsets[k] : self.offsets[k] + self.lengths[k]]


@dataclasses.dataclass(frozen=True)
class TokenizedCorpus:
    """Token ids of a document list. Document ``d`` owns global sentences
    ``sentence_starts[d]:sentence_starts[d+1]``."""

    doc_ids: tuple[str, ...]
    sentence_starts: np.ndarray  # int64 [documents + 1]
    src: TokenizedSide
    tgt: TokenizedSide
    config: PipelineConfig
    skipped_pairs: int = 0  # on_long="skip": sentence pairs removed

    @property
    def num_documents(self) -> int:
        return len(self.doc_ids)

    @property
    def num_sentences(self) -> int:
        return int(self.sentence_starts[-1])

    def document(self, d: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Source and target token arrays (with EOS) of document ``d``."""
        ks = range(int(self.sentence_starts[d]), int(self.sentence_starts[d + 1]))
        return [self.src.sentence(k) for k in ks], [self.tgt.sentence(k) for k in ks]

    @property
    def stats(self) -> PipelineStats:
        """Counts for this corpus, chunked with :attr:`config`."""
        return corpus_stats(self, make_chunks(self, self.config)["doc"].size)


def corpus_stats(corpus: TokenizedCorpus, chunks: int) -> PipelineStats:
    return PipelineStats(
        documents=corpus.num_documents,
        chunks=chunks,
        sentences=corpus.num_sentences,
        src_tokens=int(corpus.src.lengths.sum()),
        tgt_tokens=int(corpus.tgt.lengths.sum()),
        src_truncated=corpus.src.truncated,
        tgt_truncated=corpus.tgt.truncated,
        src_longest=corpus.src.longest,
        tgt_longest=corpus.tgt.longest,
        skipped_pairs=corpus.skipped_pairs,
        src_skipped=corpus.src.skipped,
        tgt_skipped=corpus.tgt.skipped,
    )


class LongSentencesError(TextTooLongError):
    """Sentences longer than ``max_src_len`` / ``max_tgt_len`` with ``on_long="error"``.

    Names the first (in file order where the documents know their
    :class:`~docnmt_jax.data.documents.Origin`, else in corpus order): ``doc_index`` (in the
    documents given), ``doc_id``, ``sentence`` (0-based in its document), ``side``,
    ``tokens`` (EOS included) and ``limit``; ``pairs`` sentence pairs are over the limits,
    ``src_over`` / ``tgt_over`` of them on each side."""

    def __init__(
        self,
        where: str | None,
        doc_index: int,
        doc_id: str,
        sentence: int,
        side: str,
        tokens: int,
        limit: int,
        pairs: int,
        src_over: int,
        tgt_over: int,
    ):
        self.where, self.doc_index, self.doc_id, self.sentence = where, doc_index, doc_id, sentence
        self.side, self.tokens, self.limit = side, tokens, limit
        self.pairs, self.src_over, self.tgt_over = pairs, src_over, tgt_over
        key = "max_src_len" if side == "source" else "max_tgt_len"
        super().__init__(
            f"{where + ': ' if where else ''}document {doc_id!r} sentence {sentence + 1} has "
            f"{tokens} {side} tokens (EOS included), more than data.{key}={limit}; {pairs} "
            f"sentence pair{'s are' if pairs != 1 else ' is'} over the limits (source "
            f"{src_over}, target {tgt_over}): raise data.max_src_len/max_tgt_len or set "
            "data.on_long=skip or truncate"
        )


def _encode(texts: list[str], encode: Encode, side: str) -> list[list[int]]:
    ids = encode(texts) if texts else []
    if len(ids) != len(texts):
        raise ValueError(f"encode returned {len(ids)} sequences for {len(texts)} {side} texts")
    return ids


def _full_lengths(ids: list[list[int]]) -> np.ndarray:
    """Tokens of every sentence with EOS."""
    return np.fromiter(map(len, ids), dtype=np.int64, count=len(ids)) + 1


def _encode_side(
    ids: list[list[int]], max_len: int, side: str, longest: int, skipped: int = 0
) -> TokenizedSide:
    """The flat side of ``ids`` (EOS appended); a sentence longer than ``max_len`` keeps its
    first ``max_len - 1`` tokens + EOS (counted and logged)."""
    raw_len = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    raw = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int64, count=int(raw_len.sum()))
    if raw.size and (raw.min() < 0 or raw.max() > np.iinfo(np.int32).max):
        raise ValueError(f"encode produced {side} ids outside [0, 2**31)")
    full = raw_len + 1  # with EOS
    keep = np.minimum(raw_len, max_len - 1)
    lengths = keep + 1
    offsets = np.zeros(len(ids), dtype=np.int64)
    np.cumsum(lengths[:-1], out=offsets[1:])
    raw_offsets = np.zeros(len(ids), dtype=np.int64)
    np.cumsum(raw_len[:-1], out=raw_offsets[1:])
    tokens = np.empty(int(lengths.sum()), dtype=np.int32)
    sent = np.repeat(np.arange(len(ids)), raw_len)
    pos = np.arange(raw.size) - raw_offsets[sent]
    kept = pos < keep[sent]
    tokens[offsets[sent[kept]] + pos[kept]] = raw[kept]
    tokens[offsets + keep] = EOS_ID
    truncated = int(np.sum(full > max_len))
    if truncated:
        logger.warning(
            "truncated %d of %d %s sentences longer than %d tokens (longest: %d, EOS included)",
            truncated,
            len(ids),
            side,
            max_len,
            longest,
        )
    return TokenizedSide(
        tokens, offsets, lengths.astype(np.int32), max_len, truncated, longest, skipped
    )


def _long_sentences_error(
    documents: Sequence[Document],
    starts: np.ndarray,
    src_full: np.ndarray,
    tgt_full: np.ndarray,
    config: PipelineConfig,
) -> LongSentencesError:
    """The error naming the first over-long sentence (file order where known)."""
    src_over, tgt_over = src_full > config.max_src_len, tgt_full > config.max_tgt_len
    over = np.flatnonzero(src_over | tgt_over)
    docs = np.searchsorted(starts, over, side="right") - 1

    def order(i: int) -> tuple[Any, ...]:
        origin = documents[docs[i]].origin
        line = int(over[i] - starts[docs[i]])
        side = "source" if src_over[over[i]] else "target"
        if origin is None:
            return (1, "", int(over[i]))
        path, number = origin.line(line, side).rsplit(":", 1)
        return (0, path, int(number))

    first = min(range(over.size), key=order)
    k, d = int(over[first]), int(docs[first])
    sentence, doc = k - int(starts[d]), documents[d]
    side = "source" if src_over[k] else "target"
    return LongSentencesError(
        doc.origin.line(sentence, side) if doc.origin else None,
        d,
        doc.doc_id,
        sentence,
        side,
        int(src_full[k] if side == "source" else tgt_full[k]),
        config.max_src_len if side == "source" else config.max_tgt_len,
        int(over.size),
        int(src_over.sum()),
        int(tgt_over.sum()),
    )


def _split_at_skipped(
    doc_ids: Sequence[str], starts: np.ndarray, keep: np.ndarray
) -> tuple[tuple[str, ...], np.ndarray]:
    """Documents after removing the sentences where ``keep`` is False: a document is split
    where a sentence was removed (parts after the first get ids ``DOC~2``, ``DOC~3``, ...);
    empty parts vanish. Returns (doc ids, sentence starts) over the kept sentences."""
    counts = np.diff(starts)
    doc_of = np.repeat(np.arange(counts.size), counts)
    first_of_doc = np.zeros(keep.size, dtype=bool)
    first_of_doc[starts[:-1][counts > 0]] = True
    previous_kept = np.concatenate([[False], keep[:-1]])
    begins = keep & (first_of_doc | ~previous_kept)
    part_doc = doc_of[begins]
    new_starts = np.append(np.cumsum(keep)[begins] - 1, int(keep.sum())).astype(np.int64)
    first_part = np.searchsorted(part_doc, part_doc, side="left")
    number = np.arange(part_doc.size) - first_part
    ids = tuple(
        doc_ids[d] if j == 0 else f"{doc_ids[d]}~{j + 1}"
        for d, j in zip(part_doc.tolist(), number.tolist(), strict=True)
    )
    return ids, new_starts


def tokenize_corpus(
    documents: Sequence[Document], encode: Encode, config: PipelineConfig | None = None
) -> TokenizedCorpus:
    """Encodes all sentences (one batched ``encode`` call per side) and appends EOS.

    ``encode`` maps texts to id lists *without* EOS. A sentence longer than ``max_len`` (EOS
    included) is handled as ``config.on_long`` says (module docstring): an error naming it,
    its pair skipped, or truncated to its first ``max_len - 1`` tokens + EOS.
    """
    config = config or PipelineConfig()
    counts = np.fromiter((len(d) for d in documents), dtype=np.int64, count=len(documents))
    starts = np.zeros(len(documents) + 1, dtype=np.int64)
    np.cumsum(counts, out=starts[1:])
    doc_ids = tuple(d.doc_id for d in documents)
    src_ids = _encode([s for d in documents for s in d.src], encode, "source")
    tgt_ids = _encode([t for d in documents for t in d.tgt], encode, "target")
    src_full, tgt_full = _full_lengths(src_ids), _full_lengths(tgt_ids)
    longest = (int(src_full.max(initial=0)), int(tgt_full.max(initial=0)))
    src_over, tgt_over = src_full > config.max_src_len, tgt_full > config.max_tgt_len
    over = src_over | tgt_over
    skipped = (0, 0)
    if over.any() and config.on_long == "error":
        raise _long_sentences_error(documents, starts, src_full, tgt_full, config)
    if over.any() and config.on_long == "skip":
        keep = ~over
        doc_ids, starts = _split_at_skipped(doc_ids, starts, keep)
        src_ids = [ids for ids, k in zip(src_ids, keep, strict=True) if k]
        tgt_ids = [ids for ids, k in zip(tgt_ids, keep, strict=True) if k]
        skipped = (int(src_over.sum()), int(tgt_over.sum()))
        logger.warning(
            "skipped %d of %d sentence pairs longer than max_src_len=%d / max_tgt_len=%d "
            "(source %d, target %d; EOS included)",
            int(over.sum()),
            over.size,
            config.max_src_len,
            config.max_tgt_len,
            *skipped,
        )
    return TokenizedCorpus(
        doc_ids=doc_ids,
        sentence_starts=starts,
        src=_encode_side(src_ids, config.max_src_len, "source", longest[0], skipped[0]),
        tgt=_encode_side(tgt_ids, config.max_tgt_len, "target", longest[1], skipped[1]),
        config=config,
        skipped_pairs=int(over.sum()) if skipped != (0, 0) else 0,
    )


# ---------------------------------------------------------------------------------------------
# Chunking.


def make_chunks(corpus: TokenizedCorpus, config: PipelineConfig) -> dict[str, np.ndarray]:
    """Chunk table: consecutive runs of <= S sentences per document, from sentence 0 (with
    ``config.whole_documents`` one chunk per document).

    Columns (one entry per chunk): ``doc``, ``index`` (chunk number in its document),
    ``offset`` (index in its document of its first sentence), ``start`` (global index of that
    sentence), ``count`` (sentences) and ``longest``: the most tokens of any of its sentences on
    either side and of the source of the up to ``config.context_sentences`` sentences of its
    document before it (global ``start - j`` for ``1 <= j <= min(K, offset)``), so that the
    chunk's ``T`` bucket holds its context too."""
    per_doc = np.diff(corpus.sentence_starts)
    S = config.sentences_per_chunk
    if config.whole_documents:
        S = max(int(per_doc.max(initial=1)), 1)
    n_chunks = -(-per_doc // S)
    doc = np.repeat(np.arange(per_doc.size, dtype=np.int64), n_chunks)
    first = np.zeros(per_doc.size, dtype=np.int64)
    np.cumsum(n_chunks[:-1], out=first[1:])
    index = np.arange(doc.size, dtype=np.int64) - first[doc]
    offset = index * S
    start = corpus.sentence_starts[:-1][doc] + offset
    count = np.minimum(S, per_doc[doc] - offset)
    sent_len = np.maximum(corpus.src.lengths, corpus.tgt.lengths)
    longest = np.maximum.reduceat(sent_len, start) if doc.size else np.zeros(0, np.int32)
    for j in range(1, config.context_sentences + 1):
        before = corpus.src.lengths[np.maximum(start - j, 0)]
        longest = np.maximum(longest, np.where(offset >= j, before, 0))
    return {
        "doc": doc,
        "index": index,
        "offset": offset,
        "start": start,
        "count": count,
        "longest": longest.astype(np.int64),
    }
