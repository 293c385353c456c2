"""Load test of a running translation server (``docnmt-serve``): latency and throughput.

    python launch/serve_load_test.py --url http://127.0.0.1:8000 \\
        [--requests 200 --concurrency 8 --next_fraction 0.5 --sentences_per_request 1]
        [--warmup 1] [--large_sentences 256] [--token_file FILE]

Fires ``--requests`` requests from ``--concurrency`` client threads, each sending its next
request as soon as its last is answered: a ``--next_fraction`` of them ``POST
/documents/load-test-C-K/next`` (client ``C``'s documents of ``--document_sentences``
sentences, one after the other), the rest ``POST /translate`` with ``--sentences_per_request``
sentences. Sentences come from ``--sentences_file`` (one a line) or a built-in list. Prints one
JSON line: the requests, their status counts, ``p50_ms``, ``p95_ms``, ``mean_ms``, ``max_ms``
of the answered ones (status 200), ``seconds`` and ``requests_per_s`` (all requests). The
documents it made are deleted at the end. ``--warmup N`` runs the same workload ``N`` times
untimed first: a fresh server compiles its search once per batch shape (seconds each), which
the measured run should not count. A server that does not answer ``/health`` is a one-line
error.

``--large_sentences N`` adds one more client that sends ``POST /translate`` jobs of ``N``
sentences one after the other while the others run: the summary's latencies are still those
of the other (small) requests, and ``large`` gives the large jobs' count and latencies, so
that a small request's wait beside a large job shows. ``--token_file`` sends the server's
bearer token.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import math
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

from docnmt_jax import cli
from docnmt_jax.errors import UserError

#: Sentences sent when no ``--sentences_file`` is given.
SENTENCES = (
    "The committee met on Tuesday to discuss the budget.",
    "She said it would be ready by the end of the week.",
    "They had never seen anything like it before.",
    "The results were published in a short report.",
    "He put the book back on the shelf and left.",
    "Nobody expected the meeting to last that long.",
    "It was raining when we arrived at the station.",
    "Their proposal was accepted after a brief debate.",
)


def _parser() -> argparse.ArgumentParser:
    p = cli.ArgumentParser(
        prog="serve_load_test.py",
        description=__doc__,
        formatter_class=argparse.RawTextHelpFormatter,
    )
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the server's base URL")
    p.add_argument("--requests", type=int, default=200, help="requests in all")
    p.add_argument("--concurrency", type=int, default=8, help="client threads")
    p.add_argument(
        "--next_fraction", type=float, default=0.5, help="share of /documents/ID/next requests"
    )
    p.add_argument(
        "--sentences_per_request", type=int, default=1, help="sentences of a /translate request"
    )
    p.add_argument(
        "--document_sentences", type=int, default=8, help="sentences of a /next document"
    )
    p.add_argument("--sentences_file", default="", help="sentences to send, one a line")
    p.add_argument("--timeout_s", type=float, default=120.0, help="one request's time limit")
    p.add_argument(
        "--warmup", type=int, default=0, help="untimed runs of the workload first (compilations)"
    )
    p.add_argument(
        "--large_sentences",
        type=int,
        default=0,
        help="one more client sending /translate jobs of this many sentences meanwhile",
    )
    p.add_argument("--token_file", default="", help="the server's bearer token")
    return p


#: The headers every request sends (``Authorization`` once ``--token_file`` is read).
HEADERS: dict[str, str] = {"Content-Type": "application/json"}


def call(
    url: str, method: str = "GET", body: Any = None, timeout_s: float = 60.0
) -> tuple[int, dict]:
    """``(status, JSON answer)`` of one request; a refused connection or a timeout is status
    0 with the reason as the error."""
    data = None if body is None else json.dumps(body).encode("utf-8")
    request = urllib.request.Request(url, data=data, method=method, headers=HEADERS)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        text = e.read()
        try:
            return e.code, json.loads(text)
        except ValueError:
            return e.code, {"error": text.decode("utf-8", "replace")}
    except (OSError, ValueError) as e:  # URLError, timeouts, a reset connection
        return 0, {"error": str(getattr(e, "reason", e))}


def percentile(values: Sequence[float], p: float) -> float:
    """The nearest-rank ``p``-th percentile of ``values`` (non-empty)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def _plan(args: argparse.Namespace, sentences: Sequence[str]) -> list[list[tuple[str, Any]]]:
    """Each client's requests ``(path, body)``, in the order it sends them."""
    texts = itertools.cycle(sentences)
    plans: list[list[tuple[str, Any]]] = [[] for _ in range(args.concurrency)]
    next_sent = [0] * args.concurrency
    for i in range(args.requests):
        client = i % args.concurrency
        if math.floor((i + 1) * args.next_fraction) > math.floor(i * args.next_fraction):
            k = next_sent[client]
            path = f"/documents/load-test-{client}-{k // args.document_sentences}/next"
            plans[client].append((path, {"sentence": next(texts)}))
            next_sent[client] += 1
        else:
            body = {"sentences": [next(texts) for _ in range(args.sentences_per_request)]}
            plans[client].append(("/translate", body))
    return plans


