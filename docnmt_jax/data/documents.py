"""The in-memory document type shared by every reader, writer and generator.

A corpus is a list of :class:`Document`; each document is a list of aligned
(source, target) segments kept in their original order.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Sequence

from docnmt_jax.errors import UserError

TSV_HEADER = ("doc_id", "src", "tgt")


class CorpusFormatError(UserError, ValueError):
    """A corpus file is malformed. The message is one line: ``FILE:LINE: reason``."""

    def __init__(self, path: str | os.PathLike, line: int | None, reason: str):
        self.path = os.fspath(path)
        self.line = line
        self.reason = reason
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: {reason}")


@dataclasses.dataclass(frozen=True)
class Origin:
    """Where a document's sentences are in their files: sentence ``k`` of the source is line
    ``src_line + k`` of ``src_path`` (1-based), of the target line ``tgt_line + k`` of
    ``tgt_path`` (the same file and line for a TSV). Every reader's documents occupy
    consecutive lines, so the first line of each side is enough."""

    src_path: str
    src_line: int
    tgt_path: str
    tgt_line: int

    def line(self, sentence: int, side: str = "source") -> str:
        """``FILE:LINE`` of sentence ``sentence`` (0-based) on ``side`` (source | target)."""
        if side == "source":
            return f"{self.src_path}:{self.src_line + sentence}"
        return f"{self.tgt_path}:{self.tgt_line + sentence}"

    def shifted(self, sentences: int) -> Origin:
        """The origin of the document that starts ``sentences`` sentences later."""
        return dataclasses.replace(
            self, src_line=self.src_line + sentences, tgt_line=self.tgt_line + sentences
        )


@dataclasses.dataclass(frozen=True)
class Document:
    """One parallel document: ``src[k]`` translates to ``tgt[k]``. ``origin``: where the
    readers found it (None for generated documents); not part of equality."""

    doc_id: str
    src: tuple[str, ...]
    tgt: tuple[str, ...]
    origin: Origin | None = dataclasses.field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if len(self.src) != len(self.tgt):
            raise ValueError(
                f"document {self.doc_id!r}: {len(self.src)} source but "
                f"{len(self.tgt)} target segments"
            )

    def __len__(self) -> int:
        return len(self.src)


def num_segments(documents: Iterable[Document]) -> int:
    """Total number of segment pairs in a corpus."""
    return sum(len(d) for d in documents)


def write_tsv(documents: Sequence[Document], path: str | os.PathLike) -> None:
    """Writes ``doc_id<TAB>src<TAB>tgt`` with a header, one row per segment.

    Rows of a document are contiguous and in order. Output is byte-deterministic
    (UTF-8, ``\\n`` line ends). Text containing a tab or newline is rejected
    rather than silently rewritten.
    """
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write("\t".join(TSV_HEADER) + "\n")
        for doc in documents:
            for k, (s, t) in enumerate(zip(doc.src, doc.tgt, strict=True)):
                for field, text in (("doc_id", doc.doc_id), ("src", s), ("tgt", t)):
                    if "\t" in text or "\n" in text or "\r" in text:
                        raise ValueError(
                            f"{os.fspath(path)}: document {doc.doc_id!r} segment {k}: "
                            f"{field} contains a tab or line break"
                        )
                f.write(f"{doc.doc_id}\t{s}\t{t}\n")
