"""Evaluation: s-BLEU / d-BLEU / chrF against sacreBLEU and by hand; readers; the CLI."""

import json
import math

import pytest
import sacrebleu
from conftest import run_launch

from docnmt_jax.data.documents import CorpusFormatError
from docnmt_jax.evaluation import metrics

HYP_DOCS = [
    ["The cat sat on the mat today.", "It was quite happy, wasn't it?", ""],
    ["Prices rose by 3.5% in May.", "Analysts had expected a smaller rise of 2 percent."],
]
REF_DOCS = [
    ["The cat sat on a mat today.", "It was very happy, wasn't it?", "Then it slept."],
    ["Prices rose 3.5% in May.", "Analysts expected a smaller increase of 2 percent."],
]


def _write(path, text):
    path.write_text(text, encoding="utf-8")
    return str(path)


def _flat(docs):
    return [s for d in docs for s in d]


# ---------------------------------------------------------------------------------------------
# Scores.


def test_scores_match_sacrebleu():
    r = metrics.score_documents(HYP_DOCS, REF_DOCS)
    hyps, refs = _flat(HYP_DOCS), _flat(REF_DOCS)
    s_bleu = sacrebleu.corpus_bleu(hyps, [refs])
    d_bleu = sacrebleu.corpus_bleu(
        [" ".join(d) for d in HYP_DOCS], [[" ".join(d) for d in REF_DOCS]]
    )
    chrf = sacrebleu.corpus_chrf(hyps, [refs])
    assert r["s_bleu"]["score"] == pytest.approx(s_bleu.score, abs=1e-9)
    assert r["s_bleu"]["precisions"] == pytest.approx(s_bleu.precisions)
    assert (r["s_bleu"]["sys_len"], r["s_bleu"]["ref_len"]) == (s_bleu.sys_len, s_bleu.ref_len)
    assert r["s_bleu"]["bp"] == pytest.approx(s_bleu.bp)
    assert r["d_bleu"]["score"] == pytest.approx(d_bleu.score, abs=1e-9)
    assert r["chrf"]["score"] == pytest.approx(chrf.score, abs=1e-9)
    assert 0 < r["s_bleu"]["score"] < 100
    assert r["s_bleu"]["signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp")
    assert r["chrf"]["signature"].startswith("nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no")
    assert (r["documents"], r["sentences"], r["empty_hypotheses"]) == (2, 5, 1)


def test_lowercase():
    hyp, ref = [["the cat sat on the mat"]], [["The Cat sat on the Mat"]]
    cased = metrics.score_documents(hyp, ref)
    lower = metrics.score_documents(hyp, ref, lowercase=True)
    assert cased["s_bleu"]["score"] < 100
    assert lower["s_bleu"]["score"] == pytest.approx(100)
    assert lower["chrf"]["score"] == pytest.approx(100)
    assert "case:lc" in lower["s_bleu"]["signature"]
    assert lower["chrf"]["score"] == pytest.approx(
        sacrebleu.corpus_chrf([s.lower() for s in hyp[0]], [[s.lower() for s in ref[0]]]).score
    )


def test_perfect_hypothesis_scores_100():
    r = metrics.score_documents(REF_DOCS, REF_DOCS)
    for key in ("s_bleu", "d_bleu", "chrf"):
        assert r[key]["score"] == pytest.approx(100.0), key
    assert r["empty_hypotheses"] == 0


def test_bleu_by_hand():
    # Simple lower-case words: 13a tokenisation leaves them as they are.
    hyp = [["the cat sat on the mat today", "a dog"]]
    ref = [["the cat sat on a mat today", "a dog barks loudly"]]
    # Sentence 1 (7 vs 7 tokens): 1-grams: the(clipped to 1) cat sat on mat today = 6/7;
    # 2-grams: the-cat cat-sat sat-on mat-today = 4/6; 3-grams: the-cat-sat cat-sat-on = 2/5;
    # 4-grams: the-cat-sat-on = 1/4. Sentence 2 (2 vs 4 tokens): 2/2, 1/1, 0/0, 0/0.
    counts, totals = [8, 5, 2, 1], [9, 7, 5, 4]
    sys_len, ref_len = 9, 11
    log_prec = sum(math.log(c / t) for c, t in zip(counts, totals, strict=True)) / 4
    bp = math.exp(1 - ref_len / sys_len)
    expected = 100 * bp * math.exp(log_prec)
    r = metrics.score_documents(hyp, ref)["s_bleu"]
    assert r["counts"] == counts and r["totals"] == totals
    assert (r["sys_len"], r["ref_len"]) == (sys_len, ref_len)
    assert r["bp"] == pytest.approx(bp)
    assert r["score"] == pytest.approx(expected, rel=1e-9)


