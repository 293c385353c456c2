"""Serve a trained run over HTTP: JSON in and out, concurrent requests batched.

    docnmt-serve --workdir runs/NAME [--host 127.0.0.1 --port 8000]
        [--beam 5 --alpha 0.6 --checkpoint best|latest|averaged|STEP --batch_tokens 4096]
        [--max_batch_wait_ms 5 --max_batch_sentences 64 --max_queue 64]
        [--max_request_bytes 1048576 --max_sentences 256]
        [--max_documents 1024 --max_document_sentences 1000 --request_timeout_s 300]
        [--max_connections 128 --read_timeout_s 10]
        [--allowed_hosts NAME,... --token_file FILE --insecure]

Endpoints (docs/serving.md): ``POST /translate`` ``{"sentences": [...]}`` or ``{"documents":
[[...], ...]}``; ``POST /documents/ID/next`` ``{"sentence": "..."}`` (the next sentence of a
document, its context kept by the server); ``GET``/``DELETE /documents/ID``; ``GET /health``.
Once the model is loaded and the port bound, one line goes to stdout: ``serving RUN (model M,
step S) on http://HOST:PORT`` (``--port 0`` picks a free port). SIGTERM or SIGINT (Ctrl-C)
stops it: queued requests are answered 503, the running batch finishes.

The standard library's ``ThreadingHTTPServer`` with a batching worker thread
(:mod:`docnmt_jax.serving`): no new dependency; the model call is the bottleneck and runs in
one worker thread (JAX releases the GIL while it computes), so a faster web framework would
gain nothing. The search options are the command's flags; a request carries only text. The
server listens on 127.0.0.1 unless ``--host`` says otherwise; it checks every request's Host
and Origin (403) and, with ``--token_file``, its bearer token (401). Binding an address other
than loopback without a token is refused unless ``--insecure``.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
from collections.abc import Sequence
from typing import Any

from docnmt_jax import cli
from docnmt_jax.errors import RunNotFoundError, UserError


def _parser() -> argparse.ArgumentParser:
    p = cli.ArgumentParser(
        prog="serve.py", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument("--workdir", required=True, help="the training run (or a release)")
    p.add_argument("--checkpoint", default="best", help="best, latest, averaged or a step number")
    p.add_argument("--beam", type=int, default=5, help="beam size; 1 = greedy")
    p.add_argument("--alpha", type=float, default=0.6, help="length penalty exponent")
    p.add_argument("--batch_tokens", type=int, default=4096, help="padded source tokens per batch")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=8000, help="port; 0 picks a free one")
    p.add_argument(
        "--max_batch_wait_ms",
        type=float,
        default=5.0,
        help="how long the worker gathers requests into one batch after the first",
    )
    p.add_argument(
        "--max_batch_sentences", type=int, default=64, help="a batch stops gathering at this size"
    )
    p.add_argument(
        "--max_queue", type=int, default=64, help="requests waiting at most; more are 503"
    )
    p.add_argument(
        "--max_request_bytes", type=int, default=1 << 20, help="largest request body (413)"
    )
    p.add_argument("--max_sentences", type=int, default=256, help="sentences per request (413)")
    p.add_argument(
        "--max_documents",
        type=int,
        default=1024,
        help="documents kept for /documents/ID/next; the least recently used is evicted",
    )
    p.add_argument(
        "--max_document_sentences",
        type=int,
        default=1000,
        help="sentences one /documents/ID/next document may hold (413)",
    )
    p.add_argument(
        "--request_timeout_s",
        type=float,
        default=300.0,
        help="a request waiting longer for its translation is answered 504 (and cancelled)",
    )
    p.add_argument(
        "--max_connections",
        type=int,
        default=128,
        help="open connections at most; one more is answered 503 as it is accepted",
    )
    p.add_argument(
        "--read_timeout_s",
        type=float,
        default=10.0,
        help="a request's line, headers and body must arrive within this (408)",
    )
    p.add_argument(
        "--allowed_hosts",
        default="",
        help="Host names allowed besides the bound address and localhost (comma-separated; *: any)",
    )
    p.add_argument("--token_file", default="", help="a file holding the bearer token to require")
    p.add_argument(
        "--insecure",
        action="store_true",
        help="serve a non-loopback --host without a token (behind a proxy that authenticates)",
    )
    return p


def _check(args: argparse.Namespace) -> None:
    positive = (
        "batch_tokens",
        "max_batch_sentences",
        "max_queue",
        "max_request_bytes",
        "max_sentences",
        "max_documents",
        "max_document_sentences",
        "request_timeout_s",
        "max_connections",
        "read_timeout_s",
    )
    for name in positive:
        if getattr(args, name) <= 0:
            raise UserError(f"--{name}={getattr(args, name)}: must be positive")
    if args.max_batch_wait_ms < 0:
        raise UserError(f"--max_batch_wait_ms={args.max_batch_wait_ms}: must be >= 0")
    if not 0 <= args.port < 65536:
        raise UserError(f"--port={args.port}: must be between 0 and 65535")
    if not os.path.isdir(args.workdir):
        raise RunNotFoundError(f"--workdir={args.workdir}: no such directory")


def _access(args: argparse.Namespace) -> Any:
    """Who may talk to the server: the Host allow-list and the token (``--token_file``); a
    non-loopback ``--host`` without a token is a one-line error unless ``--insecure``."""
    from docnmt_jax.serving import guard

    token = guard.read_token(args.token_file) if args.token_file else ""
    guard.check_exposure(args.host, token, args.insecure)
    return guard.Access.for_address(args.host, args.allowed_hosts, token)


def serve_until_signal(server) -> None:
    """Runs ``server`` until SIGTERM or SIGINT, then shuts it down cleanly."""
    stop = threading.Event()
    previous = {
        signum: signal.signal(signum, lambda *_: stop.set())
        for signum in (signal.SIGTERM, signal.SIGINT)
    }
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2})
    thread.start()
    try:
        while not stop.wait(0.5) and thread.is_alive():
            pass
    finally:
        server.shutdown()
        thread.join()
        server.close()
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    _check(args)
    access = _access(args)
    from absl import logging

    from docnmt_jax import api
    from docnmt_jax.serving.server import Limits, make_server

    logging.set_verbosity(logging.WARNING)
    search = {"beam": args.beam, "alpha": args.alpha}
    api.search_config(**search)  # a bad value: one line before the model loads
    model = api.load(args.workdir, checkpoint=args.checkpoint, batch_tokens=args.batch_tokens)
    name = model.config.get("model", {}).get("name", "?")
    limits = Limits(
        args.max_request_bytes,
        args.max_sentences,
        args.request_timeout_s,
        args.read_timeout_s,
        args.max_connections,
    )
    try:
        server = make_server(
            model,
            search,
            args.host,
            args.port,
            limits,
            info={"model": name, "step": int(model.step)},
            access=access,
            max_queue=args.max_queue,
            max_batch_wait_s=args.max_batch_wait_ms / 1000,
            max_batch_sentences=args.max_batch_sentences,
            max_document_sentences=args.max_document_sentences,
            max_documents=args.max_documents,
        )
    except OSError as e:  # the port is taken, the address is not this machine's
        raise UserError(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}") from None
    print(f"serving {args.workdir} (model {name}, step {model.step}) on {server.url}", flush=True)
    serve_until_signal(server)
    print("stopped", flush=True)
    return 0


def run() -> None:
    """The ``docnmt-serve`` command (``python launch/serve.py``)."""
    cli.run_argparse(main)


if __name__ == "__main__":
    run()
