"""Strict readers for users' own document files: one reader per file kind, one message per fault.

Every command reads its documents here (corpora: :func:`read_corpus`; files to translate:
:func:`iter_source_documents`; hypotheses and references: :func:`iter_tsv_rows` and
:func:`iter_text_blocks`), so one fault gets the same ``FILE:LINE: reason`` from ``train.py``,
``translate.py`` and ``evaluate.py``. Formats, each read in file order:

* **TSV** (:func:`read_tsv`): ``doc_id<TAB>src<TAB>tgt``, one segment pair per row, the rows
  of a document contiguous and in order. An optional header line is exactly
  ``doc_id<TAB>src<TAB>tgt``. Doc ids are taken from the file. Files to translate may also be
  ``doc_id<TAB>src``, hypotheses are ``doc_id<TAB>hyp`` and references ``doc_id<TAB>tgt``
  (:data:`SOURCE_TSV`, :data:`HYPOTHESIS_TSV`, :data:`REFERENCE_TSV`; header lines
  :data:`TSV_HEADERS`).
* **Aligned plain text** (:func:`read_parallel_text`): a source and a target file, one
  sentence per line, documents separated by one or more blank lines (leading and trailing
  blank lines are ignored). Doc ids are ``"{basename(src_path)}:{n}"``, ``n`` 0-based.
* **Maruf et al. (2019)** (:func:`read_maruf`): a source and a target file, one sentence per
  line, a line ``<d>`` opening every document (the TED / News / Europarl EN-DE document
  sets). Doc ids are ``"{basename(src_path)}:{n}"``, ``n`` 0-based.

The readers are strict: nothing is dropped or rewritten except what is tolerated by design
(a UTF-8 byte order mark at the start of a file, ``\\r`` before ``\\n``, blank lines at the
end of a TSV and at the start/end of a plain-text file and, in plain text, runs of blank lines
between documents). A line that holds only whitespace counts as blank. Everything else that is
malformed raises :class:`~docnmt_jax.data.documents.CorpusFormatError` whose message is one
line, ``FILE:LINE: reason`` (1-based line; for two-file formats the reason names the other
file, its line and the document id); a file without documents is ``FILE: no documents (...)``
(:data:`NO_DOCUMENTS`).

:func:`read_corpus` picks the reader from the number of paths (or an explicit ``fmt``).
"""

from __future__ import annotations

import codecs
import dataclasses
import errno
import os
from collections.abc import Iterator, Sequence

from absl import logging

from docnmt_jax.data.documents import (
    TSV_HEADER,
    CorpusFormatError,
    Document,
    Origin,
    num_segments,
)
from docnmt_jax.errors import ConfigError

PathLike = str | os.PathLike

FORMATS = ("auto", "tsv", "text", "maruf")
DOC_MARKER = "<d>"
#: The reason of every reader for a file that holds no document.
NO_DOCUMENTS = "no documents (the file is empty, blank or only a header)"


# ---------------------------------------------------------------------------------------------
# Low-level line reading.


