"""Writing output files atomically: a failed run never leaves a partial file.

Every output is written to ``PATH.partial`` and renamed onto ``PATH`` (``os.replace``, atomic
on POSIX within one file system) only when the write has finished; when the write raises, the
temporary file is removed and ``PATH`` keeps whatever it held before (or stays absent).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import time
from collections.abc import Iterator, Sequence
from typing import IO, Any

PARTIAL_SUFFIX = ".partial"
LOG_TIME_FORMAT = "%Y-%m-%d %H:%M:%S"  # the prefix of every line of train.log and results.log


def log_line(message: str) -> str:
    """``message`` as a log line: local time in :data:`LOG_TIME_FORMAT`, a space, a newline."""
    return f"{time.strftime(LOG_TIME_FORMAT)} {message}\n"


def log_timestamp(line: str) -> float | None:
    """Seconds since the epoch of a :func:`log_line`'s time prefix (None: the line has none)."""
    try:
        return datetime.datetime.strptime(line[:19], LOG_TIME_FORMAT).timestamp()
    except ValueError:
        return None


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", **kwargs: Any) -> Iterator[IO[Any]]:
    """``open(path, mode)`` through ``path.partial``: renamed onto ``path`` when the block
    ends normally, removed when it raises. Text mode defaults to UTF-8 with ``\\n`` newlines."""
    if "w" not in mode:
        raise ValueError(f"atomic_open writes a new file; mode {mode!r} has no 'w'")
    if "b" not in mode:
        kwargs.setdefault("encoding", "utf-8")
        kwargs.setdefault("newline", "\n")
    with atomic_path(path) as tmp, open(tmp, mode, **kwargs) as f:
        yield f


def write_atomic(path: str | os.PathLike, text: str) -> str:
    """Writes ``text`` to ``path`` through :func:`atomic_open`; returns ``path``."""
    with atomic_open(path) as f:
        f.write(text)
    return os.fspath(path)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[str]:
    """A temporary path for a writer that takes a file name (``fig.savefig``,
    ``np.save``): renamed onto ``path`` when the block ends normally, removed when it
    raises."""
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + PARTIAL_SUFFIX
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def write_hypotheses(
    path: str, documents: Sequence[Any], hypotheses: Sequence[Sequence[str]]
) -> str:
    """``doc_id<TAB>hyp`` with a header, one row per sentence (``launch/translate.py``'s
    format; a tab inside a hypothesis becomes a space), atomically; returns ``path``."""
    with atomic_open(path) as out:
        out.write("doc_id\thyp\n")
        for doc, hyps in zip(documents, hypotheses, strict=True):
            out.writelines(f"{doc.doc_id}\t{h.replace(chr(9), ' ')}\n" for h in hyps)
    return path


def read_record(path: str) -> dict[str, Any] | None:
    """The JSON record at ``path``; None when it is missing or unreadable (not yet written)."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError):
        return None


def write_record(path: str, record: dict[str, Any]) -> None:
    """Writes ``record`` as indented JSON to ``path`` atomically, creating its directory."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_atomic(path, json.dumps(record, indent=2, default=float) + "\n")
