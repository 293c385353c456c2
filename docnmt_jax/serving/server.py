"""The HTTP side of the translation server: routes, limits, access checks, JSON answers.

Built on the standard library's ``http.server.ThreadingHTTPServer`` (one thread per
connection) rather than a web framework: no new dependency, and nothing a framework adds would
be faster, since every request waits for the model, which runs in the single worker thread of
:mod:`~docnmt_jax.serving.batching` (JAX releases the GIL while it computes, so the handler
threads keep answering).

Routes (JSON in and out; docs/serving.md):

* ``POST /translate`` ``{"sentences": [...]}`` (each sentence alone, no context) or
  ``{"documents": [[...], ...]}`` (each document whole) -> ``{"translations": ...}``;
* ``POST /documents/{id}/next`` ``{"sentence": "...", "request_id": "..."}`` ->
  ``{"translation", "index"}``: the next sentence of document ``id`` (created if unknown),
  with the context of its sentences so far; a retried ``request_id`` gets its stored answer;
* ``GET /documents/{id}`` -> its ``sentences`` and ``translations``; ``DELETE`` ends it;
* ``GET /health`` -> ``{"status", "model", "step", "worker", "queued", ...}``.

Bounds: at most ``max_connections`` connections (one more is answered 503 as it is
accepted); one request per connection (no keep-alive); the request line, headers and body
must arrive within ``read_timeout_s`` of the connection (a deadline for the whole request,
not per read), else 408 and the connection is closed. Access (:mod:`~docnmt_jax.serving.guard`):
Host allow-list and Origin check (403), bearer token (401). Every error is one line of JSON,
``{"error": "..."}`` (:mod:`~docnmt_jax.serving.requests` for the 400s of parsing); a
request carries text only: no option, path or config.
"""

from __future__ import annotations

import dataclasses
import io
import json
import socket
import sys
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from docnmt_jax.serving import guard
from docnmt_jax.serving.batching import Batcher, NextSentenceJob, TranslateJob
from docnmt_jax.serving.documents import DocumentCache, RequestError
from docnmt_jax.serving.requests import ID, content_length, next_request, translate_request

