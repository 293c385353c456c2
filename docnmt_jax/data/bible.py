"""The Bible es→en document corpus, built from two public-domain SWORD modules.

Source: ``spaRV1909eb`` (Spanish Reina-Valera 1909, KJV versification). Target:
``engWEB2015eb``, text derived from the WEB (World English Bible, 2020 edition;
NRSVA versification with deuterocanon). "World English Bible" is a trademark of
eBible.org; our cleaned, re-segmented output is *derived from the WEB*, not the
WEB itself. Both modules come from the Debian packages ``sword-text-sparv`` and
``sword-text-web``.

Corpus definition
  * document = chapter, segment = verse, in canonical order (OT then NT, protestant
    book order, chapters and verses ascending);
  * ``doc_id`` = ``<OSIS book>.<chapter>``, e.g. ``Gen.1``, ``Ruth.1``, ``1Sam.17``,
    ``Ps.23``, ``Song.2``, ``John.3``, ``1John.4``, ``Rev.22`` (SWORD/OSIS book
    abbreviations, see :data:`PROTESTANT_CANON`);
  * only the 66 books both modules share; verses are aligned by the key
    ``(book, chapter, verse)``. A verse present in only one versification
    (``src_only`` / ``tgt_only``) or empty after cleaning on either side
    (``empty_src`` / ``empty_tgt`` / ``empty_both``) is dropped and counted;
  * chapters whose verse numbering is shifted between the modules (e.g. Spanish
    Jonah 2:1 = English Jonah 1:17) are detected from verse lengths
    (:func:`detect_shifted_chapters`) and dropped whole (``shifted_chapter``);
  * fixed split by whole books:
      dev  = Esther, Lamentations, Daniel, Hebrews, 1 Peter   (Esth Lam Dan Heb 1Pet)
      test = Ruth, Ecclesiastes, John, Galatians, James       (Ruth Eccl John Gal Jas)
      train = the other 56 books.

Text cleaning (:func:`clean_osis`) works on the raw OSIS markup, not on pysword's
cleaner, which glues words where a footnote stood ("Godcreated") and drops the
canonical psalm titles that the Spanish keeps inside verse 1.

Reading: pysword's public ``get()`` decompresses a whole book for every verse; here
each module's ztext index files (``.bzs`` block index, ``.bzv`` verse index, ``.bzz``
compressed blocks) are read once and every block is decompressed once
(:func:`read_module_verses`), using pysword only for the conf files and the
versification tables.

Output (:func:`prepare_bible`): ``train.tsv``, ``dev.tsv``, ``test.tsv`` (see
:func:`docnmt_jax.data.documents.write_tsv`) and ``stats.json``, byte-identical on
every run.
"""

from __future__ import annotations

import bz2
import dataclasses
import html
import json
import logging
import lzma
import math
import os
import re
import statistics
import struct
import zlib
from collections.abc import Iterable, Mapping, Sequence

from docnmt_jax.data.documents import Document, write_tsv

logger = logging.getLogger(__name__)

SRC_MODULE = "spaRV1909eb"
TGT_MODULE = "engWEB2015eb"
APT_PACKAGES = "sword-text-sparv sword-text-web"
INSTALL_HINT = (
    f"run `apt-get install -y {APT_PACKAGES}` (as root, or with sudo), or point "
    "--sword_path / $SWORD_PATH at a SWORD data directory that holds them"
)
DEFAULT_SWORD_PATHS = ("/usr/share/sword", os.path.join("~", ".sword"))

#: The 66 books of the protestant canon, in canonical order, by OSIS name.
PROTESTANT_CANON: tuple[str, ...] = tuple(
    """
    Gen Exod Lev Num Deut Josh Judg Ruth 1Sam 2Sam 1Kgs 2Kgs 1Chr 2Chr Ezra Neh Esth Job
    Ps Prov Eccl Song Isa Jer Lam Ezek Dan Hos Joel Amos Obad Jonah Mic Nah Hab Zeph Hag
    Zech Mal
    Matt Mark Luke John Acts Rom 1Cor 2Cor Gal Eph Phil Col 1Thess 2Thess 1Tim 2Tim Titus
    Phlm Heb Jas 1Pet 2Pet 1John 2John 3John Jude Rev
    """.split()
)
DEV_BOOKS: tuple[str, ...] = ("Esth", "Lam", "Dan", "Heb", "1Pet")
TEST_BOOKS: tuple[str, ...] = ("Ruth", "Eccl", "John", "Gal", "Jas")
SPLITS: tuple[str, ...] = ("train", "dev", "test")
DROP_REASONS: tuple[str, ...] = (
    "src_only",
    "tgt_only",
    "empty_src",
    "empty_tgt",
    "empty_both",
    "shifted_chapter",
)

