"""docnmt-serve exposed: bounds, exactly-once /next, access checks, fair batching, strict
parsing (docs/serving.md). Each test runs a real server in this process on 127.0.0.1 (port 0) over
a fake model whose answers are known, and speaks HTTP to it with http.client or a raw socket;
every loop is bounded in count and time.
"""

import http.client
import json
import socket
import threading
import time

import pytest

from docnmt_jax import cli
from docnmt_jax.commands import serve as serve_command
from docnmt_jax.serving import batching, guard, server

TOKEN = "0123456789abcdef0123456789abcdef"


class Fake:
    """Known answers (``T(s)``; ``N:previous|...>s`` for the ``N``-th next sentence),
    ``delay_s`` a call; ``"boom"`` raises a bug, ``"die"`` a BaseException that kills the
    worker. Records every call."""

    def __init__(self, delay_s: float = 0.0):
        self.delay_s = delay_s
        self.calls: list[tuple[str, list]] = []
        self.started = threading.Event()

    def translate(self, documents, **search):
        self.calls.append(("translate", [list(d) for d in documents]))
        self.started.set()
        time.sleep(self.delay_s)
        self._check([s for d in documents for s in d])
        return [[f"T({s})" for s in d] for d in documents]

    def translate_next(self, contexts, sentences, **search):
        self.calls.append(("next", list(sentences)))
        self.started.set()
        time.sleep(self.delay_s)
        self._check(sentences)
        return [
            f"{len(c.sources)}:{'|'.join(c.sources)}>{s}"
            for c, s in zip(contexts, sentences, strict=True)
        ]

    @staticmethod
    def _check(sentences):
        if "boom" in sentences:
            raise RuntimeError("a bug")
        if "die" in sentences:
            raise SystemExit("the worker dies")


class Running:
    """A server on a :class:`Fake` model, serving in a thread until closed."""

    def __init__(self, model=None, limits=None, access=None, **batching_limits):
        self.model = model or Fake()
        batching_limits.setdefault("max_batch_wait_s", 0.001)
        self.httpd = server.make_server(
            self.model, {"beam": 1}, limits=limits, access=access, **batching_limits
        )
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.thread.start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.close()

    def call(self, method, path, body=None, headers=None, timeout=30):
        """``(status, JSON answer, response headers)`` over http.client."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            data = body if isinstance(body, bytes) or body is None else json.dumps(body)
            conn.request(method, path, body=data, headers=headers or {})
            response = conn.getresponse()
            return response.status, json.loads(response.read()), dict(response.getheaders())
        finally:
            conn.close()

    def raw(self, data: bytes, timeout=10.0) -> bytes:
        """Sends ``data`` on a fresh connection and reads until the server closes it."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as sock:
            sock.sendall(data)
            return read_all(sock, timeout)


def read_all(sock: socket.socket, timeout: float) -> bytes:
    chunks, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        chunk = sock.recv(65536)
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/") else 0


