"""Behaviour kept across refactors: checkpoints written by an earlier commit (05c332a, see
``tests/data/golden/make_golden.py``) restore and translate to exactly the text that commit
wrote, for the sentence Transformer and FINAL, greedy and beam 2."""

import os

import pytest
from conftest import ROOT

from docnmt_jax.data import readers
from docnmt_jax.decoding.search import SearchConfig
from docnmt_jax.training import restore

GOLDEN = os.path.join(ROOT, "tests", "data", "golden")
SEARCHES = {
    "greedy": SearchConfig(beam_size=1, alpha=0.0),
    "beam2": SearchConfig(beam_size=2, alpha=1.0),
}


def _expected(path):
    rows = open(path, encoding="utf-8").read().splitlines()
    assert rows[0] == "doc_id\thyp"
    return [tuple(r.split("\t", 1)) for r in rows[1:]]


@pytest.mark.parametrize("model", ["transformer", "final"])
@pytest.mark.parametrize("search", sorted(SEARCHES))
def test_translation_equals_the_recorded_one(model, search):
    translator, step = restore.load_translator(
        os.path.join(GOLDEN, model), "latest", SEARCHES[search]
    )
    assert step == 120
    documents = readers.read_tsv(os.path.join(GOLDEN, "input.tsv"))
    hyps = translator.translate(documents)
    got = [(d.doc_id, h) for d, doc_hyps in zip(documents, hyps, strict=True) for h in doc_hyps]
    assert got == _expected(os.path.join(GOLDEN, f"{model}.{search}.tsv"))
