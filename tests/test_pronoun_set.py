"""The Spanish→English pronoun contrastive sets (docs/evaluation.md): the word rules, and the
generator
on a hand-written fixture whose instances are known by hand (``tests/data/pronouns``)."""

import json
import os

import pytest
from conftest import ROOT

from docnmt_jax.data import pronoun_rules as rules
from docnmt_jax.data import pronoun_set as ps
from docnmt_jax.data.contrastive_sets import ContrastiveFormatError
from docnmt_jax.data.readers import read_tsv

FIXTURE = os.path.join(ROOT, "tests", "data", "pronouns", "fixture.tsv")

# (doc, verse, gender, swapped reference, distance, current cue, bucket, context only), by hand:
# Ruth.1 0 has "ella" (overt: skipped); 2 has the enclitic "tomóla" (overt: skipped); 3 has
# "díjole" (le: not gendered, kept); 4 is the capitalised swap (and "la cebada" is an article);
# John.4 1 has "él" (skipped), 2 "lo vió" (masculine skipped, its "she" kept).
EXPECTED = [
    ("Ruth.1", 1, "feminine", "Then he arose with his daughters-in-law.", 1, (), "1", True),
    ("Ruth.1", 3, "feminine", "Boaz said to him, “Go in peace.”", 1, (), "1", True),
    ("Ruth.1", 4, "feminine", "His hands were full of the barley.", 1, (), "1", True),
    ("John.4", 0, "masculine", "Jesus said to her, “Give me a drink.”", None,
     ("jesus", "jesús"), "none", False),
    ("John.4", 2, "feminine", "And he saw him.", None, (), "none", False),
    ("John.4", 3, "masculine", "She answered, “Yes.”", 1, (), "1", True),
]  # fmt: skip


def _fixture_instances():
    docs = read_tsv(FIXTURE)
    evidence = rules.clitic_evidence(s for d in docs for s in d.src)
    return docs, ps.gender_instances(docs, evidence, chunk=20)


def test_generator_on_the_fixture_gives_the_known_instances():
    docs, (found, skipped) = _fixture_instances()
    got = [
        (i.doc_id, i.sentence, i.value, i.swapped, i.distance, i.current_cue, i.bucket,
         i.context_only)
        for i in found
    ]  # fmt: skip
    assert got == EXPECTED
    assert dict(skipped) == {
        "overt feminine pronoun in the source": 2,
        "overt masculine pronoun in the source": 2,
    }
    first = found[0]
    assert first.reference == docs[0].tgt[1]
    assert first.context_src == docs[0].src[:1] and first.context_tgt == docs[0].tgt[:1]


def test_balance_keeps_the_smaller_class_and_corpus_order():
    _, (found, _) = _fixture_instances()
    chosen = ps.balance(found, seed=0)
    assert [i.value for i in chosen].count("feminine") == 2
    assert [(i.doc_id, i.sentence) for i in chosen if i.value == "masculine"] == [
        ("John.4", 0),
        ("John.4", 3),
    ]
    order = [found.index(i) for i in chosen]
    assert order == sorted(order)
    assert ps.balance(found, seed=0) == chosen  # seeded


def test_build_write_and_read_back(tmp_path):
    stats = ps.build_sets(FIXTURE, str(tmp_path / "fixture"), chunk=20, seed=0)
    assert stats["pronouns"]["instances"] == 4 and stats["pronouns"]["before_balancing"] == 6
    assert stats["possessors"]["written"] is None  # fewer than 50
    assert not (tmp_path / "fixture.possessors.jsonl").exists()
    instances, records = ps.read_pronoun_set(str(tmp_path / "fixture.pronouns.jsonl"))
    assert len(instances) == 4 and [r["doc_id"] for r in records].count("John.4") >= 2
    for inst, record in zip(instances, records, strict=True):
        assert inst.correct == 0 and inst.candidates[0] == record["candidates"][0]
        assert inst.attributes["gender"] == record["gender"]
        assert inst.attributes["context_only"] == ("yes" if record["context_only"] else "no")
        assert len(inst.context_src) == record["sentence"]
        assert inst.context_tgt[0] == inst.context_tgt[1] == tuple(record["context_tgt"])
    assert "fixture.pronouns.jsonl:1" in instances[0].where


@pytest.mark.parametrize(
    "text, gender, expected",
    [
        ("Jesus told her that he would come.", "feminine", "Jesus told him that he would come."),
        ("She loved her husband.", "feminine", "He loved his husband."),
        ("Let her glean.", "feminine", "Let him glean."),
        ("HE SAID to himself", "masculine", "SHE SAID to herself"),
        ("The house is his. His son", "masculine", "The house is hers. Her son"),
        ("The field was hers.", "feminine", "The field was his."),
    ],
)
def test_swap_gender(text, gender, expected):
    assert rules.swap_gender(text, gender)[0] == expected


def test_spanish_overt_pronouns():
    assert rules.enclitic_gender("tomóla") == "feminine"
    assert rules.enclitic_gender("hízolo") == "masculine"
    assert rules.enclitic_gender("tomarla") == "feminine"
    assert rules.enclitic_gender("diciéndolo") == "masculine"
    for word in ("díjole", "discípulo", "título", "escuela", "parábola", "sólo"):
        assert rules.enclitic_gender(word) is None, word
    assert rules.overt_pronouns("la tierra y la ley") == []
    assert rules.overt_pronouns("y la tomó") == [("la tomó", "feminine")]
    assert rules.overt_pronouns("lo que dijo Ella") == [("ella", "feminine")]
    evidence = rules.clitic_evidence(["se ama", "le ama"])
    assert rules.overt_pronouns("y la ama", evidence) == [("la ama", "feminine")]
    assert rules.overt_pronouns("y la ama", rules.clitic_evidence(["su ama"])) == []


def test_possessor_number_swap():
    assert rules.swap_number("She took her bag and their coats.", "singular")[0] == (
        "She took their bag and their coats."
    )
    assert rules.swap_number("They lifted up their voices.", "plural")[0] == (
        "They lifted up his voices."
    )


def test_malformed_set_is_one_line(tmp_path):
    good = json.dumps(ps.instance_json(_fixture_instances()[1][0][0]), ensure_ascii=False)
    path = tmp_path / "bad.jsonl"
    path.write_text(good + "\n{not json\n", encoding="utf-8")
    with pytest.raises(ContrastiveFormatError, match=r"bad.jsonl:2: invalid JSON"):
        ps.read_pronoun_set(str(path))
    path.write_text(good + '\n{"src": "x"}\n', encoding="utf-8")
    with pytest.raises(ContrastiveFormatError, match=r"bad.jsonl:2: missing field"):
        ps.read_pronoun_set(str(path))