VerseKey = tuple[str, int, int]  # (OSIS book, chapter, verse)
ChapterKey = tuple[str, int]


class SwordModuleNotFoundError(FileNotFoundError):
    """A SWORD module is not installed in any searched directory."""


# --------------------------------------------------------------------------- reading


def sword_search_paths(sword_path: str | os.PathLike | None = None) -> list[str]:
    """Directories searched for SWORD modules, in order of precedence.

    ``sword_path`` if given, else ``$SWORD_PATH`` (``os.pathsep``-separated) if set,
    else ``/usr/share/sword`` and ``~/.sword``.
    """
    if sword_path:
        paths = [os.fspath(sword_path)]
    elif os.environ.get("SWORD_PATH"):
        paths = [p for p in os.environ["SWORD_PATH"].split(os.pathsep) if p]
    else:
        paths = list(DEFAULT_SWORD_PATHS)
    return [os.path.expanduser(p) for p in paths]


def find_module(module_name: str, sword_path: str | os.PathLike | None = None) -> tuple[dict, str]:
    """(parsed conf, module data directory) of the first search path holding the module."""
    from pysword.modules import SwordModules

    searched = sword_search_paths(sword_path)
    for path in searched:
        if not os.path.isdir(os.path.join(path, "mods.d")):
            continue
        modules = SwordModules(path).parse_modules()
        if module_name in modules:
            conf = modules[module_name]
            return conf, os.path.normpath(os.path.join(path, conf["datapath"]))
    raise SwordModuleNotFoundError(
        f"SWORD module {module_name!r} not found in {', '.join(searched)}: {INSTALL_HINT}"
    )


_DECOMPRESS = {"ZIP": zlib.decompress, "BZIP2": bz2.decompress, "XZ": lzma.decompress}
_RECORD_FORMATS = {"ztext": "<IIH", "ztext4": "<III"}


def read_module_verses(
    module_name: str, sword_path: str | os.PathLike | None = None, *, raw: bool = False
) -> dict[VerseKey, str]:
    """All verses of a compressed (zText) SWORD Bible module, keyed by (book, chapter, verse).

    Every key of the module's versification is present (empty string where the
    module has no text). Text is cleaned with :func:`clean_osis` unless ``raw``.
    Each compressed block is read and decompressed once (about 0.1 s a module, plus
    about 0.4 s of cleaning), instead of once per verse as pysword's ``get()`` does.

    Raises:
      SwordModuleNotFoundError: the module is in none of :func:`sword_search_paths`.
    """
    from pysword.books import BibleStructure

    conf, data_dir = find_module(module_name, sword_path)
    driver = conf.get("moddrv", "").lower()
    if driver not in _RECORD_FORMATS:
        raise ValueError(f"{module_name}: module driver {driver!r} is not supported")
    compress = conf.get("compresstype", "ZIP").upper()
    if compress not in _DECOMPRESS or conf.get("cipherkey"):
        raise ValueError(f"{module_name}: compression {compress!r} or cipher unsupported")
    letter = {"BOOK": "b", "CHAPTER": "c", "VERSE": "v"}[conf.get("blocktype", "BOOK").upper()]
    encoding = "utf-8" if conf.get("encoding", "").upper() == "UTF-8" else "cp1252"
    record = struct.Struct(_RECORD_FORMATS[driver])
    present = [t for t in ("ot", "nt") if os.path.exists(os.path.join(data_dir, f"{t}.{letter}zv"))]
    structure = BibleStructure(conf.get("versification", "kjv").lower(), present)

    verses: dict[VerseKey, str] = {}
    for testament, books in structure.get_books().items():
        base = os.path.join(data_dir, f"{testament}.{letter}z")
        with open(base + "v", "rb") as f:
            verse_index = f.read()
        with open(base + "s", "rb") as f:
            block_index = f.read()
        with open(base + "z", "rb") as f:
            blocks = f.read()
        cache: dict[int, bytes] = {}

        def block(num: int, block_index=block_index, blocks=blocks, cache=cache) -> bytes:
            if num not in cache:
                if (num + 1) * 12 > len(block_index):
                    cache[num] = b""
                else:
                    offset, size, _ = struct.unpack_from("<III", block_index, num * 12)
                    cache[num] = _DECOMPRESS[compress](blocks[offset : offset + size])
            return cache[num]

        # Index layout (as in pysword): 2 testament entries, then per book one book
        # heading entry and per chapter one heading entry followed by its verses.
        book_offset = 2
        for book in books:
            for chapter in range(1, book.num_chapters + 1):
                indices = book.get_indicies(chapters=[chapter], offset=book_offset)
                for verse, index in enumerate(indices, start=1):
                    text = ""
                    if (index + 1) * record.size <= len(verse_index):
                        num, start, length = record.unpack_from(verse_index, index * record.size)
                        if length:
                            data = block(num)[start : start + length]
                            text = data.decode(encoding, errors="replace")
                    verses[(book.osis_name, chapter, verse)] = text if raw else clean_osis(text)
            book_offset += book.size
    return verses


