"""The long-document synthetic context task: dependencies that cross the chunk boundary.

Document models cut a document into consecutive chunks of ``chunk_size`` (20) sentences
starting at sentence 0; a model that sees only its chunk cannot resolve a dependency on an
earlier chunk. This task puts such dependencies in long documents. Words and translation are
those of :mod:`docnmt_jax.data.synthetic` (same syllable alphabets, disjoint between the
languages; word-for-word translation with the adjective reordering rule), with its own
lexicon (a function of ``config.seed`` and the lexicon fields; every split shares it):

* ``lexicon_size`` filler words, a fraction ``adjective_fraction`` of them adjectives, each
  with one fixed target word;
* ``num_registers`` (R) registers with ``register_setters_per_register`` register-setting
  words each, each with one fixed target word;
* ``num_register_words`` ambiguous register words, each with R target senses, one per
  register;
* ``num_verb_classes`` (V) verb classes with ``verbs_per_class`` verbs each, each verb with
  one fixed target word;
* one class-neutral elision marker with V target forms, one per verb class.

A document has ``min_sentences..max_sentences`` sentences (uniform) of
``min_words..max_words`` words: filler words plus at most three special words (a register
word, a verb, the elision marker) at random positions. Phenomena:

* **register** (decided by sentence 0): sentence 0 holds one register-setting word of a
  uniformly drawn register r (register-setting words occur nowhere else). Every sentence
  k >= 1 holds, with probability ``p_register``, one ambiguous register word translated by
  its sense r: label ``"register"``, distance k.
* **elided_verb** (decided by sentence k - 1): sentence k holds the elision marker at every
  chunk start k = chunk_size, 2 * chunk_size, ... (k < length) and, with probability
  ``p_elided``, at any other k >= 1. Sentence k - 1 then holds one verb of a uniformly drawn
  class v and the marker is translated by form v: label ``"elided_verb"``, distance 1. Verbs
  occur only in the sentence right before an elision and a sentence holds at most one, so
  the antecedent is always the previous sentence. (Two consecutive elisions put a verb in
  an elision's own sentence; its class, drawn for the next sentence, says nothing about v.)

Register and verb class are drawn uniformly and independently of everything else in the
labelled sentence, so a model that does not see the deciding sentence is at chance:
1/R on register labels (default 1/2), 1/V on elided_verb labels (default 1/3). A chunk-local
model sees sentence 0 only for register distances < chunk_size and misses the verb of every
chunk-start elision (:func:`chunk_start`).

Labels are :class:`~docnmt_jax.data.context_labels.ContextLabel` (``doc_id``, ``segment``,
``token_index`` in the whitespace-split target, ``phenomenon``, ``distance``, ``correct``,
``alternatives``), written as ``{split}.labels.jsonl``; scoring is
:func:`~docnmt_jax.data.context_labels.context_accuracy`, plus :func:`long_context_accuracy`
(elided_verb at chunk starts vs elsewhere, register per chunk bucket) and
:func:`register_distance_table` (a Markdown table of register accuracy per distance).

Defaults: 64 filler words (16 adjectives), 2 registers x 2 setters, 4 register words,
3 verb classes x 3 verbs (82 source / 88 target word types); 30-200 sentences of 4-8 words;
p_register = 0.3, p_elided = 0.15; chunk_size 20; 1300 documents (about 147k sentence pairs,
33 register and 21 elided_verb labels per document on average).

Generation is deterministic: documents of split ``s`` come from
``numpy.random.default_rng([seed, 3, crc32(s)])`` one after another (a smaller corpus is a
prefix of a larger one), the lexicon from ``default_rng([seed, 2, 0])``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from docnmt_jax.data.context_labels import (
    ContextLabel,
    chance_level,
    context_accuracy,
    write_labels,
)
from docnmt_jax.data.documents import Document, write_tsv
from docnmt_jax.data.synthetic import (
    SRC_CONSONANTS,
    SRC_VOWELS,
    TGT_CONSONANTS,
    TGT_VOWELS,
    _word_factory,
    render_document,
)
from docnmt_jax.files import atomic_open

__all__ = [
    "LongLexicon",
    "LongSyntheticConfig",
    "build_long_lexicon",
    "chunk_start",
    "distance_bucket",
    "elided_verb_accuracy_by_position",
    "format_label_accuracy",
    "generate",
    "long_context_accuracy",
    "register_distance_table",
    "write_corpus",
]

PHENOMENA = ("register", "elided_verb")


@dataclasses.dataclass(frozen=True)
class LongSyntheticConfig:
    """Everything that defines a long-document synthetic corpus (see the module docstring)."""

    num_documents: int = 1300
    min_sentences: int = 30
    max_sentences: int = 200
    min_words: int = 4
    max_words: int = 8
    lexicon_size: int = 64
    adjective_fraction: float = 0.25
    num_registers: int = 2
    register_setters_per_register: int = 2
    num_register_words: int = 4
    num_verb_classes: int = 3
    verbs_per_class: int = 3
    p_register: float = 0.3
    p_elided: float = 0.15
    reorder: bool = True
    chunk_size: int = 20
    seed: int = 0

    def __post_init__(self) -> None:
        checks = [
            (self.num_documents >= 0, "num_documents must be >= 0"),
            (1 <= self.min_sentences <= self.max_sentences, "need 1 <= min_sentences <= max"),
            (3 <= self.min_words <= self.max_words, "need 3 <= min_words <= max_words"),
            (self.lexicon_size >= 2, "lexicon_size must be >= 2"),
            (0.0 <= self.adjective_fraction < 1.0, "adjective_fraction must be in [0, 1)"),
            (self.num_registers >= 2, "num_registers must be >= 2"),
            (self.register_setters_per_register >= 1, "register_setters_per_register >= 1"),
            (self.num_register_words >= 1, "num_register_words must be >= 1"),
            (self.num_verb_classes >= 2, "num_verb_classes must be >= 2"),
            (self.verbs_per_class >= 1, "verbs_per_class must be >= 1"),
            (0.0 <= self.p_register <= 1.0, "p_register must be in [0, 1]"),
            (0.0 <= self.p_elided <= 1.0, "p_elided must be in [0, 1]"),
            (self.chunk_size >= 2, "chunk_size must be >= 2"),
            (self.seed >= 0, "seed must be >= 0"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ValueError(f"LongSyntheticConfig: {msg}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready field dict."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LongSyntheticConfig:
        """Inverse of :meth:`to_dict`; unknown keys are an error."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"LongSyntheticConfig: unknown fields {sorted(unknown)}")
        return cls(**dict(d))

    def chance_levels(self) -> dict[str, float]:
        """Accuracy of a model blind to the deciding sentence, per phenomenon."""
        return {"register": 1.0 / self.num_registers, "elided_verb": 1.0 / self.num_verb_classes}


