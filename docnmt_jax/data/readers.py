"""Strict readers for users' own parallel document corpora.

Three formats are understood; each reader returns a ``list[Document]`` in file order:

* **TSV** (:func:`read_tsv`): ``doc_id<TAB>src<TAB>tgt``, one segment pair per row, the rows
  of a document contiguous and in order. An optional header line is exactly
  ``doc_id<TAB>src<TAB>tgt``. Doc ids are taken from the file.
* **Aligned plain text** (:func:`read_parallel_text`): a source and a target file, one
  sentence per line, documents separated by one or more blank lines (leading and trailing
  blank lines are ignored). Doc ids are ``"{basename(src_path)}:{n}"``, ``n`` 0-based.
* **Maruf et al. (2019)** (:func:`read_maruf`): a source and a target file, one sentence per
  line, a line ``<d>`` opening every document (the TED / News / Europarl EN-DE document
  sets). Doc ids are ``"{basename(src_path)}:{n}"``, ``n`` 0-based.

The readers are strict: nothing is dropped or rewritten except what is tolerated by design
(a UTF-8 byte order mark at the start of a file, ``\\r`` before ``\\n``, blank lines at the
start/end of the file and, in plain text, runs of blank lines between documents). A line
that holds only whitespace counts as blank. Everything else that is malformed raises
:class:`~docnmt_jax.data.documents.CorpusFormatError` whose message is one line,
``FILE:LINE: reason`` (1-based line; for two-file formats the reason names the other file,
its line and the document id).

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
_HEADER_LINE = "\t".join(TSV_HEADER)


# ---------------------------------------------------------------------------------------------
# Low-level line reading.


def _read_lines(path: PathLike) -> list[str]:
    """Returns the lines of a UTF-8 file: BOM and line-final ``\\r`` removed, no ``\\n``.

    A final newline does not produce an extra empty line. Invalid UTF-8 and a ``\\r`` that
    is not followed by ``\\n`` raise :class:`CorpusFormatError` naming the line.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(errno.ENOENT, "corpus file not found", path)
    with open(path, "rb") as f:
        data = f.read()
    start = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0
    try:
        text = data[start:].decode("utf-8")
    except UnicodeDecodeError as e:
        pos = start + e.start
        line = data.count(b"\n", 0, pos) + 1
        col = pos - (data.rfind(b"\n", 0, pos) + 1)
        bad = " ".join(f"0x{b:02x}" for b in data[pos : start + e.end])
        raise CorpusFormatError(
            path,
            line,
            f"invalid UTF-8: byte {bad} at byte offset {col} of the line "
            f"(offset {pos} in the file)",
        ) from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # The file ends with a newline.
    if "\r" in text:
        for i, line in enumerate(lines):
            if line.endswith("\r"):
                line = lines[i] = line[:-1]
            if "\r" in line:
                raise CorpusFormatError(
                    path, i + 1, "carriage return (\\r) inside the line (old Mac line endings?)"
                )
    return lines


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


def _log_summary(fmt: str, paths: Sequence[PathLike], docs: list[Document]) -> None:
    logging.info(
        "Read %s corpus %s: %d documents, %d segments.",
        fmt,
        ", ".join(os.fspath(p) for p in paths),
        len(docs),
        num_segments(docs),
    )


# ---------------------------------------------------------------------------------------------
# TSV.


def iter_tsv(path: PathLike) -> Iterator[Document]:
    """Yields the documents of a ``doc_id<TAB>src<TAB>tgt`` file one at a time (see module doc).

    Errors (all :class:`CorpusFormatError` naming the line): wrong column count, empty
    doc_id, empty source or target segment, blank line other than at the end of the file,
    invalid UTF-8, and the rows of a document not being contiguous.
    """
    path = os.fspath(path)
    lines = _read_lines(path)
    end = len(lines)
    while end > 0 and _is_blank(lines[end - 1]):
        end -= 1  # Trailing blank lines are tolerated.
    first = 1 if end > 0 and lines[0] == _HEADER_LINE else 0

    seen: dict[str, int] = {}  # doc_id -> first line of that document.
    cur_id: str | None = None
    cur_start = 0
    src: list[str] = []
    tgt: list[str] = []
    for i in range(first, end):
        lineno = i + 1
        line = lines[i]
        fields = line.split("\t")
        if len(fields) != 3:
            if _is_blank(line):
                raise CorpusFormatError(
                    path, lineno, "blank line (blank lines are allowed only at the end of a TSV)"
                )
            hint = " (a tab inside the text?)" if len(fields) > 3 else ""
            raise CorpusFormatError(
                path,
                lineno,
                f"expected 3 tab-separated columns doc_id, src, tgt; found {len(fields)}{hint}",
            )
        doc_id, s, t = fields
        if _is_blank(doc_id):
            raise CorpusFormatError(path, lineno, "empty doc_id")
        if _is_blank(s):
            raise CorpusFormatError(path, lineno, f"source segment is empty (document {doc_id!r})")
        if _is_blank(t):
            raise CorpusFormatError(path, lineno, f"target segment is empty (document {doc_id!r})")
        if doc_id != cur_id:
            if doc_id in seen:
                raise CorpusFormatError(
                    path,
                    lineno,
                    f"rows of document {doc_id!r} are not contiguous: it started at line "
                    f"{seen[doc_id]}, then document {cur_id!r} started at line {cur_start}",
                )
            if cur_id is not None:
                yield Document(
                    cur_id, tuple(src), tuple(tgt), Origin(path, cur_start, path, cur_start)
                )
            cur_id, cur_start, src, tgt = doc_id, lineno, [], []
            seen[doc_id] = lineno
        src.append(s)
        tgt.append(t)
    if cur_id is not None:
        yield Document(cur_id, tuple(src), tuple(tgt), Origin(path, cur_start, path, cur_start))


