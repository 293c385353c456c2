"""The HTTP side of the translation server: routes, request validation, JSON answers.

Built on the standard library's ``http.server.ThreadingHTTPServer`` (one thread per
connection) rather than a web framework: no new dependency, and nothing a framework adds would
be faster, since every request waits for the model, which runs in the single worker thread of
:mod:`~docnmt_jax.serving.batching` (JAX releases the GIL while it computes, so the handler
threads keep answering).

Routes (JSON in and out; docs/serving.md):

* ``POST /translate`` ``{"sentences": [...]}`` (each sentence alone, no context) or
  ``{"documents": [[...], ...]}`` (each document whole) -> ``{"translations": ...}``;
* ``POST /documents/{id}/next`` ``{"sentence": "..."}`` -> ``{"translation", "index"}``: the
  next sentence of document ``id`` (created if unknown), with the context of its sentences so
  far;
* ``GET /documents/{id}`` -> its ``sentences`` and ``translations``; ``DELETE`` ends it;
* ``GET /health`` -> ``{"status": "ok", "model", "step", ...}``.

Every error is one line of JSON, ``{"error": "..."}``: 400 malformed JSON, a missing, empty or
mistyped field, an unknown field; 404 unknown route or document; 405 wrong method; 411 no
Content-Length; 413 a body over ``max_request_bytes`` or more than ``max_sentences``
sentences; 503 a full queue (answered at once); 500 an internal error, after which the server
keeps serving. A request carries text only: no option, path or config.
"""

from __future__ import annotations

import dataclasses
import json
import re
import socket
import sys
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from docnmt_jax.serving.batching import (
    Batcher,
    DocumentCache,
    NextSentenceJob,
    RequestError,
    TranslateJob,
)

