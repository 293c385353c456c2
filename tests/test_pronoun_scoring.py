"""Scoring the pronoun sets (docs/evaluation.md): the three contexts and breakdowns against a
naive loop,
McNemar's exact test against a hand count, CXMI on a tiny model against a hand computation."""

import dataclasses
import os
import re

import jax
import numpy as np
import pytest
from conftest import ROOT
from flax import linen as nn

from docnmt_jax.data import pronoun_set as ps
from docnmt_jax.data.readers import read_tsv
from docnmt_jax.evaluation import contrastive, cxmi, pronoun_eval
from docnmt_jax.evaluation.significance import mcnemar_exact
from docnmt_jax.models.base import BatchLayout

FIXTURE = os.path.join(ROOT, "tests", "data", "pronouns", "fixture.tsv")
EOS = 1
WORD = re.compile(r"[a-zà-ÿ]+")


class WordTokenizer:
    """Lower-cased words to ids from 2 up, assigned on first sight."""

    eos_id = EOS

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def encode(self, text: str) -> list[int]:
        return [self.ids.setdefault(w, len(self.ids) + 2) for w in WORD.findall(text.lower())]

    def encode_batch(self, texts):
        return [self.encode(t) for t in texts]


@dataclasses.dataclass
class ToyModel:
    """A chunk model whose sentence score counts its words seen in the target sentences
    before it in the row: it picks the pronoun its context used last."""

    layout: BatchLayout = BatchLayout.CHUNKS
    context_sentences: int = 0
    whole_documents: bool = False

    def score(self, params, batch):
        tgt = np.asarray(batch["tgt"])
        out = np.zeros(tgt.shape[:2])
        for b in range(tgt.shape[0]):
            for k in range(tgt.shape[1]):
                seen = set(tgt[b, :k].ravel().tolist()) - {0, EOS}
                out[b, k] = len((set(tgt[b, k].tolist()) - {0, EOS}) & seen)
        return out


def _naive_right(inst, view: int) -> bool:
    words = [set(WORD.findall(c.lower())) for c in inst.candidates]
    scores = []
    for c, mine in enumerate(words):
        context = inst.context_tgt[c][-view:] if view else ()
        seen = set().union(*[set(WORD.findall(s.lower())) for s in context])
        scores.append(len(mine & seen))
    return scores[inst.correct] > max(s for c, s in enumerate(scores) if c != inst.correct)


@pytest.fixture(scope="module")
def pronoun_file(tmp_path_factory):
    out = tmp_path_factory.mktemp("pronouns")
    ps.build_sets(FIXTURE, str(out / "fixture"), chunk=3, seed=0)
    return str(out / "fixture.pronouns.jsonl")


def test_conditions_and_breakdowns_equal_a_naive_loop(pronoun_file):
    instances, records = ps.read_pronoun_set(pronoun_file)
    groups = [r["doc_id"] for r in records]
    model = ToyModel()
    results = pronoun_eval.score_conditions(
        model, None, WordTokenizer(), instances, groups, seed=1, max_sentences=3,
        scorer=model.score,
    )  # fmt: skip
    for mode in contrastive.CONTEXTS:
        variant = contrastive.with_context(instances, mode, groups, seed=1)
        naive = [_naive_right(i, view=2) for i in variant]
        assert results[mode]["outcomes"] == naive, mode
        assert results[mode]["correct"] == sum(naive)
        for gender in ("feminine", "masculine"):
            want = [
                ok
                for ok, i in zip(naive, instances, strict=True)
                if i.attributes["gender"] == gender
            ]
            got = results[mode]["by_gender"][gender]
            assert (got["correct"], got["total"]) == (sum(want), len(want))
        only = [
            ok
            for ok, i in zip(naive, instances, strict=True)
            if i.attributes["context_only"] == "yes"
        ]
        sub = results[mode]["context_only_subset"]
        assert (sub["correct"], sub["total"]) == (sum(only), len(only))
    assert results["none"]["correct"] == 0  # no context: every candidate ties
    assert results["true"]["correct"] > 0
    table = pronoun_eval.format_conditions(results, "title")
    assert "context-only subset" in table and "gender feminine" in table


