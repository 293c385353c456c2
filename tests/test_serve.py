"""docnmt-serve: the HTTP translation server, its batching worker and its load test.

The server is the installed command in a subprocess on 127.0.0.1 (port 0), spoken to with
urllib; its answers are checked against the Python API translating the same text in this
process (the 1-step run's output is garbage, but deterministic). The batcher's own rules
(one model call per cycle, a document's sentences serialized, a failure isolated, LRU eviction)
are checked against a fake model whose answers are known.
"""

import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

import pytest
from conftest import ROOT

from docnmt_jax import api
from docnmt_jax.commands import serve as serve_command
from docnmt_jax.commands.serve_load_test import call, percentile
from docnmt_jax.errors import UserError
from docnmt_jax.serving import batching, server

SERVE = os.path.join(os.path.dirname(sys.executable), "docnmt-serve")
TIMEOUT = 120  # seconds for any one request: no test may hang
# Words of the synthetic corpus, 12 tokens each: one length bucket, few compiled shapes.
SENTENCES = [
    "pibu moroni",
    "ruka nipisa",
    "sasinu dona",
    "mipini dona",
    "didoki nanu",
    "roti sugara",
    "tonogu tupo",
    "bamo tonogu",
]


# ------------------------------------------------------------------------------ helpers


class Served:
    """A ``docnmt-serve`` subprocess and its URL (from the line it prints)."""

    def __init__(self, workdir: str, *flags: str):
        self.stderr = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(
            [SERVE, "--workdir", workdir, "--port", "0", "--beam", "1", *flags],
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            cwd=ROOT,
        )
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.url = ""

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def wait_ready(self, timeout: float = 300) -> str:
        deadline = time.monotonic() + timeout
        while not self.url:
            line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            if line is None:
                self.stderr.seek(0)
                pytest.fail(f"docnmt-serve exited: {self.stderr.read()[-3000:]}")
            if line.startswith("serving "):
                self.first_line = line.strip()
                self.url = line.split(" on ")[-1].strip()
        return self.url

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()  # a stop that hangs fails the test, not the session
            raise
        finally:
            self.stderr.close()


def request(url: str, method: str = "GET", body=None, raw: bytes | None = None):
    """``(status, JSON answer, raw answer text)``; ``raw``: the exact body bytes to send."""
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT) as response:
            text = response.read().decode()
            return response.status, json.loads(text), text
    except urllib.error.HTTPError as e:
        text = e.read().decode()
        return e.code, json.loads(text), text


@pytest.fixture(scope="module")
def served(one_step_run):
    """A server on the 1-step run (beam 1) and the Python API's model of the same run, loaded
    while the server starts."""
    proc = Served(one_step_run, "--max_batch_sentences=8")  # batches of at most 8 rows
    try:
        reference = api.load(one_step_run)
        proc.wait_ready()
        yield proc, reference
    finally:
        assert proc.stop() == 0  # SIGTERM: a clean stop
    assert proc.lines.get(timeout=10).strip() == "stopped"


@pytest.fixture(scope="module")
def expected(served) -> list[str]:
    """The API's translations of :data:`SENTENCES`, each its own document."""
    _, reference = served
    return [t[0] for t in reference.translate([[s] for s in SENTENCES], beam=1)]


# -------------------------------------------------------------------- the real server


def test_health_names_the_model_and_binds_localhost(served):
    proc, reference = served
    assert proc.url.startswith("http://127.0.0.1:")
    assert proc.first_line.endswith(f"(model transformer, step {reference.step}) on {proc.url}")
    status, answer, _ = request(proc.url + "/health")
    assert status == 200
    assert (answer["status"], answer["model"], answer["step"]) == ("ok", "transformer", 1)
    assert serve_command._parser().parse_args(["--workdir", "RUN"]).host == "127.0.0.1"


def test_translate_equals_the_python_api(served, expected):
    proc, reference = served
    status, answer, _ = request(proc.url + "/translate", "POST", {"sentences": SENTENCES})
    assert status == 200 and answer["translations"] == expected
    documents = [SENTENCES[:5], SENTENCES[5:]]
    status, answer, _ = request(proc.url + "/translate", "POST", {"documents": documents})
    assert status == 200
    assert answer["translations"] == reference.translate(documents, beam=1)


