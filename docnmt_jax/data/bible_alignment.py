"""Verse alignment of two Bible versions and the fixed book splits of the Bible corpus.

Verses are paired by ``(book, chapter, verse)`` (:func:`align`); chapters whose numbering is
shifted between the versions are detected from verse lengths (:func:`detect_shifted_chapters`)
and dropped whole; aligned chapters become documents of the split of their book
(:func:`split_books`).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence

from docnmt_jax.data.documents import Document
from docnmt_jax.data.sword import VerseKey

#: The 66 books of the protestant canon, in canonical order, by OSIS name.
PROTESTANT_CANON: tuple[str, ...] = tuple(
    """
    Gen Exod Lev Num Deut Josh Judg Ruth 1Sam 2Sam 1Kgs 2Kgs 1Chr 2Chr Ezra Neh Esth Job
    Ps Prov Eccl Song Isa Jer Lam Ezek Dan Hos Joel Amos Obad Jonah Mic Nah Hab Zeph Hag
    Zech Mal
    Matt Mark Luke John Acts Rom 1Cor 2Cor Gal Eph Phil Col 1Thess 2Thess 1Tim 2Tim Titus
    Phlm Heb Jas 1Pet 2Pet 1John 2John 3John Jude Rev
    """.split()
)
DEV_BOOKS: tuple[str, ...] = ("Esth", "Lam", "Dan", "Heb", "1Pet")
TEST_BOOKS: tuple[str, ...] = ("Ruth", "Eccl", "John", "Gal", "Jas")
SPLITS: tuple[str, ...] = ("train", "dev", "test")
DROP_REASONS: tuple[str, ...] = (
    "src_only",
    "tgt_only",
    "empty_src",
    "empty_tgt",
    "empty_both",
    "shifted_chapter",
)

ChapterKey = tuple[str, int]


def _log_len(text: str) -> float:
    return math.log(1 + len(text))


def chapter_shift(
    src_lengths: Mapping[int, int],
    tgt_lengths: Mapping[int, int],
    *,
    center: float = 0.0,
    max_shift: int = 5,
    min_pairs: int = 4,
    ratio: float = 0.7,
    min_gain: float = 1.5,
) -> int:
    """Verse-numbering shift of one chapter, from verse lengths alone; 0 when unshifted.

    ``src_lengths`` / ``tgt_lengths`` map verse number to character length (non-empty
    verses only). The residual of pairing source verse ``v`` with target verse ``v+k``
    is ``|log(1+len_src[v]) - log(1+len_tgt[v+k]) - center|`` (``center``: the
    corpus-wide typical log length ratio). For each shift ``k`` in ``±1..max_shift``
    and each *region* -- the whole chapter, or a prefix or suffix of it (numbering
    often drifts from some verse on) -- with at least ``min_pairs`` verses pairable at
    both shift 0 and ``k``, compare the mean residuals ``m0`` and ``mk`` over the region.
    The chapter is shifted if some region has ``mk <= ratio * m0`` and a total gain
    ``(m0 - mk) * pairs >= min_gain``; the ``k`` of the largest such gain is returned.
    """
    verses = sorted(v for v in src_lengths if v in tgt_lengths)
    log_src = {v: math.log(1 + src_lengths[v]) for v in verses}
    log_tgt = {v: math.log(1 + n) for v, n in tgt_lengths.items()}
    best_gain, best_k = 0.0, 0
    for k in sorted((k for k in range(-max_shift, max_shift + 1) if k), key=lambda k: (abs(k), k)):
        pairs = [
            (abs(log_src[v] - log_tgt[v] - center), abs(log_src[v] - log_tgt[v + k] - center))
            for v in verses
            if v + k in log_tgt
        ]
        if len(pairs) < min_pairs:
            continue
        for region in (pairs, pairs[::-1]):  # prefixes, then suffixes
            sum0 = sumk = 0.0
            for n, (r0, rk) in enumerate(region, start=1):
                sum0 += r0
                sumk += rk
                gain = sum0 - sumk
                if (
                    n >= min_pairs
                    and sumk <= ratio * sum0
                    and gain >= min_gain
                    and gain > best_gain
                ):
                    best_gain, best_k = gain, k
    return best_k


def _chapter_order(chapter: ChapterKey) -> tuple[int, str, int]:
    book, number = chapter
    rank = PROTESTANT_CANON.index(book) if book in PROTESTANT_CANON else len(PROTESTANT_CANON)
    return (rank, book, number)


def typical_log_ratio(src: Mapping[VerseKey, str], tgt: Mapping[VerseKey, str]) -> float:
    """Median of ``log(1+len(src)) - log(1+len(tgt))`` over keys non-empty on both sides."""
    diffs = [_log_len(s) - _log_len(tgt[k]) for k, s in src.items() if s and tgt.get(k)]
    return statistics.median(diffs) if diffs else 0.0


def detect_shifted_chapters(
    src: Mapping[VerseKey, str], tgt: Mapping[VerseKey, str], **kwargs
) -> dict[ChapterKey, int]:
    """Chapters whose verse numbering differs between ``src`` and ``tgt``: ``{(book, ch): k}``.

    ``k`` is the detected shift (source verse ``v`` matches target verse ``v+k``);
    see :func:`chapter_shift` (``kwargs`` go there) for the test.
    """
    center = typical_log_ratio(src, tgt)
    src_lengths: dict[ChapterKey, dict[int, int]] = {}
    tgt_lengths: dict[ChapterKey, dict[int, int]] = {}
    for verses, lengths in ((src, src_lengths), (tgt, tgt_lengths)):
        for (book, chapter, verse), text in verses.items():
            if text:
                lengths.setdefault((book, chapter), {})[verse] = len(text)
    shifted = {}
    for chapter in sorted(src_lengths.keys() & tgt_lengths.keys(), key=_chapter_order):
        k = chapter_shift(src_lengths[chapter], tgt_lengths[chapter], center=center, **kwargs)
        if k:
            shifted[chapter] = k
    return shifted


@dataclasses.dataclass
class Alignment:
    """Aligned chapters in canonical order plus what was dropped and why."""

    chapters: dict[ChapterKey, list[tuple[int, str, str]]]  # (verse, src, tgt), in order
    drops: dict[ChapterKey, dict[str, int]]  # per chapter: reason -> verses dropped
    shifted: dict[ChapterKey, int]


def align(
    src: Mapping[VerseKey, str],
    tgt: Mapping[VerseKey, str],
    books: Sequence[str] = PROTESTANT_CANON,
    shifted: Mapping[ChapterKey, int] | None = None,
) -> Alignment:
    """Pairs verses by (book, chapter, verse) over ``books``; drops and counts the rest.

    Verses of chapters in ``shifted`` (default: :func:`detect_shifted_chapters`) are
    dropped as ``shifted_chapter``; other keys as ``src_only`` / ``tgt_only`` (absent
    from the other versification) or ``empty_src`` / ``empty_tgt`` / ``empty_both``.
    """
    wanted = set(books)
    src = {k: v for k, v in src.items() if k[0] in wanted}
    tgt = {k: v for k, v in tgt.items() if k[0] in wanted}
    if shifted is None:
        shifted = detect_shifted_chapters(src, tgt)
    order = {b: i for i, b in enumerate(books)}
    keys = sorted(src.keys() | tgt.keys(), key=lambda k: (order[k[0]], k[1], k[2]))
    chapters: dict[ChapterKey, list[tuple[int, str, str]]] = {}
    drops: dict[ChapterKey, dict[str, int]] = {}
    for key in keys:
        chapter = key[:2]
        s, t = src.get(key), tgt.get(key)
        if chapter in shifted:
            reason = "shifted_chapter"
        elif s is None:
            reason = "tgt_only"
        elif t is None:
            reason = "src_only"
        elif not s and not t:
            reason = "empty_both"
        elif not s:
            reason = "empty_src"
        elif not t:
            reason = "empty_tgt"
        else:
            chapters.setdefault(chapter, []).append((key[2], s, t))
            continue
        counts = drops.setdefault(chapter, {})
        counts[reason] = counts.get(reason, 0) + 1
    return Alignment(chapters=chapters, drops=drops, shifted=dict(shifted))


def split_of_book(book: str) -> str:
    """``'dev'``, ``'test'`` or ``'train'`` for an OSIS book name (fixed split by book)."""
    if book in DEV_BOOKS:
        return "dev"
    if book in TEST_BOOKS:
        return "test"
    return "train"


def doc_id(book: str, chapter: int) -> str:
    """Document id of a chapter: ``<OSIS book>.<chapter>``, e.g. ``Ruth.1``."""
    return f"{book}.{chapter}"


def split_books(alignment: Alignment) -> dict[str, list[Document]]:
    """Documents (one per aligned chapter, canonical order) of each split in :data:`SPLITS`."""
    splits: dict[str, list[Document]] = {name: [] for name in SPLITS}
    for (book, chapter), verses in alignment.chapters.items():
        splits[split_of_book(book)].append(
            Document(
                doc_id=doc_id(book, chapter),
                src=tuple(s for _, s, _ in verses),
                tgt=tuple(t for _, _, t in verses),
            )
        )
    return splits