def iter_lines(path: PathLike) -> Iterator[tuple[int, str]]:
    """Streams ``(line number, text)`` of a UTF-8 file (1-based; BOM and line-final ``\\r``
    removed, no ``\\n``; a final newline adds no empty line). Invalid UTF-8 and a ``\\r`` not
    followed by ``\\n`` raise :class:`CorpusFormatError`; a missing file FileNotFoundError."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(errno.ENOENT, "corpus file not found", path)
    offset = 0  # of the line in the file, in bytes
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            start = len(codecs.BOM_UTF8) if lineno == 1 and raw.startswith(codecs.BOM_UTF8) else 0
            try:
                line = raw[start:].decode("utf-8")
            except UnicodeDecodeError as e:
                col = start + e.start
                bad = " ".join(f"0x{b:02x}" for b in raw[col : start + e.end])
                raise CorpusFormatError(
                    path,
                    lineno,
                    f"invalid UTF-8: byte {bad} at byte offset {col} of the line "
                    f"(offset {offset + col} in the file)",
                ) from None
            offset += len(raw)
            line = line[:-1] if line.endswith("\n") else line
            line = line[:-1] if line.endswith("\r") else line
            if "\r" in line:
                raise CorpusFormatError(
                    path, lineno, "carriage return (\\r) inside the line (old Mac line endings?)"
                )
            yield lineno, line


def _read_lines(path: PathLike) -> list[str]:
    """The lines of a UTF-8 file as :func:`iter_lines` reads them."""
    return [line for _, line in iter_lines(path)]


def _is_blank(line: str) -> bool:
    return not line or line.isspace()


def _first_nonblank_line(path: PathLike, max_bytes: int = 1 << 20) -> str | None:
    """The first non-blank line of a file (BOM/CR removed, bad UTF-8 replaced), or None."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(errno.ENOENT, "corpus file not found", path)
    with open(path, "rb") as f:
        head = f.read(max_bytes)
    if head.startswith(codecs.BOM_UTF8):
        head = head[len(codecs.BOM_UTF8) :]
    for raw in head.split(b"\n"):
        line = raw.decode("utf-8", errors="replace").rstrip("\r")
        if not _is_blank(line):
            return line
    return None


def is_tsv(path: PathLike) -> bool:
    """Whether a file is a TSV: its first non-blank line holds a tab."""
    first = _first_nonblank_line(path)
    return first is not None and "\t" in first


def _log_summary(fmt: str, paths: Sequence[PathLike], docs: list[Document]) -> None:
    logging.info(
        "Read %s corpus %s: %d documents, %d segments.",
        fmt,
        ", ".join(os.fspath(p) for p in paths),
        len(docs),
        num_segments(docs),
    )


# ---------------------------------------------------------------------------------------------
# TSV: one row reader for every kind of TSV.


@dataclasses.dataclass(frozen=True)
class TsvLayout:
    """What a kind of TSV holds: its column layouts (every row of a file has the first row's),
    and the columns whose text must not be blank."""

    layouts: tuple[tuple[str, ...], ...]
    required: tuple[str, ...] = ()

    def describe(self) -> str:
        """``3 (doc_id, src, tgt)``, or its alternatives joined by ``or``."""
        return " or ".join(f"{len(c)} ({', '.join(c)})" for c in self.layouts)


#: A training/evaluation corpus.
CORPUS_TSV = TsvLayout((TSV_HEADER,), required=("src", "tgt"))
#: A file to translate (a target column is ignored).
SOURCE_TSV = TsvLayout((("doc_id", "src"), TSV_HEADER))
#: System output (an empty hypothesis is allowed).
HYPOTHESIS_TSV = TsvLayout((("doc_id", "hyp"),))
#: References: the corpus TSV or ``doc_id<TAB>tgt``.
REFERENCE_TSV = TsvLayout((("doc_id", "tgt"), TSV_HEADER), required=("tgt",))
#: Header lines skipped on line 1 of a TSV whose layout has that many columns.
TSV_HEADERS = frozenset(
    {"\t".join(TSV_HEADER), "doc_id\tsrc", "doc_id\ttgt", "doc_id\tref", "doc_id\thyp"}
)
_SIDE = {"src": "source", "tgt": "target", "hyp": "hypothesis"}


@dataclasses.dataclass(frozen=True)
class TsvRow:
    """One row of a TSV: its document, its texts by column name, its line."""

    doc_id: str
    texts: dict[str, str]
    line: int


