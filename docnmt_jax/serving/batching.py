"""Batching of concurrent requests: a bounded queue, one worker thread, a document cache.

HTTP handler threads :meth:`Batcher.submit` jobs and wait for them; a full queue is refused at
once (:class:`RequestError` 503), never waited on. The worker takes the jobs queued within
``max_batch_wait_s`` of the first one (or until they hold ``max_batch_sentences`` sentences)
and runs, per cycle, at most two model calls: one ``translate`` for every whole-document job
and one ``translate_next`` for every next-sentence job. Next-sentence jobs of the same document
in one cycle are serialized: the first runs, the later ones wait for the next cycle (ahead of
newer jobs), so a document's sentences are translated in the order they arrived.

When a batched call fails, each of its jobs is retried alone, so one bad request fails alone: a
:class:`~docnmt_jax.errors.UserError` (a sentence too long for the model) is a 400, anything
else a 500 whose traceback goes to stderr; the worker keeps running.

:class:`DocumentCache` keeps the :class:`~docnmt_jax.api.DocumentContext` of at most
``max_documents`` documents, least recently used evicted first. The model translates a copy of
a context; the sentence and its translation are appended only if the document is still the one
that was translated (a document ended or evicted meanwhile stays ended: its answer is still
returned).
"""

from __future__ import annotations

import collections
import queue
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from typing import Any, Protocol

from docnmt_jax.api import DocumentContext
from docnmt_jax.cli import one_line
from docnmt_jax.errors import UserError


class RequestError(Exception):
    """A request's failure: an HTTP status and a one-line message."""

    def __init__(self, status: int, message: str):
        super().__init__(one_line(message))
        self.status = status
        self.message = one_line(message)


class Model(Protocol):
    """What the batcher calls (:class:`~docnmt_jax.api.TranslationModel`)."""

    def translate(self, documents: Sequence[Sequence[str]], **search: Any) -> list[list[Any]]: ...

    def translate_next(
        self, contexts: Sequence[DocumentContext], sentences: Sequence[str], **search: Any
    ) -> list[str]: ...


class Job:
    """One request's work; :meth:`wait` returns its result or raises its error."""

    def __init__(self, size: int):
        self.size = size  # sentences it translates
        self._done = threading.Event()
        self._result: Any = None
        self._error: RequestError | None = None

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def finish(self, result: Any) -> None:
        self._result = result
        self._done.set()

    def fail(self, error: RequestError) -> None:
        self._error = error
        self._done.set()

    def wait(self, timeout_s: float) -> Any:
        if not self._done.wait(timeout_s):
            raise RequestError(504, f"no translation within {timeout_s:g} s (--request_timeout_s)")
        if self._error is not None:
            raise self._error
        return self._result


class TranslateJob(Job):
    """Whole documents to translate; the result is one list of translations per document."""

    def __init__(self, documents: list[list[str]]):
        super().__init__(sum(len(d) for d in documents))
        self.documents = documents


class NextSentenceJob(Job):
    """The next sentence of document ``doc_id``; the result is ``{"translation", "index"}``."""

    def __init__(self, doc_id: str, sentence: str):
        super().__init__(1)
        self.doc_id = doc_id
        self.sentence = sentence


class DocumentCache:
    """Documents translated sentence by sentence, by id; at most ``max_documents``, the least
    recently used evicted first. Thread-safe."""

    def __init__(self, max_documents: int):
        self.max_documents = max_documents
        self.evicted = 0
        self._contexts: collections.OrderedDict[str, DocumentContext] = collections.OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._contexts)

    def lookup(self, doc_id: str) -> tuple[DocumentContext | None, DocumentContext]:
        """The document's context (``None`` if unknown) and a copy of it to translate with."""
        with self._lock:
            context = self._contexts.get(doc_id)
            if context is None:
                return None, DocumentContext()
            self._contexts.move_to_end(doc_id)
            copy = DocumentContext(list(context.sources), list(context.translations))
            copy.memory = context.memory  # never modified in place: replaced by the next one
            return context, copy

    def get(self, doc_id: str) -> DocumentContext | None:
        """A copy of the document's context, ``None`` if unknown (a use: it becomes recent)."""
        cached, context = self.lookup(doc_id)
        return context if cached is not None else None

    def delete(self, doc_id: str) -> bool:
        """Ends the document; ``False`` if it was unknown."""
        with self._lock:
            return self._contexts.pop(doc_id, None) is not None

    def commit(
        self,
        doc_id: str,
        expected: DocumentContext | None,
        sentence: str,
        translation: str,
        memory: Any = None,
    ) -> None:
        """Appends a translated sentence to the document if it is still ``expected`` (``None``:
        it did not exist, and is created), with the target ``memory`` it left (a slot-by-slot
        model's, :class:`~docnmt_jax.api.DocumentContext`), else leaves the cache as it is."""
        with self._lock:
            if self._contexts.get(doc_id) is not expected:
                return
            if expected is None:
                expected = self._contexts[doc_id] = DocumentContext()
                while len(self._contexts) > self.max_documents:
                    self._contexts.popitem(last=False)
                    self.evicted += 1
            self._contexts.move_to_end(doc_id)
            expected.sources.append(sentence)
            expected.translations.append(translation)
            expected.memory = memory