# --------------------------------------------------------------------------- cleaning

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


# --------------------------------------------------------------------------- alignment


def _log_len(text: str) -> float:
    return math.log(1 + len(text))


def chapter_shift(
    src_lengths: Mapping[int, int],
    tgt_lengths: Mapping[int, int],
    *,
    center: float = 0.0,
    max_shift: int = 5,
    min_pairs: int = 4,
    ratio: float = 0.7,
    min_gain: float = 1.5,
) -> int:
    """Verse-numbering shift of one chapter, from verse lengths alone; 0 when unshifted.

    ``src_lengths`` / ``tgt_lengths`` map verse number to character length (non-empty
    verses only). The residual of pairing source verse ``v`` with target verse ``v+k``
    is ``|log(1+len_src[v]) - log(1+len_tgt[v+k]) - center|`` (``center``: the
    corpus-wide typical log length ratio). For each shift ``k`` in ``±1..max_shift``
    and each *region* -- the whole chapter, or a prefix or suffix of it (numbering
    often drifts from some verse on) -- with at least ``min_pairs`` verses pairable at
    both shift 0 and ``k``, compare the mean residuals ``m0`` and ``mk`` over the region.
    The chapter is shifted if some region has ``mk <= ratio * m0`` and a total gain
    ``(m0 - mk) * pairs >= min_gain``; the ``k`` of the largest such gain is returned.
    """
    verses = sorted(v for v in src_lengths if v in tgt_lengths)
    log_src = {v: math.log(1 + src_lengths[v]) for v in verses}
    log_tgt = {v: math.log(1 + n) for v, n in tgt_lengths.items()}
    best_gain, best_k = 0.0, 0
    for k in sorted((k for k in range(-max_shift, max_shift + 1) if k), key=lambda k: (abs(k), k)):
        pairs = [
            (abs(log_src[v] - log_tgt[v] - center), abs(log_src[v] - log_tgt[v + k] - center))
            for v in verses
            if v + k in log_tgt
        ]
        if len(pairs) < min_pairs:
            continue
        for region in (pairs, pairs[::-1]):  # prefixes, then suffixes
            sum0 = sumk = 0.0
            for n, (r0, rk) in enumerate(region, start=1):
                sum0 += r0
                sumk += rk
                gain = sum0 - sumk
                if (
                    n >= min_pairs
                    and sumk <= ratio * sum0
                    and gain >= min_gain
                    and gain > best_gain
                ):
                    best_gain, best_k = gain, k
    return best_k


def _chapter_order(chapter: ChapterKey) -> tuple[int, str, int]:
    book, number = chapter
    rank = PROTESTANT_CANON.index(book) if book in PROTESTANT_CANON else len(PROTESTANT_CANON)
    return (rank, book, number)


def typical_log_ratio(src: Mapping[VerseKey, str], tgt: Mapping[VerseKey, str]) -> float:
    """Median of ``log(1+len(src)) - log(1+len(tgt))`` over keys non-empty on both sides."""
    diffs = [_log_len(s) - _log_len(tgt[k]) for k, s in src.items() if s and tgt.get(k)]
    return statistics.median(diffs) if diffs else 0.0


def detect_shifted_chapters(
    src: Mapping[VerseKey, str], tgt: Mapping[VerseKey, str], **kwargs
) -> dict[ChapterKey, int]:
    """Chapters whose verse numbering differs between ``src`` and ``tgt``: ``{(book, ch): k}``.

    ``k`` is the detected shift (source verse ``v`` matches target verse ``v+k``);
    see :func:`chapter_shift` (``kwargs`` go there) for the test.
    """
    center = typical_log_ratio(src, tgt)
    src_lengths: dict[ChapterKey, dict[int, int]] = {}
    tgt_lengths: dict[ChapterKey, dict[int, int]] = {}
    for verses, lengths in ((src, src_lengths), (tgt, tgt_lengths)):
        for (book, chapter, verse), text in verses.items():
            if text:
                lengths.setdefault((book, chapter), {})[verse] = len(text)
    shifted = {}
    for chapter in sorted(src_lengths.keys() & tgt_lengths.keys(), key=_chapter_order):
        k = chapter_shift(src_lengths[chapter], tgt_lengths[chapter], center=center, **kwargs)
        if k:
            shifted[chapter] = k
    return shifted


