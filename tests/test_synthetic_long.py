"""Tests for the long-document synthetic context task (docnmt_jax.data.synthetic_long)."""

from __future__ import annotations

import collections
import json
import os

import pytest
from conftest import run_launch

from docnmt_jax.data import readers
from docnmt_jax.data.context_labels import ContextLabel, chance_level, read_labels
from docnmt_jax.data.synthetic import SRC_CONSONANTS, TGT_CONSONANTS
from docnmt_jax.data.synthetic_long import (
    LongLexicon,
    LongSyntheticConfig,
    build_long_lexicon,
    chunk_start,
    elided_verb_accuracy_by_position,
    generate,
    long_context_accuracy,
    register_distance_table,
)

DEFAULT = LongSyntheticConfig()


@pytest.fixture(scope="module")
def test_split():
    """The default test split: 300 documents."""
    return generate(LongSyntheticConfig(num_documents=300), split="test")


# --- independent re-derivation -------------------------------------------------------


def _naive_translate(src: list[str], resolve: dict[int, str], lex: LongLexicon):
    """Test-side translation: target words and source position -> target position."""
    table = dict(lex.filler)
    table.update({s: t for s, t, _ in lex.register_setters})
    table.update({s: t for s, t, _ in lex.verbs})
    adj = [w in lex.adjectives for w in src]
    order, i = [], 0
    while i < len(src):  # an adjective before a non-adjective swaps with it
        if adj[i] and i + 1 < len(src) and not adj[i + 1]:
            order += [i + 1, i]
            i += 2
        else:
            order.append(i)
            i += 1
    tgt = [resolve[j] if j in resolve else table[src[j]] for j in order]
    return tgt, {j: pos for pos, j in enumerate(order)}


def _expected_document(doc, lex: LongLexicon, chunk_size: int):
    """Parses a source document with the lexicon; returns the target it must have and its
    labels, re-derived from the rules (register from sentence 0, verb class from the
    previous sentence)."""
    setters = {s: r for s, _, r in lex.register_setters}
    senses = dict(lex.register_words)
    verbs = {s: v for s, _, v in lex.verbs}
    sents = [s.split() for s in doc.src]
    found = [w for w in sents[0] if w in setters]
    assert len(found) == 1, "sentence 0 holds exactly one register-setting word"
    register = setters[found[0]]
    targets, labels = [], []
    for k, words in enumerate(sents):
        assert k == 0 or not any(w in setters for w in words), "setters only in sentence 0"
        assert sum(w in verbs for w in words) <= 1
        elided = words.count(lex.elision)
        assert elided <= 1 and sum(w in senses for w in words) <= 1
        if k > 0 and k % chunk_size == 0:
            assert elided == 1, f"no elision at chunk start {k}"
        # verbs only right before an elision: sentence k has a verb iff k + 1 has the marker
        next_elided = k + 1 < len(sents) and lex.elision in sents[k + 1]
        assert any(w in verbs for w in words) == next_elided
        resolve, found_labels = {}, []
        for i, w in enumerate(words):
            if w in senses:
                forms, value, ph, dist = senses[w], register, "register", k
            elif w == lex.elision:
                (verb,) = [v for v in sents[k - 1] if v in verbs]
                forms, value, ph, dist = lex.elision_forms, verbs[verb], "elided_verb", 1
            else:
                continue
            resolve[i] = forms[value]
            found_labels.append((i, ph, dist, forms, value))
        tgt, where = _naive_translate(words, resolve, lex)
        targets.append(" ".join(tgt))
        for i, ph, dist, forms, value in found_labels:
            alts = tuple(f for j, f in enumerate(forms) if j != value)
            labels.append(ContextLabel(doc.doc_id, k, where[i], ph, dist, forms[value], alts))
    return targets, labels


# --- tests ---------------------------------------------------------------------------


def test_config_validation_and_round_trip():
    cfg = LongSyntheticConfig(num_registers=3, p_elided=0.5, seed=7)
    assert LongSyntheticConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    with pytest.raises(ValueError, match="unknown fields"):
        LongSyntheticConfig.from_dict({"distances": [1]})
    for bad in (
        dict(min_sentences=10, max_sentences=5),
        dict(min_words=2),
        dict(num_registers=1),
        dict(num_verb_classes=1),
        dict(p_register=1.5),
        dict(p_elided=-0.1),
        dict(chunk_size=1),
    ):
        with pytest.raises(ValueError, match="LongSyntheticConfig"):
            LongSyntheticConfig(**bad)


