"""Batching of concurrent requests: a bounded set of pending jobs, one worker thread.

HTTP handler threads :meth:`Batcher.submit` jobs and wait for them; more than ``max_queue``
unfinished jobs is a 503 at once, never waited on. Each cycle the worker runs at most two
model calls: one ``translate`` for pieces of whole-document jobs and one ``translate_next``
for next-sentence jobs, together at most ``max_batch_sentences`` sentences (a single document
longer than that runs alone).

**Fair batching**: a job is split into its documents (a ``sentences`` request: one document
a sentence), and a cycle takes one document of every pending job in turn, in arrival order,
round after round until the cycle is full, each job taking at most its fair share of the
cycle (``max_batch_sentences`` over the jobs with work). A job larger than its share runs over
several cycles, each shared with the requests that arrived meanwhile: a one-sentence request
waits for the model call under way and then runs in a small call beside a slice of the large
job, not behind the whole 256-sentence job. When the worker is idle it gathers requests for
``max_batch_wait_s`` after the first (or until they fill a cycle).

Next-sentence jobs of the same document are serialized: only the first pending one of a
document runs in a cycle, so a document's sentences are translated in the order they arrived,
each with the one before it in its context.

**Exactly once**: a job whose request timed out is cancelled (:meth:`Job.wait`); its
sentence is never committed to its document, since the worker commits only a job it can
:meth:`~Job.claim` (a job claimed just before the timeout is answered, not cancelled). A
next-sentence job may carry the client's ``request_id``: a retry of a committed one gets the
stored answer (:mod:`~docnmt_jax.serving.documents`).

**Failures**: when a batched call fails, its pieces are bisected (each half called again)
down to the failing ones, so a bad request fails alone in about ``2 log2 N`` extra calls
rather than one call per request; a :class:`~docnmt_jax.errors.UserError` is a 400, anything
else a 500 whose traceback goes to stderr; the worker keeps running. Should the worker thread
itself die, every pending job is answered 500, new ones 503, and :meth:`Batcher.health` says
so.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections.abc import Sequence
from typing import Any, Protocol

from docnmt_jax.api import DocumentContext
from docnmt_jax.errors import UserError
from docnmt_jax.serving.documents import DocumentCache, RequestError

__all__ = ["Batcher", "DocumentCache", "Job", "NextSentenceJob", "RequestError", "TranslateJob"]


class Model(Protocol):
    """What the batcher calls (:class:`~docnmt_jax.api.TranslationModel`)."""

    def translate(self, documents: Sequence[Sequence[str]], **search: Any) -> list[list[Any]]: ...

    def translate_next(
        self, contexts: Sequence[DocumentContext], sentences: Sequence[str], **search: Any
    ) -> list[str]: ...


class Job:
    """One request's work; :meth:`wait` returns its result or raises its error. States:
    pending, then claimed (its result is being committed), then done; or cancelled (its
    request timed out: nothing of it is committed)."""

    def __init__(self, size: int):
        self.size = size  # sentences it translates
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._state = "pending"
        self._result: Any = None
        self._error: RequestError | None = None

    @property
    def done(self) -> bool:
        """Finished, failed or cancelled: nothing more to run."""
        return self._done.is_set() or self._state == "cancelled"

    def claim(self) -> bool:
        """Takes the job for committing its result; ``False`` if it was cancelled."""
        with self._lock:
            if self._state != "pending":
                return self._state == "claimed"
            self._state = "claimed"
            return True

    def _settle(self, result: Any, error: RequestError | None) -> None:
        with self._lock:
            if self._state in ("cancelled", "done"):
                return
            self._state = "done"
            self._result, self._error = result, error
        self._done.set()

    def finish(self, result: Any) -> None:
        self._settle(result, None)

    def fail(self, error: RequestError) -> None:
        self._settle(None, error)

    def wait(self, timeout_s: float) -> Any:
        """The result within ``timeout_s``; else the job is cancelled (a 504) unless it was
        claimed already, whose commit then completes and is answered."""
        if not self._done.wait(timeout_s):
            with self._lock:
                if self._state == "pending":
                    self._state = "cancelled"
                    raise RequestError(
                        504,
                        f"no translation within {timeout_s:g} s (--request_timeout_s); the "
                        "request was cancelled and nothing of it committed: retry",
                    )
            if not self._done.wait(timeout_s):
                raise RequestError(500, "internal error: a claimed request was not answered")
        if self._error is not None:
            raise self._error
        return self._result


class TranslateJob(Job):
    """Whole documents to translate; the result is one list of translations per document.
    The worker runs its documents over one or more cycles (``next_document``)."""

    def __init__(self, documents: list[list[str]]):
        super().__init__(sum(len(d) for d in documents))
        self.documents = documents
        self.next_document = 0  # the first document not yet given to the model
        self._outputs: list[Any] = [None] * len(documents)
        self._left = len(documents)

    def store(self, index: int, output: Any) -> None:
        """Document ``index``'s translations; the last one finishes the job."""
        if self._outputs[index] is None:
            self._left -= 1
        self._outputs[index] = output
        if not self._left and self.claim():
            self.finish(self._outputs)


