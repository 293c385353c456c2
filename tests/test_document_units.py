"""Book-level documents (``config.data.document_unit``, ``translate.py --document_unit``):
grouping chapters into books, the errors, the way back to chapters, training data and
translation."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import ml_collections
import pytest
from conftest import ROOT

from docnmt_jax.config_files import load_config
from docnmt_jax.data import readers
from docnmt_jax.data.document_units import (
    ChapterSpan,
    DocumentUnitError,
    chapter_spans,
    chapters_of,
    documents_by_unit,
    split_into_chapters,
    translated_by_book,
)
from docnmt_jax.data.documents import Document, Origin, write_tsv
from docnmt_jax.decoding.search import SearchConfig
from docnmt_jax.errors import ConfigError
from docnmt_jax.training import data_setup, restore


def doc(doc_id: str, *pairs: str) -> Document:
    """A document whose pairs are ``"src|tgt"``."""
    src, tgt = zip(*(p.split("|") for p in pairs), strict=True)
    return Document(doc_id, tuple(src), tuple(tgt))


CHAPTERS = [
    doc("Gen.1", "g1a|G1a", "g1b|G1b"),
    doc("Gen.2", "g2a|G2a"),
    doc("Ps.23", "p1|P1", "p2|P2", "p3|P3"),
    doc("1John.4", "j4a|J4a", "j4b|J4b"),
    doc("1John.5", "j5a|J5a"),
]


def test_books_concatenate_consecutive_chapters_in_order():
    assert documents_by_unit(CHAPTERS, "book") == [
        Document("Gen", ("g1a", "g1b", "g2a"), ("G1a", "G1b", "G2a")),
        Document("Ps", ("p1", "p2", "p3"), ("P1", "P2", "P3")),
        Document("1John", ("j4a", "j4b", "j5a"), ("J4a", "J4b", "J5a")),
    ]
    assert chapter_spans(CHAPTERS) == {
        "Gen": (ChapterSpan("Gen.1", 2), ChapterSpan("Gen.2", 1)),
        "Ps": (ChapterSpan("Ps.23", 3),),
        "1John": (ChapterSpan("1John.4", 2), ChapterSpan("1John.5", 1)),
    }
    # The book is everything before the LAST dot.
    assert [d.doc_id for d in documents_by_unit([doc("a.b.1", "x|y")], "book")] == ["a.b"]


@pytest.mark.parametrize("unit", ["chapter", "document"])
def test_chapter_and_document_units_keep_the_files_documents(unit):
    assert documents_by_unit(CHAPTERS, unit) == CHAPTERS


@pytest.mark.parametrize("bad", ["Psalm23", "Ps.", ".23"])
def test_a_doc_id_without_a_book_is_a_one_line_error_naming_it(bad):
    with pytest.raises(DocumentUnitError) as e:
        documents_by_unit([CHAPTERS[0], doc(bad, "x|y")], "book")
    message = str(e.value)
    assert repr(bad) in message and "\n" not in message


def test_chapters_of_a_book_that_are_not_consecutive_are_an_error_naming_them():
    chapters = [doc("Ps.1", "a|A"), doc("Gen.1", "b|B"), doc("Ps.2", "c|C")]
    with pytest.raises(DocumentUnitError) as e:
        documents_by_unit(chapters, "book")
    message = str(e.value)
    assert "\n" not in message
    assert all(repr(i) in message for i in ("Ps", "Ps.1", "Gen.1", "Ps.2"))


def test_an_unknown_unit_is_a_one_line_error_listing_the_units():
    with pytest.raises(ConfigError) as e:
        documents_by_unit(CHAPTERS, "verse")
    message = str(e.value)
    assert "'verse'" in message and "\n" not in message
    assert all(u in message for u in ("chapter", "document", "book"))


def test_a_book_splits_back_into_its_chapters_with_their_lines(tmp_path):
    path = tmp_path / "corpus.tsv"
    write_tsv(CHAPTERS, path)
    chapters = readers.read_tsv(path)  # origins: header line 1, then one row a sentence
    spans = chapter_spans(chapters)
    books = documents_by_unit(chapters, "book")
    assert [b.origin for b in books] == [
        Origin(str(path), line, str(path), line) for line in (2, 5, 8)
    ]
    back = [c for b in books for c in chapters_of(b, spans[b.doc_id])]
    assert back == CHAPTERS
    assert [c.origin.src_line for c in back] == [2, 4, 5, 8, 10]
    hyps = ["h0", "h1", "h2"]
    assert split_into_chapters(hyps, spans["Gen"]) == [("Gen.1", ["h0", "h1"]), ("Gen.2", ["h2"])]
    with pytest.raises(ValueError):
        split_into_chapters(hyps[:2], spans["Gen"])
    # Chapters that do not follow each other line by line: the book has no origin.
    apart = [chapters[0], Document("Gen.2", ("x",), ("y",), chapters[3].origin)]
    assert documents_by_unit(apart, "book")[0].origin is None


def _data_config(**values) -> ml_collections.ConfigDict:
    config = load_config(os.path.join(ROOT, "configs", "transformer.py")).data
    config.update(values)
    return config


def test_the_data_config_reads_train_and_dev_in_its_unit(tmp_path):
    train, dev = tmp_path / "train.tsv", tmp_path / "dev.tsv"
    write_tsv(CHAPTERS, train)
    write_tsv(CHAPTERS[2:], dev)
    assert _data_config().document_unit == "chapter"
    own = _data_config(train=str(train), dev=str(dev))
    assert data_setup.load_documents(own, "train") == CHAPTERS
    own.document_unit = "book"
    assert [d.doc_id for d in data_setup.load_documents(own, "train")] == ["Gen", "Ps", "1John"]
    assert [d.doc_id for d in data_setup.load_documents(own, "dev")] == ["Ps", "1John"]
    prepared = _data_config(data_dir=str(tmp_path), document_unit="book")
    assert data_setup.load_documents(prepared, "train") == documents_by_unit(CHAPTERS, "book")
    mixed = _data_config(mix=f"{train} 1.0", document_unit="book")
    assert [len(d) for d in data_setup.load_documents(mixed, "train")] == [3, 3, 3]
    old_run = ml_collections.ConfigDict({"data_dir": str(tmp_path)})  # no document_unit key
    assert data_setup.load_documents(old_run, "dev") == CHAPTERS[2:]


def test_bad_data_configs_are_one_line_errors_naming_the_key(tmp_path):
    src, tgt = tmp_path / "train.es", tmp_path / "train.en"
    src.write_text("a\n\nb\n", encoding="utf-8")
    tgt.write_text("A\n\nB\n", encoding="utf-8")
    text = _data_config(train=f"{src},{tgt}", dev=f"{src},{tgt}", document_unit="book")
    with pytest.raises(ConfigError, match=r"^config\.data\.document_unit=book needs a TSV"):
        data_setup.load_documents(text, "train")
    with pytest.raises(ConfigError, match=r"^config\.data\.document_unit must be one of"):
        data_setup.load_documents(_data_config(document_unit="books"), "dev")


def test_translated_by_book_feeds_books_and_returns_chapters():
    seen: list[tuple[str, list[str]]] = []

    def streaming(documents):  # one book in, its translation out, as the Translator does
        for doc_id, sentences in documents:
            seen.append((doc_id, sentences))
            yield doc_id, [s.upper() for s in sentences]

    def whole(documents):  # all books read first, as random contexts are drawn
        return list(streaming(list(documents)))

    expected = [(c.doc_id, [s.upper() for s in c.src]) for c in CHAPTERS]
    assert list(translated_by_book(CHAPTERS, streaming)) == expected
    assert seen == [
        ("Gen", ["g1a", "g1b", "g2a"]),
        ("Ps", ["p1", "p2", "p3"]),
        ("1John", ["j4a", "j4b", "j5a"]),
    ]
    assert list(translated_by_book(CHAPTERS, whole)) == expected


GOLDEN_FINAL = os.path.join(ROOT, "tests", "data", "golden", "final")  # a document model


def _translate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, "launch", "translate.py"), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )


@pytest.mark.slow  # about 40 s: two translate.py processes and an in-process reference
def test_translate_in_the_runs_book_unit_keeps_the_chapter_doc_ids(tmp_path):
    """A run trained on books (its config.json says so) translates a book as the one document
    it makes -- the reference: the same sentences given as one document -- and writes each
    sentence under its chapter's doc id; chapters of a book apart stop it in one line."""
    workdir = tmp_path / "run"
    shutil.copytree(GOLDEN_FINAL, workdir)
    config = json.loads((workdir / "config.json").read_text(encoding="utf-8"))
    config["data"]["document_unit"] = "book"
    (workdir / "config.json").write_text(json.dumps(config), encoding="utf-8")
    golden = readers.read_tsv(os.path.join(ROOT, "tests", "data", "golden", "input.tsv"))
    sentences = [s for d in golden for s in d.src][:9]
    spans = (("A.1", 0, 3), ("A.2", 3, 6), ("B.7", 6, 9))
    chapters = [Document(i, tuple(sentences[a:b]), tuple(sentences[a:b])) for i, a, b in spans]
    write_tsv(chapters, tmp_path / "in.tsv")
    search = ["--checkpoint=latest", "--beam=1", "--alpha=0", f"--workdir={workdir}"]
    out = _translate(*search, f"--input={tmp_path / 'in.tsv'}", f"--output={tmp_path / 'o.tsv'}")
    assert out.returncode == 0, out.stderr[-3000:]
    rows = (tmp_path / "o.tsv").read_text(encoding="utf-8").splitlines()
    assert rows[0] == "doc_id\thyp"
    assert [r.split("\t")[0] for r in rows[1:]] == ["A.1"] * 3 + ["A.2"] * 3 + ["B.7"] * 3
    translator, _ = restore.load_translator(str(workdir), "latest", SearchConfig(1, alpha=0.0))
    books = [
        Document("A", tuple(sentences[:6]), ("",) * 6),
        Document("B", tuple(sentences[6:]), ("",) * 3),
    ]
    expected = [h for hyps in translator.translate(books) for h in hyps]
    assert [r.split("\t")[1] for r in rows[1:]] == expected

    write_tsv([chapters[0], chapters[2], chapters[1]], tmp_path / "apart.tsv")
    out = _translate(*search, f"--input={tmp_path / 'apart.tsv'}", "--output=-")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("translate.py: error: chapters of book 'A' are not consecutive")
    assert all(repr(i) in last for i in ("A.2", "B.7", "A.1"))