class _TsvColumns:
    """The column checks of one TSV: the first row's layout, then every row against it."""

    def __init__(self, path: str, layout: TsvLayout):
        self.path, self.layout = path, layout
        self.by_count = {len(c): c for c in layout.layouts}
        self.columns: tuple[str, ...] = ()
        self.columns_line = 0

    def fields(self, lineno: int, line: str) -> list[str]:
        """The fields of ``line``; a blank line, a wrong column count or an empty doc_id is a
        :class:`CorpusFormatError`."""
        fields = line.split("\t")
        if len(fields) == 1 and _is_blank(line):
            raise CorpusFormatError(
                self.path, lineno, "blank line (blank lines are allowed only at the end of a TSV)"
            )
        if not self.columns and len(fields) in self.by_count:
            self.columns, self.columns_line = self.by_count[len(fields)], lineno
        if len(fields) != len(self.columns):
            want = f"{len(self.columns)} (as on line {self.columns_line})"
            want = want if self.columns else self.layout.describe()
            most = len(self.columns) or max(self.by_count)
            hint = " (a tab inside the text?)" if len(fields) > most else ""
            raise CorpusFormatError(
                self.path,
                lineno,
                f"expected {want} tab-separated columns, found {len(fields)}{hint}",
            )
        if _is_blank(fields[0]):
            raise CorpusFormatError(self.path, lineno, "empty doc_id")
        return fields


def iter_tsv_rows(path: PathLike, layout: TsvLayout) -> Iterator[TsvRow]:
    """Streams the rows of a TSV of ``layout``, checked (every reader's TSV goes through here).

    Errors (:class:`CorpusFormatError` naming the line): invalid UTF-8, a ``\\r`` inside a
    line, a column count that is not one of the layout's or not the first row's, an empty
    doc_id, a blank text in a required column, a blank line other than at the end of the file,
    the rows of a document not contiguous; a file without rows is :data:`NO_DOCUMENTS`.
    """
    path = os.fspath(path)
    check = _TsvColumns(path, layout)
    seen: dict[str, int] = {}  # doc_id -> the line its rows start on
    cur_id = ""
    blank: tuple[int, str] | None = None  # the first blank line not yet known to be trailing
    rows = 0
    for lineno, line in iter_lines(path):
        if _is_blank(line):
            blank = blank or (lineno, line)
            continue
        if lineno == 1 and line in TSV_HEADERS and line.count("\t") + 1 in check.by_count:
            continue
        if blank:
            check.fields(*blank)  # raises: a blank row has no doc_id
        doc_id, *values = check.fields(lineno, line)
        texts = dict(zip(check.columns[1:], values, strict=True))
        for name in check.columns[1:]:
            if name in layout.required and _is_blank(texts[name]):
                raise CorpusFormatError(
                    path, lineno, f"{_SIDE[name]} sentence is empty (document {doc_id!r})"
                )
        if doc_id != cur_id:
            if doc_id in seen:
                raise CorpusFormatError(
                    path,
                    lineno,
                    f"rows of document {doc_id!r} are not contiguous: it started at line "
                    f"{seen[doc_id]}, then document {cur_id!r} started at line {seen[cur_id]}",
                )
            seen[doc_id], cur_id = lineno, doc_id
        rows += 1
        yield TsvRow(doc_id, texts, lineno)
    if not rows:
        raise CorpusFormatError(path, None, NO_DOCUMENTS)


def iter_tsv(path: PathLike) -> Iterator[Document]:
    """Yields the documents of a ``doc_id<TAB>src<TAB>tgt`` file one at a time (see module doc;
    the rows and errors of :func:`iter_tsv_rows` with :data:`CORPUS_TSV`)."""
    path = os.fspath(path)
    first: TsvRow | None = None  # the current document's first row
    src: list[str] = []
    tgt: list[str] = []
    for row in iter_tsv_rows(path, CORPUS_TSV):
        if first is not None and row.doc_id != first.doc_id:
            yield _tsv_document(path, first, src, tgt)
            first = None
        if first is None:
            first, src, tgt = row, [], []
        src.append(row.texts["src"])
        tgt.append(row.texts["tgt"])
    if first is not None:
        yield _tsv_document(path, first, src, tgt)