def test_next_sentences_keep_their_document(served):
    proc, reference = served
    context = api.DocumentContext()
    expected = [reference.translate_next([context], [s], beam=1)[0] for s in SENTENCES[:2]]
    answers = [
        request(proc.url + "/documents/doc-1/next", "POST", {"sentence": s}) for s in SENTENCES[:2]
    ]
    assert [(a[0], a[1]["index"]) for a in answers] == [(200, 0), (200, 1)]
    assert [a[1]["translation"] for a in answers] == expected
    status, document, _ = request(proc.url + "/documents/doc-1")
    assert status == 200
    assert document["sentences"] == SENTENCES[:2] and document["translations"] == expected
    assert request(proc.url + "/documents/doc-1", "DELETE")[0] == 200
    status, answer, _ = request(proc.url + "/documents/doc-1")
    assert status == 404 and "unknown document" in answer["error"]


def _rotations(expected: list[str]) -> int:
    """The fewest sentences ``L`` such that the ``L``-sentence rotations of the test sentences
    have pairwise different translations (so that an answer sent to the wrong client shows)."""
    n = len(expected)
    for length in range(1, n + 1):
        if len({tuple(expected[(i + k) % n] for k in range(length)) for i in range(n)}) == n:
            return length
    pytest.fail("the 1-step model translates the test sentences too alike to tell answers apart")


def test_concurrent_clients_get_their_own_answers(served, expected):
    proc, _ = served
    length, n = _rotations(expected), len(SENTENCES)
    results: dict[int, list] = {}

    def client(i: int) -> None:
        mine = [SENTENCES[(i + k) % n] for k in range(length)]
        document = proc.url + f"/documents/c{i}"
        answers = [request(proc.url + "/translate", "POST", {"sentences": mine})]
        for sentence in mine:
            answers.append(request(document + "/next", "POST", {"sentence": sentence}))
        answers.append(request(document))
        results[i] = answers

    threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT)
    assert sorted(results) == list(range(n))
    for i, answers in results.items():
        mine = [expected[(i + k) % n] for k in range(length)]
        assert [a[0] for a in answers] == [200] * (length + 2), (i, answers)
        assert answers[0][1]["translations"] == mine, i
        # a sentence Transformer: a next sentence's translation is the sentence's alone
        assert [a[1] for a in answers[1:-1]] == [
            {"translation": t, "index": k} for k, t in enumerate(mine)
        ], i
        document = answers[-1][1]
        assert document["sentences"] == [SENTENCES[(i + k) % n] for k in range(length)], i
        assert document["translations"] == mine, i
        request(proc.url + f"/documents/c{i}", "DELETE")


@pytest.mark.parametrize(
    "method, path, raw, status, fragment",
    [
        ("POST", "/translate", b'{"sentences": [', 400, "malformed JSON"),
        ("POST", "/translate", b'{"sentences": [""]}', 400, "empty sentence"),
        ("POST", "/translate", b'{"sentences": "one"}', 400, "expected a list"),
        ("POST", "/translate", b'{"documents": [["a", 3]]}', 400, "expected a string"),
        ("POST", "/translate", b'{"sentences": ["a"], "config": "x.json"}', 400, "unknown field"),
        ("POST", "/documents/d/next", b"{}", 400, 'missing field "sentence"'),
        ("POST", "/translate", json.dumps({"sentences": ["a"] * 257}).encode(), 413, "257"),
        ("POST", "/translate", b'{"sentences": ["' + b"a" * (1 << 20) + b'"]}', 413, "limit"),
        ("GET", "/no/such/route", None, 404, "no route"),
        ("GET", "/documents/never-started", None, 404, "unknown document"),
        ("DELETE", "/documents/never-started", None, 404, "unknown document"),
        ("GET", "/translate", None, 405, "use POST"),
    ],
)
def test_bad_requests_are_one_json_line(served, method, path, raw, status, fragment):
    proc, _ = served
    got, answer, text = request(proc.url + path, method, raw=raw)
    assert (got, list(answer)) == (status, ["error"]), text
    assert fragment in answer["error"] and text.count("\n") == 1 and text.endswith("\n")
    assert request(proc.url + "/health")[0] == 200


def test_load_test_reports_latency(served, tmp_path):
    proc, _ = served
    sentences = tmp_path / "sentences.txt"
    sentences.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    done = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "launch", "serve_load_test.py"),
            f"--url={proc.url}",
            "--requests=40",
            "--concurrency=4",
            f"--sentences_file={sentences}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["ok"] == summary["requests"] == 40 and summary["status_counts"] == {"200": 40}
    assert 0 < summary["p50_ms"] <= summary["p95_ms"] <= summary["max_ms"]
    assert summary["requests_per_s"] > 0
    assert request(proc.url + "/health")[1]["documents"] == 0  # it ended its documents


class SlowModel:
    """The real model, each call at least ``delay_s`` long (a busy worker on any machine)."""

    def __init__(self, model, delay_s: float):
        self.model, self.delay_s = model, delay_s

    def translate(self, documents, **search):
        time.sleep(self.delay_s)
        return self.model.translate(documents, **search)


