"""The main job's summary (docnmt_jax.commands.demo_report): its time budget and the rule that
picks the verses shown, against answers worked out by hand."""

import pytest

from docnmt_jax.commands import demo_report


@pytest.mark.parametrize(
    "rate, minutes",
    [(1800, 30.0), (3600, 30.0), (1200, 45.0), (900, 60.0), (450, 60.0), (0, 60.0)],
)
def test_time_budget_scales_with_the_hosts_rate_and_caps_at_an_hour(rate, minutes):
    assert demo_report.time_budget(rate) == pytest.approx(minutes)


def _write(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join("\t".join(r) for r in rows) + "\n")


def test_examples_are_the_changed_verses_the_true_context_helped_most(tmp_path):
    test = tmp_path / "test.tsv"
    _write(
        test,
        [
            ("A.1", "s1", "the man went home"),
            ("A.1", "s2", "he saw his brother"),
            ("B.1", "s3", "she said to them"),
            ("B.1", "s4", "and it was so"),
        ],
    )
    sentence, document, random = (tmp_path / f"{n}.tsv" for n in ("s", "d", "r"))
    _write(sentence, [("A.1", "x"), ("A.1", "y"), ("B.1", "z"), ("B.1", "w")])
    # verse 1: unchanged (not a candidate); verse 2: true exact, random half right (big
    # gain); verse 3: true worse than random (a loss); verse 4: true exact, random one word
    # off (a smaller gain)
    _write(
        document,
        [
            ("A.1", "the man went home"),
            ("A.1", "he saw his brother"),
            ("B.1", "said"),
            ("B.1", "and it was so"),
        ],
    )
    _write(
        random,
        [
            ("A.1", "the man went home"),
            ("A.1", "she saw a sister"),
            ("B.1", "she said to them"),
            ("B.1", "and it was thus"),
        ],
    )
    hyps = {"transformer": str(sentence), "final": str(document), "random": str(random)}
    examples, counts = demo_report.context_examples(str(test), hyps, "transformer", "final", 2)
    assert counts == {"verses": 4, "changed": 3, "better": 2, "worse": 1}
    assert [(e.doc_id, e.index) for e in examples] == [("A.1", 2), ("B.1", 2)]  # 1-based
    assert examples[0].bleu_true == pytest.approx(100.0)
    assert examples[0].source == "s2" and examples[0].sentence_model == "y"
    assert examples[0].random_context == "she saw a sister"
    assert examples[0].gain > examples[1].gain > 0