@dataclasses.dataclass
class Alignment:
    """Aligned chapters in canonical order plus what was dropped and why."""

    chapters: dict[ChapterKey, list[tuple[int, str, str]]]  # (verse, src, tgt), in order
    drops: dict[ChapterKey, dict[str, int]]  # per chapter: reason -> verses dropped
    shifted: dict[ChapterKey, int]


def align(
    src: Mapping[VerseKey, str],
    tgt: Mapping[VerseKey, str],
    books: Sequence[str] = PROTESTANT_CANON,
    shifted: Mapping[ChapterKey, int] | None = None,
) -> Alignment:
    """Pairs verses by (book, chapter, verse) over ``books``; drops and counts the rest.

    Verses of chapters in ``shifted`` (default: :func:`detect_shifted_chapters`) are
    dropped as ``shifted_chapter``; other keys as ``src_only`` / ``tgt_only`` (absent
    from the other versification) or ``empty_src`` / ``empty_tgt`` / ``empty_both``.
    """
    wanted = set(books)
    src = {k: v for k, v in src.items() if k[0] in wanted}
    tgt = {k: v for k, v in tgt.items() if k[0] in wanted}
    if shifted is None:
        shifted = detect_shifted_chapters(src, tgt)
    order = {b: i for i, b in enumerate(books)}
    keys = sorted(src.keys() | tgt.keys(), key=lambda k: (order[k[0]], k[1], k[2]))
    chapters: dict[ChapterKey, list[tuple[int, str, str]]] = {}
    drops: dict[ChapterKey, dict[str, int]] = {}
    for key in keys:
        chapter = key[:2]
        s, t = src.get(key), tgt.get(key)
        if chapter in shifted:
            reason = "shifted_chapter"
        elif s is None:
            reason = "tgt_only"
        elif t is None:
            reason = "src_only"
        elif not s and not t:
            reason = "empty_both"
        elif not s:
            reason = "empty_src"
        elif not t:
            reason = "empty_tgt"
        else:
            chapters.setdefault(chapter, []).append((key[2], s, t))
            continue
        counts = drops.setdefault(chapter, {})
        counts[reason] = counts.get(reason, 0) + 1
    return Alignment(chapters=chapters, drops=drops, shifted=dict(shifted))


def split_of_book(book: str) -> str:
    """``'dev'``, ``'test'`` or ``'train'`` for an OSIS book name (fixed split by book)."""
    if book in DEV_BOOKS:
        return "dev"
    if book in TEST_BOOKS:
        return "test"
    return "train"


def doc_id(book: str, chapter: int) -> str:
    """Document id of a chapter: ``<OSIS book>.<chapter>``, e.g. ``Ruth.1``."""
    return f"{book}.{chapter}"


def split_books(alignment: Alignment) -> dict[str, list[Document]]:
    """Documents (one per aligned chapter, canonical order) of each split in :data:`SPLITS`."""
    splits: dict[str, list[Document]] = {name: [] for name in SPLITS}
    for (book, chapter), verses in alignment.chapters.items():
        splits[split_of_book(book)].append(
            Document(
                doc_id=doc_id(book, chapter),
                src=tuple(s for _, s, _ in verses),
                tgt=tuple(t for _, _, t in verses),
            )
        )
    return splits


# --------------------------------------------------------------------------- statistics


def corpus_stats(documents: Iterable[Document]) -> dict[str, int]:
    """Documents, segment pairs and whitespace tokens per side of a corpus."""
    stats = {"documents": 0, "segments": 0, "src_tokens": 0, "tgt_tokens": 0}
    for doc in documents:
        stats["documents"] += 1
        stats["segments"] += len(doc)
        stats["src_tokens"] += sum(len(s.split()) for s in doc.src)
        stats["tgt_tokens"] += sum(len(t.split()) for t in doc.tgt)
    return stats


def _drop_totals(drops: Iterable[Mapping[str, int]]) -> dict[str, int]:
    totals = dict.fromkeys(DROP_REASONS, 0)
    for counts in drops:
        for reason, n in counts.items():
            totals[reason] += n
    return totals


