"""Behaviour kept across refactors of the model modules: every registered model, built tiny
with fixed-seed initial parameters, has the same parameter tree (names, shapes: checkpoints
still load) and translates ``tests/data/golden/input.tsv`` through the translator that
``launch/translate.py`` uses (greedy, and beam 2) to exactly the recorded token ids and text.

The record is ``tests/data/translation_golden.json``. The translations are marked slow (run
them with ``pytest -m slow tests/test_translation_golden.py``); the parameter trees are not.
Regenerate it only when a change is *meant* to alter a model's parameters or output, with the
code that makes that change::

    PYTHONPATH=. python tests/test_translation_golden.py --regenerate
"""

from __future__ import annotations

import functools
import json
import os
import sys
from typing import Any

import flax.linen as nn
import jax
import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # conftest, when run as a script
from conftest import ROOT, TABLE3_SWITCHES, shipped_models  # noqa: E402

from docnmt_jax.data import readers  # noqa: E402
from docnmt_jax.data.documents import Document  # noqa: E402
from docnmt_jax.data.schema import dummy_batch  # noqa: E402
from docnmt_jax.data.tokenizer import PAD_ID, load_tokenizer  # noqa: E402
from docnmt_jax.decoding.search import SearchConfig  # noqa: E402
from docnmt_jax.decoding.translator import Translator  # noqa: E402
from docnmt_jax.models import build_model  # noqa: E402

GOLDEN = os.path.join(ROOT, "tests", "data", "translation_golden.json")
TOKENIZER = os.path.join(ROOT, "tests", "data", "golden", "transformer", "spm.model")
INPUT = os.path.join(ROOT, "tests", "data", "golden", "input.tsv")
SEARCHES = {
    "greedy": SearchConfig(beam_size=1, alpha=0.0, len_a=1.0, len_b=4),
    "beam2": SearchConfig(beam_size=2, alpha=1.0, len_a=1.0, len_b=4),
}
TRANSFORMER = dict(d_model=16, num_heads=2, ffn_dim=32, num_encoder_layers=2, num_decoder_layers=2)
RNN = dict(d_model=16, embed_dim=16)
#: Every registered model, and the FINAL rows whose layers differ (Doc2Sent, the local
#: encoder), as (registered name, config values).
MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "transformer": ("transformer", TRANSFORMER),
    "final": ("final", TRANSFORMER),
    "final_doc2sent": ("final", dict(TRANSFORMER, **TABLE3_SWITCHES["doc2sent"])),
    "final_segment_relative": (
        "final",
        dict(TRANSFORMER, **TABLE3_SWITCHES["+segment_relative_attention"]),
    ),
    "doc2doc": ("doc2doc", dict(TRANSFORMER, max_len=256)),
    "doct": ("doct", TRANSFORMER),
    "hmgdc": ("hmgdc", TRANSFORMER),
    "jean_cho": ("jean_cho", dict(TRANSFORMER, context_sentences=2)),
    "rnnsearch": ("rnnsearch", RNN),
    "rnnsearch_hmgdc": ("rnnsearch_hmgdc", RNN),
}


@functools.cache
def _tokenizer():
    return load_tokenizer(TOKENIZER)


@functools.cache
def _documents() -> tuple[Document, ...]:
    """Two documents of 3 sentences each: the first ones of at most 40 characters of the two
    documents of ``input.tsv`` (short: quick to search, and within every model's limits)."""
    documents = []
    for doc in readers.read_tsv(INPUT):
        pairs = [(s, t) for s, t in zip(doc.src, doc.tgt, strict=True) if len(s) <= 40][:3]
        documents.append(Document(doc.doc_id, *map(tuple, zip(*pairs, strict=True))))
    return tuple(documents)


@functools.cache
def _model_and_params(key: str):
    name, values = MODELS[key]
    model = build_model(dict(values, name=name), _tokenizer().vocab_size)
    params = model.init(jax.random.PRNGKey(7), dummy_batch())["params"]
    return model, jax.tree_util.tree_map(np.asarray, nn.meta.unbox(params))


def _tree(params) -> list[str]:
    """``path shape`` of every parameter: what a checkpoint must match to load."""
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    return sorted(f"{jax.tree_util.keystr(p)} {list(np.shape(v))}" for p, v in flat)


class _RecordingTokenizer:
    """The tokenizer, keeping the token ids of every output it decodes, in order."""

    def __init__(self, tokenizer: Any):
        self._tokenizer = tokenizer
        self.decoded: list[list[int]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)

    def decode(self, ids: Any) -> str:
        row = [int(i) for i in ids]
        while row and row[-1] == PAD_ID:
            row.pop()
        self.decoded.append(row)
        return self._tokenizer.decode(ids)


def _record(key: str, search: str) -> dict[str, Any]:
    model, params = _model_and_params(key)
    tokenizer = _RecordingTokenizer(_tokenizer())
    translator = Translator(model, params, tokenizer, SEARCHES[search], max_sentences=3)
    hyps = [h for doc_hyps in translator.translate(list(_documents())) for h in doc_hyps]
    return {"text": hyps, "ids": tokenizer.decoded}


def _golden() -> dict[str, Any]:
    with open(GOLDEN, encoding="utf-8") as f:
        return json.load(f)


def test_every_shipped_model_is_covered():
    """Every model the package registers (a test file may register toys of its own in the
    same process: those are not shipped)."""
    assert {name for name, _ in MODELS.values()} == shipped_models()


@pytest.mark.parametrize("key", sorted(MODELS))
def test_parameter_tree_is_the_recorded_one(key):
    assert _tree(_model_and_params(key)[1]) == _golden()[key]["params"]


@pytest.mark.slow  # ~20 searches to compile: 5 minutes on a loaded 2-core machine
@pytest.mark.parametrize("search", sorted(SEARCHES))
@pytest.mark.parametrize("key", sorted(MODELS))
def test_translation_is_the_recorded_one(key, search):
    """The same texts in input order and the same token ids (compared as a multiset: ids are
    recorded in the order the translator decodes its batches, which groups by length)."""
    got, want = _record(key, search), _golden()[key][search]
    assert got["text"] == want["text"]
    assert sorted(got["ids"]) == sorted(want["ids"])


def regenerate() -> None:
    golden = {}
    for key in sorted(MODELS):
        golden[key] = {"params": _tree(_model_and_params(key)[1])}
        for search in sorted(SEARCHES):
            golden[key][search] = _record(key, search)
            print(key, search, golden[key][search]["text"][:2])
    with open(GOLDEN, "w", encoding="utf-8") as f:
        json.dump(golden, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    if sys.argv[1:] != ["--regenerate"]:
        sys.exit(f"usage: PYTHONPATH=. python {sys.argv[0]} --regenerate")
    regenerate()