def test_lexicon_alphabets_and_distinct_words():
    lex = build_long_lexicon(DEFAULT)
    src = [w for w, _ in lex.filler] + [w for w, _, _ in lex.register_setters]
    src += [w for w, _ in lex.register_words] + [w for w, _, _ in lex.verbs] + [lex.elision]
    tgt = [t for _, t in lex.filler] + [t for _, t, _ in lex.register_setters]
    tgt += [t for _, ts in lex.register_words for t in ts] + [t for _, t, _ in lex.verbs]
    tgt += list(lex.elision_forms)
    assert (len(src), len(tgt)) == (82, 88) == (len(set(src)), len(set(tgt)))
    assert all(set(w) <= set(SRC_CONSONANTS + "aiou") for w in src)
    assert all(set(w) <= set(TGT_CONSONANTS + "ey") for w in tgt)
    assert len(lex.adjectives) == 16


def test_deterministic_and_prefix():
    cfg = LongSyntheticConfig(num_documents=6, min_sentences=5, max_sentences=45)
    docs, labels = generate(cfg, "dev")
    assert generate(cfg, "dev") == (docs, labels)
    fewer = LongSyntheticConfig(**{**cfg.to_dict(), "num_documents": 3})
    fewer_docs, fewer_labels = generate(fewer, "dev")
    assert docs[:3] == fewer_docs
    assert labels[: len(fewer_labels)] == fewer_labels
    assert generate(cfg, "test")[0] != docs
    assert generate(LongSyntheticConfig(**{**cfg.to_dict(), "seed": 1}), "dev")[0] != docs