def test_d_bleu_differs_from_s_bleu_when_boundaries_move():
    # Same words, sentence boundary moved: every n-gram matches across the joined document.
    hyp = [["the old man and his dog walked", "slowly along the river bank at night"]]
    ref = [["the old man and his dog walked slowly", "along the river bank at night"]]
    r = metrics.score_documents(hyp, ref)
    assert r["d_bleu"]["score"] == pytest.approx(100.0)
    assert r["s_bleu"]["score"] < 95
    assert r["s_bleu"]["score"] == pytest.approx(
        sacrebleu.corpus_bleu(hyp[0], [ref[0]]).score, abs=1e-9
    )


def test_score_documents_rejects_misaligned_input():
    with pytest.raises(ValueError, match="document 1: 1 hypothesis sentences but 2"):
        metrics.score_documents([["a"], ["b"]], [["a"], ["b", "c"]])
    with pytest.raises(ValueError, match="1 hypothesis documents but 2"):
        metrics.score_documents([["a"]], [["a"], ["b"]])


# ---------------------------------------------------------------------------------------------
# Files.


def _hyp_tsv(tmp_path, docs=HYP_DOCS, ids=("d1", "d2"), header=True, name="hyp.tsv"):
    rows = ["doc_id\thyp"] if header else []
    rows += [f"{i}\t{s}" for i, d in zip(ids, docs, strict=True) for s in d]
    return _write(tmp_path / name, "\n".join(rows) + "\n")


def _ref_tsv(tmp_path, docs=REF_DOCS, ids=("d1", "d2"), name="ref.tsv"):
    rows = ["doc_id\tsrc\ttgt"]
    rows += [f"{i}\tsrc {k}\t{s}" for i, d in zip(ids, docs, strict=True) for k, s in enumerate(d)]
    return _write(tmp_path / name, "\n".join(rows) + "\n")


def _plain(tmp_path, docs, name):
    return _write(tmp_path / name, "\n\n".join("\n".join(d) for d in docs) + "\n")


def test_evaluate_files_formats_agree(tmp_path):
    expected = metrics.score_documents(HYP_DOCS, REF_DOCS)
    hyp = _hyp_tsv(tmp_path)
    ref3 = _ref_tsv(tmp_path)
    ref2 = _write(
        tmp_path / "ref2.tsv",
        "".join(f"{i}\t{s}\n" for i, d in zip(("d1", "d2"), REF_DOCS, strict=True) for s in d),
    )
    ref_txt = _plain(tmp_path, REF_DOCS, "ref.txt")
    for ref in (ref3, ref2, ref_txt):
        got = metrics.evaluate_files(hyp, ref)
        for key in ("s_bleu", "d_bleu", "chrf"):
            assert got[key]["score"] == pytest.approx(expected[key]["score"]), (ref, key)
        assert got["empty_hypotheses"] == 1
    # Plain-text hypotheses cannot hold an empty sentence: drop it on both sides.
    hyp_docs = [[s for s in d if s] for d in HYP_DOCS]
    ref_docs = [REF_DOCS[0][:2], REF_DOCS[1]]
    got = metrics.evaluate_files(
        _plain(tmp_path, hyp_docs, "hyp.txt"), _ref_tsv(tmp_path, ref_docs, name="r.tsv")
    )
    assert got["s_bleu"]["score"] == pytest.approx(
        metrics.score_documents(hyp_docs, ref_docs)["s_bleu"]["score"]
    )
    # Headerless hypotheses in another document order: matched by id, in the reference's order.
    got = metrics.evaluate_files(
        _hyp_tsv(tmp_path, HYP_DOCS[::-1], ("d2", "d1"), header=False, name="h2.tsv"), ref3
    )
    assert got["s_bleu"]["score"] == pytest.approx(expected["s_bleu"]["score"])


def test_read_hypotheses(tmp_path):
    docs = metrics.read_hypotheses(_hyp_tsv(tmp_path))
    assert [(d.doc_id, d.sentences, d.line) for d in docs] == [
        ("d1", tuple(HYP_DOCS[0]), 2),
        ("d2", tuple(HYP_DOCS[1]), 5),
    ]
    docs = metrics.read_hypotheses(_write(tmp_path / "h.txt", "\na\nb\n\n\nc\n\n"))
    assert [(d.doc_id, d.sentences, d.line, d.positional) for d in docs] == [
        ("doc 1", ("a", "b"), 2, True),
        ("doc 2", ("c",), 6, True),
    ]


