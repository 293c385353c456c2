"""Pronoun overlap: clipped per-sentence matches of target-language pronouns.

A reference-based, alignment-free stand-in for pronoun evaluation. It is **not** APT
(Miculicich Werlen & Popescu-Belis 2017, reported by Tan et al. 2019), which needs word
alignments; it only asks whether each sentence's hypothesis uses the reference's pronouns.

* **Tokenisation**: a sentence is lower-cased (``str.lower``) and split into maximal runs of
  letters (``str.isalpha``); every other character (spaces, punctuation, digits, ``_``,
  straight and curly apostrophes, hyphens) separates tokens. So ``"It's"`` gives ``it`` and
  ``s``, ``"I’m"`` gives ``i`` and ``m``, ``"God's"`` gives ``god`` and ``s``.
* **Pronouns**: tokens in a word list. ``PRONOUNS["en"]``: personal, object, possessive and
  reflexive pronouns, i me my mine myself you your yours yourself yourselves he him his
  himself she her hers herself it its itself we us our ours ourselves they them their theirs
  themselves, plus the archaic thou thee thy thine thyself ye (absent from the WEB Bible
  target, kept for KJV-style references). The list is by surface form: "her" object and "her"
  possessive are one type; "US" and the numeral "I" count as pronouns. Other languages or
  lists: pass ``pronouns`` (a language key or words), or a file to :func:`read_pronoun_list`.
* **Clipping**: per sentence and pronoun type ``p``, ``matched_p = min(hyp_p, ref_p)``
  (BLEU's unigram clipping, per sentence); totals and per-type counts sum over sentences.
* **Scores**: precision = matched / hypothesis pronouns, recall = matched / reference
  pronouns, F1 = 2PR / (P + R), all fractions in [0, 1], overall and per type. A zero
  denominator gives 0.0 (the counts are reported alongside), so a test set without pronouns
  scores P = R = F1 = 0.0.
"""

from __future__ import annotations

import errno
import os
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from docnmt_jax.data.documents import CorpusFormatError
from docnmt_jax.data.readers import _is_blank, _read_lines
from docnmt_jax.errors import ConfigError, InputMismatchError, RunNotFoundError

PRONOUNS: dict[str, frozenset[str]] = {
    "en": frozenset(
        "i me my mine myself you your yours yourself yourselves he him his himself she her hers "
        "herself it its itself we us our ours ourselves they them their theirs themselves "
        "thou thee thy thine thyself ye".split()
    ),
}


def tokenize(text: str) -> list[str]:
    """Lower-cased maximal runs of letters: ``"It's his."`` -> ``["it", "s", "his"]``."""
    return "".join(c if c.isalpha() else " " for c in text.lower()).split()


def _resolve(pronouns: str | Iterable[str]) -> frozenset[str]:
    if isinstance(pronouns, str):
        if pronouns not in PRONOUNS:
            raise ConfigError(f"no pronoun list for {pronouns!r} (have {sorted(PRONOUNS)})")
        return PRONOUNS[pronouns]
    words = frozenset(w.lower() for w in pronouns)
    bad = sorted(w for w in words if tokenize(w) != [w])
    if bad:
        raise InputMismatchError(f"pronouns must be single words of letters, got {bad}")
    if not words:
        raise InputMismatchError("empty pronoun list")
    return words


def read_pronoun_list(path: str | os.PathLike) -> frozenset[str]:
    """Reads a list file: one word per line (lower-cased); blank and ``#`` lines are skipped.

    Raises OSError if the file is missing, :class:`CorpusFormatError` (``FILE[:LINE]:
    reason``) for a line that is not one word of letters or a file without words.
    """
    if not os.path.exists(path):
        raise RunNotFoundError(errno.ENOENT, "pronoun list not found", os.fspath(path))
    words = set()
    for i, line in enumerate(_read_lines(path), start=1):
        word = line.strip()
        if _is_blank(word) or word.startswith("#"):
            continue
        if tokenize(word) != [word.lower()]:
            raise CorpusFormatError(
                path, i, f"pronoun list: {word!r} is not one word of letters (see pronouns.py)"
            )
        words.add(word.lower())
    if not words:
        raise CorpusFormatError(path, None, "pronoun list: no words in the file")
    return frozenset(words)


def _prf(matched: int, hyp: int, ref: int) -> dict[str, Any]:
    p = matched / hyp if hyp else 0.0
    r = matched / ref if ref else 0.0
    f1 = 2 * p * r / (p + r) if p + r else 0.0
    return {
        "matched": matched,
        "hypothesis": hyp,
        "reference": ref,
        "precision": p,
        "recall": r,
        "f1": f1,
    }


def pronoun_scores(
    hyps: Sequence[str], refs: Sequence[str], pronouns: str | Iterable[str] = "en"
) -> dict[str, Any]:
    """Pronoun overlap of aligned hypothesis and reference sentences (see the module doc).

    ``pronouns``: a key of :data:`PRONOUNS` or the words themselves. Returns ``{"matched",
    "hypothesis", "reference", "precision", "recall", "f1", "sentences", "list_size",
    "per_pronoun": {word: {matched, hypothesis, reference, precision, recall, f1}}}``,
    ``per_pronoun`` holding the types seen on either side, most frequent in the reference
    first. Raises ValueError if the sentence counts differ.
    """
    if len(hyps) != len(refs):
        raise InputMismatchError(
            f"{len(hyps)} hypothesis sentences but {len(refs)} reference sentences"
        )
    words = _resolve(pronouns)
    hyp_c, ref_c, match_c = Counter(), Counter(), Counter()
    for h, r in zip(hyps, refs, strict=True):
        hc = Counter(t for t in tokenize(h) if t in words)
        rc = Counter(t for t in tokenize(r) if t in words)
        hyp_c += hc
        ref_c += rc
        match_c += hc & rc
    types = sorted(hyp_c.keys() | ref_c.keys(), key=lambda w: (-ref_c[w], -hyp_c[w], w))
    return {
        **_prf(sum(match_c.values()), sum(hyp_c.values()), sum(ref_c.values())),
        "sentences": len(refs),
        "list_size": len(words),
        "per_pronoun": {w: _prf(match_c[w], hyp_c[w], ref_c[w]) for w in types},
    }


def format_pronoun_report(result: dict[str, Any]) -> str:
    """Text lines for ``launch/evaluate.py``: the totals, then one line per pronoun type."""

    def scores(s: dict[str, Any]) -> str:
        return f"P {s['precision']:.4f}  R {s['recall']:.4f}  F1 {s['f1']:.4f}"

    source = f"list {result['list']}, " if "list" in result else ""
    r = result
    lines = [
        f"{'pronouns':11s}{scores(r)}  (clipped overlap, not APT; matched/hyp/ref "
        f"{r['matched']}/{r['hypothesis']}/{r['reference']}; {source}{r['list_size']} words)"
    ]
    for w, s in r["per_pronoun"].items():
        lines.append(
            f"{'':11s}{w:11s}{scores(s)}  ({s['matched']}/{s['hypothesis']}/{s['reference']})"
        )
    return "\n".join(lines)
