"""The synthetic context task: parallel documents whose translation needs other sentences.

Every word is a lowercase pseudo-word. Source words are 2-3 syllables over the letters
``b d g k m n p r s t`` + ``a i o u``; target words over ``c f h j l v w x z`` + ``e y``.
The two alphabets are disjoint and every word is whitespace-separated, so a subword
segmenter (sentencepiece) sees two clean, non-overlapping languages.

Lexicon (a function of ``config.seed`` and the lexicon fields of the config only; every
split of a corpus shares it):

* ``lexicon_size`` filler words, a fraction ``adjective_fraction`` of them adjectives,
  each with one fixed target word;
* ``num_classes`` (C) noun classes with ``nouns_per_class`` class nouns each (balanced),
  each noun with one fixed, class-less target word;
* one class-neutral source pronoun with C target forms, one per class;
* ``num_topics`` (T) topics with ``topic_words_per_topic`` topic words each (balanced),
  each with one fixed target word;
* ``num_ambiguous`` ambiguous source words, each with T target senses, one per topic.

Translation is word for word with one reordering rule: an adjective directly followed by a
non-adjective is swapped with it (source ``ADJ X`` -> target ``X' ADJ'``), scanning left to
right. Every word except pronouns and ambiguous words translates without context.

A document has ``min_sentences..max_sentences`` sentences of ``min_words..max_words``
words; sentences are filler words plus the phenomena below (at most two special words per
sentence, at random positions; nothing else in a sentence depends on a class or a topic):

* **pronoun** (probability ``p_pronoun``): a distance d is drawn uniformly from
  ``distances``; sentence ``a`` contains one class noun of a uniformly drawn class c and
  sentence ``a + d`` contains the pronoun, translated by form c. Class nouns occur in no
  other sentence, so the antecedent is always the most recent noun-bearing sentence and
  the pronoun's own sentence says nothing about c.
* **topic** (probability ``p_topic``): sentence 0 contains one topic word of a uniformly
  drawn topic t (topic words occur nowhere else); 1..``max_ambiguous_per_doc`` distinct
  distances are drawn from ``distances`` and sentence d contains one ambiguous word,
  translated by its sense t.

Both may co-occur. The document length is drawn uniformly among the lengths that fit the
drawn distances. Dependencies never cross a chunk boundary: with ``chunk_size`` = 20
(documents cut into consecutive chunks of at most 20 sentences starting at sentence 0),
``a // 20 == (a + d) // 20`` always holds, and ambiguous words lie in chunk 0 because
every distance is < ``chunk_size`` (only relevant when ``max_sentences`` > 20).

Labels (:mod:`docnmt_jax.data.context_labels`, which also scores translations on them): one
:class:`ContextLabel` per pronoun and per ambiguous word in the target: ``doc_id``,
``segment`` (sentence index k), ``token_index`` (whitespace-token index in the target
sentence k), ``phenomenon`` (``"pronoun"``/``"topic"``), ``distance`` (k minus the index of
the deciding sentence), ``correct`` (the reference word) and ``alternatives`` (the other C-1
pronoun forms or T-1 senses). Since class and topic are drawn uniformly and independently of
everything in the labelled sentence, a model that sees only that sentence is exactly at
chance on the labels: 1/C for pronouns, 1/T for topic words (defaults 1/3 each);
:func:`chance_level` gives the mix for a label set.

Defaults: 64 filler words (16 adjectives), 3 classes x 4 nouns, 3 topics x 2 topic words,
4 ambiguous words (87 source / 97 target word types); 2-20 sentences of 4-8 words per
document; distances 1..15; p_pronoun = p_topic = 0.8; 1-2 ambiguous words per topic
document; 2000 documents (about 15.5k sentence pairs, 0.8 pronoun and 1.2 topic labels
per document on average).

Generation is deterministic: documents of split ``s`` come from
``numpy.random.default_rng([seed, 1, crc32(s)])`` one after another (a smaller corpus is a
prefix of a larger one), the lexicon from ``default_rng([seed, 0, 0])``.
"""

from __future__ import annotations

