"""Published contrastive test sets (Voita et al. 2019, ContraPro, Bawden et al. 2018): the
readers on hand-written fixtures, forced-choice scoring with a toy model whose answers are
known by hand, malformed files, a real tiny document model, and ``evaluate.py --contrastive``.

The toy model scores a sentence by the number of distinct words it shares with the target
sentences before it in its batch row (its target context): it prefers the candidate that
repeats a word of its context, and ties when no candidate does. The fixtures are written so
that every instance's outcome under that rule is known (comments give the deciding words).
"""

import dataclasses
import json
import os
import re
import shutil

import jax
import numpy as np
import pytest
from conftest import ROOT, run_launch, tiny_final_config

from docnmt_jax.data import contrastive_sets as cs
from docnmt_jax.data.contrastive_sets import ContrastiveFormatError
from docnmt_jax.evaluation import contrastive
from docnmt_jax.models.base import BatchLayout

DATA = os.path.join(ROOT, "tests", "data", "contrastive")
VOITA = os.path.join(DATA, "voita_deixis.json")
VOITA_LINES = os.path.join(DATA, "voita_lines.jsonl")
CONTRAPRO = os.path.join(DATA, "contrapro.json")
BAWDEN = os.path.join(DATA, "bawden")

# (format, path, expected toy result: correct, total, ties, breakdowns {value: (correct, total)})
EXPECTED = {
    # 0: "ты" in context -> right; 1: no candidate word in context -> tie; 2: "Пол" -> right;
    # 3: "ты" in context but the plural "вы" is right -> wrong.
    "voita": (
        "voita",
        VOITA,
        (2, 4, 1, {"by_ctx_dist": {"1": (1, 2), "2": (0, 1), "3": (1, 1)}}),
    ),
    # 0: "это сумка" beats "это" -> right; 1: no context -> tie.
    "voita_lines": ("voita", VOITA_LINES, (1, 2, 1, {"by_ctx_dist": {"1": (1, 1)}})),
    # A sie (context "Sie war") right; B er no context: tie; C es, context "Er hat": wrong;
    # D sie ("Sie hat") right; E er ("Er schläft") right.
    "contrapro": (
        "contrapro",
        CONTRAPRO,
        (
            3,
            5,
            1,
            {
                "by_pronoun": {"er": (1, 2), "es": (0, 1), "sie": (2, 2)},
                "by_ante_distance": {
                    "0": (0, 1),
                    "1": (1, 1),
                    "2": (0, 1),
                    "3": (1, 1),
                    ">3": (1, 1),
                },
            },
        ),
    ),
    # anaphora: pairs 1-2 repeat the context's pronoun (right), 3-4 share only "sont" (ties);
    # lexical choice: rivière (right), je/je (tie), taupe (right), grain de beauté (right).
    "bawden": (
        "bawden",
        BAWDEN,
        (5, 8, 3, {"by_set": {"anaphora": (2, 4), "lexical_choice": (3, 4)}}),
    ),
}

EOS = 1
WORD = re.compile(r"[^\W\d_][\w'’-]*")


class WordTokenizer:
    """Lower-cased words (punctuation dropped) to ids from 2 up, assigned on first sight."""

    eos_id = EOS

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def encode(self, text: str) -> list[int]:
        return [self.ids.setdefault(w, len(self.ids) + 2) for w in WORD.findall(text.lower())]

    def encode_batch(self, texts):
        return [self.encode(t) for t in texts]

    def decode(self, ids) -> str:
        words = {i: w for w, i in self.ids.items()}
        return " ".join(words[int(i)] for i in ids if int(i) > EOS)


@dataclasses.dataclass
class ToyModel:
    """The :class:`~docnmt_jax.models.base.Model` attributes the scorer reads, and a ``score``
    that counts each sentence's words found in the target sentences before it in its row."""

    layout: BatchLayout = BatchLayout.CHUNKS
    context_sentences: int = 0
    whole_documents: bool = False
    batches: list = dataclasses.field(default_factory=list)

    def score(self, params, batch):
        self.batches.append(batch)
        tgt = np.asarray(batch["tgt"])
        out = np.zeros(tgt.shape[:2])
        for b in range(tgt.shape[0]):
            for k in range(tgt.shape[1]):
                words = set(tgt[b, k].tolist()) - {0, EOS}
                context = set(tgt[b, :k].ravel().tolist()) - {0, EOS}
                out[b, k] = len(words & context)
        return out