def bible_stats(
    splits: Mapping[str, Sequence[Document]],
    alignment: Alignment,
    extra_tgt_books: Mapping[str, int] | None = None,
) -> dict:
    """The ``stats.json`` content: per split and total counts, drops, shifted chapters."""
    per_split = {}
    for name in SPLITS:
        entry = corpus_stats(splits[name])
        entry["books"] = sum(1 for b in PROTESTANT_CANON if split_of_book(b) == name)
        entry["drops"] = _drop_totals(
            c for (book, _), c in alignment.drops.items() if split_of_book(book) == name
        )
        per_split[name] = entry
    total = corpus_stats(d for name in SPLITS for d in splits[name])
    total["books"] = len(PROTESTANT_CANON)
    total["drops"] = _drop_totals(alignment.drops.values())
    return {
        "corpus": "bible",
        "description": (
            f"Bible es-en, source {SRC_MODULE} (Reina-Valera 1909), target derived from "
            f"the WEB ({TGT_MODULE}); document = chapter, segment = verse"
        ),
        "src_module": SRC_MODULE,
        "tgt_module": TGT_MODULE,
        "splits": per_split,
        "total": total,
        "shifted_chapters": [
            {"doc_id": doc_id(*chapter), "shift": k} for chapter, k in alignment.shifted.items()
        ],
        "split_books": {
            name: [b for b in PROTESTANT_CANON if split_of_book(b) == name] for name in SPLITS
        },
        "tgt_books_not_shared": dict(extra_tgt_books or {}),
    }


def format_stats(stats: Mapping) -> str:
    """Human-readable multi-line summary of :func:`bible_stats` output."""
    lines = [stats["description"]]
    for name in (*SPLITS, "total"):
        e = stats["splits"][name] if name in stats["splits"] else stats[name]
        drops = ", ".join(f"{r}={n}" for r, n in e["drops"].items() if n) or "none"
        lines.append(
            f"  {name:5s}: {e['books']:2d} books {e['documents']:5d} documents "
            f"{e['segments']:6d} segments {e['src_tokens']:7d} src / {e['tgt_tokens']:7d} tgt "
            f"tokens; dropped verses: {drops}"
        )
    shifted = ", ".join(f"{c['doc_id']}({c['shift']:+d})" for c in stats["shifted_chapters"])
    lines.append(f"  shifted chapters dropped ({len(stats['shifted_chapters'])}): {shifted}")
    extra = stats["tgt_books_not_shared"]
    lines.append(f"  target-only books skipped: {len(extra)} ({sum(extra.values())} verses)")
    return "\n".join(lines)


# --------------------------------------------------------------------------- pipeline


def prepare_bible(out_dir: str | os.PathLike, sword_path: str | os.PathLike | None = None) -> dict:
    """Reads, cleans, aligns and splits the modules; writes the TSVs and ``stats.json``.

    Returns the statistics written to ``stats.json``. Deterministic: the same bytes
    on every run. Raises :class:`SwordModuleNotFoundError` when a module is missing.
    """
    logger.info("reading %s (source) and %s (target, derived from the WEB)", SRC_MODULE, TGT_MODULE)
    src = read_module_verses(SRC_MODULE, sword_path)
    tgt = read_module_verses(TGT_MODULE, sword_path)
    have = {k[0] for k in src} & {k[0] for k in tgt}
    missing = [b for b in PROTESTANT_CANON if b not in have]
    if missing:
        raise ValueError(f"SWORD modules {SRC_MODULE}/{TGT_MODULE} lack the books {missing}")
    extra: dict[str, int] = {}
    for (book, _, _), text in tgt.items():
        if book not in PROTESTANT_CANON and text:
            extra[book] = extra.get(book, 0) + 1
    logger.info("read %d source and %d target verse slots", len(src), len(tgt))

    alignment = align(src, tgt)
    splits = split_books(alignment)
    stats = bible_stats(splits, alignment, extra)

    os.makedirs(out_dir, exist_ok=True)
    for name in SPLITS:
        path = os.path.join(out_dir, f"{name}.tsv")
        write_tsv(splits[name], path)
        logger.info("wrote %s (%d documents)", path, len(splits[name]))
    with open(os.path.join(out_dir, "stats.json"), "w", encoding="utf-8", newline="\n") as f:
        json.dump(stats, f, indent=2, sort_keys=True, ensure_ascii=False)
        f.write("\n")
    return stats