import argparse
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
    context_blind_hypotheses,
    read_labels,
    write_labels,
)
from docnmt_jax.data.documents import Document, write_tsv
from docnmt_jax.files import atomic_open

__all__ = [
    "SRC_CONSONANTS",
    "SRC_VOWELS",
    "TGT_CONSONANTS",
    "TGT_VOWELS",
    "ContextLabel",
    "Lexicon",
    "SyntheticConfig",
    "build_lexicon",
    "chance_level",
    "context_accuracy",
    "context_blind_hypotheses",
    "generate",
    "main",
    "read_labels",
    "word_level_vocab_size",
    "write_corpus",
    "write_labels",
]

SRC_CONSONANTS = "bdgkmnprst"
SRC_VOWELS = "aiou"
TGT_CONSONANTS = "cfhjlvwxz"
TGT_VOWELS = "ey"


@dataclasses.dataclass(frozen=True)
class SyntheticConfig:
    """Everything that defines a synthetic corpus (see the module docstring)."""

    num_documents: int = 2000
    min_sentences: int = 2
    max_sentences: int = 20
    min_words: int = 4
    max_words: int = 8
    lexicon_size: int = 64
    adjective_fraction: float = 0.25
    num_classes: int = 3
    nouns_per_class: int = 4
    num_topics: int = 3
    topic_words_per_topic: int = 2
    num_ambiguous: int = 4
    distances: tuple[int, ...] = tuple(range(1, 16))
    p_pronoun: float = 0.8
    p_topic: float = 0.8
    max_ambiguous_per_doc: int = 2
    reorder: bool = True
    chunk_size: int = 20
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "distances", tuple(int(d) for d in self.distances))
        checks = [
            (self.num_documents >= 0, "num_documents must be >= 0"),
            (1 <= self.min_sentences <= self.max_sentences, "need 1 <= min_sentences <= max"),
            (2 <= self.min_words <= self.max_words, "need 2 <= min_words <= max_words"),
            (self.lexicon_size >= 2, "lexicon_size must be >= 2"),
            (0.0 <= self.adjective_fraction < 1.0, "adjective_fraction must be in [0, 1)"),
            (self.num_classes >= 2 and self.num_topics >= 2, "need >= 2 classes and topics"),
            (self.nouns_per_class >= 1, "nouns_per_class must be >= 1"),
            (self.topic_words_per_topic >= 1, "topic_words_per_topic must be >= 1"),
            (self.num_ambiguous >= 1, "num_ambiguous must be >= 1"),
            (len(self.distances) > 0, "distances must not be empty"),
            (len(set(self.distances)) == len(self.distances), "distances must be distinct"),
            (all(d >= 1 for d in self.distances), "distances must be >= 1"),
            (self.chunk_size >= 2, "chunk_size must be >= 2"),
            (0.0 <= self.p_pronoun <= 1.0 and 0.0 <= self.p_topic <= 1.0, "bad probability"),
            (self.max_ambiguous_per_doc >= 1, "max_ambiguous_per_doc must be >= 1"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ValueError(f"SyntheticConfig: {msg}")
        d_max = max(self.distances)
        if d_max >= self.chunk_size:
            raise ValueError(f"SyntheticConfig: distance {d_max} >= chunk_size {self.chunk_size}")
        if d_max + 1 > self.max_sentences:
            raise ValueError(
                f"SyntheticConfig: distance {d_max} needs max_sentences >= {d_max + 1}"
            )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready field dict."""
        d = dataclasses.asdict(self)
        d["distances"] = list(self.distances)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SyntheticConfig:
        """Inverse of :meth:`to_dict`; unknown keys are an error."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"SyntheticConfig: unknown fields {sorted(unknown)}")
        return cls(**dict(d))


@dataclasses.dataclass(frozen=True)
class Lexicon:
    """The bilingual word tables of a task; a function of the config's lexicon fields."""

    filler: tuple[tuple[str, str], ...]  # (source, target)
    adjectives: frozenset[str]  # source filler words that are adjectives
    nouns: tuple[tuple[str, str, int], ...]  # (source, target, class)
    pronoun: str
    pronoun_forms: tuple[str, ...]  # target form per class
    topic_words: tuple[tuple[str, str, int], ...]  # (source, target, topic)
    ambiguous: tuple[tuple[str, tuple[str, ...]], ...]  # (source, target sense per topic)

    @functools.cached_property
    def context_free(self) -> dict[str, str]:
        """Source -> target for every word that translates without context."""
        table = dict(self.filler)
        table.update((s, t) for s, t, _ in self.nouns)
        table.update((s, t) for s, t, _ in self.topic_words)
        return table

    @functools.cached_property
    def noun_class(self) -> dict[str, int]:
        return {s: c for s, _, c in self.nouns}

    @functools.cached_property
    def topic_of(self) -> dict[str, int]:
        return {s: t for s, _, t in self.topic_words}

    @functools.cached_property
    def senses(self) -> dict[str, tuple[str, ...]]:
        return dict(self.ambiguous)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready tables."""
        return {
            "filler": [[s, t, s in self.adjectives] for s, t in self.filler],
            "nouns": [list(n) for n in self.nouns],
            "pronoun": self.pronoun,
            "pronoun_forms": list(self.pronoun_forms),
            "topic_words": [list(w) for w in self.topic_words],
            "ambiguous": [[s, list(senses)] for s, senses in self.ambiguous],
        }


def _word_factory(rng: np.random.Generator, consonants: str, vowels: str):
    syllables = [c + v for c in consonants for v in vowels]
    seen: set[str] = set()

    def new_word() -> str:
        while True:
            n = int(rng.integers(2, 4))
            w = "".join(syllables[i] for i in rng.integers(len(syllables), size=n))
            if w not in seen:
                seen.add(w)
                return w

    return new_word


def build_lexicon(config: SyntheticConfig) -> Lexicon:
    """The lexicon of ``config``; depends only on the seed and the lexicon fields."""
    rng = np.random.default_rng([config.seed, 0, 0])
    src = _word_factory(rng, SRC_CONSONANTS, SRC_VOWELS)
    tgt = _word_factory(rng, TGT_CONSONANTS, TGT_VOWELS)
    n_tgt = (
        config.lexicon_size
        + config.num_classes * (config.nouns_per_class + 1)
        + config.num_topics * (config.topic_words_per_topic + config.num_ambiguous)
    )
    n_syl = len(TGT_CONSONANTS) * len(TGT_VOWELS)
    capacity = n_syl**2 + n_syl**3
    if n_tgt > capacity // 2:
        raise ValueError(f"lexicon needs {n_tgt} target words; at most {capacity // 2} supported")
    filler = tuple((src(), tgt()) for _ in range(config.lexicon_size))
    n_adj = int(round(config.adjective_fraction * config.lexicon_size))
    adjectives = frozenset(s for s, _ in filler[:n_adj])
    nouns = tuple(
        (src(), tgt(), c) for c in range(config.num_classes) for _ in range(config.nouns_per_class)
    )
    pronoun = src()
    pronoun_forms = tuple(tgt() for _ in range(config.num_classes))
    topic_words = tuple(
        (src(), tgt(), t)
        for t in range(config.num_topics)
        for _ in range(config.topic_words_per_topic)
    )
    ambiguous = tuple(
        (src(), tuple(tgt() for _ in range(config.num_topics))) for _ in range(config.num_ambiguous)
    )
    return Lexicon(filler, adjectives, nouns, pronoun, pronoun_forms, topic_words, ambiguous)


def _split_rng(config: SyntheticConfig, split: str) -> np.random.Generator:
    return np.random.default_rng([config.seed, 1, zlib.crc32(split.encode("utf-8"))])


def _translate(
    words: list[tuple[str, str, bool, Any]], reorder: bool
) -> tuple[list[str], dict[Any, int]]:
    """(src, tgt, is_adjective, tag) tokens -> target words and target index per tag."""
    order: list[int] = []
    i = 0
    while i < len(words):
        if reorder and words[i][2] and i + 1 < len(words) and not words[i + 1][2]:
            order += [i + 1, i]
            i += 2
        else:
            order.append(i)
            i += 1
    out = [words[j][1] for j in order]
    where = {words[j][3]: pos for pos, j in enumerate(order) if words[j][3] is not None}
    return out, where


def _document(
    rng: np.random.Generator, config: SyntheticConfig, lex: Lexicon, doc_id: str
) -> tuple[Document, list[ContextLabel]]:
    dists = config.distances
    specials: dict[int, list[tuple[str, Any]]] = {}
    need = config.min_sentences
    d_pron = 0
    if rng.random() < config.p_pronoun:
        d_pron = dists[int(rng.integers(len(dists)))]
        need = max(need, d_pron + 1)
    topic_ds: list[int] = []
    if rng.random() < config.p_topic:
        m = min(int(rng.integers(1, config.max_ambiguous_per_doc + 1)), len(dists))
        topic_ds = sorted(int(dists[i]) for i in rng.permutation(len(dists))[:m])
        need = max(need, topic_ds[-1] + 1)
    n = int(rng.integers(need, config.max_sentences + 1))
    if topic_ds:
        t = int(rng.integers(config.num_topics))
        tw = lex.topic_words[
            t * config.topic_words_per_topic + int(rng.integers(config.topic_words_per_topic))
        ]
        specials.setdefault(0, []).append(("topicword", tw))
        for d in topic_ds:
            src, senses = lex.ambiguous[int(rng.integers(config.num_ambiguous))]
            specials.setdefault(d, []).append(("topic", (src, senses, t, d)))
    if d_pron:
        cs = config.chunk_size
        valid = [a for a in range(n - d_pron) if a % cs + d_pron < cs]
        a = valid[int(rng.integers(len(valid)))]
        c = int(rng.integers(config.num_classes))
        noun = lex.nouns[c * config.nouns_per_class + int(rng.integers(config.nouns_per_class))]
        specials.setdefault(a, []).append(("noun", noun))
        forms = lex.pronoun_forms
        specials.setdefault(a + d_pron, []).append(("pronoun", (lex.pronoun, forms, c, d_pron)))

    return render_document(rng, config, lex, doc_id, n, specials, ("noun", "topicword"))


def render_document(
    rng: np.random.Generator,
    config: Any,
    lex: Any,
    doc_id: str,
    n: int,
    specials: Mapping[int, list[tuple[str, Any]]],
    plain_kinds: tuple[str, ...],
) -> tuple[Document, list[ContextLabel]]:
    """Document ``doc_id`` of ``n`` sentences of filler words (``config.min_words ..
    max_words``, ``lex.filler``/``lex.adjectives``) with ``specials[k]`` placed at random
    positions of sentence ``k``: ``(kind, (src, tgt))`` for a kind in ``plain_kinds`` (a word
    translated as it is), else ``(kind, (src, forms, value, distance))``, a labelled word
    translated by ``forms[value]``; translated by :func:`_translate`. Shared by this task and
    :mod:`~docnmt_jax.data.synthetic_long` (the same draws in the same order)."""
    srcs: list[str] = []
    tgts: list[str] = []
    labels: list[ContextLabel] = []
    for k in range(n):
        length = int(rng.integers(config.min_words, config.max_words + 1))
        fill = rng.integers(len(lex.filler), size=length)
        words = [(s, t, s in lex.adjectives, None) for s, t in (lex.filler[i] for i in fill)]
        sp = specials.get(k, [])
        slots = rng.permutation(length)[: len(sp)]
        pending = []
        for slot, (kind, info) in zip(slots, sp, strict=True):
            if kind in plain_kinds:
                words[slot] = (info[0], info[1], False, None)
            else:
                src, forms, value, dist = info
                words[slot] = (src, forms[value], False, kind)
                pending.append((kind, forms, value, dist))
        out, where = _translate(words, config.reorder)
        for kind, forms, value, dist in pending:
            labels.append(
                ContextLabel(
                    doc_id=doc_id,
                    segment=k,
                    token_index=where[kind],
                    phenomenon=kind,
                    distance=dist,
                    correct=forms[value],
                    alternatives=tuple(f for i, f in enumerate(forms) if i != value),
                )
            )
        srcs.append(" ".join(w[0] for w in words))
        tgts.append(" ".join(out))
    labels.sort(key=lambda lb: (lb.segment, lb.token_index))
    return Document(doc_id, tuple(srcs), tuple(tgts)), labels


def generate(
    config: SyntheticConfig, split: str = "train"
) -> tuple[list[Document], list[ContextLabel]]:
    """``config.num_documents`` documents of ``split`` (ids ``{split}-000000``...) + labels."""
    lex = build_lexicon(config)
    rng = _split_rng(config, split)
    docs: list[Document] = []
    labels: list[ContextLabel] = []
    for i in range(config.num_documents):
        doc, doc_labels = _document(rng, config, lex, f"{split}-{i:06d}")
        docs.append(doc)
        labels.extend(doc_labels)
    return docs, labels


def write_corpus(
    out_dir: str | os.PathLike,
    config: SyntheticConfig,
    splits: Mapping[str, int] | None = None,
) -> dict[str, Path]:
    """Writes ``{split}.tsv``, ``{split}.labels.jsonl`` per split and ``config.json``.

    ``splits`` maps split name -> number of documents (default ``train``:
    ``config.num_documents``, ``dev``: 500, ``test``: 1000). Splits differ in their
    document seed, share the lexicon. ``config.json`` holds the config, the splits, label
    counts, chance levels and the lexicon. Returns written paths by file name.
    """
    if splits is None:
        splits = {"train": config.num_documents, "dev": 500, "test": 1000}
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
        stats[name] = {
            "documents": len(docs),
            "segments": sum(len(d) for d in docs),
            "labels": len(labels),
            "chance_level": chance_level(labels),
        }
    meta = {
        "task": "docnmt_jax synthetic context task",
        "config": config.to_dict(),
        "splits": stats,
        "lexicon": build_lexicon(config).to_dict(),
    }
    with atomic_open(out / "config.json") as f:
        json.dump(meta, f, indent=2, sort_keys=True)
        f.write("\n")
    written["config.json"] = out / "config.json"
    return written


def word_level_vocab_size(documents: Sequence[Document]) -> int:
    """The largest sentencepiece vocabulary (byte fallback) for ``documents``: 256 bytes + 4
    specials + the characters + the word-boundary piece + the words. At this size (nearly)
    every word is one piece; a smaller one splits words into letters, which makes the
    synthetic task much slower to learn."""
    words = {w for doc in documents for text in doc.src + doc.tgt for w in text.split()}
    chars = {c for w in words for c in w}
    return 256 + 4 + len(chars) + 1 + len(words)


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m docnmt_jax.data.synthetic OUT_DIR [--train N --dev N --test N --seed S]
    [--distances 1,2 --min_sentences 2 --max_sentences 4 --p_pronoun 1 --p_topic 0]``."""
    p = argparse.ArgumentParser(description="Write the synthetic context-task corpus.")
    p.add_argument("out_dir")
    p.add_argument("--train", type=int, default=SyntheticConfig.num_documents)
    p.add_argument("--dev", type=int, default=500)
    p.add_argument("--test", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--distances", help="comma-separated antecedent distances (default 1..15)")
    for name in ("min_sentences", "max_sentences"):
        p.add_argument(f"--{name}", type=int, default=getattr(SyntheticConfig, name))
    for name in ("p_pronoun", "p_topic"):
        p.add_argument(f"--{name}", type=float, default=getattr(SyntheticConfig, name))
    args = p.parse_args(argv)
    task = {k: getattr(args, k) for k in ("min_sentences", "max_sentences", "p_pronoun", "p_topic")}
    if args.distances:
        task["distances"] = tuple(int(d) for d in args.distances.split(","))
    config = SyntheticConfig(num_documents=args.train, seed=args.seed, **task)
    written = write_corpus(
        args.out_dir, config, {"train": args.train, "dev": args.dev, "test": args.test}
    )
    for path in written.values():
        print(path)


if __name__ == "__main__":
    main()