def _toy_scores(model, instances, **kwargs):
    return contrastive.instance_scores(
        model, None, WordTokenizer(), instances, scorer=model.score, **kwargs
    )


# ---------------------------------------------------------------------------------- readers


def test_read_voita():
    instances = cs.read_voita(VOITA)
    assert len(instances) == 4
    first = instances[0]
    assert first.context_src == (
        "Where have you been ?",
        "I waited for you all evening .",
        "I had a meeting .",
    )
    assert first.src == "Did you eat anything ?"
    assert first.candidates == ("Ты что-нибудь ел ?", "Вы что-нибудь ели ?")
    assert first.context_tgt[1] == (
        "Где ты был ?",
        "Я ждала тебя весь вечер .",
        "У меня было совещание .",
    )
    assert first.correct == 0 and first.attributes == {"ctx_dist": 3}
    assert [i.where for i in instances] == [f"{VOITA}:{n}" for n in (2, 6, 10, 15)]
    assert [len(i.candidates) for i in instances] == [2, 2, 3, 2]
    assert [i.correct for i in instances] == [0, 1, 0, 1]
    # JSON Lines, one instance without context (no _eos) and without ctx_dist.
    lines = cs.read_voita(VOITA_LINES)
    assert [i.where for i in lines] == [f"{VOITA_LINES}:1", f"{VOITA_LINES}:3"]
    assert lines[0].context_src == ("Is this your bag ?",)
    assert lines[1].context_src == () and lines[1].context_tgt == ((), ())
    assert lines[1].src == "Thank you ." and lines[1].attributes == {}


def test_split_eos():
    assert cs.split_eos("a b . _eos c . _eos d") == ["a b .", "c .", "d"]
    assert cs.split_eos("no context") == ["no context"]
    assert cs.split_eos("x_eos y _eos z") == ["x_eos y", "z"]  # only the whole token


def test_read_contrapro():
    instances = cs.read_contrapro(CONTRAPRO)
    assert len(instances) == 5
    a, b = instances[:2]
    assert a.context_src == ("The lamp? It was a gift.",)
    assert a.context_tgt == (("Die Lampe? Sie war ein Geschenk.",),) * 3
    assert a.src == "It is very old."
    assert a.candidates == ("Sie ist sehr alt.", "Er ist sehr alt.", "Es ist sehr alt.")
    assert a.correct == 0 and a.attributes == {"pronoun": "sie", "ante_distance": "1"}
    # Empty context lines (the document's first sentence): no context at all.
    assert b.context_src == () and b.context_tgt == ((), (), ())
    assert [i.attributes["ante_distance"] for i in instances] == ["1", "0", "2", ">3", "3"]
    assert [i.where for i in instances] == [f"{CONTRAPRO}:{n}" for n in (2, 18, 34, 50, 66)]
    assert [cs.ante_distance_bucket(d) for d in (0, 3, 4, 17, -1)] == [
        "0",
        "3",
        ">3",
        ">3",
        "unknown",
    ]


def test_contrapro_with_two_context_sentences(tmp_path):
    """``json2text_and_context.pl --context 2``: two context lines per variant."""
    _copy(DATA, CONTRAPRO_FILES, tmp_path)
    for lang, extra in (("en", "Hello."), ("de", "Hallo.")):
        path = tmp_path / f"contrapro.context.{lang}"
        lines = path.read_text(encoding="utf-8").split("\n")[:-1]
        path.write_text("".join(f"{extra}\n{line}\n" for line in lines), encoding="utf-8")
    two = cs.read_contrapro(tmp_path / "contrapro.json")
    one = cs.read_contrapro(CONTRAPRO)
    assert two[0].context_src == ("Hello.", "The lamp? It was a gift.")
    assert two[0].context_tgt[2] == ("Hallo.", "Die Lampe? Sie war ein Geschenk.")
    assert two[1].context_src == ("Hello.",)  # the empty position is dropped
    assert [i.candidates for i in two] == [i.candidates for i in one]


def test_read_bawden():
    instances = cs.read_bawden(BAWDEN)
    assert [i.attributes["set"] for i in instances] == ["anaphora"] * 4 + ["lexical_choice"] * 4
    third = instances[2]
    assert third.context_src == ("Are they new, these chairs?",)
    assert third.context_tgt == (("Ces sièges sont neufs ?",),) * 2
    assert third.candidates == (
        "Oui, ils sont arrivés ce matin.",
        "Oui, elles sont arrivées ce matin.",
    )
    assert third.correct == 0
    assert third.where == os.path.join(BAWDEN, "anaphora.current.en") + ":5"
    # One set by its prefix.
    lexical = cs.read_bawden(os.path.join(BAWDEN, "lexical_choice"))
    assert lexical == instances[4:]


