"""Pronoun overlap: hand-computed answers, tokenisation, a brute-force reference, the CLI."""

import json
import random
import re
from collections import Counter

import pytest
from conftest import run_launch

from docnmt_jax.data.documents import CorpusFormatError
from docnmt_jax.evaluation import metrics
from docnmt_jax.evaluation.pronouns import (
    PRONOUNS,
    pronoun_scores,
    read_pronoun_list,
    tokenize,
)


def _counts(s):
    return s["matched"], s["hypothesis"], s["reference"]


def _write(path, text):
    path.write_text(text, encoding="utf-8")
    return str(path)


# ---------------------------------------------------------------------------------------------
# Known answers.


def test_clipping():
    r = pronoun_scores(["it it it"], ["it"])
    assert _counts(r) == (1, 3, 1)
    assert r["precision"] == pytest.approx(1 / 3)
    assert r["recall"] == 1.0
    assert r["f1"] == pytest.approx(2 * (1 / 3) / (1 / 3 + 1))
    assert r["sentences"] == 1 and r["list_size"] == len(PRONOUNS["en"])


def test_clipping_is_per_sentence():
    # Corpus-level clipping would match 2 "he"; per sentence only sentence 2's "he" matches.
    r = pronoun_scores(["he and he", "he"], ["she", "he and he"])
    assert _counts(r) == (1, 3, 3)
    assert r["per_pronoun"]["he"] == {
        "matched": 1,
        "hypothesis": 3,
        "reference": 2,
        "precision": pytest.approx(1 / 3),
        "recall": 0.5,
        "f1": pytest.approx(0.4),
    }
    assert r["per_pronoun"]["she"]["precision"] == 0.0  # No "she" in the hypothesis.
    assert r["per_pronoun"]["she"]["recall"] == 0.0


def test_by_hand_with_breakdown():
    hyps = ["He gave her his book.", "They saw us, and we saw them.", "It rained."]
    refs = ["She gave him her book.", "They saw them and us.", "Then it rained on them."]
    # Sentence 1: hyp {he, her, his}, ref {she, him, her}: matched her (1).
    # Sentence 2: hyp {they, us, we, them}, ref {they, them, us}: matched 3.
    # Sentence 3: hyp {it}, ref {it, them}: matched 1.
    r = pronoun_scores(hyps, refs)
    assert _counts(r) == (5, 8, 8)
    assert r["precision"] == r["recall"] == r["f1"] == pytest.approx(5 / 8)
    per = r["per_pronoun"]
    assert list(per)[0] == "them"  # Most frequent in the reference (2) comes first.
    assert set(per) == {"he", "her", "his", "she", "him", "they", "us", "we", "them", "it"}
    assert _counts(per["them"]) == (1, 1, 2)
    assert (per["them"]["precision"], per["them"]["recall"]) == (1.0, 0.5)
    assert per["her"]["f1"] == 1.0
    assert (per["his"]["hypothesis"], per["his"]["reference"], per["his"]["f1"]) == (1, 0, 0.0)
    assert (per["she"]["hypothesis"], per["she"]["reference"], per["she"]["recall"]) == (0, 1, 0.0)
    assert sum(p["matched"] for p in per.values()) == r["matched"]


def test_case_insensitive():
    r = pronoun_scores(["IT is HERS, not Mine"], ["it is hers, not MINE"])
    assert _counts(r) == (3, 3, 3)
    assert r["f1"] == 1.0


def test_tokenisation():
    assert tokenize("It's his—not hers!") == ["it", "s", "his", "not", "hers"]
    assert tokenize("I’m “ours” (them) 3us_we") == ["i", "m", "ours", "them", "us", "we"]
    assert tokenize("God's THEIR,yours.") == ["god", "s", "their", "yours"]
    assert tokenize("Él dijo: ¡ella!") == ["él", "dijo", "ella"]
    assert tokenize("him-self½ ²it") == ["him", "self", "it"]
    # Apostrophes split words: "it's" counts "it"; "'s" is not a pronoun; "hist" is not "his".
    r = pronoun_scores(["It's mine; it’s yours."], ["it is history, I'm sure"])
    assert _counts(r["per_pronoun"]["it"]) == (1, 2, 1)
    assert r["per_pronoun"]["i"]["reference"] == 1 and "his" not in r["per_pronoun"]
    assert _counts(r) == (1, 4, 2)


def test_english_list():
    modern = (
        "i me my mine myself you your yours yourself yourselves he him his himself she her "
        "hers herself it its itself we us our ours ourselves they them their theirs themselves"
    ).split()
    assert PRONOUNS["en"] == frozenset(modern + "thou thee thy thine thyself ye".split())
    assert not {"that", "who", "one", "s", "this"} & PRONOUNS["en"]


