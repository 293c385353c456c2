"""Input and output of ``docnmt-translate``: standard input and output, the output formats,
and the interactive loop.

Formats: ``tsv`` writes ``doc_id<TAB>hyp`` with a header, one row per sentence; ``text``
writes one translation per line at the line of its source, so the output lines up with a
plain-text input line for line (blank lines where the input has them: ``cat src | docnmt-
translate | sacrebleu ref`` scores it); ``nbest`` (``--nbest N``) writes ``doc_id<TAB>sentence
<TAB>rank<TAB>hyp<TAB>log_prob<TAB>score`` with a header, ``N`` rows per sentence, best first
(``log_prob`` = ``log p(hyp | source, context)``, ``score`` its length-normalised value, the
search's ranking).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from typing import IO, Any

from docnmt_jax.data import readers
from docnmt_jax.files import atomic_open

STDIO = "-"
#: The name standard input gets in doc ids (``stdin:0``) and error messages.
STDIN_NAME = "stdin"
OUTPUT_FORMATS = ("auto", "tsv", "text")


@contextlib.contextmanager
def input_path(value: str) -> Iterator[str]:
    """A path to read ``value`` from: the file itself, or for ``-`` (and ``/dev/stdin``)
    standard input copied to a temporary file named ``stdin`` (its format is detected, and an
    error names its line, as for a file; the copy is removed afterwards)."""
    if value not in (STDIO, "/dev/stdin"):
        yield value
        return
    with tempfile.TemporaryDirectory(prefix="docnmt-translate-") as tmp:
        path = os.path.join(tmp, STDIN_NAME)
        with open(path, "wb") as f:
            shutil.copyfileobj(sys.stdin.buffer, f)
        yield path


def resolved_format(requested: str, path: str) -> str:
    """``tsv`` or ``text``: ``requested``, or (``auto``) the input's own format."""
    if requested != "auto":
        return requested
    return "tsv" if readers.is_tsv(path) else "text"


@contextlib.contextmanager
def output_stream(value: str) -> Iterator[IO[str]]:
    """Standard output for ``-``, else the file written atomically (nothing is left on a
    failure)."""
    if value == STDIO:
        yield sys.stdout
        sys.stdout.flush()
        return
    with atomic_open(value) as out:
        yield out


class OutputWriter:
    """Writes a document's translations in one of the formats (module docstring); with
    ``line_aligned`` (a plain-text input) a ``text`` output puts each translation at its
    source's line, else one blank line between documents."""

    def __init__(self, out: IO[str], fmt: str, nbest: bool, line_aligned: bool):
        self.out, self.line_aligned = out, line_aligned
        self.fmt = "nbest" if nbest else fmt
        self.line = 0  # text: output lines written so far
        self.empty_lines = 0  # text: empty translations (a blank line in the output)
        header = {"tsv": "doc_id\thyp", "nbest": "doc_id\tsentence\trank\thyp\tlog_prob\tscore"}
        if self.fmt in header:
            out.write(header[self.fmt] + "\n")

    def write(self, doc_id: str, hyps: list[Any], first_line: int) -> None:
        """Writes one document; ``first_line``: the input line of its first sentence."""
        if self.fmt == "tsv":
            self.out.write("".join(f"{doc_id}\t{_one_field(h)}\n" for h in hyps))
        elif self.fmt == "nbest":
            for k, entries in enumerate(hyps):
                for rank, h in enumerate(entries, start=1):
                    self.out.write(
                        f"{doc_id}\t{k}\t{rank}\t{_one_field(h.text)}\t{h.log_prob:.4f}\t"
                        f"{h.score:.4f}\n"
                    )
        else:
            gap = first_line - 1 - self.line if self.line_aligned else int(self.line > 0)
            lines = [""] * max(gap, 0) + [_one_line(h) for h in hyps]
            self.out.write("".join(line + "\n" for line in lines))
            self.line += len(lines)
            self.empty_lines += sum(1 for h in hyps if not _one_line(h))
        self.out.flush()


def _one_field(text: str) -> str:
    """``text`` as one TSV field (tabs and line breaks become spaces)."""
    return " ".join(text.replace("\t", " ").splitlines())


def _one_line(text: str) -> str:
    return " ".join(text.splitlines())


def interactive_loop(model: Any, search: dict[str, Any], lines: IO[str], out: IO[str]) -> int:
    """Translates each line of ``lines`` as it arrives, as the next sentence of the current
    document (its earlier sentences as context: :meth:`~docnmt_jax.api.TranslationModel.
    translate_next`); a blank line ends the document (and is echoed). Flushes after each
    line; returns the number of sentences translated."""
    from docnmt_jax.api import DocumentContext

    context = DocumentContext()
    count = 0
    for raw in lines:
        line = raw.rstrip("\n").rstrip("\r")
        if not line.strip():
            if context.sources:
                out.write("\n")
                out.flush()
            context = DocumentContext()
            continue
        (translation,) = model.translate_next([context], [line], **search)
        out.write(_one_line(translation) + "\n")
        out.flush()
        count += 1
    return count