# --------------------------------------------------------------------------- toy scoring


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_toy_accuracy_and_breakdowns_known_by_hand(name):
    fmt, path, (correct, total, ties, breakdowns) = EXPECTED[name]
    instances = cs.read_contrastive_set(fmt, path)
    scores = _toy_scores(ToyModel(), instances)
    assert [len(s) for s in scores] == [len(i.candidates) for i in instances]
    result = contrastive.forced_choice_accuracy(instances, scores)
    assert (result["correct"], result["total"], result["ties"]) == (correct, total, ties)
    assert result["accuracy"] == pytest.approx(correct / total)
    assert sorted(k for k in result if k.startswith("by_")) == sorted(breakdowns)
    for key, buckets in breakdowns.items():
        got = {v: (b["correct"], b["total"]) for v, b in result[key].items()}
        assert list(got) == list(buckets)  # in natural order: 0 1 2 3 >3
        assert got == buckets
    table = contrastive.format_forced_choice(result, "title")
    assert table.splitlines()[1].split()[:2] == ["overall", f"{100 * correct / total:.2f}%"]
    assert f"({correct}/{total}); {ties} lost to ties" in table


def test_tie_is_wrong_and_strictly_higher_is_right():
    inst = cs.read_voita(VOITA_LINES)[0]
    assert contrastive.forced_choice_accuracy([inst], [np.array([-1.0, -1.0])])["correct"] == 0
    assert contrastive.forced_choice_accuracy([inst], [np.array([-1.0, -1.5])])["correct"] == 1
    assert contrastive.forced_choice_accuracy([inst], [np.array([np.nan, -1.5])])["correct"] == 0


def test_sentence_model_sees_only_the_current_sentence():
    instances = cs.read_voita(VOITA)
    model = ToyModel(layout=BatchLayout.SENTENCES)
    scores = _toy_scores(model, instances)
    assert all(b["tgt"].shape[1] == 1 for b in model.batches)
    assert contrastive.forced_choice_accuracy(instances, scores)["correct"] == 0  # all ties


def test_window_model_gets_the_source_context():
    instances = cs.read_voita(VOITA)[:1]
    tok = WordTokenizer()
    model = ToyModel(layout=BatchLayout.SENTENCES, context_sentences=2)
    contrastive.instance_scores(model, None, tok, instances, scorer=model.score)
    (batch,) = model.batches
    assert batch["src"].shape[1] == 1 and batch["context_src"].shape[1] == 2
    for row in range(len(instances[0].candidates)):
        assert tok.decode(batch["src"][row, 0]) == "did you eat anything"
        assert [tok.decode(s) for s in batch["context_src"][row]] == [
            "i waited for you all evening",
            "i had a meeting",
        ]
        assert batch["context_src"][row, 1, 4] == EOS  # sentences end with EOS


def test_chunk_model_keeps_the_last_sentences_of_a_long_document():
    inst = cs.read_voita(VOITA)[0]
    tok = WordTokenizer()
    items = contrastive.instance_items([inst], tok, max_sentences=2, sentence_level=False)
    assert [it.segment for it in items] == [1, 1]
    assert [tok.decode(s) for s in items[1].src] == ["i had a meeting", "did you eat anything"]
    assert tok.decode(items[1].tgt[1]) == "вы что-нибудь ели"
    whole = contrastive.instance_items(
        [inst], tok, max_sentences=2, sentence_level=False, whole_documents=True
    )
    assert whole[0].segment == 3 and len(whole[0].src) == 4
    assert whole[0].context == () and items[0].context == ()


def test_batches_hold_whole_instances_in_few_shapes():
    instances = cs.read_contrastive_set("contrapro", CONTRAPRO) + cs.read_voita(VOITA)
    model = ToyModel()
    # 2 rows < the 3 candidates of an instance: rows grow to 3; every batch whole instances.
    scores = _toy_scores(model, instances, rows=2, bucket=8)
    assert all(b["src"].shape[0] == 3 and b["src"].shape[2] % 8 == 0 for b in model.batches)
    assert len({b["src"].shape for b in model.batches}) <= 2
    assert sum(int((b["tgt_mask"][:, :, 0] > 0).any(-1).sum()) for b in model.batches) == sum(
        len(i.candidates) for i in instances
    )
    reference = _toy_scores(ToyModel(), instances)
    for got, want in zip(scores, reference, strict=True):
        np.testing.assert_array_equal(got, want)