def _tsv_document(path: str, first: TsvRow, src: list[str], tgt: list[str]) -> Document:
    origin = Origin(path, first.line, path, first.line)
    return Document(first.doc_id, tuple(src), tuple(tgt), origin)


def read_tsv(path: PathLike) -> list[Document]:
    """Reads a ``doc_id<TAB>src<TAB>tgt`` file (header optional); see :func:`iter_tsv`."""
    docs = list(iter_tsv(path))
    _log_summary("TSV", [path], docs)
    return docs


# ---------------------------------------------------------------------------------------------
# Plain text and the two-file formats.


@dataclasses.dataclass
class TextBlock:
    """One document of one side: the line it starts on and its (line, text) segments."""

    start: int
    lines: list[int] = dataclasses.field(default_factory=list)
    texts: list[str] = dataclasses.field(default_factory=list)


def iter_text_blocks(path: PathLike) -> Iterator[TextBlock]:
    """Streams the documents of a plain-text file: one sentence per line, one or more blank
    lines between documents (the line errors of :func:`iter_lines`; a file without a
    sentence is :data:`NO_DOCUMENTS`)."""
    cur: TextBlock | None = None
    blocks = 0
    for lineno, line in iter_lines(path):
        if _is_blank(line):
            if cur is not None:
                yield cur
            cur = None
            continue
        if cur is None:
            cur, blocks = TextBlock(start=lineno), blocks + 1
        cur.lines.append(lineno)
        cur.texts.append(line)
    if cur is not None:
        yield cur
    elif not blocks:
        raise CorpusFormatError(path, None, NO_DOCUMENTS)


def _split_maruf(path: str, lines: list[str], side: str) -> list[TextBlock]:
    """Splits at ``<d>`` lines. Blank lines are kept (as empty texts) for the caller to report,
    except leading/trailing ones."""
    end = len(lines)
    while end > 0 and _is_blank(lines[end - 1]):
        end -= 1
    docs: list[TextBlock] = []
    cur: TextBlock | None = None
    for i in range(end):
        line = lines[i]
        if line.strip() == DOC_MARKER:
            cur = TextBlock(start=i + 1)
            docs.append(cur)
        elif cur is None:
            if not _is_blank(line):
                raise CorpusFormatError(
                    path, i + 1, f"{side} text before the first {DOC_MARKER} line"
                )
        else:
            cur.lines.append(i + 1)
            cur.texts.append(line)
    if not docs:
        raise CorpusFormatError(path, None, NO_DOCUMENTS)
    return docs


