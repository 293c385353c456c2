"""Plain text of the OSIS verse markup stored in SWORD Bible modules (:func:`clean_osis`).

The cleaning works on the raw OSIS markup, not on pysword's cleaner, which glues words where a
footnote stood ("Godcreated") and drops the canonical psalm titles that the Spanish keeps inside
verse 1.
"""

from __future__ import annotations

import html
import re

_GAP = "\x00"  # stands for removed material (notes, headings) until spacing is settled
_CHAPTER_END_RE = re.compile(r"<chapter\b[^>]*\beID=")
_NOTE_RE = re.compile(r"<note\b[^>]*(?<!/)>.*?</note\s*>", re.S)
_TITLE_RE = re.compile(r"<title\b([^>]*)(?<!/)>(.*?)</title\s*>", re.S)
_SPEAKER_RE = re.compile(r"<speaker\b[^>]*(?<!/)>.*?</speaker\s*>", re.S)
_ELEMENT_BOUNDARY_RE = re.compile(r"</(w|transChange)\s*>(?=<(w|transChange)\b[^>]*>([^<]*)<)")
_LAST_WORD_RE = re.compile(r"[^\s<>]*$")
_TAG_RE = re.compile(r"<[^>]*>")
_GAP_RE = re.compile(r"\s*\x00[\s\x00]*")
_CLOSING = set(",.;:!?)]}”’»›…")
_OPENING = set("([{“‘«‹¡¿")
_ENCLITIC_RE = re.compile(r"(?:me|te|se|nos|os|le|les|lo|los|la|las)+")
_ACCENTED_RE = re.compile(r"[áéíóú]")
_NOT_VERBS = frozenset({"jehová", "josué", "cuánto"})
_SHORT_VERBS = frozenset({"di", "da", "vi", "haz"})


def _is_verb_like(word: str) -> bool:
    """Whether a Spanish word takes a following enclitic pronoun (``díjo|le``, ``sáca|lo``).

    The RV1909 module marks supplied enclitics as ``<transChange>`` after the verb's
    ``<w>`` element. Archaic verb forms that take enclitics carry a written accent
    (``díjole``, ``oyéndolo``), are infinitives (``-r``), plural imperatives (``-d``)
    or a few short imperatives/preterites; names and adverbs with accents are excluded.
    """
    word = word.lower()
    if word in _NOT_VERBS:
        return False
    return bool(_ACCENTED_RE.search(word)) or word.endswith(("r", "d")) or word in _SHORT_VERBS


def _previous_word(text: str, end: int) -> str:
    return _LAST_WORD_RE.search(text, max(0, end - 64), end).group()


def _element_boundary(match: re.Match) -> str:
    closing, opening, following = match.groups()
    glue = (
        closing == "w"
        and opening == "transChange"
        and _ENCLITIC_RE.fullmatch(following) is not None
        and _is_verb_like(_previous_word(match.string, match.start()))
    )
    return match.group() if glue else match.group() + " "


def _title(match: re.Match) -> str:
    attrs, content = match.groups()
    canonical = 'canonical="true"' in attrs or 'type="psalm"' in attrs
    return f"{_GAP}{content}{_GAP}" if canonical else _GAP


def _close_gap(match: re.Match) -> str:
    text = match.string
    before = text[match.start() - 1] if match.start() > 0 else ""
    after = text[match.end()] if match.end() < len(text) else ""
    if not before or not after or after in _CLOSING or before in _OPENING:
        return ""
    return " "


def clean_osis(raw: str) -> str:
    """Plain text of one verse of OSIS markup (as stored in the SWORD modules).

    * everything from an end-of-chapter milestone ``<chapter eID=.../>`` on is dropped
      (the WEB appends its glossary to Rev 22:21 there);
    * footnotes and cross-references (``<note ...>...</note>``) are removed with their
      content, leaving a word boundary (``God<note/>created`` -> ``God created``, but
      ``cornerstone.<note/>`` -> ``cornerstone.``);
    * canonical titles (``<title canonical="true" type="psalm">``: the psalm titles,
      which the Spanish keeps as plain text inside verse 1) are kept as text; other
      headings (``<title>``, ``<speaker>``) are removed with their content;
    * all other markup (``<w>`` Strong's wrappers, ``<transChange>``, ``<q>``,
      ``<divineName>``, line/paragraph milestones ...) is dropped and its text kept;
      adjacent ``</w><w>`` elements are separate words, except a Spanish enclitic
      pronoun supplied as ``<transChange>`` after a verb (``díjo`` + ``le``);
    * entities are unescaped and whitespace is collapsed to single spaces.
    """
    end = _CHAPTER_END_RE.search(raw)
    if end:
        raw = raw[: end.start()]
    if "<" not in raw and "&" not in raw:
        return " ".join(raw.split())
    text = raw.replace(_GAP, "")
    text = _NOTE_RE.sub(_GAP, text)
    text = _TITLE_RE.sub(_title, text)
    text = _SPEAKER_RE.sub(_GAP, text)
    if "</w><" in text or "</transChange><" in text:
        text = _ELEMENT_BOUNDARY_RE.sub(_element_boundary, text)
    text = _TAG_RE.sub("", text)
    if "&" in text:
        text = html.unescape(text)
    if _GAP in text:
        text = _GAP_RE.sub(_close_gap, text)
    return " ".join(text.split())