# ------------------------------------------------------------------------- malformed files

GOOD = '{"src": "a . _eos b .", "dst": ["x . _eos y .", "x . _eos z ."], "true_ind": 0}'


def _assert_one_line(error: Exception, prefix: str, reason: str) -> None:
    """The error is one line ``FILE:LINE: reason`` with ``prefix`` and ``reason`` in it."""
    msg = str(error)
    assert "\n" not in msg
    assert msg.startswith(prefix), msg
    assert reason in msg


@pytest.mark.parametrize(
    "name, text, line, reason",
    [
        ("syntax.json", f'[\n {GOOD},\n {{"src": "a", "dst": ["x" "y"]}}\n]', 3, "invalid JSON: "),
        (
            "missing.json",
            f'[\n {GOOD},\n {{"src": "b .",\n  "dst": ["x", "y"]}}\n]',
            3,
            "instance 1: missing field 'true_ind'",
        ),
        (
            "range.json",
            '[{"src": "a", "dst": ["x", "y"], "true_ind": 2}]',
            1,
            "instance 0: correct candidate 2 is outside the 2 candidates",
        ),
        (
            "count.json",
            f'[\n{GOOD},\n{GOOD},\n{{"src": "a _eos b", "dst": ["x _eos y", "y"], "true_ind": 0}}]',
            4,
            "instance 2: candidate 1 has 1 sentences (split on _eos) but 'src' has 2",
        ),
        (
            "one.json",
            '[{"src": "a", "dst": ["x"], "true_ind": 0}]',
            1,
            "instance 0: 1 candidate(s); a choice needs at least 2",
        ),
        (
            "type.json",
            '[{"src": "a", "dst": ["x", "y"], "true_ind": "0"}]',
            1,
            "instance 0: field 'true_ind' must be int",
        ),
        ("trailing.json", f"[{GOOD}]\n]", 2, "text after the closing ']'"),
        ("lines.jsonl", f'{GOOD}\n\n{{"src": \n', 3, "invalid JSON Lines record"),
        ("array.jsonl", f"{GOOD}\n[1, 2]\n", 2, "instance 1: expected a JSON object, got list"),
    ],
)
def test_malformed_voita(tmp_path, name, text, line, reason):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ContrastiveFormatError) as e:
        cs.read_voita(path)
    _assert_one_line(e.value, f"{path}:{line}: ", reason)


def _copy(src_dir, names, tmp_path):
    for name in names:
        shutil.copy(os.path.join(src_dir, name), tmp_path / name)


def _edit(path, line, text):
    lines = path.read_text(encoding="utf-8").split("\n")
    if text is None:
        del lines[line - 1]
    else:
        lines[line - 1] = text
    path.write_text("\n".join(lines), encoding="utf-8")


CONTRAPRO_FILES = ["contrapro.json"] + [
    f"contrapro.{k}.{lang}" for k in ("text", "context") for lang in ("en", "de")
]


@pytest.mark.parametrize(
    "file, line, text, where, reason",
    [
        ("contrapro.text.de", 15, None, ("contrapro.text.de", 14), "14 lines, but"),
        (
            "contrapro.text.en",
            5,
            "The cat barked.",
            ("contrapro.text.en", 5),
            "instance 1 (",
        ),
        (
            "contrapro.context.en",
            8,
            "She got that from his sister.",
            ("contrapro.context.en", 8),
            "source context differs from its reference's (line 7)",
        ),
        (
            "contrapro.json",
            41,
            '    "ante distance": "far",',
            ("contrapro.json", 34),
            "instance 2: field 'ante distance' must be int",
        ),
        ("contrapro.context.de", 1, None, ("contrapro.context.de", 14), "14 lines"),
    ],
)
def test_malformed_contrapro(tmp_path, file, line, text, where, reason):
    _copy(DATA, CONTRAPRO_FILES, tmp_path)
    _edit(tmp_path / file, line, text)
    with pytest.raises(ContrastiveFormatError) as e:
        cs.read_contrapro(tmp_path / "contrapro.json")
    _assert_one_line(e.value, f"{tmp_path / where[0]}:{where[1]}: ", reason)


def test_contrapro_needs_its_text_files(tmp_path):
    shutil.copy(CONTRAPRO, tmp_path / "contrapro.json")
    with pytest.raises(FileNotFoundError, match="json2text_and_context.pl"):
        cs.read_contrapro(tmp_path / "contrapro.json")