def test_sentence_count_mismatch_names_document_counts_and_lines(tmp_path):
    hyp_docs = [HYP_DOCS[0], HYP_DOCS[1][:1]]
    hyp = _hyp_tsv(tmp_path, hyp_docs)
    ref = _ref_tsv(tmp_path)
    with pytest.raises(CorpusFormatError) as e:
        metrics.evaluate_files(hyp, ref)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith(f"{hyp}:5: document 'd2' has 1 hypothesis sentences")
    assert f"2 reference sentences in {ref} starting at line 5" in msg
    # Plain text on both sides: matched by position, named "doc N".
    with pytest.raises(CorpusFormatError, match=r"h\.txt:5: document 'doc 2' has 1 hyp.*line 5$"):
        metrics.evaluate_files(
            _plain(tmp_path, [["a", "b", "c"], ["d"]], "h.txt"),
            _plain(tmp_path, [["a", "b", "c"], ["d", "e"]], "r.txt"),
        )


def test_missing_and_extra_documents_are_named(tmp_path):
    hyp = _hyp_tsv(tmp_path, ids=("d1", "zz"))
    ref = _ref_tsv(tmp_path)
    with pytest.raises(CorpusFormatError) as e:
        metrics.evaluate_files(hyp, ref)
    msg = str(e.value)
    assert msg.startswith(f"{hyp}: document ids differ from {ref}")
    assert f"1 reference documents missing: 'd2' ({ref}:5)" in msg
    assert f"1 documents not in the reference: 'zz' ({hyp}:5)" in msg
    with pytest.raises(CorpusFormatError, match=r"1 hypothesis documents but 2 .*'doc 2'"):
        metrics.evaluate_files(
            _plain(tmp_path, [["a"]], "h.txt"), _plain(tmp_path, [["a"], ["b"]], "r.txt")
        )


@pytest.mark.parametrize(
    "text, line, reason",
    [
        (
            "doc_id\thyp\nd1\ta\nd1\tb\tc\n",
            3,
            "expected 2 (as on line 2) tab-separated columns, found 3",
        ),
        ("d1\ta\td\n", 1, "expected 2 (doc_id, hyp) tab-separated columns, found 3"),
        ("d1\ta\nd1\n", 2, "expected 2 (as on line 1) tab-separated columns, found 1"),
        ("d1\ta\n\nd1\tb\n", 2, "blank line"),
        ("d1\ta\nd2\tb\nd1\tc\n", 3, "rows of document 'd1' are not contiguous"),
        ("\ta\n", 1, "empty doc_id"),
    ],
)
def test_malformed_hypothesis_tsv(tmp_path, text, line, reason):
    path = _write(tmp_path / "bad.tsv", text)
    with pytest.raises(CorpusFormatError) as e:
        metrics.read_hypotheses(path)
    assert str(e.value).startswith(f"{path}:{line}: ")
    assert reason in str(e.value)


def test_empty_reference_sentence_is_an_error(tmp_path):
    path = _write(tmp_path / "ref.tsv", "d1\tsrc\tok\nd1\tsrc\t \n")
    with pytest.raises(CorpusFormatError, match=r"ref\.tsv:2: target sentence is empty"):
        metrics.read_references(path)


# ---------------------------------------------------------------------------------------------
# Command line.


def _cli(*args):
    return run_launch("evaluate.py", *args)


def test_cli_text_and_json(tmp_path):
    hyp, ref = _hyp_tsv(tmp_path), _ref_tsv(tmp_path)
    expected = metrics.score_documents(HYP_DOCS, REF_DOCS)
    out = _cli("--hyp", hyp, "--ref", ref)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split()[:2] == ["s-BLEU", f"{expected['s_bleu']['score']:.2f}"]
    assert f"({expected['s_bleu']['signature']})" in lines[0]
    assert any(ln.split()[:2] == ["d-BLEU", f"{expected['d_bleu']['score']:.2f}"] for ln in lines)
    assert any(ln.split()[:2] == ["chrF", f"{expected['chrf']['score']:.2f}"] for ln in lines)
    assert "documents  2" in lines and "sentences  5  (1 empty hypotheses)" in lines

    out = _cli("--hyp", hyp, "--ref", ref, "--json", "--lowercase")
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    lower = metrics.score_documents(HYP_DOCS, REF_DOCS, lowercase=True)
    for key in ("s_bleu", "d_bleu", "chrf"):
        assert got[key]["score"] == pytest.approx(lower[key]["score"]), key
        assert "case:lc" in got[key]["signature"]
    assert got["s_bleu"]["precisions"] == pytest.approx(lower["s_bleu"]["precisions"])
    assert (got["documents"], got["sentences"], got["empty_hypotheses"]) == (2, 5, 1)


def test_cli_error_is_one_line(tmp_path):
    hyp = _hyp_tsv(tmp_path, [HYP_DOCS[0], HYP_DOCS[1][:1]])
    out = _cli("--hyp", hyp, "--ref", _ref_tsv(tmp_path))
    assert out.returncode == 2
    assert out.stdout == ""
    err = out.stderr.strip().splitlines()
    assert len(err) == 1 and f"{hyp}:5: document 'd2' has 1 hypothesis sentences" in err[0]
