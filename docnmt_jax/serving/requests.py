"""Strict parsing of a request: its ``Content-Length`` and its JSON body.

A request carries text only (no option, path or config); every mistake is a
:class:`~docnmt_jax.serving.documents.RequestError` with a one-line message naming the
field: a 400, or a 413 for too many sentences.
"""

from __future__ import annotations

import re
from email.message import Message
from typing import Any

from docnmt_jax.serving.documents import RequestError

#: A document id or a request id: 1 to 128 characters a URL path segment takes unescaped.
ID = re.compile(r"[A-Za-z0-9._~-]{1,128}")
_DIGITS = re.compile(r"[0-9]{1,18}")


def content_length(headers: Message) -> int | None:
    """The body's length: ``None`` without a ``Content-Length``; a repeated header (even with
    equal values), anything but ASCII digits, or a ``Transfer-Encoding`` is a 400."""
    if headers.get_all("Transfer-Encoding"):
        raise RequestError(400, "Transfer-Encoding is not supported: send a Content-Length")
    values = headers.get_all("Content-Length") or []
    if len(values) > 1:
        raise RequestError(400, f"{len(values)} Content-Length headers; send exactly one")
    if not values:
        return None
    if not _DIGITS.fullmatch(values[0]):
        raise RequestError(400, f"bad Content-Length {values[0]!r}: expected digits only")
    return int(values[0])


def _fields(body: Any, allowed: set[str]) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise RequestError(400, f"the body must be a JSON object, got {type(body).__name__}")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise RequestError(400, f"unknown field(s) {unknown}; expected one of {sorted(allowed)}")
    return body


def text(value: Any, where: str) -> str:
    """A non-blank string that UTF-8 can encode (no lone surrogate such as ``\\ud800``)."""
    if not isinstance(value, str):
        raise RequestError(400, f"{where}: expected a string, got {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        char = value[e.start]
        raise RequestError(
            400, f"{where}: not valid Unicode text (lone surrogate U+{ord(char):04X})"
        ) from None
    if not value.strip():
        raise RequestError(400, f"{where}: empty sentence")
    return value


def _sentences(value: Any, where: str) -> list[str]:
    if not isinstance(value, list):
        raise RequestError(400, f"{where}: expected a list of strings, got {type(value).__name__}")
    if not value:
        raise RequestError(400, f"{where}: empty list")
    return [text(s, f"{where}[{i}]") for i, s in enumerate(value)]


def translate_request(body: Any, max_sentences: int) -> tuple[list[list[str]], bool]:
    """The documents of a ``/translate`` body and whether it gave ``sentences`` (each its own
    one-sentence document) rather than ``documents``."""
    fields = _fields(body, {"sentences", "documents"})
    if len(fields) != 1:
        raise RequestError(400, 'expected exactly one of "sentences" or "documents"')
    if "sentences" in fields:
        documents = [[s] for s in _sentences(fields["sentences"], "sentences")]
    else:
        value = fields["documents"]
        if not isinstance(value, list) or not value:
            raise RequestError(400, "documents: expected a non-empty list of lists of strings")
        documents = [_sentences(d, f"documents[{i}]") for i, d in enumerate(value)]
    total = sum(len(d) for d in documents)
    if total > max_sentences:
        raise RequestError(
            413, f"{total} sentences in one request; the limit is {max_sentences} (--max_sentences)"
        )
    return documents, "sentences" in fields


def next_request(body: Any) -> tuple[str, str]:
    """The sentence of a ``/documents/{id}/next`` body and its ``request_id`` ('' if none)."""
    fields = _fields(body, {"sentence", "request_id"})
    if "sentence" not in fields:
        raise RequestError(400, 'missing field "sentence"')
    request_id = fields.get("request_id", "")
    if "request_id" in fields and not (isinstance(request_id, str) and ID.fullmatch(request_id)):
        raise RequestError(
            400, "request_id: 1 to 128 characters of A-Z a-z 0-9 . _ ~ - (or leave it out)"
        )
    return text(fields["sentence"], "sentence"), request_id
