"""Pretraining data through config: a corpus read as one-sentence documents, and several
corpora mixed with sampling weights.

* ``config.data.train_as = "sentences"``: every sentence pair of the training corpus becomes a
  one-sentence document (Zheng et al. 2020, Sec. 5.3 / Table 4: "every single sentence is
  regarded as a document"; Tan et al. 2019, footnote 2: the document corpus's sentences
  shuffled), in a seeded shuffled order, so no model sees a neighbour as context. Readers are
  unchanged: a sentence-level corpus (aligned plain files without blank lines, or a TSV) is
  read as it is and then split.
* ``config.data.train_as = "multi_resolution"``: every document also split into 2, 4, 8, ...
  contiguous parts of near-equal length, and into single sentences, all levels trained on
  (the multi-resolutional training of Sun et al. 2022, "Rethinking Document-level Neural
  Machine Translation", Sec. 4): a batch of short pieces holds many documents, so a document
  model's batches are as varied as a sentence model's while the longer pieces still carry the
  context. Reading chosen: levels up to single sentences (``2^k < n``, then ``n`` parts), each
  level a whole copy of the corpus (an epoch is ``~2 + log2(n)`` passes over every sentence).
* ``config.data.mix = "PATH [WEIGHT] [documents|sentences|multi_resolution]; ..."``: the
  training corpus is the mix of the entries (Tan et al. 2019, Table 4, last row). ``PATH`` is
  what ``data.train`` accepts (``FILE.tsv`` or ``SRC,TGT``; no spaces), read with
  ``data.format``; ``WEIGHT`` (default 1) is the entry's multiplicity per epoch: each of its
  documents appears ``floor(WEIGHT)`` times, plus once more for a seeded ``WEIGHT -
  floor(WEIGHT)`` share of them (fixed for the run). The mixed documents then go through the
  ordinary plan (grid or packed), so every batch is still one shape, the plan is a pure
  function of the seed and a resumed run continues it exactly. Reading chosen: sampling
  weights as per-epoch multiplicities of documents, not a per-batch corpus draw, because the
  plan is built once and must stay deterministic.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from docnmt_jax.data.documents import Document
from docnmt_jax.errors import UserError

TRAIN_AS = ("documents", "sentences", "multi_resolution")


class DataConfigError(UserError, ValueError):
    """A mistake in ``config.data.train_as`` / ``config.data.mix`` (one line, no traceback)."""


@dataclasses.dataclass(frozen=True)
class MixEntry:
    """One corpus of ``data.mix``: its path, per-epoch weight and how it is read."""

    path: str
    weight: float = 1.0
    read_as: str = "documents"


def check_train_as(value: str, key: str = "config.data.train_as") -> str:
    if value not in TRAIN_AS:
        raise DataConfigError(f"{key} must be one of {TRAIN_AS}, got {value!r}")
    return value


def as_sentences(documents: Sequence[Document], seed: int) -> list[Document]:
    """Every sentence pair as its own document (id ``DOC#k``), in a seeded shuffled order."""
    singles = [
        Document(f"{doc.doc_id}#{k}", (src,), (tgt,), doc.origin.shifted(k) if doc.origin else None)
        for doc in documents
        for k, (src, tgt) in enumerate(zip(doc.src, doc.tgt, strict=True))
    ]
    order = np.random.default_rng([seed, 0x5E17]).permutation(len(singles))
    return [singles[i] for i in order]


def part_bounds(n: int, parts: int) -> list[tuple[int, int]]:
    """``[start, end)`` of ``parts`` contiguous near-equal parts of ``n`` sentences (the
    longer parts first)."""
    base, extra = divmod(n, parts)
    bounds, start = [], 0
    for j in range(parts):
        end = start + base + (j < extra)
        bounds.append((start, end))
        start = end
    return bounds


def resolution_levels(n: int) -> list[int]:
    """How many parts a document of ``n`` sentences is split into at each level: 1, 2, 4, ...
    while fewer than ``n``, then ``n`` (single sentences)."""
    levels, parts = [], 1
    while parts < n:
        levels.append(parts)
        parts *= 2
    return levels + [n]


def as_multi_resolution(documents: Sequence[Document]) -> list[Document]:
    """Every document at every level of :func:`resolution_levels`, its parts as documents
    (id ``DOC#pP.J``: part ``J`` of ``P``; the whole document keeps its id)."""
    out = []
    for doc in documents:
        for parts in resolution_levels(len(doc)):
            for j, (a, b) in enumerate(part_bounds(len(doc), parts)):
                if parts == 1:
                    out.append(doc)
                    continue
                origin = doc.origin.shifted(a) if doc.origin else None
                out.append(
                    Document(f"{doc.doc_id}#p{parts}.{j}", doc.src[a:b], doc.tgt[a:b], origin)
                )
    return out


def parse_mix(spec: str) -> list[MixEntry]:
    """``"PATH [WEIGHT] [documents|sentences]; ..."`` (entries split by ``;`` or newlines)."""
    entries = []
    for part in (p.strip() for p in spec.replace("\n", ";").split(";")):
        if not part:
            continue
        fields = part.split()
        path, weight, read_as = fields[0], 1.0, "documents"
        for field in fields[1:]:
            if field in TRAIN_AS:
                read_as = field
                continue
            try:
                weight = float(field)
            except ValueError:
                raise DataConfigError(
                    f"config.data.mix entry {part!r}: {field!r} is neither a weight nor one of "
                    f"{TRAIN_AS}"
                ) from None
            if not weight > 0:
                raise DataConfigError(
                    f"config.data.mix entry {part!r}: the weight must be > 0, got {field}"
                )
        entries.append(MixEntry(path, weight, read_as))
    if not entries:
        raise DataConfigError(f"config.data.mix={spec!r} names no corpus")
    return entries


def weighted(documents: Sequence[Document], weight: float, seed: int) -> list[Document]:
    """``floor(weight)`` copies of every document, then a seeded ``weight - floor(weight)``
    share of them once more (copies get the id suffix ``@r`` beyond the first)."""
    whole = int(np.floor(weight))
    extra = int(round((weight - whole) * len(documents)))
    picked = np.sort(np.random.default_rng([seed, 0x3A1]).permutation(len(documents))[:extra])
    out = [
        dataclasses.replace(doc, doc_id=f"{doc.doc_id}@{r}") if r else doc
        for r in range(whole)
        for doc in documents
    ]
    out += [
        dataclasses.replace(documents[i], doc_id=f"{documents[i].doc_id}@{whole}") for i in picked
    ]
    return out


def mix_documents(
    entries: Sequence[MixEntry], read: Callable[[str], list[Document]], seed: int
) -> list[Document]:
    """The training documents of ``data.mix``: each entry read by ``read``, split into
    sentences where asked, weighted; entries keep their order (the plan shuffles)."""
    out: list[Document] = []
    for i, entry in enumerate(entries):
        try:
            docs = read(entry.path)
        except FileNotFoundError as e:
            raise DataConfigError(f"config.data.mix entry {entry.path!r}: {e}") from None
        if entry.read_as == "sentences":
            docs = as_sentences(docs, seed + i)
        elif entry.read_as == "multi_resolution":
            docs = as_multi_resolution(docs)
        out += weighted(docs, entry.weight, seed + i)
    return out
