"""Pretraining data through config: one-sentence documents and mixes."""

from __future__ import annotations

import collections
import os
import subprocess
import sys

import pytest
from conftest import ROOT, tiny_config, tiny_final_config

from docnmt_jax.data import corpus_mix
from docnmt_jax.data.documents import Document, write_tsv
from docnmt_jax.training import data_setup, trainer


def _docs(prefix: str, sizes: list[int]) -> list[Document]:
    return [
        Document(
            f"{prefix}{d}",
            tuple(f"{prefix} s{d}.{k}" for k in range(n)),
            tuple(f"{prefix} t{d}.{k}" for k in range(n)),
        )
        for d, n in enumerate(sizes)
    ]


def _pairs(docs: list[Document]) -> collections.Counter:
    return collections.Counter(p for d in docs for p in zip(d.src, d.tgt, strict=True))


def test_multi_resolution_splits_every_document_at_every_level():
    import numpy as np

    docs = _docs("m", [1, 2, 5, 8, 13])
    pieces = corpus_mix.as_multi_resolution(docs)
    assert len({d.doc_id for d in pieces}) == len(pieces)
    for doc in docs:
        n = len(doc)
        # Brute force: powers of two below n, then n single sentences; each level the
        # contiguous near-equal parts np.array_split makes.
        levels = [2**k for k in range(n.bit_length()) if 2**k < n] + [n]
        mine = [
            d for d in pieces if d.doc_id == doc.doc_id or d.doc_id.startswith(doc.doc_id + "#")
        ]
        expected = [
            (doc.src[idx[0] : idx[-1] + 1], doc.tgt[idx[0] : idx[-1] + 1])
            for parts in levels
            for idx in np.array_split(np.arange(n), parts)
        ]
        assert [(d.src, d.tgt) for d in mine] == expected, doc.doc_id
    # Every sentence pair once per level of its document.
    per_doc = {d.doc_id: len([p for p in [1, 2, 4, 8, 16] if p < len(d)]) + 1 for d in docs}
    expected_pairs = collections.Counter()
    for d in docs:
        for pair in zip(d.src, d.tgt, strict=True):
            expected_pairs[pair] += per_doc[d.doc_id]
    assert _pairs(pieces) == expected_pairs


def test_multi_resolution_is_a_train_as_value(tmp_path):
    docs = _docs("r", [4, 3])
    write_tsv(docs, str(tmp_path / "train.tsv"))
    write_tsv(docs, str(tmp_path / "dev.tsv"))
    cfg = tiny_config(str(tmp_path)).data
    cfg.train_as = "multi_resolution"
    got = data_setup.load_documents(cfg, "train")
    assert sorted(len(d) for d in got) == sorted([4, 2, 2, 1, 1, 1, 1, 3, 2, 1, 1, 1, 1])
    assert [len(d) for d in data_setup.load_documents(cfg, "dev")] == [4, 3]  # dev as it is


def test_sentences_are_one_sentence_documents_in_a_seeded_order():
    docs = _docs("a", [3, 1, 4, 2])
    singles = corpus_mix.as_sentences(docs, seed=1)
    assert all(len(d) == 1 for d in singles)
    assert _pairs(singles) == _pairs(docs)  # every pair exactly once
    assert len({d.doc_id for d in singles}) == 10
    in_order = [(s, t) for d in docs for s, t in zip(d.src, d.tgt, strict=True)]
    assert [(d.src[0], d.tgt[0]) for d in singles] != in_order  # shuffled
    assert corpus_mix.as_sentences(docs, seed=1) == singles  # deterministic
    assert corpus_mix.as_sentences(docs, seed=2) != singles


@pytest.mark.parametrize("weight, copies", [(1.0, 10), (2.0, 20), (0.5, 5), (1.3, 13)])
def test_weights_are_per_epoch_multiplicities(weight, copies):
    docs = _docs("b", [1] * 10)
    out = corpus_mix.weighted(docs, weight, seed=3)
    assert len(out) == copies
    counts = collections.Counter(d.src for d in out)
    whole = int(weight)
    assert set(counts.values()) <= {whole, whole + 1}  # floor(w) each, a share once more
    assert len({d.doc_id for d in out}) == copies  # copies get their own ids
    assert corpus_mix.weighted(docs, weight, seed=3) == out


