"""The documents that ``/documents/ID/next`` translates sentence by sentence, by id.

:class:`DocumentCache` keeps the :class:`~docnmt_jax.api.DocumentContext` of at most
``max_documents`` documents, the least recently used evicted first. An evicted id is
remembered (up to :data:`EVICTED_MEMORY` ids a document slot), so that a later request for it
is a 409 naming it rather than a silent restart at index 0; ``DELETE`` forgets it.

Each document also keeps the answers of its sentences by the client's ``request_id``: a retry
of a request whose answer was committed gets that answer again instead of a second commit
(exactly once, docs/serving.md).
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from typing import Any

from docnmt_jax.api import DocumentContext
from docnmt_jax.cli import one_line

#: Evicted ids remembered per document slot (``max_documents``), oldest forgotten first.
EVICTED_MEMORY = 4


class RequestError(Exception):
    """A request's failure: an HTTP status and a one-line message."""

    def __init__(self, status: int, message: str):
        super().__init__(one_line(message))
        self.status = status
        self.message = one_line(message)


@dataclasses.dataclass(frozen=True)
class Answer:
    """A committed sentence's answer, kept under its request id."""

    sentence: str
    translation: str
    index: int

    def as_json(self) -> dict[str, Any]:
        return {"translation": self.translation, "index": self.index}


class DocumentCache:
    """Documents translated sentence by sentence, by id; at most ``max_documents``, the least
    recently used evicted first. Thread-safe."""

    def __init__(self, max_documents: int):
        self.max_documents = max_documents
        self.evicted = 0
        self._contexts: collections.OrderedDict[str, DocumentContext] = collections.OrderedDict()
        self._answers: dict[str, dict[str, Answer]] = {}
        self._gone: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._contexts)

    def _check_not_evicted(self, doc_id: str) -> None:
        if doc_id in self._gone:
            raise RequestError(
                409,
                f"document {doc_id!r} was evicted (least recently used of --max_documents="
                f"{self.max_documents}): its context is gone; DELETE it to start it again",
            )

    def lookup(self, doc_id: str) -> tuple[DocumentContext | None, DocumentContext]:
        """The document's context (``None`` if unknown) and a copy of it to translate with;
        an evicted document is a 409."""
        with self._lock:
            self._check_not_evicted(doc_id)
            context = self._contexts.get(doc_id)
            if context is None:
                return None, DocumentContext()
            self._contexts.move_to_end(doc_id)
            copy = DocumentContext(list(context.sources), list(context.translations))
            copy.memory = context.memory  # never modified in place: replaced by the next one
            return context, copy

    def get(self, doc_id: str) -> DocumentContext | None:
        """A copy of the document's context, ``None`` if unknown (a use: it becomes recent);
        an evicted document is a 409."""
        cached, context = self.lookup(doc_id)
        return context if cached is not None else None

    def answer(self, doc_id: str, request_id: str, sentence: str) -> Answer | None:
        """The committed answer of ``request_id`` in the document, ``None`` if none; the id
        used for another sentence is a 409."""
        with self._lock:
            self._check_not_evicted(doc_id)
            answer = self._answers.get(doc_id, {}).get(request_id)
        if answer is not None and answer.sentence != sentence:
            raise RequestError(
                409,
                f"request_id {request_id!r} of document {doc_id!r} was used for another "
                "sentence; use a new id for a new sentence",
            )
        return answer

    def delete(self, doc_id: str) -> bool:
        """Ends the document (or forgets its eviction); ``False`` if it was unknown."""
        with self._lock:
            self._answers.pop(doc_id, None)
            gone = self._gone.pop(doc_id, False) is None
            return self._contexts.pop(doc_id, None) is not None or gone

    def commit(
        self,
        doc_id: str,
        expected: DocumentContext | None,
        sentence: str,
        translation: str,
        memory: Any = None,
        request_id: str = "",
    ) -> bool:
        """Appends a translated sentence to the document if it is still ``expected`` (``None``:
        it did not exist, and is created), with the target ``memory`` it left (a slot-by-slot
        model's, :class:`~docnmt_jax.api.DocumentContext`) and its answer under
        ``request_id``; else leaves the cache as it is. Whether it was appended."""
        with self._lock:
            if self._contexts.get(doc_id) is not expected or doc_id in self._gone:
                return False
            if expected is None:
                expected = self._contexts[doc_id] = DocumentContext()
                while len(self._contexts) > self.max_documents:
                    self._evict()
            self._contexts.move_to_end(doc_id)
            if request_id:
                answer = Answer(sentence, translation, len(expected.sources))
                self._answers.setdefault(doc_id, {})[request_id] = answer
            expected.sources.append(sentence)
            expected.translations.append(translation)
            expected.memory = memory
            return True

    def _evict(self) -> None:
        doc_id, _ = self._contexts.popitem(last=False)
        self._answers.pop(doc_id, None)
        self._gone[doc_id] = None
        while len(self._gone) > EVICTED_MEMORY * self.max_documents:
            self._gone.popitem(last=False)
        self.evicted += 1