#: A document id: 1 to 128 characters a URL path segment takes unescaped.
DOC_ID = re.compile(r"[A-Za-z0-9._~-]{1,128}")
#: The most bytes of an oversized body read (and dropped) so that its client gets the 413.
DISCARD_LIMIT = 64 << 20


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one request may ask (the command's flags of the same names)."""

    max_request_bytes: int = 1 << 20
    max_sentences: int = 256
    request_timeout_s: float = 300.0
    socket_timeout_s: float = 30.0


# --------------------------------------------------------------------------- request bodies


def _fields(body: Any, allowed: set[str]) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise RequestError(400, f"the body must be a JSON object, got {type(body).__name__}")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise RequestError(400, f"unknown field(s) {unknown}; expected one of {sorted(allowed)}")
    return body


def _sentence(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise RequestError(400, f"{where}: expected a string, got {type(value).__name__}")
    if not value.strip():
        raise RequestError(400, f"{where}: empty sentence")
    return value


def _sentences(value: Any, where: str) -> list[str]:
    if not isinstance(value, list):
        raise RequestError(400, f"{where}: expected a list of strings, got {type(value).__name__}")
    if not value:
        raise RequestError(400, f"{where}: empty list")
    return [_sentence(s, f"{where}[{i}]") for i, s in enumerate(value)]


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


def next_request(body: Any) -> str:
    """The sentence of a ``/documents/{id}/next`` body."""
    fields = _fields(body, {"sentence"})
    if "sentence" not in fields:
        raise RequestError(400, 'missing field "sentence"')
    return _sentence(fields["sentence"], "sentence")


# ----------------------------------------------------------------------------------- server


class TranslationServer(ThreadingHTTPServer):
    """A ``ThreadingHTTPServer`` that hands translations to a started :class:`Batcher`;
    ``info``: what ``/health`` reports besides the status (model name, step)."""

    daemon_threads = True
    request_queue_size = 128  # the listen backlog: a burst of clients is answered, not reset

    def __init__(
        self, address: tuple[str, int], batcher: Batcher, limits: Limits, info: dict[str, Any]
    ):
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.batcher = batcher
        self.limits = limits
        self.info = dict(info)
        super().__init__(address, Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    def close(self) -> None:
        """Stops serving: no new connection, queued requests answered 503, the socket closed
        (call :meth:`shutdown` first when ``serve_forever`` runs in another thread)."""
        self.batcher.stop()
        self.server_close()


class Handler(BaseHTTPRequestHandler):
    """Routes a request (module docstring); every answer is JSON."""

    server: TranslationServer
    server_version = "docnmt-serve"

    def setup(self) -> None:
        self.timeout = self.server.limits.socket_timeout_s  # a silent client frees its thread
        super().setup()

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self._dispatch("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch("POST")

    def do_DELETE(self) -> None:  # noqa: N802
        self._dispatch("DELETE")

    def do_PUT(self) -> None:  # noqa: N802
        self._dispatch("PUT")

    def do_PATCH(self) -> None:  # noqa: N802
        self._dispatch("PATCH")

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        """Quiet: no access log on stderr (errors of the model are logged by the batcher)."""

    def send_error(self, code: int, message: str | None = None, explain: str | None = None):
        """http.server's own errors (a malformed request line, an unknown method) as JSON."""
        self.close_connection = True
        self._answer(code, {"error": message or self.responses.get(code, ("error",))[0]})

    # ------------------------------------------------------------------------------ routing

    def _dispatch(self, method: str) -> None:
        self._body_read = False
        try:
            status, answer = self._route(method, urlsplit(self.path).path)
        except RequestError as e:
            status, answer = e.status, {"error": e.message}
        except Exception as e:  # noqa: BLE001 - a bug answers 500; the server stays up
            traceback.print_exc(file=sys.stderr)
            status, answer = 500, {"error": f"internal error ({type(e).__name__})"}
        if not self._body_read:  # a route that reads none, a request refused before reading
            self._discard()
        self._answer(status, answer)

    def _route(self, method: str, path: str) -> tuple[int, dict[str, Any]]:
        parts = path.split("/")[1:]
        if parts == ["health"]:
            self._allow(method, "GET")
            return 200, self._health()
        if parts == ["translate"]:
            self._allow(method, "POST")
            return 200, self._translate()
        if len(parts) in (2, 3) and parts[0] == "documents" and parts[-1] != "":
            doc_id = parts[1]
            if not DOC_ID.fullmatch(doc_id):
                raise RequestError(
                    400, "a document id is 1 to 128 characters of A-Z a-z 0-9 . _ ~ -"
                )
            if len(parts) == 3 and parts[2] == "next":
                self._allow(method, "POST")
                return 200, self._next(doc_id)
            if len(parts) == 2:
                self._allow(method, "GET", "DELETE")
                return 200, self._document(method, doc_id)
        raise RequestError(404, f"no route {path!r}")

    def _allow(self, method: str, *allowed: str) -> None:
        self._allowed = allowed
        if method not in allowed:
            raise RequestError(405, f"{method} not allowed here; use {' or '.join(allowed)}")

    def _health(self) -> dict[str, Any]:
        batcher = self.server.batcher
        return {
            "status": "ok",
            **self.server.info,
            "queued": batcher.queued,
            "documents": len(batcher.cache),
        }

    def _translate(self) -> dict[str, Any]:
        limits = self.server.limits
        documents, sentences = translate_request(self._read_json(), limits.max_sentences)
        job = self.server.batcher.submit(TranslateJob(documents))
        translations = job.wait(limits.request_timeout_s)
        if sentences:
            translations = [t[0] for t in translations]
        return {"translations": translations}

    def _next(self, doc_id: str) -> dict[str, Any]:
        sentence = next_request(self._read_json())
        job = self.server.batcher.submit(NextSentenceJob(doc_id, sentence))
        return job.wait(self.server.limits.request_timeout_s)

    def _document(self, method: str, doc_id: str) -> dict[str, Any]:
        cache = self.server.batcher.cache
        if method == "DELETE":
            if not cache.delete(doc_id):
                raise RequestError(404, f"unknown document {doc_id!r}")
            return {"deleted": doc_id}
        context = cache.get(doc_id)
        if context is None:
            raise RequestError(404, f"unknown document {doc_id!r} (never started, ended, evicted)")
        return {
            "document": doc_id,
            "sentences": context.sources,
            "translations": context.translations,
        }

    # -------------------------------------------------------------------------------- bodies

    def _read_json(self) -> Any:
        limit = self.server.limits.max_request_bytes
        header = self.headers.get("Content-Length")
        if header is None:
            raise RequestError(411, "a request body needs a Content-Length header")
        try:
            length = int(header)
            if length < 0:
                raise ValueError(header)
        except ValueError:
            raise RequestError(400, f"bad Content-Length {header!r}") from None
        if length > limit:
            self._discard()
            raise RequestError(
                413, f"a body of {length} bytes; the limit is {limit} (--max_request_bytes)"
            )
        self._body_read = True
        try:
            body = self.rfile.read(length)
        except OSError:  # a socket timeout: the client stopped sending
            self.close_connection = True
            raise RequestError(408, "timed out reading the body") from None
        if len(body) < length:
            self.close_connection = True
            raise RequestError(400, f"the body ended after {len(body)} of {length} bytes")
        try:
            return json.loads(body)
        except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
            raise RequestError(400, f"malformed JSON: {e}") from None

    def _discard(self) -> None:
        """Reads and drops a body that will not be parsed (up to :data:`DISCARD_LIMIT`), so that
        its client, maybe still sending, gets the answer rather than a reset connection."""
        self._body_read = True
        self.close_connection = True
        try:
            left = min(int(self.headers.get("Content-Length", "0")), DISCARD_LIMIT)
        except ValueError:
            return
        try:
            while left > 0:
                chunk = self.rfile.read(min(left, 1 << 16))
                if not chunk:
                    break
                left -= len(chunk)
        except OSError:
            pass

    def _answer(self, status: int, answer: dict[str, Any]) -> None:
        data = json.dumps(answer, ensure_ascii=False).encode("utf-8") + b"\n"
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            if status == 405:
                self.send_header("Allow", ", ".join(getattr(self, "_allowed", ())))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
        except OSError:  # the client went away
            self.close_connection = True


def make_server(
    model: Any,
    search: dict[str, Any],
    host: str = "127.0.0.1",
    port: int = 0,
    limits: Limits | None = None,
    info: dict[str, Any] | None = None,
    **batching: Any,
) -> TranslationServer:
    """A bound server (not yet serving: call ``serve_forever``) whose started
    :class:`Batcher` runs ``model`` with ``search``; ``batching``: the Batcher's limits and
    ``max_documents`` of its cache."""
    cache = DocumentCache(batching.pop("max_documents", 1024))
    batcher = Batcher(model, search, cache, **batching)
    server = TranslationServer((host, port), batcher, limits or Limits(), info or {})
    batcher.start()
    return server