def failure(error: Exception) -> RequestError:
    """A model call's exception as a request error: a user's mistake 400, else 500 (logged)."""
    if isinstance(error, UserError):
        return RequestError(400, str(error))
    traceback.print_exception(type(error), error, error.__traceback__, file=sys.stderr)
    return RequestError(500, f"internal error ({type(error).__name__}); the server logged it")


class Batcher:
    """The queue and the worker thread that runs the model on batches of jobs (module
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
        self.max_batch_wait_s = max_batch_wait_s
        self.max_batch_sentences = max_batch_sentences
        self.max_document_sentences = max_document_sentences
        self._queue: queue.Queue[Job] = queue.Queue(maxsize=max_queue)
        self._deferred: collections.deque[Job] = collections.deque()
        self._stopping = threading.Event()
        self._submitting = threading.Lock()  # no job queued once stop() has begun
        self._thread = threading.Thread(target=self._loop, name="docnmt-batcher", daemon=True)

    @property
    def queued(self) -> int:
        return self._queue.qsize()

    def start(self) -> Batcher:
        self._thread.start()
        return self

    def submit(self, job: Job) -> Job:
        """Queues ``job``; a full queue or a stopping server is a 503 at once."""
        with self._submitting:
            if self._stopping.is_set():
                raise RequestError(503, "the server is shutting down")
            try:
                self._queue.put_nowait(job)
            except queue.Full:
                raise RequestError(
                    503, f"server busy: {self._queue.maxsize} requests queued (--max_queue); retry"
                ) from None
        return job

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stops taking jobs, lets the running cycle finish, and fails every job still queued
        with a 503."""
        with self._submitting:
            self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        stopped = RequestError(503, "the server is shutting down")
        while self._deferred:
            self._deferred.popleft().fail(stopped)
        while True:
            try:
                self._queue.get_nowait().fail(stopped)
            except queue.Empty:
                break

    # ------------------------------------------------------------------------- worker thread

    def _loop(self) -> None:
        while not self._stopping.is_set():
            jobs = self._collect()
            if not jobs:
                continue
            try:
                self.run_cycle(jobs)
            except Exception as e:  # noqa: BLE001 - the worker must outlive any bug
                error = failure(e)
                for job in jobs:
                    if not job.done and job not in self._deferred:
                        job.fail(error)

    def _collect(self) -> list[Job]:
        """The jobs of one cycle: those deferred from the last one, then the queue's, taken
        until ``max_batch_wait_s`` after the first or ``max_batch_sentences`` sentences."""
        jobs = list(self._deferred)
        self._deferred.clear()
        if not jobs:
            try:
                jobs.append(self._queue.get(timeout=0.1))
            except queue.Empty:
                return []
        deadline = time.monotonic() + self.max_batch_wait_s
        size = sum(job.size for job in jobs)
        while size < self.max_batch_sentences:
            remaining = deadline - time.monotonic()
            try:  # after the deadline, only what is queued already
                job = self._queue.get(remaining > 0, max(remaining, 0.0))
            except queue.Empty:
                break
            jobs.append(job)
            size += job.size
        return jobs

    def run_cycle(self, jobs: list[Job]) -> None:
        """One cycle: every whole-document job in one ``translate`` call, the next-sentence
        jobs of distinct documents in one ``translate_next`` call; a document's later jobs are
        deferred to the next cycle."""
        documents = [job for job in jobs if isinstance(job, TranslateJob)]
        following, seen = [], set()
        for job in jobs:
            if isinstance(job, NextSentenceJob):
                if job.doc_id in seen:
                    self._deferred.append(job)
                else:
                    seen.add(job.doc_id)
                    following.append(job)
        if documents:
            self._translate(documents)
        if following:
            self._translate_next(following)

    def _translate(self, jobs: list[TranslateJob]) -> None:
        try:
            outputs = self.model.translate([d for j in jobs for d in j.documents], **self.search)
        except Exception as e:  # noqa: BLE001 - answered as a request error
            if len(jobs) > 1:  # one bad request fails alone
                for job in jobs:
                    self._translate([job])
            else:
                jobs[0].fail(failure(e))
            return
        start = 0
        for job in jobs:
            job.finish(outputs[start : start + len(job.documents)])
            start += len(job.documents)

    def _translate_next(self, jobs: list[NextSentenceJob]) -> None:
        ready: list[tuple[NextSentenceJob, DocumentContext | None, DocumentContext]] = []
        for job in jobs:
            cached, context = self.cache.lookup(job.doc_id)
            if len(context.sources) >= self.max_document_sentences:
                job.fail(
                    RequestError(
                        413,
                        f"document {job.doc_id!r} has {len(context.sources)} sentences, the "
                        "limit (--max_document_sentences); DELETE it to start again",
                    )
                )
            else:
                ready.append((job, cached, context))
        if not ready:
            return
        try:
            contexts = [context for _, _, context in ready]
            indices = [len(context.sources) for context in contexts]
            sentences = [job.sentence for job, _, _ in ready]
            outputs = self.model.translate_next(contexts, sentences, **self.search)
        except Exception as e:  # noqa: BLE001 - answered as a request error
            if len(ready) > 1:
                for job, _, _ in ready:
                    self._translate_next([job])
            else:
                ready[0][0].fail(failure(e))
            return
        for (job, cached, context), index, output in zip(ready, indices, outputs, strict=True):
            self.cache.commit(job.doc_id, cached, job.sentence, output, context.memory)
            job.finish({"translation": output, "index": index})
