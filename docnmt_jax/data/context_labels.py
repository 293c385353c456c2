"""Labels of context-dependent target tokens (:class:`ContextLabel`), their ``.labels.jsonl``
files, and the scoring of translations on them (:func:`context_accuracy`, :func:`chance_level`,
the context-blind baseline :func:`context_blind_hypotheses`). The synthetic tasks
(:mod:`docnmt_jax.data.synthetic`, :mod:`docnmt_jax.data.synthetic_long`) produce these
labels."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from docnmt_jax.data.documents import CorpusFormatError, Document
from docnmt_jax.files import atomic_open

PHENOMENA = ("pronoun", "topic", "register", "elided_verb")


@dataclasses.dataclass(frozen=True)
class ContextLabel:
    """One context-dependent target token (see the module docstring)."""

    doc_id: str
    segment: int
    token_index: int
    phenomenon: str
    distance: int
    correct: str
    alternatives: tuple[str, ...]

    def to_json(self) -> str:
        """One JSON object with sorted keys."""
        d = dataclasses.asdict(self)
        d["alternatives"] = list(self.alternatives)
        return json.dumps(d, sort_keys=True, ensure_ascii=False)

    @property
    def candidates(self) -> tuple[str, ...]:
        """All forms, sorted: an order that does not reveal which one is correct."""
        return tuple(sorted((self.correct, *self.alternatives)))


def write_labels(labels: Sequence[ContextLabel], path: str | os.PathLike) -> None:
    """One JSON object (sorted keys) per line."""
    with atomic_open(path) as f:
        for lb in labels:
            f.write(lb.to_json() + "\n")


def read_labels(path: str | os.PathLike) -> list[ContextLabel]:
    """Reads a ``.labels.jsonl`` file; malformed lines raise :class:`CorpusFormatError`."""
    types = {
        "doc_id": str,
        "segment": int,
        "token_index": int,
        "phenomenon": str,
        "distance": int,
        "correct": str,
        "alternatives": list,
    }
    labels = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise CorpusFormatError(path, lineno, f"invalid JSON: {e.msg}") from None
            if not isinstance(obj, dict) or set(obj) != set(types):
                raise CorpusFormatError(path, lineno, f"expected keys {sorted(types)}")
            for key, typ in types.items():
                v = obj[key]
                if not isinstance(v, typ) or (typ is int and isinstance(v, bool)):
                    raise CorpusFormatError(path, lineno, f"{key!r} must be {typ.__name__}")
            if obj["phenomenon"] not in PHENOMENA:
                raise CorpusFormatError(path, lineno, f"unknown phenomenon {obj['phenomenon']!r}")
            if not all(isinstance(a, str) for a in obj["alternatives"]):
                raise CorpusFormatError(path, lineno, "'alternatives' must be strings")
            obj["alternatives"] = tuple(obj["alternatives"])
            labels.append(ContextLabel(**obj))
    return labels


def _bucket(correct: int, total: int) -> dict[str, float | int]:
    return {"accuracy": correct / total if total else 0.0, "correct": correct, "total": total}


def context_accuracy(
    hypotheses: Mapping[str, Sequence[str]], labels: Sequence[ContextLabel]
) -> dict[str, Any]:
    """Accuracy on the context-dependent tokens.

    A label is right iff ``hypotheses[doc_id][segment].split()[token_index] == correct``;
    a missing document, sentence or token counts as wrong (and as ``missing``). Returns
    ``accuracy``/``correct``/``total``/``missing``, ``chance_level`` and the buckets
    ``by_phenomenon``, ``by_distance`` and ``by_phenomenon_distance`` (each bucket a dict
    with ``accuracy``, ``correct``, ``total``; distance keys are ints, sorted).
    """
    tallies: dict[tuple[str, Any], list[int]] = {}
    missing = 0
    for lb in labels:
        sents = hypotheses.get(lb.doc_id)
        tokens = None
        if sents is not None and 0 <= lb.segment < len(sents):
            tokens = sents[lb.segment].split()
        if tokens is None or not 0 <= lb.token_index < len(tokens):
            missing += 1
            ok = 0
        else:
            ok = int(tokens[lb.token_index] == lb.correct)
        for key in (
            ("all", None),
            ("ph", lb.phenomenon),
            ("d", lb.distance),
            ("phd", (lb.phenomenon, lb.distance)),
        ):
            t = tallies.setdefault(key, [0, 0])
            t[0] += ok
            t[1] += 1
    all_c, all_t = tallies.get(("all", None), [0, 0])
    result: dict[str, Any] = {**_bucket(all_c, all_t), "missing": missing}
    result["chance_level"] = chance_level(labels)
    result["by_phenomenon"] = {
        k[1]: _bucket(*tallies[k]) for k in sorted(k for k in tallies if k[0] == "ph")
    }
    result["by_distance"] = {
        k[1]: _bucket(*tallies[k]) for k in sorted(k for k in tallies if k[0] == "d")
    }
    by_pd: dict[str, dict[int, Any]] = {}
    for k in sorted(k for k in tallies if k[0] == "phd"):
        by_pd.setdefault(k[1][0], {})[k[1][1]] = _bucket(*tallies[k])
    result["by_phenomenon_distance"] = by_pd
    return result


def chance_level(labels: Sequence[ContextLabel]) -> float:
    """Expected accuracy of a guesser that knows the candidate forms but not the context."""
    if not labels:
        return 0.0
    return float(np.mean([1.0 / (1 + len(lb.alternatives)) for lb in labels]))


def context_blind_hypotheses(
    documents: Sequence[Document],
    labels: Sequence[ContextLabel],
    strategy: str = "random",
    seed: int = 0,
) -> dict[str, list[str]]:
    """The references with every labelled token replaced by a context-blind guess.

    This is the best a sentence-level system can do: perfect elsewhere, and on labelled
    tokens a choice among :attr:`ContextLabel.candidates` made without the context,
    ``"random"`` (uniform, seeded) or ``"first"`` (always the first candidate). Its
    expected :func:`context_accuracy` is :func:`chance_level`.
    """
    if strategy not in ("random", "first"):
        raise ValueError(f"unknown strategy {strategy!r}")
    rng = np.random.default_rng(seed)
    hyps = {d.doc_id: [s.split() for s in d.tgt] for d in documents}
    for lb in labels:
        cands = lb.candidates
        guess = cands[int(rng.integers(len(cands)))] if strategy == "random" else cands[0]
        hyps[lb.doc_id][lb.segment][lb.token_index] = guess
    return {doc_id: [" ".join(t) for t in sents] for doc_id, sents in hyps.items()}
