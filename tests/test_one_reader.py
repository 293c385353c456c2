"""One reader, one message per fault: the same malformed file gets the same ``FILE:LINE: reason``
from every command that reads it -- train (``config.data.train``), translate (``--input``),
evaluate (``--hyp``/``--ref``) and analyze (``--input``).

Each fault's message is written out here (the known answer); the entry points are the ones the
commands call. One slow test runs the three command lines on one fault and compares their
stderr.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import run_launch, tiny_config

from docnmt_jax.commands import analyze
from docnmt_jax.data import readers
from docnmt_jax.data.documents import CorpusFormatError
from docnmt_jax.evaluation import metrics, significance
from docnmt_jax.training import data_setup

NO_DOCUMENTS = "no documents (the file is empty, blank or only a header)"
BLANK = "blank line (blank lines are allowed only at the end of a TSV)"
CR = "carriage return (\\r) inside the line (old Mac line endings?)"

#: Corpus TSVs (doc_id, src, tgt): (rows, line, reason); line None: the whole file.
CORPUS_FAULTS = {
    "extra column": (
        ["d1\tuno\tone", "d1\tdos\ttwo\textra"],
        2,
        "expected 3 (as on line 1) tab-separated columns, found 4 (a tab inside the text?)",
    ),
    "missing column": (
        ["d1\tuno\tone", "d1\tdos"],
        2,
        "expected 3 (as on line 1) tab-separated columns, found 2",
    ),
    "empty doc_id": (["d1\tuno\tone", " \tdos\ttwo"], 2, "empty doc_id"),
    "rows not contiguous": (
        ["d1\tuno\tone", "d2\tdos\ttwo", "d1\ttres\tthree"],
        3,
        "rows of document 'd1' are not contiguous: it started at line 1, then document 'd2' "
        "started at line 2",
    ),
    "bad UTF-8": (
        [b"d1\tuno\tone", b"d1\tdo\xffs\ttwo"],
        2,
        "invalid UTF-8: byte 0xff at byte offset 5 of the line (offset 16 in the file)",
    ),
    "blank line inside": (["d1\tuno\tone", "", "d2\tdos\ttwo"], 2, BLANK),
    "carriage return": (["d1\tuno\tone", "d1\tdo\rs\ttwo"], 2, CR),
    "empty file": ([], None, NO_DOCUMENTS),
    "header only": (["doc_id\tsrc\ttgt"], None, NO_DOCUMENTS),
    "blank file": (["", "  "], None, NO_DOCUMENTS),
}

#: Two-column TSVs (doc_id, text): a file to translate, hypotheses, references.
TWO_COLUMN_FAULTS = {
    "extra column": (
        ["d1\tuno", "d1\tdos\tthree"],
        2,
        "expected 2 (as on line 1) tab-separated columns, found 3 (a tab inside the text?)",
    ),
    "empty doc_id": (["d1\tuno", "\tdos"], 2, "empty doc_id"),
    "rows not contiguous": (
        ["d1\tuno", "d2\tdos", "d1\ttres"],
        3,
        "rows of document 'd1' are not contiguous: it started at line 1, then document 'd2' "
        "started at line 2",
    ),
    "blank line inside": (["d1\tuno", " ", "d2\tdos"], 2, BLANK),
}

#: Plain text (blank lines between documents).
PLAIN_FAULTS = {
    "bad UTF-8": (
        ["uno", b"d\xc3os"],
        2,
        "invalid UTF-8: byte 0xc3 at byte offset 1 of the line (offset 5 in the file)",
    ),
    "carriage return": (["uno", "", "do\rs"], 3, CR),
}


def write(path: Path, rows: list) -> str:
    data = b"".join((r if isinstance(r, bytes) else r.encode()) + b"\n" for r in rows)
    path.write_bytes(data)
    return str(path)


def good_files(tmp_path: Path) -> dict[str, str]:
    return {
        "corpus": write(tmp_path / "good.tsv", ["d1\tuno\tone", "d1\tdos\ttwo"]),
        "hyp": write(tmp_path / "good.hyp.tsv", ["d1\tone", "d1\ttwo"]),
        "plain": write(tmp_path / "good.txt", ["one", "two"]),
    }


def train_reader(tmp_path: Path) -> Callable[[str], object]:
    """What ``train.py`` reads: ``config.data.train`` (``config.data.dev`` a good file)."""
    config = tiny_config(str(tmp_path))
    config.data.dev = good_files(tmp_path)["corpus"]

    def read(path: str) -> object:
        config.data.train = path
        return data_setup.load_documents(config.data, "train")

    return read


def corpus_readers(tmp_path: Path) -> dict[str, Callable[[str], object]]:
    good = good_files(tmp_path)
    return {
        "train": train_reader(tmp_path),
        "translate --input": lambda p: list(readers.iter_source_documents(p)),
        "evaluate --ref": lambda p: metrics.evaluate_files(good["hyp"], p),
        "evaluate --workdir --ref": readers.read_tsv,
        "analyze --input": analyze.read_references,
    }


def two_column_readers(tmp_path: Path) -> dict[str, Callable[[str], object]]:
    good = good_files(tmp_path)
    return {
        "translate --input": lambda p: list(readers.iter_source_documents(p)),
        "evaluate --hyp": lambda p: metrics.evaluate_files(p, good["corpus"]),
        "evaluate --ref": lambda p: metrics.evaluate_files(good["hyp"], p),
        "evaluate --baseline": lambda p: significance.paired_files(
            good["hyp"], p, good["corpus"], ["bs"], 10, False
        ),
    }


def plain_readers(tmp_path: Path) -> dict[str, Callable[[str], object]]:
    good = good_files(tmp_path)
    return {
        "train (src,tgt text)": lambda p: readers.read_corpus([p, good["plain"]]),
        "translate --input": lambda p: list(readers.iter_source_documents(p)),
        "evaluate --hyp": lambda p: metrics.evaluate_files(p, good["plain"]),
        "evaluate --ref": lambda p: metrics.evaluate_files(good["plain"], p),
    }


def messages(read_by: dict[str, Callable[[str], object]], path: str) -> dict[str, str]:
    """Each reader's error message on ``path`` (a reader that accepts it: a failure)."""
    out = {}
    for name, read in read_by.items():
        with pytest.raises(CorpusFormatError) as e:
            read(path)
        out[name] = str(e.value)
    return out


