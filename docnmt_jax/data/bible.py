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
    abbreviations, see :data:`~docnmt_jax.data.bible_alignment.PROTESTANT_CANON`);
  * only the 66 books both modules share; verses are aligned by the key
    ``(book, chapter, verse)``. A verse present in only one versification
    (``src_only`` / ``tgt_only``) or empty after cleaning on either side
    (``empty_src`` / ``empty_tgt`` / ``empty_both``) is dropped and counted;
  * chapters whose verse numbering is shifted between the modules (e.g. Spanish
    Jonah 2:1 = English Jonah 1:17) are detected from verse lengths
    (:func:`~docnmt_jax.data.bible_alignment.detect_shifted_chapters`) and dropped
    whole (``shifted_chapter``);
  * fixed split by whole books:
      dev  = Esther, Lamentations, Daniel, Hebrews, 1 Peter   (Esth Lam Dan Heb 1Pet)
      test = Ruth, Ecclesiastes, John, Galatians, James       (Ruth Eccl John Gal Jas)
      train = the other 56 books.

Module layout: :mod:`docnmt_jax.data.sword` reads the modules, :mod:`docnmt_jax.data.osis`
cleans the verse markup, :mod:`docnmt_jax.data.bible_alignment` aligns the verses and splits
the books; this module counts and writes the corpus.

Output (:func:`prepare_bible`): ``train.tsv``, ``dev.tsv``, ``test.tsv`` (see
:func:`docnmt_jax.data.documents.write_tsv`) and ``stats.json``, byte-identical on
every run.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping, Sequence

from docnmt_jax.data.bible_alignment import (
    DROP_REASONS,
    PROTESTANT_CANON,
    SPLITS,
    Alignment,
    align,
    doc_id,
    split_books,
    split_of_book,
)
from docnmt_jax.data.documents import Document, write_tsv
from docnmt_jax.data.sword import SwordModuleNotFoundError, read_module_verses
from docnmt_jax.files import atomic_open

__all__ = [
    "SPLITS",
    "SRC_MODULE",
    "SwordModuleNotFoundError",
    "TGT_MODULE",
    "bible_stats",
    "corpus_stats",
    "format_stats",
    "prepare_bible",
]

logger = logging.getLogger(__name__)

SRC_MODULE = "spaRV1909eb"
TGT_MODULE = "engWEB2015eb"


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
    with atomic_open(os.path.join(out_dir, "stats.json")) as f:
        json.dump(stats, f, indent=2, sort_keys=True, ensure_ascii=False)
        f.write("\n")
    return stats