@dataclasses.dataclass(frozen=True)
class LongLexicon:
    """The bilingual word tables of the long task."""

    filler: tuple[tuple[str, str], ...]  # (source, target)
    adjectives: frozenset[str]  # source filler words that are adjectives
    register_setters: tuple[tuple[str, str, int], ...]  # (source, target, register)
    register_words: tuple[tuple[str, tuple[str, ...]], ...]  # (source, sense per register)
    verbs: tuple[tuple[str, str, int], ...]  # (source, target, class)
    elision: str
    elision_forms: tuple[str, ...]  # target form per verb class

    @functools.cached_property
    def context_free(self) -> dict[str, str]:
        """Source -> target for every word that translates without context."""
        table = dict(self.filler)
        table.update((s, t) for s, t, _ in self.register_setters)
        table.update((s, t) for s, t, _ in self.verbs)
        return table

    @functools.cached_property
    def register_of(self) -> dict[str, int]:
        return {s: r for s, _, r in self.register_setters}

    @functools.cached_property
    def verb_class(self) -> dict[str, int]:
        return {s: v for s, _, v in self.verbs}

    @functools.cached_property
    def senses(self) -> dict[str, tuple[str, ...]]:
        return dict(self.register_words)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready tables."""
        return {
            "filler": [[s, t, s in self.adjectives] for s, t in self.filler],
            "register_setters": [list(w) for w in self.register_setters],
            "register_words": [[s, list(senses)] for s, senses in self.register_words],
            "verbs": [list(w) for w in self.verbs],
            "elision": self.elision,
            "elision_forms": list(self.elision_forms),
        }


def build_long_lexicon(config: LongSyntheticConfig) -> LongLexicon:
    """The lexicon of ``config``; depends only on the seed and the lexicon fields."""
    rng = np.random.default_rng([config.seed, 2, 0])
    src = _word_factory(rng, SRC_CONSONANTS, SRC_VOWELS)
    tgt = _word_factory(rng, TGT_CONSONANTS, TGT_VOWELS)
    R, V = config.num_registers, config.num_verb_classes
    n_tgt = (
        config.lexicon_size
        + R * (config.register_setters_per_register + config.num_register_words)
        + V * (config.verbs_per_class + 1)
    )
    n_syl = len(TGT_CONSONANTS) * len(TGT_VOWELS)
    capacity = n_syl**2 + n_syl**3
    if n_tgt > capacity // 2:
        raise ValueError(f"lexicon needs {n_tgt} target words; at most {capacity // 2} supported")
    filler = tuple((src(), tgt()) for _ in range(config.lexicon_size))
    n_adj = int(round(config.adjective_fraction * config.lexicon_size))
    adjectives = frozenset(s for s, _ in filler[:n_adj])
    setters = tuple(
        (src(), tgt(), r) for r in range(R) for _ in range(config.register_setters_per_register)
    )
    register_words = tuple(
        (src(), tuple(tgt() for _ in range(R))) for _ in range(config.num_register_words)
    )
    verbs = tuple((src(), tgt(), v) for v in range(V) for _ in range(config.verbs_per_class))
    elision = src()
    elision_forms = tuple(tgt() for _ in range(V))
    return LongLexicon(filler, adjectives, setters, register_words, verbs, elision, elision_forms)


def _split_rng(config: LongSyntheticConfig, split: str) -> np.random.Generator:
    return np.random.default_rng([config.seed, 3, zlib.crc32(split.encode("utf-8"))])


def _specials(
    rng: np.random.Generator, config: LongSyntheticConfig, lex: LongLexicon, n: int
) -> dict[int, list[tuple[str, Any]]]:
    """Sentence index -> its special words: ("setter"|"verb", (src, tgt)) or
    ("register"|"elided_verb", (src, forms, value, distance))."""
    specials: dict[int, list[tuple[str, Any]]] = {k: [] for k in range(n)}
    r = int(rng.integers(config.num_registers))
    per = config.register_setters_per_register
    setter = lex.register_setters[r * per + int(rng.integers(per))]
    specials[0].append(("setter", setter[:2]))
    has_register = rng.random(n) < config.p_register
    has_elision = rng.random(n) < config.p_elided
    has_elision[:: config.chunk_size] = True  # every chunk start
    for k in range(1, n):
        if has_register[k]:
            src, senses = lex.register_words[int(rng.integers(config.num_register_words))]
            specials[k].append(("register", (src, senses, r, k)))
        if has_elision[k]:
            v = int(rng.integers(config.num_verb_classes))
            verb = lex.verbs[v * config.verbs_per_class + int(rng.integers(config.verbs_per_class))]
            specials[k - 1].append(("verb", verb[:2]))
            specials[k].append(("elided_verb", (lex.elision, lex.elision_forms, v, 1)))
    return specials


def _document(
    rng: np.random.Generator, config: LongSyntheticConfig, lex: LongLexicon, doc_id: str
) -> tuple[Document, list[ContextLabel]]:
    n = int(rng.integers(config.min_sentences, config.max_sentences + 1))
    specials = _specials(rng, config, lex, n)
    return render_document(rng, config, lex, doc_id, n, specials, ("setter", "verb"))


def generate(
    config: LongSyntheticConfig, split: str = "train"
) -> tuple[list[Document], list[ContextLabel]]:
    """``config.num_documents`` documents of ``split`` (ids ``{split}-000000``...) + labels."""
    lex = build_long_lexicon(config)
    rng = _split_rng(config, split)
    docs: list[Document] = []
    labels: list[ContextLabel] = []
    for i in range(config.num_documents):
        doc, doc_labels = _document(rng, config, lex, f"{split}-{i:06d}")
        docs.append(doc)
        labels.extend(doc_labels)
    return docs, labels


# ---------------------------------------------------------------------------------------------
# Label breakdowns and reports.


def chunk_start(label: ContextLabel, chunk_size: int = 20) -> bool:
    """Whether the label's sentence opens a chunk other than the first (its previous sentence
    lies in the previous chunk)."""
    return label.segment > 0 and label.segment % chunk_size == 0


def distance_bucket(distance: int, chunk_size: int = 20) -> str:
    """``"1-19"``, ``"20-39"``, ...: the chunk a register label at ``distance`` lies in (the
    first bucket is the only one in which a chunk-local model sees sentence 0)."""
    c = distance // chunk_size
    return f"{max(1, c * chunk_size)}-{(c + 1) * chunk_size - 1}"


def _by_key(labels: Sequence[ContextLabel], key) -> dict[Any, list[ContextLabel]]:
    groups: dict[Any, list[ContextLabel]] = {}
    for lb in labels:
        groups.setdefault(key(lb), []).append(lb)
    return groups


def _register_buckets(labels: Sequence[ContextLabel], chunk_size: int) -> dict[str, list]:
    reg = sorted((lb for lb in labels if lb.phenomenon == "register"), key=lambda b: b.distance)
    return _by_key(reg, lambda lb: distance_bucket(lb.distance, chunk_size))


def _accuracy_bucket(
    hypotheses: Mapping[str, Sequence[str]], labels: Sequence[ContextLabel]
) -> dict[str, float | int]:
    r = context_accuracy(hypotheses, labels)
    return {"accuracy": r["accuracy"], "correct": r["correct"], "total": r["total"]}


def elided_verb_accuracy_by_position(
    hypotheses: Mapping[str, Sequence[str]],
    labels: Sequence[ContextLabel],
    chunk_size: int = 20,
) -> dict[str, dict[str, float | int]]:
    """Accuracy on ``elided_verb`` labels at chunk starts (antecedent in the previous chunk)
    and elsewhere: ``{"chunk_start": bucket, "elsewhere": bucket}``, each bucket with
    ``accuracy``, ``correct``, ``total`` (scored by ``context_accuracy``)."""
    elided = [lb for lb in labels if lb.phenomenon == "elided_verb"]
    at_start = [lb for lb in elided if chunk_start(lb, chunk_size)]
    others = [lb for lb in elided if not chunk_start(lb, chunk_size)]
    return {
        "chunk_start": _accuracy_bucket(hypotheses, at_start),
        "elsewhere": _accuracy_bucket(hypotheses, others),
    }


def long_context_accuracy(
    hypotheses: Mapping[str, Sequence[str]],
    labels: Sequence[ContextLabel],
    chunk_size: int = 20,
) -> dict[str, Any]:
    """:func:`~docnmt_jax.data.context_labels.context_accuracy` plus
    ``elided_verb_by_position`` (:func:`elided_verb_accuracy_by_position`) and
    ``register_by_bucket`` (accuracy per :func:`distance_bucket`)."""
    result = context_accuracy(hypotheses, labels)
    result["elided_verb_by_position"] = elided_verb_accuracy_by_position(
        hypotheses, labels, chunk_size
    )
    result["register_by_bucket"] = {
        name: _accuracy_bucket(hypotheses, group)
        for name, group in _register_buckets(labels, chunk_size).items()
    }
    return result


def format_label_accuracy(result: Mapping[str, Any], max_distance: int = 60) -> str:
    """Text report of :func:`long_context_accuracy` (or ``context_accuracy``): overall, per
    phenomenon (with chance), the elided_verb and register splits when present, and per
    phenomenon and distance up to ``max_distance``."""

    def line(name: str, b: Mapping[str, Any]) -> str:
        return f"  {name:26s}{100 * b['accuracy']:6.1f}%  ({b['correct']}/{b['total']})"

    lines = [
        f"context labels: {100 * result['accuracy']:.1f}% ({result['correct']}/"
        f"{result['total']}; {result['missing']} missing); chance "
        f"{100 * result['chance_level']:.1f}%"
    ]
    lines += [line(ph, b) for ph, b in result["by_phenomenon"].items()]
    split = result.get("elided_verb_by_position", {})
    lines += [line(f"elided_verb {pos}", b) for pos, b in split.items() if b["total"]]
    for name, b in result.get("register_by_bucket", {}).items():
        lines.append(line(f"register distance {name}", b))
    for ph, by_d in result["by_phenomenon_distance"].items():
        shown = [(int(d), b) for d, b in by_d.items() if int(d) <= max_distance]
        lines.append(f"  {ph} by distance (1..{max_distance}):")
        lines += [line(f"  d={d}", b) for d, b in sorted(shown)]
    return "\n".join(lines)


def register_distance_table(
    results: Mapping[str, Mapping[str, Any]], max_distance: int = 60, chunk_size: int = 20
) -> str:
    """A Markdown table: one row per register distance 1..``max_distance`` (its chunk and
    label count, from the first result), one accuracy column (%) per model. ``results``: model
    name -> :func:`long_context_accuracy` / ``context_accuracy`` result (distance keys int, or
    str as read back from JSON); a distance without labels shows ``-``."""
    names = list(results)
    header = "| distance | chunk | labels | " + " | ".join(names) + " |"
    rule = "|---:|---:|---:|" + "---:|" * len(names)
    rows = [header, rule]

    def bucket(result: Mapping[str, Any], d: int) -> Mapping[str, Any] | None:
        by_d = result.get("by_phenomenon_distance", {}).get("register", {})
        return by_d.get(d, by_d.get(str(d)))

    for d in range(1, max_distance + 1):
        first = bucket(results[names[0]], d) if names else None
        cells = []
        for name in names:
            b = bucket(results[name], d)
            cells.append(f"{100 * b['accuracy']:.1f}" if b and b["total"] else "-")
        count = first["total"] if first else 0
        rows.append(f"| {d} | {d // chunk_size} | {count} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


# ---------------------------------------------------------------------------------------------
# Writing a corpus.


def split_statistics(
    config: LongSyntheticConfig, docs: Sequence[Document], labels: Sequence[ContextLabel]
) -> dict[str, Any]:
    """Documents, segments, label counts (per phenomenon, register per distance bucket,
    elided_verb at chunk starts / elsewhere) and chance levels of one split."""
    by_ph = _by_key(labels, lambda lb: lb.phenomenon)
    elided = by_ph.get("elided_verb", [])
    starts = sum(chunk_start(lb, config.chunk_size) for lb in elided)
    buckets = _register_buckets(labels, config.chunk_size)
    return {
        "documents": len(docs),
        "segments": sum(len(d) for d in docs),
        "labels": len(labels),
        "labels_by_phenomenon": {ph: len(by_ph.get(ph, [])) for ph in PHENOMENA},
        "register_labels_by_distance_bucket": {k: len(v) for k, v in buckets.items()},
        "elided_verb_labels_by_position": {
            "chunk_start": starts,
            "elsewhere": len(elided) - starts,
        },
        "chance_level": chance_level(labels),
        "chance_level_by_phenomenon": config.chance_levels(),
    }


def write_corpus(
    out_dir: str | os.PathLike,
    config: LongSyntheticConfig,
    splits: Mapping[str, int] | None = None,
) -> dict[str, Path]:
    """Writes ``{split}.tsv``, ``{split}.labels.jsonl`` per split and ``config.json``.

    ``splits`` maps split name -> number of documents (default ``train``:
    ``config.num_documents``, ``dev``: 100, ``test``: 300). ``config.json`` holds the config,
    per split :func:`split_statistics`, and the lexicon. Returns written paths by file name.
    """
    if splits is None:
        splits = {"train": config.num_documents, "dev": 100, "test": 300}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    stats: dict[str, Any] = {}
    for name, n in splits.items():
        if not name or any(ch in name for ch in "/\\\t\n") or name in (".", ".."):
            raise ValueError(f"bad split name {name!r}")
        docs, labels = generate(dataclasses.replace(config, num_documents=int(n)), split=name)
        for fname, writer, obj in (
            (f"{name}.tsv", write_tsv, docs),
            (f"{name}.labels.jsonl", write_labels, labels),
        ):
            writer(obj, out / fname)
            written[fname] = out / fname
        stats[name] = split_statistics(config, docs, labels)
    meta = {
        "task": "docnmt_jax long-document synthetic context task",
        "config": config.to_dict(),
        "splits": stats,
        "lexicon": build_long_lexicon(config).to_dict(),
    }
    with atomic_open(out / "config.json") as f:
        json.dump(meta, f, indent=2, sort_keys=True)
        f.write("\n")
    written["config.json"] = out / "config.json"
    return written