@pytest.mark.parametrize(
    "edits, where, reason",
    [
        (
            {
                f"anaphora.{k}.{lang}": (8, None)
                for k in ("current", "prev")
                for lang in ("en", "fr")
            },
            ("anaphora.current.en", 7),
            "7 lines: expected pairs of lines",
        ),
        (
            {"anaphora.current.en": (4, "Yes, they came this morning.")},
            ("anaphora.current.en", 4),
            "pair 1 of anaphora: source differs from line 3",
        ),
        ({"anaphora.prev.fr": (2, None)}, ("anaphora.prev.fr", 7), "7 lines but"),
    ],
)
def test_malformed_bawden(tmp_path, edits, where, reason):
    _copy(BAWDEN, sorted(os.listdir(BAWDEN)), tmp_path)
    for name, (line, text) in edits.items():
        _edit(tmp_path / name, line, text)
    with pytest.raises(ContrastiveFormatError) as e:
        cs.read_bawden(tmp_path)
    _assert_one_line(e.value, f"{tmp_path / where[0]}:{where[1]}: ", reason)


def test_unknown_format_and_missing_files(tmp_path):
    with pytest.raises(ValueError, match="unknown contrastive set format 'nope'"):
        cs.read_contrastive_set("nope", VOITA)
    with pytest.raises(FileNotFoundError, match="no such file"):
        cs.read_contrastive_set("voita", tmp_path / "absent.json")
    with pytest.raises(FileNotFoundError, match="anaphora.current.en"):
        cs.read_contrastive_set("bawden", tmp_path)


# ----------------------------------------------------------------- a real model, the CLI


@pytest.fixture(scope="module")
def final_run(synthetic_dir, tmp_path_factory):
    """A tiny FINAL document model trained two steps (chunks of 4 sentences)."""
    from docnmt_jax.training import trainer

    workdir = str(tmp_path_factory.mktemp("contrastive_run"))
    trainer.train_and_evaluate(tiny_final_config(synthetic_dir, num_steps=2), workdir)
    return workdir


def test_real_document_model_scores_every_candidate(final_run):
    from docnmt_jax.training import restore

    model, tokenizer, config = restore.load_model(final_run)
    params, _ = restore.load_params(model, final_run, "latest")
    instances = cs.read_voita(VOITA)
    calls = []

    def scorer(p, batch):
        calls.append({k: v.shape for k, v in batch.items()})
        return jitted(p, batch)

    jitted = contrastive.make_sentence_scorer(model)
    options = dict(max_sentences=config.data.max_sentences, rows=8, bucket=128, scorer=scorer)
    scores = contrastive.instance_scores(model, params, tokenizer, instances, **options)
    assert [s.shape for s in scores] == [(len(i.candidates),) for i in instances]
    assert all(np.all(np.isfinite(s)) and np.all(s < 0) for s in scores)
    assert calls and all(c["src"] == (8, 4, 128) and c["tgt"] == (8, 4, 128) for c in calls)
    # The same scores with each instance alone in its batch: rows do not mix.
    for inst, together in zip(instances, scores, strict=True):
        (alone,) = contrastive.instance_scores(model, params, tokenizer, [inst], **options)
        np.testing.assert_allclose(alone, together, rtol=1e-5, atol=1e-4)
    # Different candidates, different scores: the candidate reaches the model.
    assert all(len(set(np.round(s, 4))) == len(s) for s in scores)


def test_window_model_in_chunks_or_sentence_rows_scores_the_same(final_run):
    """Jean & Cho's chunk rows (context inside the chunk) and sentence rows (context in
    ``context_src``) are one model: the same scores show the window is laid out right."""
    from flax import linen as nn

    from docnmt_jax.data.schema import dummy_batch
    from docnmt_jax.data.tokenizer import load_tokenizer
    from docnmt_jax.models import build_model

    tokenizer = load_tokenizer(os.path.join(final_run, "spm.model"))
    instances = cs.read_voita(VOITA)
    sizes = dict(d_model=16, num_heads=2, ffn_dim=32, num_encoder_layers=1, num_decoder_layers=1)
    out = []
    for sentence_rows in (False, True):
        model = build_model(
            dict(name="jean_cho", context_sentences=2, sentence_rows=sentence_rows, **sizes),
            tokenizer.vocab_size,
        )
        params = nn.meta.unbox(model.init(jax.random.PRNGKey(0), dummy_batch())["params"])
        out.append(
            contrastive.instance_scores(model, params, tokenizer, instances, rows=8, bucket=128)
        )
    for chunks, rows in zip(*out, strict=True):
        np.testing.assert_allclose(chunks, rows, rtol=1e-5, atol=1e-3)