class NextSentenceJob(Job):
    """The next sentence of document ``doc_id``; the result is ``{"translation", "index"}``.
    ``request_id``: the client's id for exactly-once retries ('' for none)."""

    def __init__(self, doc_id: str, sentence: str, request_id: str = ""):
        super().__init__(1)
        self.doc_id = doc_id
        self.sentence = sentence
        self.request_id = request_id


def failure(error: Exception) -> RequestError:
    """A model call's exception as a request error: a user's mistake 400, else 500 (logged)."""
    if isinstance(error, UserError):
        return RequestError(400, str(error))
    traceback.print_exception(type(error), error, error.__traceback__, file=sys.stderr)
    return RequestError(500, f"internal error ({type(error).__name__}); the server logged it")


Piece = tuple[TranslateJob, int]  # a job's document, by index


def plan_cycle(jobs: Sequence[Job], max_sentences: int) -> tuple[list[Piece], list[Any]]:
    """The pieces of one cycle from ``jobs`` (arrival order): one unit of each job in turn
    (a document of a :class:`TranslateJob`, a :class:`NextSentenceJob` that is its
    document's first pending one), round after round, while they fit ``max_sentences`` (a
    cycle's first unit always does) and each job's fair share of it (its first unit always
    does), ``max_sentences`` over
    the jobs with work. Advances the jobs' ``next_document``."""
    first_of_document: dict[str, Job] = {}
    for job in jobs:
        if isinstance(job, NextSentenceJob) and not job.done:
            first_of_document.setdefault(job.doc_id, job)
    ready = [
        job
        for job in jobs
        if not job.done
        and (
            (isinstance(job, TranslateJob) and job.next_document < len(job.documents))
            or first_of_document.get(getattr(job, "doc_id", None)) is job
        )
    ]
    share = max(1, max_sentences // max(1, len(ready)))
    taken = {id(job): 0 for job in ready}
    pieces: list[Piece] = []
    following: list[NextSentenceJob] = []
    size, added = 0, True
    while added and size < max_sentences:
        added = False
        for job in ready:
            if isinstance(job, TranslateJob):
                if job.next_document >= len(job.documents):
                    continue
                n = len(job.documents[job.next_document])
            elif job in following:
                continue
            else:
                n = 1
            if size and size + n > max_sentences:
                continue  # the first unit of a cycle always fits
            if taken[id(job)] and taken[id(job)] + n > share:
                continue  # so does a job's first unit in it
            if isinstance(job, TranslateJob):
                pieces.append((job, job.next_document))
                job.next_document += 1
            else:
                following.append(job)
            taken[id(job)] += n
            size, added = size + n, True
            if size >= max_sentences:
                break
    order = {id(job): i for i, job in enumerate(jobs)}
    pieces.sort(key=lambda piece: (order[id(piece[0])], piece[1]))
    return pieces, following


class Batcher:
    """The pending jobs and the worker thread that runs the model on them (module
    docstring). ``search``: the search options of every model call."""

    def __init__(
        self,
        model: Model,
        search: dict[str, Any],
        cache: DocumentCache,
        max_queue: int = 64,
        max_batch_wait_s: float = 0.005,
        max_batch_sentences: int = 64,
        max_document_sentences: int = 1000,
    ):
        self.model = model
        self.search = dict(search)
        self.cache = cache
        self.max_queue = max_queue
        self.max_batch_wait_s = max_batch_wait_s
        self.max_batch_sentences = max_batch_sentences
        self.max_document_sentences = max_document_sentences
        self._pending: list[Job] = []
        self._cond = threading.Condition()
        self._stopping = False
        self._started = False
        self._died = False
        self._cycle_started: float | None = None
        self._thread = threading.Thread(target=self._loop, name="docnmt-batcher", daemon=True)

    @property
    def queued(self) -> int:
        """Requests not yet answered (waiting or in the running cycle)."""
        with self._cond:
            return sum(not job.done for job in self._pending)

    @property
    def alive(self) -> bool:
        """Whether the worker thread runs (``True`` before :meth:`start`, too)."""
        return not self._started or (self._thread.is_alive() and not self._died)

    def health(self) -> dict[str, Any]:
        """The worker's liveness and the queue: ``worker`` (running/stopped), ``queued``,
        ``queued_sentences`` (left to translate), ``cycle_s`` (the running cycle's age)."""
        with self._cond:
            jobs = [job for job in self._pending if not job.done]
        left = sum(
            sum(len(d) for d in job.documents[job.next_document :])
            if isinstance(job, TranslateJob)
            else 1
            for job in jobs
        )
        started = self._cycle_started
        return {
            "worker": "running" if self.alive and not self._stopping else "stopped",
            "queued": len(jobs),
            "queued_sentences": left,
            "cycle_s": round(time.monotonic() - started, 3) if started else 0.0,
        }

    def start(self) -> Batcher:
        self._started = True
        self._thread.start()
        return self

    def submit(self, job: Job) -> Job:
        """Queues ``job``; a full queue, a stopping server or a dead worker is a 503 at once."""
        with self._cond:
            if self._stopping:
                raise RequestError(503, "the server is shutting down")
            if not self.alive:
                raise RequestError(503, "the translation worker stopped; restart the server")
            self._pending = [j for j in self._pending if not j.done]
            if len(self._pending) >= self.max_queue:
                raise RequestError(
                    503, f"server busy: {self.max_queue} requests queued (--max_queue); retry"
                )
            self._pending.append(job)
            self._cond.notify()
        return job

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stops taking jobs, lets the running cycle finish, and fails every job still
        pending with a 503."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        self._fail_pending(RequestError(503, "the server is shutting down"))

    def _fail_pending(self, error: RequestError) -> None:
        with self._cond:
            jobs, self._pending = self._pending, []
        for job in jobs:
            job.fail(error)

    # ------------------------------------------------------------------------- worker thread

    def _loop(self) -> None:
        try:
            while not self._stopping:
                jobs = self._collect()
                if not jobs:
                    continue
                self._cycle_started = time.monotonic()
                try:
                    self.run_cycle(jobs)
                except Exception as e:  # noqa: BLE001 - the worker must outlive any bug
                    error = failure(e)
                    for job in jobs:
                        job.fail(error)
                finally:
                    self._cycle_started = None
        finally:
            if not self._stopping:  # died of a BaseException: nobody is left waiting
                self._died = True
                self._fail_pending(RequestError(500, "the translation worker stopped"))

    def _collect(self) -> list[Job]:
        """The pending jobs, once there are any: when the worker was idle, after gathering
        for ``max_batch_wait_s`` or until they fill a cycle."""
        with self._cond:
            if not self._pending:
                self._cond.wait(0.1)
                if not self._pending:
                    return []
                deadline = time.monotonic() + self.max_batch_wait_s
                while not self._stopping and self._size() < self.max_batch_sentences:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining)
            self._pending = [job for job in self._pending if not job.done]
            return list(self._pending)

    def _size(self) -> int:
        return sum(job.size for job in self._pending)

    def run_cycle(self, jobs: list[Job]) -> None:
        """One cycle over ``jobs`` (:func:`plan_cycle`): at most one ``translate`` call for
        its document pieces and one ``translate_next`` call for its next sentences (more
        only to isolate a failure)."""
        pieces, following = plan_cycle(jobs, self.max_batch_sentences)
        if pieces:
            self._translate(pieces)
        if following:
            self._translate_next(following)

    def _translate(self, pieces: list[Piece]) -> None:
        pieces = [(job, index) for job, index in pieces if not job.done]
        if not pieces:
            return
        try:
            documents = [job.documents[index] for job, index in pieces]
            outputs = self.model.translate(documents, **self.search)
        except Exception as e:  # noqa: BLE001 - answered as a request error
            if len(pieces) == 1:
                pieces[0][0].fail(failure(e))
            else:  # bisect: a bad piece fails alone, the others are answered
                half = len(pieces) // 2
                self._translate(pieces[:half])
                self._translate(pieces[half:])
            return
        for (job, index), output in zip(pieces, outputs, strict=True):
            job.store(index, output)

    def _ready(self, jobs: list[NextSentenceJob]) -> list[tuple[Any, ...]]:
        """The next-sentence jobs to translate, each with its cached context, a copy and its
        index; the others answered here (a stored answer, an evicted or full document)."""
        ready = []
        for job in jobs:
            try:
                if job.request_id:
                    stored = self.cache.answer(job.doc_id, job.request_id, job.sentence)
                    if stored is not None:
                        job.finish(stored.as_json())
                        continue
                cached, context = self.cache.lookup(job.doc_id)
            except RequestError as e:
                job.fail(e)
                continue
            if len(context.sources) >= self.max_document_sentences:
                job.fail(
                    RequestError(
                        413,
                        f"document {job.doc_id!r} has {len(context.sources)} sentences, the "
                        "limit (--max_document_sentences); DELETE it to start again",
                    )
                )
            else:
                ready.append((job, cached, context, len(context.sources)))
        return ready

    def _translate_next(self, jobs: list[NextSentenceJob]) -> None:
        ready = self._ready([job for job in jobs if not job.done])
        if not ready:
            return
        try:
            contexts = [context for _, _, context, _ in ready]
            sentences = [job.sentence for job, _, _, _ in ready]
            outputs = self.model.translate_next(contexts, sentences, **self.search)
        except Exception as e:  # noqa: BLE001 - answered as a request error
            if len(ready) == 1:
                ready[0][0].fail(failure(e))
            else:  # bisect, each half with fresh copies of its contexts
                half = len(ready) // 2
                self._translate_next([job for job, *_ in ready[:half]])
                self._translate_next([job for job, *_ in ready[half:]])
            return
        for (job, cached, context, index), output in zip(ready, outputs, strict=True):
            if not job.claim():
                continue  # timed out and cancelled: not committed
            try:
                self.cache.commit(
                    job.doc_id, cached, job.sentence, output, context.memory, job.request_id
                )
            finally:
                job.finish({"translation": output, "index": index})