def test_random_context_comes_from_another_document():
    docs = read_tsv(FIXTURE)
    windows, groups = cxmi.sentence_windows(docs)
    swapped = contrastive.with_context(windows, "random", groups, seed=0)
    own = {d.doc_id: set(d.src) for d in docs}
    for w, new, group in zip(windows, swapped, groups, strict=True):
        assert len(new.context_src) == len(w.context_src)
        assert not set(new.context_src) & own[group]
        assert new.src == w.src and new.candidates == w.candidates


def test_mcnemar_against_a_hand_count():
    system = [1, 1, 1, 1, 1, 1, 0, 1, 0, 1]
    baseline = [0, 0, 0, 0, 0, 1, 1, 1, 0, 0]
    # discordant: 6 only-system, 1 only-baseline; p = 2 (C(7,0) + C(7,1)) / 2^7 = 16/128
    got = mcnemar_exact([bool(x) for x in system], [bool(x) for x in baseline])
    assert got == {
        "pairs": 10,
        "system_only": 6,
        "baseline_only": 1,
        "both": 2,
        "neither": 1,
        "p_value": 0.125,
    }
    assert mcnemar_exact(baseline, system)["p_value"] == 0.125
    assert mcnemar_exact([True, False], [True, False])["p_value"] == 1.0
    assert mcnemar_exact([True] * 3 + [False] * 3, [False] * 3 + [True] * 3)["p_value"] == 1.0
    # 20 discordant, all one way: 2 / 2^20
    assert mcnemar_exact([True] * 20, [False] * 20)["p_value"] == pytest.approx(2**-19)
    with pytest.raises(ValueError):
        mcnemar_exact([True], [True, False])


def _tiny_final():
    from docnmt_jax.data.schema import dummy_batch
    from docnmt_jax.models import build_model

    sizes = dict(d_model=16, num_heads=2, ffn_dim=32, num_encoder_layers=1,
                 num_decoder_layers=1, max_segments=20, max_relative_distance=20)  # fmt: skip
    model = build_model(dict(name="final", **sizes), 256)
    params = nn.meta.unbox(model.init(jax.random.PRNGKey(5), dummy_batch())["params"])
    return model, params


def _hand_scorer(model):
    """``logp(params, tok, src_sents, tgt_sents)``: log p of the last target sentence given
    exactly these sentences, one document in a ``[1, 3, 32]`` grid (empty slots padding)."""
    from docnmt_jax.data.schema import batch_from_grids

    score = jax.jit(model.score)

    def logp(params, tok, src_sents, tgt_sents):
        grids = {}
        for side, texts in (("src", src_sents), ("tgt", tgt_sents)):
            grid = np.zeros((1, 3, 32), np.int32)
            for i, text in enumerate(texts):
                ids = tok.encode(text) + [EOS]
                grid[0, i, : len(ids)] = ids
            grids[side] = grid
        batch = batch_from_grids(grids["src"], grids["tgt"])
        return float(np.asarray(score(params, batch))[0, len(tgt_sents) - 1])

    return logp


def test_cxmi_and_delta_d_equal_a_hand_count_with_the_toy_model():
    from docnmt_jax.data.documents import Document

    docs = [
        Document("A", ("s a", "s b", "s c"), ("a b", "c d", "a e")),
        Document("B", ("s d", "s e"), ("x y", "y")),
    ]
    model = ToyModel()
    got = cxmi.cxmi(model, None, WordTokenizer(), docs, 3, sizes=(1, 5), draws=1,
                    scorer=model.score)  # fmt: skip
    # tokens with EOS: 3 + 3 + 3 + 3 + 2 = 14; alone every score is 0. True context (the 2
    # previous): A1 {c,d}&{a,b} = 0, A2 {a,e}&{a,b,c,d} = 1, B1 {y}&{x,y} = 1 -> 2 / 14.
    # One previous: A2 {a,e}&{c,d} = 0 -> 1 / 14. Random (B's verses for A, A's for B): 0.
    assert (got["tokens"], got["sentences"], got["with_context"]) == (14, 5, 3)
    assert got["cxmi"] == pytest.approx(2 / 14)
    assert got["by_size"] == {"1": pytest.approx(1 / 14)}  # 5 >= the view (2): not a size
    assert got["delta_d"] == pytest.approx(2 / 14)
    blind = cxmi.cxmi(ToyModel(layout=BatchLayout.SENTENCES), None, WordTokenizer(), docs)
    assert blind["cxmi"] == 0.0 and blind["delta_d"] is None and "never" in blind["no_context"]


