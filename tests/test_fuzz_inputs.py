"""Fuzz tests: seeded corruptions of valid files through the readers and
the command lines; every outcome is a clean result or a one-line error naming the file --
never a traceback, never a partial output.

The corruptions are :mod:`fuzz_corruptions`' (deleted/duplicated tabs and newlines, invalid
UTF-8, a BOM in the middle, CRLF mixes, empty sides, huge lines, binary, files cut short, NUL
bytes). Readers run in this process (every reader a user's file reaches: the corpus TSV, the
aligned plain-text pair, the ``<d>`` pair, a file to translate, a hypothesis file); the
command lines run in one worker process each (``cli_fuzz_worker.py``), which calls the
script's ``main`` behind :mod:`docnmt_jax.cli`'s boundary as ``cli.run`` does.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import ROOT
from fuzz_corruptions import CORRUPTIONS, corrupt

from docnmt_jax.data import readers
from docnmt_jax.data.documents import Document
from docnmt_jax.errors import UserError
from docnmt_jax.evaluation.metrics import read_hypotheses

DATA = Path(__file__).parent / "data"
VALID = {
    "tsv": (DATA / "readers_good.tsv",),
    "text": (DATA / "readers_plain.en", DATA / "readers_plain.de"),
    "maruf": (DATA / "readers_maruf.en", DATA / "readers_maruf.de"),
}
READER_SEEDS = range(300)


def _check_documents(docs: list[Document]) -> None:
    """What a clean read promises: aligned sides, one line per sentence, named documents."""
    for doc in docs:
        assert doc.doc_id and len(doc.src) == len(doc.tgt), doc
        for sentence in (*doc.src, *doc.tgt):
            assert "\n" not in sentence and "\t" not in sentence, repr(sentence)


def _check_sources(items: list[tuple[str, list[str], int]]) -> None:
    for doc_id, sentences, line in items:
        assert doc_id and sentences and line >= 1, (doc_id, sentences, line)
        for sentence in sentences:
            assert "\n" not in sentence and "\t" not in sentence, repr(sentence)


def _check_hypotheses(docs: list) -> None:
    for doc in docs:
        assert doc.doc_id, doc
        for sentence in doc.sentences:
            assert "\n" not in sentence and "\t" not in sentence, repr(sentence)


def _readers(kind: str, paths: list[str]) -> list[tuple[str, Callable[[], None]]]:
    """The readers a file of ``kind`` goes through, each with its clean-result check."""
    if kind == "tsv":
        (path,) = paths
        return [
            ("read_tsv", lambda: _check_documents(readers.read_tsv(path))),
            ("read_corpus", lambda: _check_documents(readers.read_corpus(path))),
            (
                "iter_source_documents",
                lambda: _check_sources(list(readers.iter_source_documents(path))),
            ),
            ("read_hypotheses", lambda: _check_hypotheses(read_hypotheses(path))),
        ]
    read = readers.read_parallel_text if kind == "text" else readers.read_maruf
    return [
        (f"read_{kind}", lambda: _check_documents(read(*paths))),
        ("read_corpus", lambda: _check_documents(readers.read_corpus(paths))),
        (
            "iter_source_documents",
            lambda: _check_sources(list(readers.iter_source_documents(paths[0]))),
        ),
    ]


def _corrupted_case(kind: str, seed: int, tmp_path: Path) -> tuple[str, list[str], str]:
    """Writes the valid files of ``kind`` with one of them corrupted by ``seed``."""
    originals = VALID[kind]
    victim = seed % len(originals)
    paths = []
    operator = ""
    for i, original in enumerate(originals):
        data = original.read_bytes()
        if i == victim:
            operator, data = corrupt(data, seed)
        path = tmp_path / f"s{seed}.{original.name}"
        path.write_bytes(data)
        paths.append(str(path))
    return operator, paths, paths[victim]


@pytest.mark.parametrize("kind", sorted(VALID))
def test_corrupted_files_give_a_clean_result_or_a_one_line_error(kind, tmp_path):
    outcomes = {"clean": 0, "error": 0}
    failures = []
    for seed in READER_SEEDS:
        operator, paths, victim = _corrupted_case(kind, seed, tmp_path)
        for name, read in _readers(kind, paths):
            try:
                read()
            except UserError as e:
                message = str(e)
                if "\n" in message or not any(p in message for p in paths):
                    failures.append(f"seed {seed} {operator} {name}: bad message {message!r}")
                outcomes["error"] += 1
            except Exception as e:  # noqa: BLE001 - every other exception is a failure
                failures.append(f"seed {seed} {operator} {name}: {type(e).__name__}: {e}"[:300])
            else:
                outcomes["clean"] += 1
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:20])
    # the fuzzing reached both outcomes (a generator that broke nothing would prove nothing)
    assert outcomes["error"] > 0 and outcomes["clean"] > 0, outcomes


def test_every_corruption_changes_some_file():
    data = (DATA / "readers_good.tsv").read_bytes()
    for name, operator in CORRUPTIONS.items():
        changed = any(operator(data, random.Random(s)) != data for s in range(5))
        assert changed, name


# --------------------------------------------------------------------------- command lines


def run_worker(script: str, cases: list[dict], tmp_path: Path, timeout: float = 1200) -> list:
    """Runs ``cases`` (``{"args": [...], "output": PATH | None}``) through ``script``'s main in
    one worker process; returns one ``{"code", "stderr", "traceback"}`` per case."""
    cases_path, results_path = tmp_path / "cases.json", tmp_path / "results.json"
    cases_path.write_text(json.dumps(cases), encoding="utf-8")
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tests", "cli_fuzz_worker.py"), script]
        + [str(cases_path), str(results_path)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(results_path.read_text(encoding="utf-8"))


def check_cli_outcomes(cases: list[dict], results: list[dict], prog: str) -> dict[str, int]:
    """Every case ended with status 0 and a complete output, or status 2 with one line
    ``PROG: error: ...`` and no output file (not even a ``.partial``)."""
    failures, counts = [], {"clean": 0, "error": 0}
    for case, result in zip(cases, results, strict=True):
        where = f"{case['name']}: {result['stderr'][-600:]}"
        output = case.get("output")
        leftovers = [p for p in (output, output and output + ".partial") if p and os.path.exists(p)]
        if result["traceback"]:
            failures.append(f"traceback in {where}")
        elif result["code"] == 0:
            counts["clean"] += 1
            if output and not os.path.exists(output):
                failures.append(f"status 0 without output in {where}")
        elif result["code"] == 2:
            counts["error"] += 1
            lines = result["stderr"].strip().splitlines()
            if not lines or not lines[-1].startswith(f"{prog}: error: "):
                failures.append(f"no one-line error in {where}")
            if leftovers:
                failures.append(f"partial output {leftovers} in {where}")
        else:
            failures.append(f"status {result['code']} in {where}")
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:20])
    return counts


CLI_SEEDS = range(120)


def test_evaluate_cli_on_corrupted_hypotheses_and_references(tmp_path):
    """``evaluate.py --hyp H --ref R`` with either file corrupted."""
    ref = DATA / "readers_good.tsv"
    docs = readers.read_tsv(ref)
    hyp = tmp_path / "hyp.tsv"
    hyp.write_text(
        "doc_id\thyp\n" + "".join(f"{d.doc_id}\t{t}\n" for d in docs for t in d.tgt),
        encoding="utf-8",
    )
    cases = []
    for seed in CLI_SEEDS:
        victim = hyp if seed % 2 else ref
        operator, data = corrupt(victim.read_bytes(), seed)
        path = tmp_path / f"s{seed}.{victim.name}"
        path.write_bytes(data)
        args = ["--hyp", str(path), "--ref", str(ref)] if seed % 2 else ["--hyp", str(hyp)]
        args += [] if seed % 2 else ["--ref", str(path)]
        cases.append({"name": f"seed {seed} {victim.name} {operator}", "args": args})
    results = run_worker("evaluate.py", cases, tmp_path)
    counts = check_cli_outcomes(cases, results, "evaluate.py")
    assert counts["error"] > 0 and counts["clean"] > 0, counts


def _translate_cases(seeds: range, synthetic_dir: str, run: str, tmp_path: Path) -> list[dict]:
    source = tmp_path / "source.tsv"
    docs = readers.read_tsv(os.path.join(synthetic_dir, "test.tsv"))[:3]
    source.write_text(
        "doc_id\tsrc\n" + "".join(f"{d.doc_id}\t{s}\n" for d in docs for s in d.src),
        encoding="utf-8",
    )
    cases = []
    for seed in seeds:
        operator, data = corrupt(source.read_bytes(), seed)
        path = tmp_path / f"s{seed}.tsv"
        path.write_bytes(data)
        output = str(tmp_path / f"s{seed}.hyp.tsv")
        args = [f"--workdir={run}", f"--input={path}", f"--output={output}", "--beam=1"]
        cases.append({"name": f"seed {seed} {operator}", "args": args, "output": output})
    return cases


def _check_translations(cases: list[dict]) -> None:
    """A complete output: for a TSV input (a corruption can leave plain text, e.g. a line
    without a tab) one row per source sentence the reader finds, in order; for plain text a
    line-aligned output, one line per input line up to the last sentence's."""
    for case in cases:
        if os.path.exists(case["output"]):
            source = case["args"][1].partition("=")[2]
            rows = Path(case["output"]).read_text(encoding="utf-8").split("\n")
            assert rows[-1] == "", case["name"]
            if readers.is_tsv(source):
                expected = [d for d, s, _ in readers.iter_source_documents(source) for _ in s]
                assert rows[0] == "doc_id\thyp", case["name"]
                assert [r.split("\t")[0] for r in rows[1:-1]] == expected, case["name"]
            else:
                lines = [line for _, _, line in readers.iter_source_rows(source)]
                last_line = max(lines, default=0)
                assert len(rows) - 1 == last_line, case["name"]


@pytest.mark.parametrize(
    "seeds", [range(24), pytest.param(range(24, 300), marks=pytest.mark.slow)], ids=str
)
def test_translate_cli_on_corrupted_input(seeds, one_step_run, synthetic_dir, tmp_path):
    """``translate.py`` on corrupted files to translate: a complete output or a one-line
    error and no output (the slow variant runs 276 more seeds)."""
    cases = _translate_cases(seeds, synthetic_dir, one_step_run, tmp_path)
    results = run_worker("translate.py", cases, tmp_path, timeout=3000)
    counts = check_cli_outcomes(cases, results, "translate.py")
    _check_translations(cases)
    assert counts["error"] > 0 and counts["clean"] > 0, counts
