"""What a document is: the files' documents (chapters of the Bible) or whole books.

``config.data.document_unit`` (and ``docnmt-translate --document_unit``) picks the unit:
``chapter`` or ``document`` keep the documents as the files hold them; ``book`` concatenates
the consecutive documents whose doc ids share a book -- everything before the last ``.``
(``Ps.23`` -> ``Ps``, ``1John.4`` -> ``1John``) -- in file order into one document with the
book as its doc id. Every book keeps its chapters' spans (:class:`ChapterSpan`: doc id and
number of sentences), so a book's translation splits back into its chapters
(:func:`chapter_spans`, :func:`split_into_chapters`, :func:`chapters_of`,
:func:`translated_by_book`).

A doc id without a book (no ``.``, or nothing on one side of the last one), or a book whose
chapters are not consecutive in the file, is a :class:`DocumentUnitError` naming the doc ids:
nothing is merged silently.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TypeVar

from docnmt_jax.data.documents import Document
from docnmt_jax.errors import ConfigError, UserError

#: The document units; ``chapter`` and ``document`` are the documents as the files hold them.
UNITS = ("chapter", "document", "book")

T = TypeVar("T")


class DocumentUnitError(UserError, ValueError):
    """Documents cannot be grouped into books; the message is one line naming the doc ids."""


@dataclasses.dataclass(frozen=True)
class ChapterSpan:
    """One chapter of a book document: its doc id and its number of sentences."""

    doc_id: str
    sentences: int


def check_unit(unit: str, key: str = "document unit") -> str:
    """``unit`` if it is one of :data:`UNITS`, else a one-line :class:`ConfigError` naming
    ``key`` and the allowed values."""
    if unit not in UNITS:
        raise ConfigError(f"{key} must be one of {', '.join(UNITS)}; got {unit!r}")
    return unit


def book_of(document: Document) -> str:
    """The book of ``document``: its doc id before the last ``.`` (``Ps.23`` -> ``Ps``)."""
    book, dot, chapter = document.doc_id.rpartition(".")
    if not (dot and book and chapter):
        where = f" ({document.origin.line(0)})" if document.origin else ""
        raise DocumentUnitError(
            f"document {document.doc_id!r}{where} has no book: book units need doc ids "
            "BOOK.CHAPTER (e.g. Ps.23)"
        )
    return book


def _book_document(book: str, chapters: Sequence[Document]) -> Document:
    """The chapters concatenated; the first chapter's origin when the chapters follow each
    other line by line in one file (a TSV), else none."""
    origin = chapters[0].origin
    starts = itertools.accumulate([0] + [len(c) for c in chapters[:-1]])
    if origin and any(c.origin != origin.shifted(k) for c, k in zip(chapters, starts, strict=True)):
        origin = None
    src = tuple(s for c in chapters for s in c.src)
    tgt = tuple(t for c in chapters for t in c.tgt)
    return Document(book, src, tgt, origin)


def iter_books(documents: Iterable[Document]) -> Iterator[tuple[Document, tuple[ChapterSpan, ...]]]:
    """Streams ``(book document, its chapters' spans)``: runs of consecutive documents of one
    book concatenated in order. A book met again after another one is an error naming both
    chapters and the one in between."""
    done: dict[str, str] = {}  # book -> the doc id of its last chapter
    chapters: list[Document] = []
    for document in documents:
        book = book_of(document)
        if chapters and book != book_of(chapters[0]):
            previous = chapters[-1].doc_id
            yield _flush(chapters, done)
            chapters = []
            if book in done:
                raise DocumentUnitError(
                    f"chapters of book {book!r} are not consecutive: {document.doc_id!r} comes "
                    f"after {previous!r}, but {done[book]!r} came earlier"
                )
        chapters.append(document)
    if chapters:
        yield _flush(chapters, done)


def _flush(
    chapters: list[Document], done: dict[str, str]
) -> tuple[Document, tuple[ChapterSpan, ...]]:
    book = book_of(chapters[0])
    done[book] = chapters[-1].doc_id
    spans = tuple(ChapterSpan(c.doc_id, len(c)) for c in chapters)
    return _book_document(book, chapters), spans


def chapter_spans(documents: Iterable[Document]) -> dict[str, tuple[ChapterSpan, ...]]:
    """``{book doc id: its chapters' spans}`` of ``documents`` grouped into books
    (:func:`iter_books`), in book order."""
    return {book.doc_id: spans for book, spans in iter_books(documents)}


def documents_by_unit(documents: Sequence[Document], unit: str) -> list[Document]:
    """``documents`` in ``unit`` (:data:`UNITS`): as they are for ``chapter``/``document``,
    else one document per book in order (:func:`iter_books`)."""
    if check_unit(unit) != "book":
        return list(documents)
    return [book for book, _ in iter_books(documents)]


def split_into_chapters(
    items: Sequence[T], spans: Sequence[ChapterSpan]
) -> list[tuple[str, list[T]]]:
    """``(chapter doc id, its items)`` of one book's per-sentence ``items`` (its translations,
    sources or targets), cut at the chapters' ``spans``."""
    total = sum(span.sentences for span in spans)
    if len(items) != total:
        raise ValueError(f"{len(items)} items for chapters of {total} sentences")
    out, start = [], 0
    for span in spans:
        out.append((span.doc_id, list(items[start : start + span.sentences])))
        start += span.sentences
    return out


def chapters_of(book: Document, spans: Sequence[ChapterSpan]) -> list[Document]:
    """The chapter documents of ``book`` (the inverse of :func:`iter_books`); origins follow
    the book's."""
    src = split_into_chapters(book.src, spans)
    tgt = split_into_chapters(book.tgt, spans)
    out, offset = [], 0
    for (doc_id, s), (_, t) in zip(src, tgt, strict=True):
        origin = book.origin.shifted(offset) if book.origin else None
        out.append(Document(doc_id, tuple(s), tuple(t), origin))
        offset += len(s)
    return out


def translated_by_book(
    chapters: Iterable[Document],
    translate: Callable[[Iterator[tuple[str, list[str]]]], Iterable[tuple[str, list[T]]]],
) -> Iterator[tuple[str, list[T]]]:
    """Streams ``(chapter doc id, its translations)`` of ``chapters`` translated a book at a
    time: ``translate`` maps a stream of ``(book doc id, source sentences)`` to their
    ``(doc id, per-sentence translations)`` in order."""
    pending: collections.deque[tuple[ChapterSpan, ...]] = collections.deque()

    def books() -> Iterator[tuple[str, list[str]]]:
        for book, spans in iter_books(chapters):
            pending.append(spans)
            yield book.doc_id, list(book.src)

    for _, translations in translate(books()):
        yield from split_into_chapters(translations, pending.popleft())