#: The most bytes of an oversized body read (and dropped) so that its client gets the 413.
DISCARD_LIMIT = 64 << 20
#: Connections over the cap answered 503 at once by short-lived threads; more are closed.
MAX_REFUSING = 16


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one request may ask (the command's flags of the same names)."""

    max_request_bytes: int = 1 << 20
    max_sentences: int = 256
    request_timeout_s: float = 300.0
    read_timeout_s: float = 10.0
    max_connections: int = 128


class DeadlineReader(io.RawIOBase):
    """A socket's reads, all of them due by ``deadline`` (``time.monotonic``): a client
    sending one byte a second still times out at the deadline."""

    def __init__(self, sock: socket.socket, deadline: float):
        super().__init__()
        self.sock, self.deadline, self.expired = sock, deadline, False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            self.expired = True
            raise TimeoutError("the request's deadline passed")
        self.sock.settimeout(remaining)
        try:
            return self.sock.recv_into(buffer)
        except TimeoutError:
            self.expired = True
            raise


def _busy_answer(max_connections: int) -> bytes:
    body = json.dumps({"error": f"server busy: {max_connections} connections (--max_connections)"})
    return (
        "HTTP/1.0 503 Service Unavailable\r\nContent-Type: application/json; charset=utf-8\r\n"
        f"Content-Length: {len(body) + 1}\r\nConnection: close\r\nRetry-After: 1\r\n\r\n"
        f"{body}\n"
    ).encode()


# ----------------------------------------------------------------------------------- server


class TranslationServer(ThreadingHTTPServer):
    """A ``ThreadingHTTPServer`` that hands translations to a started :class:`Batcher`;
    ``info``: what ``/health`` reports besides the status (model name, step); ``access``:
    who may talk to it (:class:`~docnmt_jax.serving.guard.Access`)."""

    daemon_threads = True
    request_queue_size = 128  # the listen backlog: a burst of clients is answered, not reset

    def __init__(
        self,
        address: tuple[str, int],
        batcher: Batcher,
        limits: Limits,
        info: dict[str, Any],
        access: guard.Access | None = None,
    ):
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.batcher = batcher
        self.limits = limits
        self.info = dict(info)
        self.access = access or guard.Access.for_address(address[0])
        self._slots = threading.BoundedSemaphore(limits.max_connections)
        self._refusing = threading.BoundedSemaphore(MAX_REFUSING)
        self._busy = _busy_answer(limits.max_connections)
        self.connections = 0
        self._count = threading.Lock()
        super().__init__(address, Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    def process_request(self, request: Any, client_address: Any) -> None:
        """A thread for the connection while under ``max_connections``; else a 503 now."""
        if not self._slots.acquire(blocking=False):
            self._refuse(request)
            return
        with self._count:
            self.connections += 1
        try:
            super().process_request(request, client_address)
        except Exception:
            self._release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release()

    def _release(self) -> None:
        with self._count:
            self.connections -= 1
        self._slots.release()

    def _refuse(self, sock: socket.socket) -> None:
        """Answers 503 on a short-lived thread (it lingers up to 2 s so that the client reads
        the answer rather than a reset); past :data:`MAX_REFUSING` of those, just closes."""
        if not self._refusing.acquire(blocking=False):
            self.shutdown_request(sock)
            return
        threading.Thread(target=self._answer_busy, args=(sock,), daemon=True).start()

    def _answer_busy(self, sock: socket.socket) -> None:
        try:
            sock.settimeout(1.0)
            sock.sendall(self._busy)
            sock.shutdown(socket.SHUT_WR)
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline and sock.recv(1 << 16):
                pass  # what the client sent, dropped until it closes
        except OSError:
            pass
        finally:
            sock.close()
            self._refusing.release()

    def close(self) -> None:
        """Stops serving: no new connection, queued requests answered 503, the socket closed
        (call :meth:`shutdown` first when ``serve_forever`` runs in another thread)."""
        self.batcher.stop()
        self.server_close()


class Handler(BaseHTTPRequestHandler):
    """Routes a request (module docstring); every answer is JSON, then the connection
    closes (HTTP/1.0, no keep-alive)."""

    server: TranslationServer
    server_version = "docnmt-serve"

    def setup(self) -> None:
        limits = self.server.limits
        self.timeout = limits.read_timeout_s
        super().setup()
        self.reader = DeadlineReader(self.connection, time.monotonic() + limits.read_timeout_s)
        self.rfile = io.BufferedReader(self.reader)
        self.request_version, self.command, self.requestline = "HTTP/1.0", "", ""
        self._answered = False

    def handle(self) -> None:
        """One request (no keep-alive); a request line or headers that did not arrive by
        the deadline are answered 408."""
        self.close_connection = True
        self.handle_one_request()
        if self.reader.expired and not self._answered:
            self._answer(408, {"error": "the request did not arrive in time (--read_timeout_s)"})

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
            guard.check(self.server.access, self.headers)
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
            return self._health()
        if parts == ["translate"]:
            self._allow(method, "POST")
            return 200, self._translate()
        if len(parts) in (2, 3) and parts[0] == "documents" and parts[-1] != "":
            doc_id = parts[1]
            if not ID.fullmatch(doc_id):
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

    def _health(self) -> tuple[int, dict[str, Any]]:
        """200 while the worker runs, else 503; the queue and the connections either way."""
        batcher = self.server.batcher
        state = batcher.health()
        ok = state["worker"] == "running"
        answer = {
            "status": "ok" if ok else "error",
            **self.server.info,
            **state,
            "documents": len(batcher.cache),
            "connections": self.server.connections,
        }
        return (200 if ok else 503), answer

    def _translate(self) -> dict[str, Any]:
        limits = self.server.limits
        documents, sentences = translate_request(self._read_json(), limits.max_sentences)
        job = self.server.batcher.submit(TranslateJob(documents))
        translations = job.wait(limits.request_timeout_s)
        if sentences:
            translations = [t[0] for t in translations]
        return {"translations": translations}

    def _next(self, doc_id: str) -> dict[str, Any]:
        sentence, request_id = next_request(self._read_json())
        batcher = self.server.batcher
        if request_id:  # a retry of a committed request: its answer, not a second commit
            stored = batcher.cache.answer(doc_id, request_id, sentence)
            if stored is not None:
                return stored.as_json()
        job = batcher.submit(NextSentenceJob(doc_id, sentence, request_id))
        return job.wait(self.server.limits.request_timeout_s)

    def _document(self, method: str, doc_id: str) -> dict[str, Any]:
        cache = self.server.batcher.cache
        if method == "DELETE":
            if not cache.delete(doc_id):
                raise RequestError(404, f"unknown document {doc_id!r}")
            return {"deleted": doc_id}
        context = cache.get(doc_id)
        if context is None:
            raise RequestError(404, f"unknown document {doc_id!r} (never started, or ended)")
        return {
            "document": doc_id,
            "sentences": context.sources,
            "translations": context.translations,
        }

    # -------------------------------------------------------------------------------- bodies

    def _read_json(self) -> Any:
        limit = self.server.limits.max_request_bytes
        length = content_length(self.headers)
        if length is None:
            raise RequestError(411, "a request body needs a Content-Length header")
        if length > limit:
            self._discard()
            raise RequestError(
                413, f"a body of {length} bytes; the limit is {limit} (--max_request_bytes)"
            )
        self._body_read = True
        try:
            body = self.rfile.read(length)
        except OSError:  # the deadline passed, or the client went away
            raise RequestError(408, "the body did not arrive in time (--read_timeout_s)") from None
        if len(body) < length:
            raise RequestError(400, f"the body ended after {len(body)} of {length} bytes")
        try:
            return json.loads(body)
        except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
            raise RequestError(400, f"malformed JSON: {e}") from None

    def _discard(self) -> None:
        """Reads and drops a body that will not be parsed (up to :data:`DISCARD_LIMIT`, by the
        request's deadline), so that its client, maybe still sending, gets the answer rather
        than a reset connection."""
        self._body_read = True
        try:
            left = min(content_length(self.headers) or 0, DISCARD_LIMIT)
        except RequestError:
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
        self._answered = True
        self.close_connection = True
        data = json.dumps(answer, ensure_ascii=False).encode("utf-8") + b"\n"
        try:
            self.connection.settimeout(self.server.limits.read_timeout_s)
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Connection", "close")
            if status == 405:
                self.send_header("Allow", ", ".join(getattr(self, "_allowed", ())))
            if status == 401:
                self.send_header("WWW-Authenticate", "Bearer")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
        except OSError:  # the client went away, or reads too slowly
            pass


def make_server(
    model: Any,
    search: dict[str, Any],
    host: str = "127.0.0.1",
    port: int = 0,
    limits: Limits | None = None,
    info: dict[str, Any] | None = None,
    access: guard.Access | None = None,
    **batching: Any,
) -> TranslationServer:
    """A bound server (not yet serving: call ``serve_forever``) whose started
    :class:`Batcher` runs ``model`` with ``search``; ``access``: who may talk to it (default:
    the bound address and localhost, no token); ``batching``: the Batcher's limits and
    ``max_documents`` of its cache."""
    cache = DocumentCache(batching.pop("max_documents", 1024))
    batcher = Batcher(model, search, cache, **batching)
    server = TranslationServer((host, port), batcher, limits or Limits(), info or {}, access)
    batcher.start()
    return server