def read_tsv(path: PathLike) -> list[Document]:
    """Reads a ``doc_id<TAB>src<TAB>tgt`` file (header optional); see :func:`iter_tsv`."""
    docs = list(iter_tsv(path))
    _log_summary("TSV", [path], docs)
    return docs


# ---------------------------------------------------------------------------------------------
# Two-file formats.


@dataclasses.dataclass
class _RawDoc:
    """One document of one side: the line it starts on and its (line, text) segments."""

    start: int
    lines: list[int] = dataclasses.field(default_factory=list)
    texts: list[str] = dataclasses.field(default_factory=list)


def _split_blank_separated(lines: list[str]) -> list[_RawDoc]:
    docs: list[_RawDoc] = []
    cur: _RawDoc | None = None
    for i, line in enumerate(lines):
        if _is_blank(line):
            cur = None
            continue
        if cur is None:
            cur = _RawDoc(start=i + 1)
            docs.append(cur)
        cur.lines.append(i + 1)
        cur.texts.append(line)
    return docs


def _split_maruf(path: str, lines: list[str], side: str) -> list[_RawDoc]:
    """Splits at ``<d>`` lines. Blank lines are kept (as empty texts) for the caller to report,
    except leading/trailing ones."""
    end = len(lines)
    while end > 0 and _is_blank(lines[end - 1]):
        end -= 1
    docs: list[_RawDoc] = []
    cur: _RawDoc | None = None
    for i in range(end):
        line = lines[i]
        if line.strip() == DOC_MARKER:
            cur = _RawDoc(start=i + 1)
            docs.append(cur)
        elif cur is None:
            if not _is_blank(line):
                raise CorpusFormatError(
                    path, i + 1, f"{side} text before the first {DOC_MARKER} line"
                )
        else:
            cur.lines.append(i + 1)
            cur.texts.append(line)
    return docs


def _align(
    fmt: str,
    src_path: str,
    tgt_path: str,
    src_docs: list[_RawDoc],
    tgt_docs: list[_RawDoc],
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
    src_docs = _split_blank_separated(_read_lines(src_path))
    tgt_docs = _split_blank_separated(_read_lines(tgt_path))
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

_SOURCE_HEADERS = ("doc_id\tsrc", "doc_id\tsrc\ttgt")


def iter_source_rows(path: PathLike) -> Iterator[tuple[str, str, int]]:
    """Streams ``(doc_id, source sentence, line)`` of a file to translate, one per sentence
    (the format and errors of :func:`iter_source_documents`)."""
    path = os.fspath(path)
    first = _first_nonblank_line(path)
    is_tsv = first is not None and "\t" in first
    base = os.path.basename(path)
    cur_id: str | None = None
    documents = 0  # plain text: documents started so far
    in_document = False
    seen: set[str] = set()
    columns = None
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise CorpusFormatError(
                    path, lineno, f"invalid UTF-8 at byte {e.start} of the line"
                ) from None
            if lineno == 1 and line.startswith("\ufeff"):
                line = line[1:]
            line = line.rstrip("\n").rstrip("\r")
            if not is_tsv:
                if _is_blank(line):
                    in_document = False
                    continue
                if not in_document:
                    in_document, documents = True, documents + 1
                yield f"{base}:{documents - 1}", line, lineno
                continue
            if _is_blank(line):
                continue  # blank rows carry nothing in a TSV to translate
            if lineno == 1 and line in _SOURCE_HEADERS:
                continue
            fields = line.split("\t")
            columns = columns or len(fields)
            if len(fields) not in (2, 3) or len(fields) != columns:
                raise CorpusFormatError(
                    path,
                    lineno,
                    f"expected {columns if columns in (2, 3) else '2 or 3'} tab-separated "
                    f"columns (doc_id, src[, tgt]); found {len(fields)}",
                )
            doc_id, src = fields[0], fields[1]
            if _is_blank(doc_id):
                raise CorpusFormatError(path, lineno, "empty doc_id")
            if doc_id != cur_id:
                if doc_id in seen:
                    raise CorpusFormatError(
                        path, lineno, f"rows of document {doc_id!r} are not contiguous"
                    )
                seen.add(doc_id)
                cur_id = doc_id
            yield doc_id, src, lineno


def iter_source_documents(path: PathLike) -> Iterator[tuple[str, list[str], int]]:
    """Streams ``(doc_id, source sentences, first line)`` of a file to translate.

    A TSV (detected by a tab in the first non-blank line) has rows ``doc_id<TAB>src`` or
    ``doc_id<TAB>src<TAB>tgt`` (header optional, a document's rows contiguous); any other
    file is plain text, one sentence per line, a blank line between documents, doc ids
    ``"{basename}:{n}"``. Reads line by line, so memory does not grow with the file. Errors
    are :class:`CorpusFormatError` naming the line.
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
