"""Spanish→English pronoun contrastive sets from any es→en document TSV (docs/evaluation.md).

**Gender set** (``PREFIX.pronouns.jsonl``). An instance is a sentence (a Bible verse) whose
reference has third-person singular gendered pronouns of a gender *g* and whose source has no
overt pronoun of *g* (:func:`~docnmt_jax.data.pronoun_rules.overt_pronouns`: *él/ella*, *la/lo*
before a verb, enclitics as *tomóla*; *díjole*'s *le* is not gendered and does not count).
Candidates: the reference (correct) and the reference with every pronoun of *g* given the other
gender (:func:`~docnmt_jax.data.pronoun_rules.swap_gender`); a sentence with pronouns of both
genders gives one instance per gender, each swapping only its own. Context: the document's
(chapter's) previous sentences, source and reference. Recorded per instance:

* ``gender``; ``distance``: sentences back to the nearest previous sentence whose reference
  names *g* (a pronoun of *g*, or a cue word of :data:`~docnmt_jax.data.pronoun_rules.CUES_EN`),
  None when none does; ``in_chunk``: ``distance <= chunk - 1`` (the forced-choice view of a
  chunk model: the current sentence and its ``chunk - 1`` predecessors); ``same_chunk``: the
  antecedent lies in the current sentence's fixed pipeline chunk (``i // chunk``);
* ``current_cue``: the cue words of *g* in the current sentence (reference or source);
  ``context_only``: no current cue and the antecedent inside the chunk -- only the context
  can decide;
* ``bucket``: ``1``, ``2``, ``3-5``, ``>5`` (up to ``chunk - 1``), ``outside`` (farther),
  ``none`` (no antecedent in the document).

**Possessor-number set** (``PREFIX.possessors.jsonl``): a source with *su*/*sus* and no *de
él/ella/ellos/ellas*, whose reference's possessives are all singular (*his*, *her* before a noun,
*hers*) or all plural (*their(s)*); candidates: the reference and its number swapped
(:func:`~docnmt_jax.data.pronoun_rules.swap_number`); recorded: ``number``, ``current_cue``.

The possessor set is written only when balancing leaves at least :data:`MIN_INSTANCES` (50)
instances (the Bible's test books give 32: none). Both sets are balanced (:func:`balance`:
the larger class drawn down to the smaller, seeded, corpus order kept). One JSON object a
line (:func:`instance_json`); :func:`read_pronoun_set` gives
:class:`~docnmt_jax.data.contrastive_sets.ContrastiveInstance` objects with breakdown
attributes (gender set: ``gender``, ``distance``, ``context_only``; number set: ``number``,
``context_only`` = no same-number personal pronoun in the reference) and ``where`` =
``FILE:LINE``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from docnmt_jax.data import pronoun_rules as rules
from docnmt_jax.data.contrastive_sets import ContrastiveFormatError, ContrastiveInstance
from docnmt_jax.data.documents import Document
from docnmt_jax.data.readers import _read_lines, read_tsv

SETS = ("pronouns", "possessors")
#: The possessor set is written only when balancing leaves this many instances (docs/evaluation.md).
MIN_INSTANCES = 50
DISTANCE_BUCKETS = ("1", "2", "3-5", ">5", "outside", "none")


@dataclasses.dataclass(frozen=True)
class PronounInstance:
    """One built instance (see the module docstring); ``value`` is the gender or number."""

    phenomenon: str  # "gender" or "number"
    value: str
    doc_id: str
    sentence: int
    src: str
    reference: str
    swapped: str
    context_src: tuple[str, ...]
    context_tgt: tuple[str, ...]
    current_cue: tuple[str, ...] = ()
    distance: int | None = None
    chunk: int = 20
    words: tuple[str, ...] = ()

    @property
    def in_chunk(self) -> bool:
        return self.distance is not None and self.distance <= self.chunk - 1

    @property
    def same_chunk(self) -> bool:
        d = self.distance
        return d is not None and (self.sentence - d) // self.chunk == self.sentence // self.chunk

    @property
    def bucket(self) -> str:
        return distance_bucket(self.distance, self.chunk)

    @property
    def context_only(self) -> bool:
        if self.phenomenon == "number":
            return not self.current_cue
        return not self.current_cue and self.in_chunk


def distance_bucket(distance: int | None, chunk: int = 20) -> str:
    """``1``, ``2``, ``3-5``, ``>5`` (to ``chunk - 1``), ``outside``, or ``none``."""
    if distance is None:
        return "none"
    if distance >= chunk:
        return "outside"
    if distance <= 2:
        return str(distance)
    return "3-5" if distance <= 5 else ">5"


def antecedent_distance(document: Document, index: int, gender: str) -> int | None:
    """Sentences back from ``index`` to the nearest one whose reference names ``gender``."""
    for j in range(index - 1, -1, -1):
        if rules.names_gender(document.tgt[j], gender):
            return index - j
    return None


Evidence = tuple[frozenset[str], frozenset[str]]


def gender_instances(
    documents: Sequence[Document], evidence: Evidence, chunk: int = 20
) -> tuple[list[PronounInstance], Counter]:
    """Every gender instance of ``documents`` and the skip counts by reason."""
    found, skipped = [], Counter()
    for doc in documents:
        for i, (src, tgt) in enumerate(zip(doc.src, doc.tgt, strict=True)):
            genders = sorted({g for _, g in rules.pronouns_en(tgt)})
            overt = {g for _, g in rules.overt_pronouns(src, evidence)}
            for gender in genders:
                if gender in overt:
                    skipped[f"overt {gender} pronoun in the source"] += 1
                    continue
                swapped, n = rules.swap_gender(tgt, gender)
                words = tuple(w for w, g in rules.pronouns_en(tgt) if g == gender)
                found.append(
                    PronounInstance(
                        "gender",
                        gender,
                        doc.doc_id,
                        i,
                        src,
                        tgt,
                        swapped,
                        tuple(doc.src[:i]),
                        tuple(doc.tgt[:i]),
                        tuple(rules.gender_cues(src, tgt, gender)),
                        antecedent_distance(doc, i, gender),
                        chunk,
                        words,
                    )
                )
    return found, skipped


def _overt_possessor(src: str) -> bool:
    words = rules.spanish_words(src)
    return any(
        a == "de" and b in ("él", "ella", "ellos", "ellas")
        for a, b in zip(words, words[1:], strict=False)
    )


def number_instances(
    documents: Sequence[Document], chunk: int = 20
) -> tuple[list[PronounInstance], Counter]:
    """Every possessor-number instance of ``documents`` and the skip counts by reason."""
    found, skipped = [], Counter()
    for doc in documents:
        for i, (src, tgt) in enumerate(zip(doc.src, doc.tgt, strict=True)):
            if not {"su", "sus"} & set(rules.spanish_words(src)):
                continue
            numbers = {n for _, n in rules.possessives_en(tgt)}
            if len(numbers) != 1:
                skipped["no possessive" if not numbers else "both numbers"] += 1
                continue
            if _overt_possessor(src):
                skipped["de él/ella/ellos/ellas in the source"] += 1
                continue
            (number,) = numbers
            swapped, _ = rules.swap_number(tgt, number)
            cue = [w for w, _ in rules.pronouns_en(tgt)] if number == "singular" else []
            cue += [w for w in rules.spanish_words(tgt.lower()) if w in ("they", "them")]
            words = tuple(w for w, _ in rules.possessives_en(tgt))
            found.append(
                PronounInstance(
                    "number",
                    number,
                    doc.doc_id,
                    i,
                    src,
                    tgt,
                    swapped,
                    tuple(doc.src[:i]),
                    tuple(doc.tgt[:i]),
                    tuple(c for c in cue if c not in ("his", "her", "hers")),
                    None,
                    chunk,
                    words,
                )
            )
    return found, skipped


def balance(instances: Sequence[PronounInstance], seed: int = 0) -> list[PronounInstance]:
    """Every class (``value``) drawn down to the smallest class's size (seeded; the chosen
    instances kept in corpus order)."""
    classes: dict[str, list[int]] = {}
    for n, inst in enumerate(instances):
        classes.setdefault(inst.value, []).append(n)
    if not classes:
        return []
    size = min(len(v) for v in classes.values())
    rng = random.Random(seed)
    keep = sorted(n for v in sorted(classes) for n in rng.sample(classes[v], size))
    return [instances[n] for n in keep]


# ------------------------------------------------------------------------------- files


def instance_json(inst: PronounInstance) -> dict[str, Any]:
    """The JSON object of one instance (one line of the set)."""
    key = "gender" if inst.phenomenon == "gender" else "number"
    return {
        "phenomenon": inst.phenomenon,
        key: inst.value,
        "doc_id": inst.doc_id,
        "sentence": inst.sentence,
        "src": inst.src,
        "candidates": [inst.reference, inst.swapped],
        "correct": 0,
        "words": list(inst.words),
        "distance": inst.distance,
        "bucket": inst.bucket if inst.phenomenon == "gender" else None,
        "in_chunk": inst.in_chunk,
        "same_chunk": inst.same_chunk,
        "chunk": inst.chunk,
        "current_cue": list(inst.current_cue),
        "context_only": inst.context_only,
        "context_src": list(inst.context_src),
        "context_tgt": list(inst.context_tgt),
    }


def _attributes(record: dict[str, Any]) -> dict[str, str]:
    only = "yes" if record["context_only"] else "no"
    if record["phenomenon"] == "gender":
        return {"gender": record["gender"], "distance": record["bucket"], "context_only": only}
    return {"number": record["number"], "context_only": only}


_FIELDS = ("phenomenon", "doc_id", "src", "candidates", "correct", "context_src", "context_tgt")


def read_pronoun_set(path: str) -> tuple[list[ContrastiveInstance], list[dict[str, Any]]]:
    """The instances of a set file and their JSON records (``doc_id``, ``distance`` ...);
    a malformed line is a :class:`ContrastiveFormatError` ``FILE:LINE: reason``."""
    path = os.fspath(path)
    instances, records = [], []
    for n, line in enumerate(_read_lines(path), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ContrastiveFormatError(path, n, f"invalid JSON: {e.msg}") from None
        missing = [k for k in _FIELDS if not isinstance(record, dict) or k not in record]
        if missing:
            raise ContrastiveFormatError(path, n, f"missing field {missing[0]!r}")
        try:
            ctx_src, ctx_tgt = tuple(record["context_src"]), tuple(record["context_tgt"])
            instances.append(
                ContrastiveInstance(
                    context_src=ctx_src,
                    src=record["src"],
                    context_tgt=(ctx_tgt,) * len(record["candidates"]),
                    candidates=tuple(record["candidates"]),
                    correct=record["correct"],
                    attributes=_attributes(record),
                    where=f"{path}:{n}",
                )
            )
        except (ValueError, KeyError, TypeError) as e:
            raise ContrastiveFormatError(path, n, str(e).strip("'")) from None
        records.append(record)
    if not instances:
        raise ContrastiveFormatError(path, 1, "no instances")
    return instances, records


def write_set(path: str, instances: Iterable[PronounInstance]) -> None:
    from docnmt_jax.files import write_atomic

    lines = [json.dumps(instance_json(i), ensure_ascii=False) for i in instances]
    write_atomic(path, "".join(line + "\n" for line in lines))


def set_stats(instances: Sequence[PronounInstance], skipped: Counter, found: int) -> dict:
    """Counts of a built set: total, by class, bucket, context-only, book, skips."""
    count = Counter
    return {
        "instances": len(instances),
        "before_balancing": found,
        "by_value": dict(sorted(count(i.value for i in instances).items())),
        "by_distance": {
            b: n
            for b in DISTANCE_BUCKETS
            if (n := sum(i.bucket == b for i in instances if i.phenomenon == "gender"))
        },
        "context_only": sum(i.context_only for i in instances),
        "context_only_by_value": dict(
            sorted(count(i.value for i in instances if i.context_only).items())
        ),
        "current_cue": sum(bool(i.current_cue) for i in instances),
        "by_book": dict(sorted(count(i.doc_id.split(".")[0] for i in instances).items())),
        "skipped": dict(sorted(skipped.items())),
    }


def build_sets(
    tsv: str,
    out_prefix: str,
    evidence_tsvs: Sequence[str] = (),
    chunk: int = 20,
    seed: int = 0,
    min_instances: int = MIN_INSTANCES,
) -> dict[str, dict[str, Any]]:
    """Builds the sets of the corpus TSV ``tsv``: ``OUT_PREFIX.{pronouns,possessors}.jsonl``
    (the *la/lo* evidence from ``tsv`` and ``evidence_tsvs``), the possessor set only when
    balancing leaves ``min_instances`` (else a stale file of it is removed); returns their
    statistics (``written``: the file, or None)."""
    documents = read_tsv(tsv)
    sources = [s for doc in documents for s in doc.src]
    for extra in evidence_tsvs:
        sources += [s for doc in read_tsv(extra) for s in doc.src]
    evidence = rules.clitic_evidence(sources)
    stats = {}
    built = {
        "pronouns": gender_instances(documents, evidence, chunk),
        "possessors": number_instances(documents, chunk),
    }
    for name, (found, skipped) in built.items():
        chosen = balance(found, seed)
        path = f"{out_prefix}.{name}.jsonl"
        stats[name] = set_stats(chosen, skipped, len(found))
        enough = name == "pronouns" or len(chosen) >= min_instances
        stats[name]["written"] = path if enough else None
        if enough:
            write_set(path, chosen)
        elif os.path.exists(path):
            os.remove(path)
    return stats


def format_stats(stats: dict[str, dict[str, Any]], tsv: str) -> str:
    """A readable summary of :func:`build_sets`' statistics."""
    lines = [f"pronoun contrastive sets of {tsv}:"]
    for name, s in stats.items():
        where = f"written to {s['written']}" if s["written"] else "too few: not written"
        lines.append(
            f"  {name}: {s['instances']} instances (balanced from {s['before_balancing']}; "
            f"{where}); "
            f"by class {s['by_value']}; context-only {s['context_only']} "
            f"{s['context_only_by_value']}"
        )
        if s["by_distance"]:
            lines.append(f"    by antecedent distance {s['by_distance']}")
        lines.append(f"    by book {s['by_book']}; skipped {s['skipped']}")
    return "\n".join(lines)