def expected(path: str, line: int | None, reason: str) -> str:
    return f"{path}:{line}: {reason}" if line is not None else f"{path}: {reason}"


@pytest.mark.parametrize("fault", sorted(CORPUS_FAULTS))
def test_a_corpus_fault_reads_the_same_everywhere(tmp_path, fault):
    rows, line, reason = CORPUS_FAULTS[fault]
    path = write(tmp_path / "bad.tsv", rows)
    got = messages(corpus_readers(tmp_path), path)
    assert got == dict.fromkeys(got, expected(path, line, reason))


@pytest.mark.parametrize("fault", sorted(TWO_COLUMN_FAULTS))
def test_a_two_column_fault_reads_the_same_everywhere(tmp_path, fault):
    rows, line, reason = TWO_COLUMN_FAULTS[fault]
    path = write(tmp_path / "bad.tsv", rows)
    got = messages(two_column_readers(tmp_path), path)
    assert got == dict.fromkeys(got, expected(path, line, reason))


@pytest.mark.parametrize("fault", sorted(PLAIN_FAULTS))
def test_a_plain_text_fault_reads_the_same_everywhere(tmp_path, fault):
    rows, line, reason = PLAIN_FAULTS[fault]
    path = write(tmp_path / "bad.txt", rows)
    got = messages(plain_readers(tmp_path), path)
    assert got == dict.fromkeys(got, expected(path, line, reason))


def test_an_empty_file_reads_the_same_in_every_format(tmp_path):
    """TSV or plain text, first or second file of a pair: one message."""
    path = write(tmp_path / "empty.txt", [])
    read_by = {**corpus_readers(tmp_path), **plain_readers(tmp_path)}
    got = messages(read_by, path)
    assert got == dict.fromkeys(got, expected(path, None, NO_DOCUMENTS))


def test_sentence_counts_that_differ_read_the_same_in_evaluate_and_its_paired_tests(tmp_path):
    hyp = write(tmp_path / "hyp.tsv", ["d1\tone", "d2\tthree"])
    ref = write(tmp_path / "ref.tsv", ["d1\tuno\tone", "d1\tdos\ttwo", "d2\ttres\tthree"])
    good = write(tmp_path / "base.tsv", ["d1\tone", "d1\ttwo", "d2\tthree"])
    want = (
        f"{hyp}:1: document 'd1' has 1 hypothesis sentences starting at line 1 but 2 reference "
        f"sentences in {ref} starting at line 1"
    )
    got = messages(
        {
            "evaluate": lambda p: metrics.evaluate_files(p, ref),
            "evaluate --baseline": lambda p: significance.paired_files(
                good, p, ref, ["bs"], 10, False
            ),
        },
        hyp,
    )
    assert got == dict.fromkeys(got, want)


#: TensorFlow's start-up lines (see docnmt_jax/__init__.py).
TENSORFLOW_NOISE = re.compile(r"oneDNN|cuDNN|TF-TRT|absl::InitializeLog|cpu_feature_guard")
ERROR_LINE = re.compile(r"^(?P<prog>[\w.]+): error: (?P<message>.*)$")


def error_lines(stderr: str) -> list[tuple[str, str]]:
    """``(prog, message)`` of the error lines (a progress bar may share stderr)."""
    lines = re.split(r"[\r\n]+", stderr)
    return [(m["prog"], m["message"]) for ln in lines if (m := ERROR_LINE.match(ln.strip()))]


@pytest.mark.slow
def test_train_translate_and_evaluate_print_one_identical_line(one_step_run, tmp_path):
    """The command lines on a file whose document's rows are not contiguous: each ends with
    status 2 and the same one-line message, and no TensorFlow start-up lines (train imports it
    for tf.data before it reads the corpus)."""
    rows, line, reason = CORPUS_FAULTS["rows not contiguous"]
    bad = write(tmp_path / "bad.tsv", rows)
    good = good_files(tmp_path)
    config = os.path.join(os.path.dirname(os.path.dirname(__file__)), "configs", "transformer.py")
    runs = {
        "train.py": run_launch(
            "train.py",
            f"--config={config}",
            f"--workdir={tmp_path}/run",
            f"--config.data.train={bad}",
            f"--config.data.dev={good['corpus']}",
        ),
        "translate.py": run_launch(
            "translate.py",
            f"--workdir={one_step_run}",
            f"--input={bad}",
            f"--output={tmp_path}/out.tsv",
        ),
        "evaluate.py": run_launch("evaluate.py", f"--hyp={good['hyp']}", f"--ref={bad}"),
    }
    want = expected(bad, line, reason)
    for prog, proc in runs.items():
        assert proc.returncode == 2, (prog, proc.stderr[-2000:])
        assert error_lines(proc.stderr) == [(prog, want)], (prog, proc.stderr[-2000:])
        assert not [ln for ln in proc.stderr.splitlines() if TENSORFLOW_NOISE.search(ln)], prog
    assert not os.path.exists(f"{tmp_path}/out.tsv")