def _align(
    fmt: str,
    src_path: str,
    tgt_path: str,
    src_docs: list[TextBlock],
    tgt_docs: list[TextBlock],
    check_blank: bool,
) -> list[Document]:
    """Pairs the documents of both sides, raising on the first difference."""
    base = os.path.basename(src_path)
    n_src, n_tgt = len(src_docs), len(tgt_docs)
    count_note = (
        f"; overall source has {n_src} documents, target has {n_tgt}" if n_src != n_tgt else ""
    )
    docs: list[Document] = []
    for n, (sd, td) in enumerate(zip(src_docs, tgt_docs, strict=False)):
        doc_id = f"{base}:{n}"
        if check_blank:
            for k in range(max(len(sd.texts), len(td.texts))):
                for side, path, d, other_path, od in (
                    ("source", src_path, sd, tgt_path, td),
                    ("target", tgt_path, td, src_path, sd),
                ):
                    if k < len(d.texts) and _is_blank(d.texts[k]):
                        other = (
                            f"{other_path}:{od.lines[k]}"
                            if k < len(od.lines)
                            else f"{other_path} (no segment {k + 1} there)"
                        )
                        raise CorpusFormatError(
                            path,
                            d.lines[k],
                            f"blank line inside document {doc_id!r}: {side} segment {k + 1} "
                            f"is empty (aligned {'target' if side == 'source' else 'source'} "
                            f"line: {other})",
                        )
        if not sd.texts and not td.texts:
            raise CorpusFormatError(
                src_path,
                sd.start,
                f"document {doc_id!r} is empty on both sides ({tgt_path}:{td.start})",
            )
        if len(sd.texts) != len(td.texts):
            raise CorpusFormatError(
                src_path,
                sd.start,
                f"document {doc_id!r} has {len(sd.texts)} source sentences starting at line "
                f"{sd.start} but {len(td.texts)} target sentences in {tgt_path} starting at "
                f"line {td.start}{count_note}",
            )
        origin = Origin(src_path, sd.lines[0], tgt_path, td.lines[0])
        docs.append(Document(doc_id, tuple(sd.texts), tuple(td.texts), origin))
    if n_src != n_tgt:
        longer_path, extra = (
            (src_path, src_docs[n_tgt]) if n_src > n_tgt else (tgt_path, tgt_docs[n_src])
        )
        other_path = tgt_path if longer_path == src_path else src_path
        raise CorpusFormatError(
            longer_path,
            extra.start,
            f"source has {n_src} documents, target has {n_tgt}: document "
            f"'{base}:{min(n_src, n_tgt)}' starting here has no counterpart in {other_path}",
        )
    _log_summary(fmt, [src_path, tgt_path], docs)
    return docs


def read_parallel_text(src_path: PathLike, tgt_path: PathLike) -> list[Document]:
    """Reads two aligned plain-text files; blank lines separate documents (see module doc).

    Doc ids are ``"{basename(src_path)}:{n}"`` with ``n`` 0-based. Errors: different numbers
    of documents, different sentence counts in a document (naming the document and its start
    line in both files), invalid UTF-8.
    """
    src_path, tgt_path = os.fspath(src_path), os.fspath(tgt_path)
    src_docs = list(iter_text_blocks(src_path))
    tgt_docs = list(iter_text_blocks(tgt_path))
    return _align("plain-text", src_path, tgt_path, src_docs, tgt_docs, check_blank=False)


def read_maruf(src_path: PathLike, tgt_path: PathLike) -> list[Document]:
    """Reads a Maruf et al. (2019) document corpus: a ``<d>`` line opens every document.

    Doc ids are ``"{basename(src_path)}:{n}"`` with ``n`` 0-based. Errors: text before the
    first ``<d>``; a blank line inside a document (an empty segment, naming side, file and
    line); an empty document; different numbers of documents or of sentences in a document
    (naming the document); invalid UTF-8.
    """
    src_path, tgt_path = os.fspath(src_path), os.fspath(tgt_path)
    src_docs = _split_maruf(src_path, _read_lines(src_path), "source")
    tgt_docs = _split_maruf(tgt_path, _read_lines(tgt_path), "target")
    return _align("Maruf", src_path, tgt_path, src_docs, tgt_docs, check_blank=True)


# ---------------------------------------------------------------------------------------------
# Dispatch.


def _normalize_paths(paths: PathLike | Sequence[PathLike]) -> list[str]:
    if isinstance(paths, (str, os.PathLike)):
        p = os.fspath(paths)
        if "," in p and not os.path.exists(p):
            parts = [q.strip() for q in p.split(",")]
            if len(parts) != 2 or not all(parts):
                raise ConfigError(
                    f"expected one corpus path or 'src,tgt'; got {len(parts)} "
                    f"comma-separated parts in {p!r}"
                )
            return parts
        return [p]
    out = [os.fspath(p) for p in paths]
    if len(out) not in (1, 2):
        raise ConfigError(f"expected one corpus path or a (src, tgt) pair; got {len(out)} paths")
    return out