def test_text_and_labels_follow_the_rules(test_split):
    """Target text and every label re-derived by parsing the source with the lexicon: the
    register word's sense is sentence 0's register, the elision's form the previous
    sentence's verb class, an elision at every chunk start, verbs only before elisions."""
    docs, labels = test_split
    lex = build_long_lexicon(DEFAULT)
    expected = []
    for doc in docs:
        assert DEFAULT.min_sentences <= len(doc) <= DEFAULT.max_sentences
        targets, doc_labels = _expected_document(doc, lex, DEFAULT.chunk_size)
        assert list(doc.tgt) == targets, doc.doc_id
        expected += doc_labels
    assert labels == expected
    n_starts = sum((len(d) - 1) // DEFAULT.chunk_size for d in docs)
    assert sum(chunk_start(lb) for lb in labels if lb.phenomenon == "elided_verb") == n_starts


def test_distances_cover_1_to_60(test_split):
    _, labels = test_split
    counts = collections.Counter(lb.distance for lb in labels if lb.phenomenon == "register")
    assert min(counts[d] for d in range(1, 61)) >= 30
    assert {lb.distance for lb in labels if lb.phenomenon == "elided_verb"} == {1}


def test_chance_levels(test_split):
    _, labels = test_split
    assert DEFAULT.chance_levels() == pytest.approx({"register": 1 / 2, "elided_verb": 1 / 3})
    n_reg = sum(lb.phenomenon == "register" for lb in labels)
    n_el = sum(lb.phenomenon == "elided_verb" for lb in labels)
    assert n_reg + n_el == len(labels)
    assert chance_level(labels) == pytest.approx((n_reg / 2 + n_el / 3) / len(labels))


def _label(segment, phenomenon, distance, correct="a"):
    return ContextLabel("d", segment, 0, phenomenon, distance, correct, ("b",))


def test_accuracy_split_by_chunk_start_on_a_hand_made_example():
    labels = [
        _label(19, "elided_verb", 1),  # elsewhere, right
        _label(20, "elided_verb", 1),  # chunk start, wrong
        _label(21, "elided_verb", 1),  # elsewhere, wrong
        _label(40, "elided_verb", 1),  # chunk start, right
        _label(60, "elided_verb", 1),  # chunk start, right
        _label(5, "register", 5),  # bucket 1-19, right
        _label(25, "register", 25),  # bucket 20-39, wrong
    ]
    hyp = ["x"] * 61
    for k in (19, 40, 60, 5):
        hyp[k] = "a"
    for k in (20, 21, 25):
        hyp[k] = "b"
    split = elided_verb_accuracy_by_position({"d": hyp}, labels)
    assert split["chunk_start"] == {"accuracy": pytest.approx(2 / 3), "correct": 2, "total": 3}
    assert split["elsewhere"] == {"accuracy": 0.5, "correct": 1, "total": 2}
    by_19 = elided_verb_accuracy_by_position({"d": hyp}, labels, chunk_size=19)
    assert by_19["chunk_start"] == {"accuracy": 1.0, "correct": 1, "total": 1}  # segment 19
    report = long_context_accuracy({"d": hyp}, labels)
    assert report["correct"] == 4 and report["total"] == 7
    assert report["register_by_bucket"] == {
        "1-19": {"accuracy": 1.0, "correct": 1, "total": 1},
        "20-39": {"accuracy": 0.0, "correct": 0, "total": 1},
    }
    assert not chunk_start(_label(0, "elided_verb", 1))

    table = register_distance_table({"doc": report, "blind": long_context_accuracy({}, labels)})
    lines = table.splitlines()
    assert lines[0] == "| distance | chunk | labels | doc | blind |"
    assert len(lines) == 2 + 60
    assert lines[2 + 4] == "| 5 | 0 | 1 | 100.0 | 0.0 |"
    assert lines[2 + 24] == "| 25 | 1 | 1 | 0.0 | 0.0 |"
    assert lines[2 + 5] == "| 6 | 0 | 0 | - | - |"
    as_json = {k: json.loads(json.dumps(v)) for k, v in (("doc", report), ("blind", report))}
    assert register_distance_table(as_json).splitlines()[2 + 4] == "| 5 | 0 | 1 | 100.0 | 100.0 |"


def test_prepare_writes_the_corpus_and_evaluate_scores_it(tmp_path):
    """``prepare_data.py --corpus synthetic_long`` writes readable files; ``evaluate.py
    --labels`` scores a translation whose chunk-start elisions are all wrong."""
    out = tmp_path / "long"
    proc = run_launch(
        "prepare_data.py", "--corpus=synthetic_long", f"--out={out}",
        "--synthetic_long_train_documents=3", "--synthetic_long_dev_documents=1",
        "--synthetic_long_test_documents=4", timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    names = {f"{s}{ext}" for s in ("train", "dev", "test") for ext in (".tsv", ".labels.jsonl")}
    assert set(os.listdir(out)) == names | {"config.json"}
    meta = json.loads((out / "config.json").read_text())
    docs = readers.read_tsv(out / "test.tsv")
    labels = read_labels(out / "test.labels.jsonl")
    assert (docs, labels) == generate(LongSyntheticConfig(num_documents=4), "test")
    stats = meta["splits"]["test"]
    assert (stats["documents"], stats["labels"]) == (4, len(labels))
    assert stats["segments"] == sum(len(d) for d in docs)
    assert sum(stats["register_labels_by_distance_bucket"].values()) == sum(
        lb.phenomenon == "register" for lb in labels
    )

    hyp = {d.doc_id: [s.split() for s in d.tgt] for d in docs}
    wrong = [lb for lb in labels if lb.phenomenon == "elided_verb" and lb.segment % 20 == 0]
    for lb in wrong:
        hyp[lb.doc_id][lb.segment][lb.token_index] = lb.alternatives[0]
    hyp_path = tmp_path / "hyp.tsv"
    rows = [f"{d}\t{' '.join(s)}" for d, sents in hyp.items() for s in sents]
    hyp_path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    proc = run_launch(
        "evaluate.py", f"--hyp={hyp_path}", f"--ref={out / 'test.tsv'}",
        f"--labels={out / 'test.labels.jsonl'}", "--json", timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)["context_labels"]
    n_elided = sum(lb.phenomenon == "elided_verb" for lb in labels)
    assert got["elided_verb_by_position"]["chunk_start"]["correct"] == 0
    assert got["elided_verb_by_position"]["chunk_start"]["total"] == len(wrong) > 0
    assert got["elided_verb_by_position"]["elsewhere"]["correct"] == n_elided - len(wrong)
    assert got["by_phenomenon"]["register"]["accuracy"] == 1.0
    assert got["correct"] == len(labels) - len(wrong)
    assert got["by_phenomenon_distance"]["register"]["1"]["total"] == sum(
        lb.phenomenon == "register" and lb.distance == 1 for lb in labels
    )


def test_long_context_rows_pass_their_own_overrides(tmp_path, monkeypatch):
    """``experiments/long_context.py``'s ``recurrent_bptt2`` trains recurrent FINAL with
    ``model.bptt_chunks=2``; the plain ``recurrent`` row passes no such override."""
    import sys

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from experiments import long_context

    commands = {}

    def fake_run(argv, log):  # the command, and the workdir train() marks done
        workdir = next(a for a in argv if a.startswith("--workdir=")).split("=", 1)[1]
        os.makedirs(workdir)
        commands[os.path.basename(workdir)] = argv

    monkeypatch.setattr(long_context, "run", fake_run)
    monkeypatch.setattr(long_context, "tokenizer", lambda out, data: "spm.model")
    for row in ("recurrent", "recurrent_bptt2"):
        long_context.train(str(tmp_path), "DATA", row, 8)
    plain, bptt2 = commands["recurrent"], commands["recurrent_bptt2"]
    assert "--config=final.py:recurrent" in plain and "--config=final.py:recurrent" in bptt2
    assert "--config.model.bptt_chunks=2" in bptt2
    assert not any("bptt_chunks" in arg for arg in plain)