def test_overload_is_503_at_once(served, expected):
    """The real model behind a queue of one: a burst of requests is answered, 503 for those
    that find the queue full, the others with their translation; nothing hangs."""
    _, reference = served
    httpd = server.make_server(
        SlowModel(reference, 0.3),
        {"beam": 1},
        max_queue=1,
        max_batch_wait_s=0.5,
        max_batch_sentences=1,
    )
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    answers: dict[int, tuple] = {}
    try:

        def client(i: int) -> None:
            body = {"sentences": [SENTENCES[i % 8]]}
            answers[i] = call(httpd.url + "/translate", "POST", body, TIMEOUT)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(24)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(TIMEOUT + 10)
        statuses = [answers[i][0] for i in sorted(answers)]
        assert len(statuses) == 24 and set(statuses) == {200, 503}, statuses
        for i, (status, answer) in answers.items():
            if status == 200:
                assert answer == {"translations": [expected[i % 8]]}
            else:
                assert "server busy" in answer["error"] and "--max_queue" in answer["error"]
        assert request(httpd.url + "/health")[0] == 200
    finally:
        httpd.shutdown()
        httpd.close()


@pytest.mark.parametrize(
    "flags, fragment",
    [(["--port", "70000"], "--port=70000"), (["--max_queue", "0"], "--max_queue=0")],
)
def test_bad_flags_are_one_line(one_step_run, flags, fragment):
    done = subprocess.run(
        [SERVE, "--workdir", one_step_run, *flags], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("serve.py: error: ") and fragment in done.stderr


# -------------------------------------------------------------- the batcher, a fake model


class FakeModel:
    """Known answers: ``T(s)`` for a sentence of a document, ``N:previous|sentences>s`` for
    the ``N``-th next sentence; ``"too long"`` is a user error, ``"boom"`` a bug. Records the
    inputs of every call."""

    def __init__(self, delay_s: float = 0.0):
        self.calls: list[tuple[str, list]] = []
        self.memories_seen: list = []
        self.delay_s = delay_s

    def translate(self, documents, **search):
        self.calls.append(("translate", [list(d) for d in documents]))
        time.sleep(self.delay_s)
        self._check([s for d in documents for s in d])
        return [[f"T({s})" for s in d] for d in documents]

    def translate_next(self, contexts, sentences, **search):
        self.calls.append(("next", list(sentences)))
        time.sleep(self.delay_s)
        self._check(sentences)
        outputs = [
            f"{len(c.sources)}:{'|'.join(c.sources)}>{s}"
            for c, s in zip(contexts, sentences, strict=True)
        ]
        for context, sentence, output in zip(contexts, sentences, outputs, strict=True):
            context.sources.append(sentence)
            context.translations.append(output)
            # a slot-by-slot model's target memory: what it was given, then what it leaves
            self.memories_seen.append(context.memory)
            context.memory = f"memory of {output}"
        return outputs

    @staticmethod
    def _check(sentences):
        if "too long" in sentences:
            raise UserError("sentence too long")
        if "boom" in sentences:
            raise RuntimeError("a bug")


def _batcher(model, max_documents=16, **kwargs):
    cache = batching.DocumentCache(max_documents)
    return batching.Batcher(model, {"beam": 1}, cache, **kwargs)


def test_one_cycle_is_one_call_per_kind():
    model = FakeModel()
    batcher = _batcher(model, max_batch_wait_s=0.05)
    jobs = [batching.TranslateJob([["a", "b"]]), batching.TranslateJob([["c"], ["d"]])]
    jobs += [batching.NextSentenceJob("x", "e"), batching.NextSentenceJob("y", "f")]
    batcher.run_cycle(jobs)
    assert model.calls == [("translate", [["a", "b"], ["c"], ["d"]]), ("next", ["e", "f"])]
    assert [job.wait(1) for job in jobs] == [
        [["T(a)", "T(b)"]],
        [["T(c)"], ["T(d)"]],
        {"translation": "0:>e", "index": 0},
        {"translation": "0:>f", "index": 0},
    ]


def test_a_documents_sentences_are_serialized_in_order():
    model = FakeModel()
    batcher = _batcher(model, max_batch_wait_s=0.2).start()
    try:
        jobs = [batching.NextSentenceJob(d, s) for d, s in [("d", "a"), ("d", "b"), ("e", "x")]]
        jobs.append(batching.NextSentenceJob("d", "c"))
        for job in jobs:  # queued within one gathering window
            batcher.submit(job)
        answers = [job.wait(10) for job in jobs]
    finally:
        batcher.stop()
    assert model.calls == [("next", ["a", "x"]), ("next", ["b"]), ("next", ["c"])]
    assert answers == [
        {"translation": "0:>a", "index": 0},
        {"translation": "1:a>b", "index": 1},
        {"translation": "0:>x", "index": 0},
        {"translation": "2:a|b>c", "index": 2},
    ]
    document = batcher.cache.get("d")
    assert document.sources == ["a", "b", "c"]
    assert document.translations == ["0:>a", "1:a>b", "2:a|b>c"]


def test_a_failing_request_fails_alone():
    batcher = _batcher(FakeModel(), max_document_sentences=1)
    jobs = [batching.TranslateJob([[s]]) for s in ("ok", "too long", "boom")]
    nexts = [batching.NextSentenceJob(d, s) for d, s in [("p", "boom"), ("q", "fine")]]
    batcher.run_cycle(jobs + nexts)
    assert jobs[0].wait(1) == [["T(ok)"]] and nexts[1].wait(1)["translation"] == "0:>fine"
    for job, status in [(jobs[1], 400), (jobs[2], 500), (nexts[0], 500)]:
        with pytest.raises(batching.RequestError) as error:
            job.wait(1)
        assert error.value.status == status
    assert batcher.cache.get("p") is None  # a failed sentence starts no document
    full = batching.NextSentenceJob("q", "more")  # q holds its one allowed sentence
    batcher.run_cycle([full])
    with pytest.raises(batching.RequestError) as error:
        full.wait(1)
    assert error.value.status == 413


def test_a_document_keeps_the_target_memory_its_last_sentence_left():
    model = FakeModel()
    batcher = _batcher(model)
    for sentence in ("s1", "s2", "s3"):
        job = batching.NextSentenceJob("d", sentence)
        batcher.run_cycle([job])
        job.wait(1)
    assert model.memories_seen == [None, "memory of 0:>s1", "memory of 1:s1>s2"]
    assert batcher.cache.get("d").memory == "memory of 2:s1|s2>s3"


def test_the_least_recently_used_document_is_evicted():
    cache = batching.DocumentCache(2)
    for doc_id in ("a", "b"):
        cache.commit(doc_id, None, f"{doc_id}1", f"t-{doc_id}1")
    assert cache.get("a").sources == ["a1"]  # a use: b is now the oldest
    cache.commit("c", None, "c1", "t-c1")
    with pytest.raises(batching.RequestError) as error:  # never a silent restart at 0
        cache.get("b")
    assert error.value.status == 409 and "'b' was evicted" in error.value.message
    assert cache.evicted == 1 and not cache.commit("b", None, "b2", "t-b2")
    assert cache.delete("b") and cache.lookup("b")[0] is None  # DELETE: it may start again
    assert [cache.get(d).translations for d in ("a", "c")] == [["t-a1"], ["t-c1"]]
    stale, _ = cache.lookup("a")
    assert cache.delete("a") and not cache.delete("a")
    cache.commit("a", stale, "a2", "t-a2")  # ended while translated: stays ended
    assert cache.get("a") is None and len(cache) == 1


def test_a_full_queue_is_refused_at_once():
    batcher = _batcher(FakeModel(), max_queue=2)  # not started: nothing leaves the queue
    queued = [batcher.submit(batching.TranslateJob([[s]])) for s in ("a", "b")]
    start = time.monotonic()
    with pytest.raises(batching.RequestError) as error:
        batcher.submit(batching.TranslateJob([["c"]]))
    assert error.value.status == 503 and time.monotonic() - start < 1
    batcher.stop()  # the queued jobs are answered, not left waiting
    for job in queued:
        with pytest.raises(batching.RequestError) as error:
            job.wait(0.01)
        assert error.value.status == 503 and "shutting down" in error.value.message
    with pytest.raises(batching.RequestError) as error:
        batching.TranslateJob([["d"]]).wait(0.01)  # never answered: a timeout, not a hang
    assert error.value.status == 504


def test_an_internal_error_is_500_and_the_server_stays_up():
    httpd = server.make_server(FakeModel(), {"beam": 1}, max_batch_wait_s=0.001)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        status, answer, text = request(httpd.url + "/translate", "POST", {"sentences": ["boom"]})
        assert status == 500 and "RuntimeError" in answer["error"] and text.count("\n") == 1
        status, answer, _ = request(httpd.url + "/translate", "POST", {"sentences": ["fine"]})
        assert (status, answer) == (200, {"translations": ["T(fine)"]})
    finally:
        httpd.shutdown()
        httpd.close()


def test_percentiles_are_nearest_rank():
    values = [50, 10, 40, 20, 30, 60, 70, 80, 90, 100]
    assert (percentile(values, 50), percentile(values, 95), percentile([7], 95)) == (50, 100, 7)