def detect_format(paths: PathLike | Sequence[PathLike]) -> str:
    """``"tsv"`` for one path; for two, ``"maruf"`` if the source's first non-blank line is
    ``<d>``, else ``"text"``."""
    ps = _normalize_paths(paths)
    if len(ps) == 1:
        return "tsv"
    first = _first_nonblank_line(ps[0])
    return "maruf" if first is not None and first.strip() == DOC_MARKER else "text"


def read_corpus(paths: PathLike | Sequence[PathLike], fmt: str = "auto") -> list[Document]:
    """Reads a corpus given as one TSV path, a ``(src, tgt)`` pair or a ``"src,tgt"`` string.

    ``fmt`` is one of :data:`FORMATS`: ``"auto"`` (see :func:`detect_format`), ``"tsv"``,
    ``"text"`` (blank-line separated plain text) or ``"maruf"`` (``<d>``-marked plain text).
    """
    if fmt not in FORMATS:
        raise ConfigError(f"unknown corpus format {fmt!r}; expected one of {', '.join(FORMATS)}")
    ps = _normalize_paths(paths)
    if fmt == "auto":
        fmt = detect_format(ps)
    if fmt == "tsv":
        if len(ps) != 1:
            raise ConfigError(f"format 'tsv' takes one path; got {len(ps)}: {ps}")
        return read_tsv(ps[0])
    if len(ps) != 2:
        raise ConfigError(f"format {fmt!r} takes a (src, tgt) pair of paths; got {ps}")
    if fmt == "text":
        return read_parallel_text(ps[0], ps[1])
    return read_maruf(ps[0], ps[1])


# ---------------------------------------------------------------------------------------------
# Source-only input for translation (streamed).


def iter_source_rows(path: PathLike) -> Iterator[tuple[str, str, int]]:
    """Streams ``(doc_id, source sentence, line)`` of a file to translate, one per sentence
    (the format and errors of :func:`iter_source_documents`)."""
    path = os.fspath(path)
    if is_tsv(path):
        for row in iter_tsv_rows(path, SOURCE_TSV):
            yield row.doc_id, row.texts["src"], row.line
        return
    base = os.path.basename(path)
    for n, block in enumerate(iter_text_blocks(path)):
        for lineno, text in zip(block.lines, block.texts, strict=True):
            yield f"{base}:{n}", text, lineno


def iter_source_documents(path: PathLike) -> Iterator[tuple[str, list[str], int]]:
    """Streams ``(doc_id, source sentences, first line)`` of a file to translate.

    A TSV (detected by a tab in the first non-blank line) has rows ``doc_id<TAB>src`` or
    ``doc_id<TAB>src<TAB>tgt`` (:data:`SOURCE_TSV`: header optional, a document's rows
    contiguous, blank lines only at the end); any other file is plain text, one sentence per
    line, a blank line between documents, doc ids ``"{basename}:{n}"``. Reads line by line, so
    memory does not grow with the file. Errors are :class:`CorpusFormatError` naming the line
    (those of :func:`iter_tsv_rows` and :func:`iter_text_blocks`).
    """
    cur_id: str | None = None
    cur_start = 0
    sentences: list[str] = []
    for doc_id, sentence, lineno in iter_source_rows(path):
        if doc_id != cur_id:
            if cur_id is not None:
                yield cur_id, sentences, cur_start
            cur_id, cur_start, sentences = doc_id, lineno, []
        sentences.append(sentence)
    if cur_id is not None:
        yield cur_id, sentences, cur_start


def find_source_line(path: PathLike, doc_id: str, sentence: str) -> int | None:
    """The line of ``sentence`` in document ``doc_id`` of a file to translate; else its first
    line in any document (a document rebuilt from several, e.g. random contexts); else None.
    Reads the whole file: for error messages."""
    anywhere = None
    for row_doc, text, lineno in iter_source_rows(path):
        if text == sentence:
            if row_doc == doc_id:
                return lineno
            anywhere = anywhere or lineno
    return anywhere
