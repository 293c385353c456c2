"""Tests for docnmt_jax.data.readers: good inputs of each format and every error path."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from docnmt_jax.data.documents import CorpusFormatError, Document, write_tsv
from docnmt_jax.data.readers import (
    detect_format,
    read_corpus,
    read_maruf,
    read_parallel_text,
    read_tsv,
)

DATA = Path(__file__).parent / "data"
GOOD_TSV = DATA / "readers_good.tsv"
PLAIN_EN, PLAIN_DE = DATA / "readers_plain.en", DATA / "readers_plain.de"
MARUF_EN, MARUF_DE = DATA / "readers_maruf.en", DATA / "readers_maruf.de"

SRC1 = ("Hello.", "How are you?")
TGT1 = ("Hallo.", "Wie geht es dir?")
SRC2, TGT2 = ("Good bye.",), ("Tschüss.",)


def expected(id1: str, id2: str) -> list[Document]:
    return [Document(id1, SRC1, TGT1), Document(id2, SRC2, TGT2)]


def write(path: Path, text: str | bytes) -> Path:
    path.write_bytes(text.encode("utf-8") if isinstance(text, str) else text)
    return path


def check_error(exc: pytest.ExceptionInfo, path: Path, line: int, *fragments: str) -> str:
    """The message is one line ``path:line: reason`` containing every fragment."""
    msg = str(exc.value)
    assert "\n" not in msg
    assert msg.startswith(f"{path}:{line}: "), msg
    for fragment in fragments:
        assert fragment in msg, (fragment, msg)
    assert exc.value.path == str(path) and exc.value.line == line
    return msg


# ------------------------------------------------------------------------------------------ TSV


def test_tsv_good_file():
    assert read_tsv(GOOD_TSV) == expected("talk1", "talk2")


def test_tsv_without_header_crlf_bom_and_trailing_blank_lines(tmp_path):
    body = "talk1\tHello.\tHallo.\r\ntalk1\tHow are you?\tWie geht es dir?\r\n"
    body += "talk2\tGood bye.\tTschüss.\r\n\r\n\n"
    path = write(tmp_path / "c.tsv", b"\xef\xbb\xbf" + body.encode())
    assert read_tsv(path) == expected("talk1", "talk2")
    # A BOM before the header, no final newline.
    path = write(tmp_path / "h.tsv", b"\xef\xbb\xbf" + GOOD_TSV.read_bytes().rstrip(b"\n"))
    assert read_tsv(path) == expected("talk1", "talk2")


def test_tsv_round_trip_with_write_tsv(tmp_path):
    docs = expected("x", "y") + [Document("z", ("a  b ",), (" c",))]
    write_tsv(docs, tmp_path / "rt.tsv")
    assert read_tsv(tmp_path / "rt.tsv") == docs


@pytest.mark.parametrize("text", ["doc_id\tsrc\ttgt\n", "", "\n \n", "\ufeff"])
def test_tsv_without_rows_is_an_error(tmp_path, text):
    path = write(tmp_path / "e.tsv", text)
    with pytest.raises(CorpusFormatError) as exc:
        read_tsv(path)
    assert str(exc.value) == f"{path}: no documents (the file is empty, blank or only a header)"


@pytest.mark.parametrize(
    "rows, line, fragments",
    [
        (["a\tx\ty\tz"], 3, ["expected 3 (as on line 2) tab-separated columns, found 4 (a tab"]),
        (["a\tx"], 3, ["expected 3 (as on line 2) tab-separated columns, found 2"]),
        (["\tx\ty"], 3, ["empty doc_id"]),
        (["a\t \ty"], 3, ["source sentence is empty (document 'a')"]),
        (["a\tx\t"], 3, ["target sentence is empty (document 'a')"]),
        (["", "a\tx\ty"], 3, ["blank line"]),
        (["b\tx\ty", "a\tx\ty"], 4, ["document 'a'", "not contiguous", "line 2", "'b'", "line 3"]),
        (["a\tx\r\ty"], 3, ["carriage return"]),
    ],
)
def test_tsv_errors(tmp_path, rows, line, fragments):
    path = write(tmp_path / "bad.tsv", "doc_id\tsrc\ttgt\na\tfine\tgut\n" + "\n".join(rows) + "\n")
    with pytest.raises(CorpusFormatError) as exc:
        read_tsv(path)
    check_error(exc, path, line, *fragments)


def test_tsv_invalid_utf8_names_line_and_byte_offset(tmp_path):
    path = write(tmp_path / "bad.tsv", b"a\tok\tgut\r\na\tca\xffe\tx\n")
    with pytest.raises(CorpusFormatError) as exc:
        read_tsv(path)
    check_error(exc, path, 2, "invalid UTF-8", "0xff", "byte offset 4 of the line", "offset 14")


def test_tsv_invalid_utf8_after_bom_on_first_line(tmp_path):
    path = write(tmp_path / "bad.tsv", b"\xef\xbb\xbfa\t\xc3\tx\n")
    with pytest.raises(CorpusFormatError) as exc:
        read_tsv(path)
    check_error(exc, path, 1, "invalid UTF-8", "0xc3", "byte offset 5 of the line")


def test_missing_file_names_path(tmp_path):
    missing = tmp_path / "nope.tsv"
    with pytest.raises(FileNotFoundError, match="nope.tsv"):
        read_tsv(missing)
    with pytest.raises(FileNotFoundError, match="nope.tsv"):
        read_corpus(str(missing))
    with pytest.raises(FileNotFoundError, match="nope.de"):
        read_corpus([PLAIN_EN, tmp_path / "nope.de"])


# ----------------------------------------------------------------------------------- plain text


def test_plain_text_good_files():
    assert read_parallel_text(PLAIN_EN, PLAIN_DE) == expected(
        "readers_plain.en:0", "readers_plain.en:1"
    )


def test_plain_text_crlf_bom(tmp_path):
    src = write(tmp_path / "s.txt", b"\xef\xbb\xbf" + PLAIN_EN.read_bytes().replace(b"\n", b"\r\n"))
    tgt = write(tmp_path / "t.txt", PLAIN_DE.read_bytes().replace(b"\n", b"\r\n"))
    assert read_parallel_text(src, tgt) == expected("s.txt:0", "s.txt:1")


def test_plain_text_document_count_mismatch(tmp_path):
    src = write(tmp_path / "s.txt", "a\nb\n\nc\n\nd\n")
    tgt = write(tmp_path / "t.txt", "A\nB\n\nC\n")
    with pytest.raises(CorpusFormatError) as exc:
        read_parallel_text(src, tgt)
    check_error(exc, src, 6, "source has 3 documents, target has 2", "'s.txt:2'", str(tgt))
    # Target longer: the error points into the target file.
    with pytest.raises(CorpusFormatError) as exc:
        read_parallel_text(tgt, src)
    check_error(exc, src, 6, "source has 2 documents, target has 3", str(tgt))


def test_plain_text_sentence_count_mismatch_names_document_and_both_lines(tmp_path):
    src = write(tmp_path / "s.txt", "a\n\nb\nc\nd\n\ne\n")
    tgt = write(tmp_path / "t.txt", "\n\nA\n\nB\nC\n\nE\n")
    with pytest.raises(CorpusFormatError) as exc:
        read_parallel_text(src, tgt)
    check_error(
        exc,
        src,
        3,
        "document 's.txt:1'",
        "3 source sentences starting at line 3",
        f"2 target sentences in {tgt} starting at line 5",
    )


def test_plain_text_missing_separator_reports_first_divergence_and_counts(tmp_path):
    src = write(tmp_path / "s.txt", "a\n\nb\nc\n")
    tgt = write(tmp_path / "t.txt", "A\n\nB\n\nC\n")
    with pytest.raises(CorpusFormatError) as exc:
        read_parallel_text(src, tgt)
    check_error(exc, src, 3, "document 's.txt:1'", "source has 2 documents, target has 3")


def test_plain_text_invalid_utf8_in_target(tmp_path):
    tgt = write(tmp_path / "t.txt", b"Hallo.\nWie geht\xe2\x28 es dir?\n\nTsch\n")
    with pytest.raises(CorpusFormatError) as exc:
        read_parallel_text(PLAIN_EN, tgt)
    check_error(exc, tgt, 2, "invalid UTF-8", "0xe2", "byte offset 8 of the line")


# ---------------------------------------------------------------------------------------- Maruf


def test_maruf_good_files():
    assert read_maruf(MARUF_EN, MARUF_DE) == expected("readers_maruf.en:0", "readers_maruf.en:1")


def test_maruf_crlf_bom_and_surrounding_blank_lines(tmp_path):
    src = write(
        tmp_path / "s.en", b"\xef\xbb\xbf\r\n" + MARUF_EN.read_bytes().replace(b"\n", b"\r\n")
    )
    tgt = write(tmp_path / "t.de", MARUF_DE.read_bytes() + b"\n\n")
    assert read_maruf(src, tgt) == expected("s.en:0", "s.en:1")


def test_maruf_text_before_first_marker(tmp_path):
    tgt = write(tmp_path / "t.de", "\nVorwort\n" + MARUF_DE.read_text())
    with pytest.raises(CorpusFormatError) as exc:
        read_maruf(MARUF_EN, tgt)
    check_error(exc, tgt, 2, "target text before the first <d> line")


def test_maruf_blank_line_in_source_document(tmp_path):
    src = write(tmp_path / "s.en", "<d>\nHello.\n\n<d>\nGood bye.\n")
    with pytest.raises(CorpusFormatError) as exc:
        read_maruf(src, MARUF_DE)
    check_error(
        exc,
        src,
        3,
        "blank line inside document 's.en:0'",
        "source segment 2 is empty",
        f"aligned target line: {MARUF_DE}:3",
    )


def test_maruf_blank_line_in_target_document(tmp_path):
    tgt = write(tmp_path / "t.de", "<d>\nHallo.\nWie geht es dir?\n<d>\n \nTschüss.\n")
    with pytest.raises(CorpusFormatError) as exc:
        read_maruf(MARUF_EN, tgt)
    check_error(
        exc,
        tgt,
        5,
        "blank line inside document 'readers_maruf.en:1'",
        "target segment 1 is empty",
        f"aligned source line: {MARUF_EN}:5",
    )


def test_maruf_sentence_count_mismatch(tmp_path):
    tgt = write(tmp_path / "t.de", "<d>\nHallo.\n<d>\nTschüss.\n")
    with pytest.raises(CorpusFormatError) as exc:
        read_maruf(MARUF_EN, tgt)
    check_error(
        exc,
        MARUF_EN,
        1,
        "document 'readers_maruf.en:0'",
        "2 source sentences starting at line 1",
        f"1 target sentences in {tgt} starting at line 1",
    )


def test_maruf_document_count_mismatch(tmp_path):
    tgt = write(tmp_path / "t.de", MARUF_DE.read_text() + "<d>\nNoch was.\n")
    with pytest.raises(CorpusFormatError) as exc:
        read_maruf(MARUF_EN, tgt)
    check_error(exc, tgt, 6, "source has 2 documents, target has 3", "'readers_maruf.en:2'")


def test_maruf_empty_document(tmp_path):
    src = write(tmp_path / "s.en", "<d>\n<d>\nx\n")
    tgt = write(tmp_path / "t.de", "<d>\n<d>\ny\n")
    with pytest.raises(CorpusFormatError) as exc:
        read_maruf(src, tgt)
    check_error(exc, src, 1, "document 's.en:0' is empty on both sides")


def test_maruf_invalid_utf8(tmp_path):
    src = write(tmp_path / "s.en", b"<d>\nok\n<d>\n\x80bad\n")
    with pytest.raises(CorpusFormatError) as exc:
        read_maruf(src, MARUF_DE)
    check_error(exc, src, 4, "invalid UTF-8", "0x80", "byte offset 0 of the line")


# ---------------------------------------------------------------------------------- read_corpus


def test_detect_format():
    assert detect_format(GOOD_TSV) == "tsv"
    assert detect_format([MARUF_EN, MARUF_DE]) == "maruf"
    assert detect_format((PLAIN_EN, PLAIN_DE)) == "text"
    assert detect_format(f"{PLAIN_EN},{PLAIN_DE}") == "text"


def test_read_corpus_auto_and_explicit():
    assert read_corpus(GOOD_TSV) == expected("talk1", "talk2")
    assert read_corpus(str(GOOD_TSV), fmt="tsv") == expected("talk1", "talk2")
    maruf = expected("readers_maruf.en:0", "readers_maruf.en:1")
    assert read_corpus((MARUF_EN, MARUF_DE)) == maruf
    assert read_corpus(f"{MARUF_EN},{MARUF_DE}", fmt="maruf") == maruf
    plain = expected("readers_plain.en:0", "readers_plain.en:1")
    assert read_corpus(f"{PLAIN_EN},{PLAIN_DE}") == plain
    assert read_corpus([str(PLAIN_EN), str(PLAIN_DE)], fmt="text") == plain


def test_read_corpus_rejects_bad_arguments():
    with pytest.raises(ValueError, match="'xml'.*auto, tsv, text, maruf"):
        read_corpus(GOOD_TSV, fmt="xml")
    with pytest.raises(ValueError, match="format 'tsv' takes one path"):
        read_corpus((PLAIN_EN, PLAIN_DE), fmt="tsv")
    with pytest.raises(ValueError, match="'maruf' takes a"):
        read_corpus(GOOD_TSV, fmt="maruf")
    with pytest.raises(ValueError, match="3 comma-separated"):
        read_corpus("a,b,c")
    with pytest.raises(ValueError, match="got 3 paths"):
        read_corpus(["a", "b", "c"])


def test_read_corpus_logs_summary(caplog):
    caplog.set_level(logging.INFO)
    caplog.set_level(logging.INFO, logger="absl")  # whatever verbosity an earlier test left
    read_corpus((PLAIN_EN, PLAIN_DE))
    lines = [r.getMessage() for r in caplog.records if "documents" in r.getMessage()]
    assert lines and str(PLAIN_EN) in lines[-1] and "2 documents, 3 segments" in lines[-1]


def test_readers_read_a_large_corpus_whole(tmp_path):
    """30k rows: every document and segment comes back (speed is the benchmark's business:
    no timed assertion here)."""
    n = 30_000
    rows = [f"doc{i // 20}\tsource sentence number {i}\tZielsatz Nummer {i}" for i in range(n)]
    tsv = write(tmp_path / "big.tsv", "\n".join(rows) + "\n")
    src = write(tmp_path / "big.en", "".join(f"<d>\n{r.split(chr(9))[1]}\n" for r in rows))
    tgt = write(tmp_path / "big.de", "".join(f"<d>\n{r.split(chr(9))[2]}\n" for r in rows))
    docs = read_tsv(tsv)
    maruf = read_maruf(src, tgt)
    assert len(docs) == n // 20 and len(maruf) == n
    assert sum(len(d.src) for d in docs) == n
    assert docs[-1].src[-1] == f"source sentence number {n - 1}"
    assert maruf[-1].tgt == (f"Zielsatz Nummer {n - 1}",)


def test_tsv_first_row_with_a_wrong_column_count_names_the_layout(tmp_path):
    path = write(tmp_path / "two.tsv", "a\tx\na\ty\n")
    with pytest.raises(CorpusFormatError) as exc:
        read_tsv(path)
    check_error(exc, path, 1, "expected 3 (doc_id, src, tgt) tab-separated columns, found 2")