def latency_summary(latencies: Sequence[float]) -> dict[str, float]:
    """``p50_ms``, ``p95_ms``, ``mean_ms``, ``max_ms`` of ``latencies`` (ms; empty: {})."""
    if not latencies:
        return {}
    return {
        "p50_ms": round(percentile(latencies, 50), 1),
        "p95_ms": round(percentile(latencies, 95), 1),
        "mean_ms": round(sum(latencies) / len(latencies), 1),
        "max_ms": round(max(latencies), 1),
    }


def _large_jobs(
    base: str, args: argparse.Namespace, sentences: Sequence[str], stop: threading.Event
) -> list[float]:
    """Sends ``--large_sentences`` jobs one after the other until ``stop``; their latencies
    (ms) of those answered 200."""
    texts = itertools.cycle(sentences)
    body = {"sentences": [next(texts) for _ in range(args.large_sentences)]}
    latencies = []
    while not stop.is_set():
        start = time.perf_counter()
        status, _ = call(base + "/translate", "POST", body, args.timeout_s)
        if status == 200:
            latencies.append(1000 * (time.perf_counter() - start))
        elif status == 0:
            break
    return latencies


def load_test(args: argparse.Namespace, sentences: Sequence[str]) -> dict[str, Any]:
    """Runs the load test (module docstring) and returns its summary."""
    base = args.url.rstrip("/")
    plans = _plan(args, sentences)
    latencies: list[float] = []
    statuses: collections.Counter[int] = collections.Counter()
    lock = threading.Lock()
    stop, large = threading.Event(), []
    if args.large_sentences:
        worker = threading.Thread(
            target=lambda: large.extend(_large_jobs(base, args, sentences, stop))
        )
        worker.start()
        time.sleep(0.5)  # the first large job is under way before the small requests start

    def client(plan: list[tuple[str, Any]]) -> None:
        for path, body in plan:
            start = time.perf_counter()
            status, _ = call(base + path, "POST", body, args.timeout_s)
            elapsed = 1000 * (time.perf_counter() - start)
            with lock:
                statuses[status] += 1
                if status == 200:
                    latencies.append(elapsed)

    threads = [threading.Thread(target=client, args=(plan,)) for plan in plans]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - start
    if args.large_sentences:
        stop.set()
        worker.join()
    documents = {path.rsplit("/", 1)[0] for plan in plans for path, _ in plan if "/next" in path}
    for document in sorted(documents):
        call(base + document, "DELETE", timeout_s=args.timeout_s)
    summary: dict[str, Any] = {
        "requests": args.requests,
        "concurrency": args.concurrency,
        "ok": statuses[200],
        "status_counts": {str(k): v for k, v in sorted(statuses.items())},
        "seconds": round(seconds, 3),
        "requests_per_s": round(args.requests / seconds, 2),
    }
    summary.update(latency_summary(latencies))
    if args.large_sentences:
        summary["large"] = {"sentences": args.large_sentences, "answered": len(large)}
        summary["large"].update(latency_summary(large))
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    for name in ("requests", "concurrency", "sentences_per_request", "document_sentences"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name}={getattr(args, name)}: must be at least 1")
    if args.large_sentences < 0:
        raise UserError(f"--large_sentences={args.large_sentences}: must be >= 0")
    if args.token_file:
        from docnmt_jax.serving.guard import read_token

        HEADERS["Authorization"] = f"Bearer {read_token(args.token_file)}"
    if args.warmup < 0:
        raise UserError(f"--warmup={args.warmup}: must be >= 0")
    if not 0 <= args.next_fraction <= 1:
        raise UserError(f"--next_fraction={args.next_fraction}: must be between 0 and 1")
    sentences: Sequence[str] = SENTENCES
    if args.sentences_file:
        with open(args.sentences_file, encoding="utf-8") as f:
            sentences = [line.strip() for line in f if line.strip()]
        if not sentences:
            raise UserError(f"{args.sentences_file}: no sentences")
    status, answer = call(args.url.rstrip("/") + "/health", timeout_s=args.timeout_s)
    if status != 200:
        raise UserError(f"{args.url}/health: {answer.get('error', status)}")
    for _ in range(args.warmup):
        load_test(args, sentences)
    print(json.dumps(load_test(args, sentences)), flush=True)
    return 0


def run() -> None:
    """``python launch/serve_load_test.py``."""
    cli.run_argparse(main)


if __name__ == "__main__":
    run()