def test_empty_counts_give_zero_not_division_error():
    r = pronoun_scores(["the cat", ""], ["a dog", "the end"])
    assert _counts(r) == (0, 0, 0)
    assert (r["precision"], r["recall"], r["f1"]) == (0.0, 0.0, 0.0)
    assert r["per_pronoun"] == {}
    r = pronoun_scores(["he"], ["the end"])  # Hypothesis pronouns only: recall 0 by definition.
    assert (r["precision"], r["recall"], r["hypothesis"], r["reference"]) == (0.0, 0.0, 1, 0)
    r = pronoun_scores([], [])
    assert (r["sentences"], r["f1"]) == (0, 0.0)


def test_mismatched_sentence_counts():
    with pytest.raises(ValueError, match="2 hypothesis sentences but 1 reference"):
        pronoun_scores(["it", "he"], ["it"])


def test_custom_list():
    hyps, refs = ["Él dijo que ella vino.", "Lo vi."], ["Ella dijo que él vino.", "La vi."]
    r = pronoun_scores(hyps, refs, pronouns=["él", "Ella", "lo", "la"])
    assert r["list_size"] == 4
    assert _counts(r) == (2, 3, 3)
    assert r["per_pronoun"]["lo"]["recall"] == 0.0 and r["per_pronoun"]["la"]["precision"] == 0.0
    # A custom English list ignores the built-in one.
    r = pronoun_scores(["he saw it"], ["she saw it"], pronouns={"it"})
    assert (r["matched"], r["hypothesis"], r["reference"], r["f1"]) == (1, 1, 1, 1.0)
    with pytest.raises(ValueError, match="no pronoun list for 'xx'"):
        pronoun_scores(["a"], ["a"], pronouns="xx")
    with pytest.raises(ValueError, match="single words of letters"):
        pronoun_scores(["a"], ["a"], pronouns=["it's"])
    with pytest.raises(ValueError, match="empty pronoun list"):
        pronoun_scores(["a"], ["a"], pronouns=[])


def test_read_pronoun_list(tmp_path):
    path = _write(tmp_path / "p.txt", "# Spanish\nÉl\n\n ella \nlo\nlo\n")
    assert read_pronoun_list(path) == frozenset({"él", "ella", "lo"})
    bad = _write(tmp_path / "bad.txt", "él\nse lo\n")
    with pytest.raises(CorpusFormatError, match=f"^{bad}:2: pronoun list: 'se lo' is not one"):
        read_pronoun_list(bad)
    empty = _write(tmp_path / "empty.txt", "# nothing\n\n")
    with pytest.raises(CorpusFormatError, match="no words in the file"):
        read_pronoun_list(empty)
    with pytest.raises(FileNotFoundError, match="pronoun list not found"):
        read_pronoun_list(tmp_path / "missing.txt")


# ---------------------------------------------------------------------------------------------
# Brute force.


def _brute_force(hyps, refs, words):
    """Independent: every word compared against the list by hand, Counter & per sentence."""
    total = {"m": Counter(), "h": Counter(), "r": Counter()}
    for h, r in zip(hyps, refs, strict=True):
        sides = []
        for text in (h, r):
            tokens = re.findall(r"[^\W\d_]+", text.lower())  # Letters, written differently.
            sides.append(Counter(w for w in tokens if w in words))
        total["h"] += sides[0]
        total["r"] += sides[1]
        total["m"] += sides[0] & sides[1]
    return total


def test_matches_brute_force_on_random_sentences():
    rng = random.Random(0)
    en = sorted(PRONOUNS["en"])
    vocab = [*en, "It", "HIS", "history", "theirs'", "cat", "the", "3", "it's", "—", ",", "Us."]
    for trial in range(30):
        n = rng.randint(0, 12)
        make = lambda: " ".join(rng.choices(vocab, k=rng.randint(0, 10)))  # noqa: E731
        hyps, refs = [make() for _ in range(n)], [make() for _ in range(n)]
        words = PRONOUNS["en"] if trial % 2 else frozenset(rng.sample(en, 5))
        got = pronoun_scores(hyps, refs, pronouns=words)
        want = _brute_force(hyps, refs, words)
        m, h, r = (sum(want[k].values()) for k in "mhr")
        assert (got["matched"], got["hypothesis"], got["reference"]) == (m, h, r)
        assert got["precision"] == pytest.approx(m / h if h else 0.0)
        assert got["recall"] == pytest.approx(m / r if r else 0.0)
        assert set(got["per_pronoun"]) == set(want["h"]) | set(want["r"])
        for w, s in got["per_pronoun"].items():
            assert (s["matched"], s["hypothesis"], s["reference"]) == (
                want["m"][w],
                want["h"][w],
                want["r"][w],
            )