def test_sentence_transformer_is_at_chance_on_bawden(final_run):
    """A context-blind model scores a translation the same in every context, and the Bawden
    sets are balanced: exactly half of each set right."""
    from flax import linen as nn

    from docnmt_jax.data.schema import dummy_batch
    from docnmt_jax.data.tokenizer import load_tokenizer
    from docnmt_jax.models import build_model

    tokenizer = load_tokenizer(os.path.join(final_run, "spm.model"))
    sizes = dict(d_model=16, num_heads=2, ffn_dim=32, num_encoder_layers=1, num_decoder_layers=1)
    model = build_model(dict(name="transformer", **sizes), tokenizer.vocab_size)
    params = nn.meta.unbox(model.init(jax.random.PRNGKey(0), dummy_batch())["params"])
    instances = cs.read_bawden(BAWDEN)
    scores = contrastive.instance_scores(model, params, tokenizer, instances, rows=8, bucket=32)
    by_text: dict[tuple[str, str], list[float]] = {}
    for inst, logp in zip(instances, scores, strict=True):
        for candidate, value in zip(inst.candidates, logp, strict=True):
            by_text.setdefault((inst.src, candidate), []).append(float(value))
    assert all(len(v) >= 2 and np.ptp(v) < 1e-4 for v in by_text.values())
    result = contrastive.forced_choice_accuracy(instances, scores)
    assert (result["correct"], result["total"], result["ties"]) == (4, 8, 0)
    assert {k: (b["correct"], b["total"]) for k, b in result["by_set"].items()} == {
        "anaphora": (2, 4),
        "lexical_choice": (2, 4),
    }


def _cli(*args):
    return run_launch("evaluate.py", *args)


def test_cli_scores_a_set_and_writes_the_result(final_run):
    out = _cli(
        "--contrastive=bawden", f"--data={BAWDEN}", f"--workdir={final_run}", "--checkpoint=latest"
    )
    assert out.returncode == 0, out.stderr[-3000:]
    path = os.path.join(final_run, "contrastive", "bawden.bawden.json")
    result = json.loads(open(path, encoding="utf-8").read())
    assert os.listdir(os.path.dirname(path)) == ["bawden.bawden.json"]  # no temporary left
    assert (result["format"], result["model"], result["instances"]) == ("bawden", "final", 8)
    assert result["candidates"] == 16 and result["total"] == 8
    right = 0
    for entry in result["scores"]:
        logp = np.array(entry["log_probs"])
        assert logp.shape == (2,) and np.all(np.isfinite(logp)) and np.all(logp < 0)
        right += int(logp[entry["correct"]] > np.delete(logp, entry["correct"]).max())
    assert result["correct"] == right
    by_set = result["by_set"]
    assert list(by_set) == ["anaphora", "lexical_choice"]
    assert by_set["anaphora"]["total"] == by_set["lexical_choice"]["total"] == 4
    lines = out.stdout.splitlines()
    assert lines[0].startswith(f"bawden contrastive set {BAWDEN}: 8 instances, 16 candidates")
    assert lines[1].split()[:2] == ["overall", f"{100 * result['accuracy']:.2f}%"]
    assert "  by set:" in lines and lines[-1] == f"written: {path}"


def test_cli_user_mistakes_are_one_line_with_status_2(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(f'[\n {GOOD},\n {{"src": "b .", "dst": ["x", "y"]}}\n]', encoding="utf-8")
    shutil.copy(CONTRAPRO, tmp_path / "contrapro.json")
    cases = [
        (["--contrastive=nope", f"--data={VOITA}"], "--contrastive: unknown format 'nope'"),
        (
            ["--contrastive=voita", f"--data={bad}", f"--workdir={tmp_path}"],
            f"{bad}:3: instance 1: missing field 'true_ind'",
        ),
        (
            ["--contrastive=contrapro", f"--data={tmp_path / 'contrapro.json'}", "--workdir=x"],
            "json2text_and_context.pl",
        ),
    ]
    for args, expected in cases:
        out = _cli(*args)
        assert out.returncode == 2, (args, out.stderr[-2000:])
        assert out.stdout == ""
        err = out.stderr.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("evaluate.py: error: "), err
        assert expected in err[0]