@pytest.mark.slow
def test_cxmi_equals_a_hand_computation_on_a_tiny_model():
    docs = read_tsv(FIXTURE)[:1]  # Ruth.1, 5 verses
    model, params = _tiny_final()
    tok = WordTokenizer()
    got = cxmi.cxmi(model, params, tok, docs, max_sentences=3, sizes=(1,), draws=0, rows=4)
    hand = _hand_scorer(model)
    diff = diff1 = tokens = 0.0
    for doc in docs:
        for i in range(len(doc.src)):
            alone = hand(params, tok, doc.src[i : i + 1], doc.tgt[i : i + 1])
            lo, lo1 = max(0, i - 2), max(0, i - 1)
            diff += hand(params, tok, doc.src[lo : i + 1], doc.tgt[lo : i + 1]) - alone
            diff1 += hand(params, tok, doc.src[lo1 : i + 1], doc.tgt[lo1 : i + 1]) - alone
            tokens += len(tok.encode(doc.tgt[i])) + 1
    assert got["tokens"] == tokens and got["view"] == 2
    assert got["cxmi"] == pytest.approx(diff / tokens, abs=1e-5)
    assert got["by_size"] == {"1": pytest.approx(diff1 / tokens, abs=1e-5)}
    assert abs(got["cxmi"]) > 1e-4  # the random model does read its context
    assert got["no_context"] == "the sentence as a one-sentence chunk"


@pytest.mark.slow
def test_cli_scores_the_set_with_a_baseline_and_cxmi(synthetic_dir, tmp_path, pronoun_file):
    """``evaluate.py --contrastive pronouns`` on a tiny FINAL trained two steps, itself as the
    baseline (McNemar: no discordant pair, p = 1), with ``--cxmi``; and a one-line mistake."""
    import json

    from conftest import run_launch, tiny_final_config

    from docnmt_jax.training import trainer

    run = str(tmp_path / "run")
    trainer.train_and_evaluate(tiny_final_config(synthetic_dir, num_steps=2), run)
    args = ["--contrastive=pronouns", f"--data={pronoun_file}", f"--workdir={run}",
            "--checkpoint=latest", f"--contrastive_baseline={run}", "--cxmi", f"--ref={FIXTURE}",
            "--cxmi_sizes=1", "--context_draws=1", "--json"]  # fmt: skip
    out = run_launch("evaluate.py", *args)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    pron, info = result["contrastive"], result["cxmi"]
    assert pron["instances"] == 4 and set(pron["system"]) >= {"true", "none", "random"}
    for mode in ("true", "none", "random"):
        assert pron["mcnemar"][mode]["all"]["p_value"] == 1.0
        assert pron["system"][mode]["outcomes"] == pron["baseline"][mode]["outcomes"]
    assert np.isfinite(info["cxmi"]) and info["tokens"] > 0 and "1" in info["by_size"]
    written = json.load(open(os.path.join(run, "contrastive", "pronouns.fixture.pronouns.json")))
    assert written["system"]["true"]["total"] == 4
    bad = run_launch("evaluate.py", "--contrastive=pronouns", f"--workdir={run}")
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.strip().splitlines() == [
        "evaluate.py: error: --contrastive pronouns needs --data (the set) and --workdir (the run)"
    ]