# ---------------------------------------------------------------------------------------------
# Files and the command line.

HYP_ROWS = [("d1", "He gave her his book."), ("d1", "It rained."), ("d2", "They saw us.")]
REF_ROWS = [
    ("d1", "She gave him her book."),
    ("d1", "Then it rained on them."),
    ("d2", "They saw them."),
]


def _files(tmp_path):
    hyp = _write(
        tmp_path / "hyp.tsv", "doc_id\thyp\n" + "".join(f"{d}\t{s}\n" for d, s in HYP_ROWS)
    )
    ref = _write(
        tmp_path / "ref.tsv",
        "doc_id\tsrc\ttgt\n" + "".join(f"{d}\tsrc\t{s}\n" for d, s in REF_ROWS),
    )
    return hyp, ref


def _expected(pronouns="en"):
    return pronoun_scores([s for _, s in HYP_ROWS], [s for _, s in REF_ROWS], pronouns)


def test_evaluate_files_pronouns_is_optional(tmp_path):
    hyp, ref = _files(tmp_path)
    assert "pronouns" not in metrics.evaluate_files(hyp, ref)
    assert "pronouns" not in metrics.format_report(metrics.evaluate_files(hyp, ref))
    got = metrics.evaluate_files(hyp, ref, pronouns="en")
    assert got["pronouns"] == _expected()
    # Sentence 1: her (hyp he her his, ref she him her); 2: it (ref it them); 3: they
    # (hyp they us, ref they them): 3 matched of 6 hypothesis and 7 reference pronouns.
    p = got["pronouns"]
    assert (p["matched"], p["hypothesis"], p["reference"]) == (3, 6, 7)
    assert p["f1"] == pytest.approx(6 / 13)  # 2PR / (P + R) = 2m / (h + r).
    report = metrics.format_report(got).splitlines()
    total = [ln for ln in report if ln.startswith("pronouns ")]
    assert total == [
        "pronouns   P 0.5000  R 0.4286  F1 0.4615  (clipped overlap, not APT; matched/hyp/ref "
        f"3/6/7; {len(PRONOUNS['en'])} words)"
    ]
    assert report.index(total[0]) == len(report) - len(p["per_pronoun"]) - 1


def _cli(*args):
    return run_launch("evaluate.py", *args)


def test_cli_pronouns_text_json_and_custom_list(tmp_path):
    hyp, ref = _files(tmp_path)
    out = _cli("--hyp", hyp, "--ref", ref, "--pronouns")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("s-BLEU")
    total = [ln for ln in lines if ln.startswith("pronouns ")]
    assert len(total) == 1
    assert total[0].split()[:7] == ["pronouns", "P", "0.5000", "R", "0.4286", "F1", "0.4615"]
    assert f"matched/hyp/ref 3/6/7; list en, {len(PRONOUNS['en'])} words)" in total[0]
    her = ["her", "P", "1.0000", "R", "1.0000", "F1", "1.0000", "(1/1/1)"]
    assert any(ln.split() == her for ln in lines)

    out = _cli("--hyp", hyp, "--ref", ref, "--json")
    assert out.returncode == 0, out.stderr
    assert "pronouns" not in json.loads(out.stdout)

    out = _cli("--hyp", hyp, "--ref", ref, "--json", "--pronouns", "--lowercase")
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)["pronouns"]
    assert got == {**_expected(), "list": "en"}

    plist = _write(tmp_path / "p.txt", "it\nthey\nthem\n")
    out = _cli("--hyp", hyp, "--ref", ref, "--json", "--pronoun_list", plist)  # Implies it.
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)["pronouns"]
    assert got == {**_expected({"it", "they", "them"}), "list": plist}
    assert (got["matched"], got["hypothesis"], got["reference"], got["list_size"]) == (2, 2, 4, 3)


@pytest.mark.parametrize(
    "name,text,message",
    [
        ("missing.txt", None, "{path}: pronoun list not found"),
        ("bad.txt", "it\nit's\n", '{path}:2: pronoun list: "it\'s" is not one word'),
        ("empty.txt", "\n", "{path}: pronoun list: no words in the file"),
    ],
)
def test_cli_bad_pronoun_list_is_one_line(tmp_path, name, text, message):
    hyp, ref = _files(tmp_path)
    path = str(tmp_path / name) if text is None else _write(tmp_path / name, text)
    out = _cli("--hyp", hyp, "--ref", ref, "--pronouns", "--pronoun_list", path)
    assert out.returncode == 2
    assert out.stdout == ""
    err = out.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("evaluate.py: error: "), out.stderr
    assert message.format(path=path) in err[0]