def test_mix_spec_parses_and_mistakes_are_named():
    entries = corpus_mix.parse_mix("a.tsv; b.src,b.tgt 0.5 sentences\nc.tsv sentences 2")
    assert entries == [
        corpus_mix.MixEntry("a.tsv"),
        corpus_mix.MixEntry("b.src,b.tgt", 0.5, "sentences"),
        corpus_mix.MixEntry("c.tsv", 2.0, "sentences"),
    ]
    for spec, words in [
        ("a.tsv lots", "'lots' is neither a weight"),
        ("a.tsv 0", "the weight must be > 0"),
        (" ; ", "names no corpus"),
    ]:
        with pytest.raises(corpus_mix.DataConfigError, match=words) as err:
            corpus_mix.parse_mix(spec)
        assert "\n" not in str(err.value)


def test_the_trainer_reads_a_weighted_mix_and_sentence_documents(tmp_path):
    first, second = _docs("x", [2, 3]), _docs("y", [4])
    write_tsv(first, tmp_path / "first.tsv")
    write_tsv(second, tmp_path / "second.tsv")
    config = tiny_config(str(tmp_path))
    config.data.mix = f"{tmp_path / 'first.tsv'} 2; {tmp_path / 'second.tsv'} sentences"
    docs = data_setup.load_documents(config.data, "train", seed=0)
    # Independent count: every pair of `first` twice inside its documents, `second` once as
    # one-sentence documents.
    expected = collections.Counter({p: 2 for p in _pairs(first)}) + _pairs(second)
    assert _pairs(docs) == expected
    assert sorted(len(d) for d in docs) == [1, 1, 1, 1, 2, 2, 3, 3]
    config.data.mix = ""
    config.data.train = str(tmp_path / "first.tsv")
    config.data.dev = str(tmp_path / "second.tsv")
    config.data.train_as = "sentences"
    docs = data_setup.load_documents(config.data, "train", seed=0)
    assert _pairs(docs) == _pairs(first) and all(len(d) == 1 for d in docs)
    assert data_setup.load_documents(config.data, "dev") == second  # dev stays documents
    config.data.mix = str(tmp_path / "first.tsv")
    with pytest.raises(corpus_mix.DataConfigError, match="both set"):
        data_setup.load_documents(config.data, "train")
    config.data.train, config.data.mix = "", str(tmp_path / "absent.tsv")
    with pytest.raises(corpus_mix.DataConfigError, match="absent.tsv"):
        data_setup.load_documents(config.data, "train")
    config.data.mix, config.data.train_as = "", "paragraphs"
    with pytest.raises(corpus_mix.DataConfigError, match="train_as"):
        data_setup.load_documents(config.data, "train")


def test_final_pretrains_on_one_sentence_documents(synthetic_dir, tmp_path):
    config = tiny_final_config(synthetic_dir, num_steps=2)
    config.data.train_as = "sentences"
    workdir = str(tmp_path / "final_sentences")
    trainer.train_and_evaluate(config, workdir)
    log = open(os.path.join(workdir, "train.log"), encoding="utf-8").read()
    sentences = sum(len(d) for d in data_setup.load_documents(config.data, "train"))
    assert f"data: {sentences} train /" in log  # as many documents as sentences


def test_a_bad_mix_is_a_one_line_error_of_train_py(synthetic_dir, tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "launch", "train.py"),
            "--config=configs/transformer.py",
            f"--workdir={tmp_path / 'x'}",
            f"--config.data.data_dir={synthetic_dir}",
            "--config.data.mix=train.tsv heavy",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert out.returncode == 2, out.stderr[-2000:]
    last = out.stderr.strip().splitlines()[-1]
    assert "Traceback" not in out.stderr and last.startswith("train.py: error: ")
    assert "'heavy' is neither a weight" in last


def _readme_train_commands() -> list[list[str]]:
    """Every ``python launch/train.py`` command of README.md and the user guides in docs/
    (``docs/*.md``, not the dated logs), continuation lines joined."""
    import glob
    import shlex

    guides = sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
    pages = [os.path.join(ROOT, "README.md"), *guides]
    text = "\n".join(open(p, encoding="utf-8").read() for p in pages).replace("\\\n", " ")
    commands = []
    for line in text.splitlines():
        line = line.split("  #")[0].strip()
        if line.startswith("python launch/train.py") and "--helpfull" not in line:
            commands.append(shlex.split(line)[1:])
    return commands


def test_the_readme_training_recipes_parse():
    commands = _readme_train_commands()
    assert sum("--config.init_from_rules=source" in c for c in commands) == 1
    assert any("--config.data.train_as=sentences" in c for c in commands)
    for args in commands:
        out = subprocess.run(
            [sys.executable, *args, "--dry_run"],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=600,
        )
        assert out.returncode == 0, f"{' '.join(args)}: {out.stderr[-1500:]}"