def wait_until(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


# ------------------------------------------------------------------------- 1. bounds


def test_connections_over_the_cap_are_503_at_accept():
    with Running(limits=server.Limits(max_connections=2, read_timeout_s=5)) as srv:
        idle = [socket.create_connection(("127.0.0.1", srv.port), timeout=5) for _ in range(2)]
        try:
            assert wait_until(lambda: srv.httpd.connections == 2)
            status, answer, headers = srv.call("GET", "/health")
            assert status == 503 and "--max_connections" in answer["error"]
            assert headers["Connection"] == "close"
        finally:
            for sock in idle:
                sock.close()
        assert wait_until(lambda: srv.httpd.connections == 0)
        status, answer, _ = srv.call("GET", "/health")
        assert status == 200 and answer["connections"] == 1


def test_a_request_has_one_deadline_for_headers_and_body():
    """A client sending a byte every 0.2 s is cut off at the 1 s deadline, not per read."""
    with Running(limits=server.Limits(read_timeout_s=1.0)) as srv:
        for head, drip in [
            (b"POST /translate HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Length: 60\r\n\r\n", b"{"),
            (b"", b"G"),  # the request line itself, one byte at a time
        ]:
            with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as sock:
                start = time.monotonic()
                sock.sendall(head)
                for _ in range(25):  # 5 s of drip at most
                    try:
                        sock.sendall(drip)
                    except OSError:  # closed by the server
                        break
                    sock.settimeout(0.2)
                    try:
                        if sock.recv(65536, socket.MSG_PEEK):
                            break  # the answer arrived
                    except TimeoutError:
                        continue
                sock.settimeout(10)
                answer = read_all(sock, 10)
                elapsed = time.monotonic() - start
            assert status_of(answer) == 408 and b"--read_timeout_s" in answer, answer
            assert 0.9 < elapsed < 3.0, elapsed


def test_no_keep_alive_one_request_per_connection():
    with Running() as srv:
        request = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: keep-alive\r\n\r\n"
        answer = srv.raw(request * 2)  # a second request on the same connection is not read
        assert answer.count(b"HTTP/1.0 200") == 1 and b"Connection: close" in answer


# ----------------------------------------------------------- 2. exactly-once /next


def test_a_timed_out_next_is_cancelled_and_its_retry_commits_once():
    model = Fake(delay_s=0.6)
    with Running(model, limits=server.Limits(request_timeout_s=0.2)) as srv:
        body = {"sentence": "s1", "request_id": "r-1"}
        status, answer, _ = srv.call("POST", "/documents/d/next", body)
        assert status == 504 and "nothing of it committed" in answer["error"]

        def idle():
            health = srv.call("GET", "/health")[1]
            return (health["queued"], health["cycle_s"]) == (0, 0.0)

        assert wait_until(idle, 5)
        assert model.calls == [("next", ["s1"])]  # translated, then not committed
        assert srv.call("GET", "/documents/d")[0] == 404
        model.delay_s = 0.0
        first = srv.call("POST", "/documents/d/next", body)
        again = srv.call("POST", "/documents/d/next", body)  # a retry: the stored answer
        assert first[:2] == again[:2] == (200, {"translation": "0:>s1", "index": 0})
        assert len(model.calls) == 2
        status, answer, _ = srv.call("POST", "/documents/d/next", {**body, "sentence": "s2"})
        assert status == 409 and "'r-1'" in answer["error"]
        status, document, _ = srv.call("GET", "/documents/d")
        assert document["sentences"] == ["s1"]


def test_a_retry_while_the_first_is_running_gets_the_same_answer():
    model = Fake(delay_s=0.4)
    with Running(model) as srv:
        answers = []

        def send():
            answers.append(
                srv.call("POST", "/documents/d/next", {"sentence": "a", "request_id": "x"})
            )

        first = threading.Thread(target=send)
        first.start()
        assert model.started.wait(10)
        send()  # queued behind the first of its document, then answered from its commit
        first.join(30)
        assert [a[:2] for a in answers] == [(200, {"translation": "0:>a", "index": 0})] * 2
        assert model.calls == [("next", ["a"])]
        assert srv.call("GET", "/documents/d")[1]["sentences"] == ["a"]


# ------------------------------------------------------------------------- 3. access


@pytest.mark.parametrize(
    "headers, status",
    [
        ({"Host": "evil.example"}, 403),
        ({"Host": "evil.example:80"}, 403),
        ({"Host": "localhost:1"}, 200),
        ({"Origin": "http://evil.example"}, 403),
        ({"Origin": "null"}, 403),
        ({"Sec-Fetch-Site": "cross-site"}, 403),
        ({"Origin": "http://127.0.0.1:8000"}, 200),
    ],
)
def test_foreign_host_or_origin_is_403(headers, status):
    with Running() as srv:
        body = b'{"sentence": "written"}'
        sent = {"Content-Type": "text/plain", **headers}  # a form a page may post cross-site
        got, answer, _ = srv.call("POST", "/documents/x/next", body, sent)
        assert got == status, answer
        expected = 200 if status == 200 else 404
        assert srv.call("GET", "/documents/x")[0] == expected  # a 403 wrote nothing


def test_a_bearer_token_is_required_when_set():
    with Running(access=guard.Access.for_address("127.0.0.1", token=TOKEN)) as srv:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
            status, answer, sent = srv.call("GET", "/health", headers=headers)
            assert status == 401 and sent["WWW-Authenticate"] == "Bearer", answer
        auth = {"Authorization": f"Bearer {TOKEN}"}
        assert srv.call("GET", "/health", headers=auth)[0] == 200


@pytest.mark.parametrize(
    "flags, fragment",
    [
        (["--host", "0.0.0.0"], "--host=0.0.0.0 serves other machines: give --token_file"),
        (["--token_file", "/nonexistent/token"], "--token_file=/nonexistent/token"),
        (["--max_connections", "0"], "--max_connections=0"),
    ],
)
def test_exposing_the_server_is_refused_in_one_line(tmp_path, capsys, flags, fragment):
    with pytest.raises(SystemExit) as exit_info:  # the command's boundary, in this process
        cli.run_argparse(serve_command.main, ["--workdir", str(tmp_path), *flags])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith("serve.py: error: ") and fragment in err
    assert guard.is_loopback("::1") and guard.is_loopback("localhost")
    assert not guard.is_loopback("10.0.0.1") and not guard.is_loopback("example.org")
    guard.check_exposure("0.0.0.0", "", insecure=True)  # --insecure: allowed


# ------------------------------------------------------------------ 4. fair batching


def test_a_large_job_is_split_and_interleaved_with_small_ones():
    big = batching.TranslateJob([[f"b{i}"] for i in range(256)])
    small = batching.TranslateJob([["s"]])
    pieces, _ = batching.plan_cycle([big, small], 64)
    assert pieces == [(big, i) for i in range(32)] + [(small, 0)]  # each its share of 64
    pieces, _ = batching.plan_cycle([big], 64)  # alone: the whole cycle
    assert pieces == [(big, i) for i in range(32, 96)]
    model = Fake(delay_s=0.05)
    with Running(model, max_batch_sentences=32) as srv:
        done = {}

        def send(name, sentences):
            done[name] = srv.call("POST", "/translate", {"sentences": sentences})
            done[name + "_at"] = len(model.calls)

        large = threading.Thread(target=send, args=("big", [f"b{i}" for i in range(256)]))
        large.start()
        assert model.started.wait(10)
        send("small", ["s"])
        large.join(60)
        assert done["small"][1] == {"translations": ["T(s)"]}
        assert done["big"][1] == {"translations": [f"T(b{i})" for i in range(256)]}
        assert done["small_at"] <= 3 < done["big_at"]  # the small one is not behind it
        assert all(sum(len(d) for d in docs) <= 32 for _, docs in model.calls)


def test_a_failed_batch_is_bisected_not_retried_one_by_one():
    model = Fake()
    batcher = batching.Batcher(model, {}, batching.DocumentCache(4))
    jobs = [batching.TranslateJob([[s]]) for s in ("a", "b", "c", "boom", "e", "f", "g", "h")]
    batcher.run_cycle(jobs)
    assert len(model.calls) == 7  # 8 jobs, one bad: 1 + 2 log2 8 calls, not 1 + 8
    for job, sentence in zip(jobs, "abc?efgh", strict=True):
        if sentence == "?":
            with pytest.raises(batching.RequestError) as error:
                job.wait(1)
            assert error.value.status == 500
        else:
            assert job.wait(1) == [[f"T({sentence})"]]


# --------------------------------------------------------------- 5. strict parsing


@pytest.mark.parametrize(
    "headers, fragment",
    [
        (b"Content-Length: 1_9\r\n", "digits only"),
        (b"Content-Length: +19\r\n", "digits only"),
        (b"Content-Length: 19\r\nContent-Length: 20\r\n", "2 Content-Length headers"),
        (b"Content-Length: 19\r\nContent-Length: 19\r\n", "2 Content-Length headers"),
        (b"Transfer-Encoding: chunked\r\nContent-Length: 19\r\n", "Transfer-Encoding"),
    ],
)
def test_content_length_is_one_plain_number(headers, fragment):
    with Running() as srv:
        request = b"POST /translate HTTP/1.0\r\nHost: 127.0.0.1\r\n" + headers + b"\r\n"
        answer = srv.raw(request + b'{"sentences": ["a"]}')
        assert status_of(answer) == 400 and fragment.encode() in answer, answer
        assert srv.model.calls == []


def test_unencodable_text_is_400_naming_the_field():
    with Running() as srv:
        for path, body, field in [
            ("/translate", b'{"sentences": ["ok", "\\ud800"]}', "sentences[1]"),
            ("/translate", b'{"documents": [["\\udfff x"]]}', "documents[0][0]"),
            ("/documents/d/next", b'{"sentence": "a\\udc00"}', "sentence"),
        ]:
            status, answer, _ = srv.call("POST", path, body)
            assert status == 400 and answer["error"].startswith(f"{field}: not valid Unicode")
        assert srv.model.calls == []


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_health_reports_the_worker_and_a_dead_one():
    with Running(Fake(delay_s=0.3)) as srv:
        status, answer, _ = srv.call("GET", "/health")
        assert status == 200 and (answer["worker"], answer["queued"]) == ("running", 0)
        slow = threading.Thread(target=srv.call, args=("POST", "/translate", {"sentences": ["a"]}))
        slow.start()
        assert srv.model.started.wait(10)
        time.sleep(0.05)
        busy = srv.call("GET", "/health")[1]
        assert (busy["queued"], busy["queued_sentences"]) == (1, 0) and busy["cycle_s"] > 0
        slow.join(30)
        status, answer, _ = srv.call("POST", "/translate", {"sentences": ["die"]})
        assert status == 500 and "worker stopped" in answer["error"]
        status, answer, _ = srv.call("GET", "/health")
        assert status == 503 and (answer["status"], answer["worker"]) == ("error", "stopped")
        status, answer, _ = srv.call("POST", "/translate", {"sentences": ["a"]})
        assert status == 503 and "worker stopped" in answer["error"]


def test_an_evicted_document_is_409_never_a_restart():
    with Running(max_documents=1) as srv:
        for doc in ("a", "b"):  # b evicts a
            assert srv.call("POST", f"/documents/{doc}/next", {"sentence": "s"})[0] == 200
        for method, path, body in [
            ("POST", "/documents/a/next", {"sentence": "t"}),
            ("GET", "/documents/a", None),
        ]:
            status, answer, _ = srv.call(method, path, body)
            assert status == 409 and "document 'a' was evicted" in answer["error"]
        assert srv.call("DELETE", "/documents/a")[0] == 200  # forgotten: it may start again
        status, answer, _ = srv.call("POST", "/documents/a/next", {"sentence": "t"})
        assert (status, answer["index"]) == (200, 0)


def test_the_load_test_measures_small_requests_beside_a_large_job(tmp_path, capsys):
    from docnmt_jax.commands import serve_load_test

    token = tmp_path / "token"
    token.write_text(TOKEN + "\n", encoding="utf-8")
    access = guard.Access.for_address("127.0.0.1", token=TOKEN)
    with Running(Fake(delay_s=0.01), access=access) as srv:
        url = f"--url=http://127.0.0.1:{srv.port}"
        flags = ["--requests=8", "--concurrency=2", "--large_sentences=64"]
        try:
            assert serve_load_test.main([url, *flags, f"--token_file={token}"]) == 0
        finally:
            serve_load_test.HEADERS.pop("Authorization", None)
        summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert summary["status_counts"] == {"200": 8} and summary["large"]["answered"] >= 1
        assert summary["large"]["sentences"] == 64 and summary["p50_ms"] <= summary["p95_ms"]
        assert any(len(docs) == 64 for kind, docs in srv.model.calls if kind == "translate")
