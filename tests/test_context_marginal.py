"""Context-marginalised evaluation (Jean & Cho 2019, Table 1, Sec. 4.4, Fig. 1) and the
random-context objective (Table 1 row (b)): layouts checked by brute force, the measures
against hand-built expectations and sacreBLEU, the command lines end to end."""

import dataclasses
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sacrebleu
from conftest import ROOT, tiny_config

from docnmt_jax.data import pipeline as P
from docnmt_jax.data.documents import Document
from docnmt_jax.data.schema import batch_from_grids
from docnmt_jax.evaluation import context_marginal as cm
from docnmt_jax.models import build_model
from docnmt_jax.objectives import ObjectiveError, build_objective


def _documents(lengths):
    """Documents whose sentences name their document and index: ``d3 s5`` / ``t3 w5``."""
    return [
        Document(
            f"doc{d}",
            tuple(f"d{d} s{i}" for i in range(n)),
            tuple(f"the t{d} word{i} here ." for i in range(n)),
        )
        for d, n in enumerate(lengths)
    ]


def _where(sentence):
    d, i = sentence.split()
    return int(d[1:]), int(i[1:])


# ----------------------------------------------------------------------- random layouts


SMALL = [5, 7, 3, 9, 4, 6, 8, 2]
MANY = list(np.random.default_rng(3).integers(2, 12, size=40))


@pytest.mark.parametrize(
    "lengths, max_sentences, window",
    [
        (SMALL, 3, 0),  # chunk model (FINAL, doc2doc)
        (SMALL, 4, 2),  # window model (DocT k = 2)
        (SMALL, 20, 1),  # Jean & Cho, one chunk per document
        (SMALL, None, 0),  # whole documents (HM-GDC)
        (MANY, 4, 0),
        (MANY, 20, 1),
        (MANY, 5, 2),
    ],
)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_corpus_keeps_positions_and_sees_only_other_documents(
    lengths, max_sentences, window, seed
):
    docs = _documents(lengths)
    corpus = cm.random_context_corpus(docs, max_sentences, window, seed)
    # every sentence translated exactly once, back in place (gather checks duplicates)
    back = corpus.gather([list(d.src) for d in corpus.documents], lengths)
    assert back == [list(d.src) for d in docs]
    for doc, origin in zip(corpus.documents, corpus.origin, strict=True):
        assert [_where(s) for s, w in zip(doc.src, origin, strict=True) if w] == [
            w for w in origin if w
        ]
        assert all(doc.tgt[j] == docs[w[0]].tgt[w[1]] for j, w in enumerate(origin) if w)
        # window sentences come first, at most `window` of them
        n_window = sum(w is None for w in origin)
        assert n_window <= window and all(w is None for w in origin[:n_window])
        translated = [w for w in origin if w]
        for j, (d, i) in enumerate(translated):
            # same position in its chunk (the window is the row's: a document's first
            # sentence may get a random window where it had none)
            S = lengths[d] if max_sentences is None else max_sentences
            assert j == i % S
            # brute force: what the sentence sees (chunk mates; window predecessors)
            k = n_window + j
            seen = (
                list(doc.src[max(0, k - window) : k])
                if window
                else list(doc.src[:k] + doc.src[k + 1 :])
            )
            foreign = all(_where(s)[0] != d for s in seen)
            assert corpus.foreign[d][i] == foreign, (d, i, seen)
    coverage = np.mean(np.concatenate(corpus.foreign))
    if len(lengths) > 20 and max_sentences is not None:
        assert coverage > 0.95  # forty documents: nearly every sentence gets a foreign context


def test_whole_documents_tail_of_the_longest_document_has_no_foreign_context():
    docs = _documents([2, 2, 2, 9])
    corpus = cm.random_context_corpus(docs, None, 0, seed=0)
    # columns 2..8 hold only document 3: those sentences keep their own document around them
    assert not corpus.foreign[3][2:].any()
    again = cm.random_context_corpus(docs, None, 0, seed=0)  # seeded
    assert (again.documents, again.origin) == (corpus.documents, corpus.origin)


def test_log_mean_exp_against_float64():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 11)) * 30 - 400
    ref = np.log(np.mean(np.exp(x.astype(np.longdouble)), axis=0))
    np.testing.assert_allclose(cm.log_mean_exp(x), ref.astype(np.float64), rtol=1e-12)


def test_cumulative_bleu_equals_sacrebleu_on_every_prefix():
    refs = ["the cat sat on the mat .", "a dog ran", "it was red and blue", "so it goes", "ok"]
    hyps = ["the cat sat on a mat .", "the dog ran", "it is red and blue", "", "ok"]
    curve = cm.cumulative_bleu(cm.bleu_statistics(hyps, refs))
    for k in range(1, len(refs) + 1):
        ref = sacrebleu.corpus_bleu(hyps[:k], [refs[:k]]).score
        assert curve[k - 1] == pytest.approx(ref, abs=1e-9)
    # A corpus without a matched 4-gram (a collapsed model's output): sacreBLEU smooths, so
    # must the sums (BLEU.compute_bleu alone gives 0 here).
    refs = ["a dog ran fast today", "it was red"]
    hyps = ["the dog ran slow today", "it is red"]
    expected = sacrebleu.corpus_bleu(hyps, [refs]).score
    assert expected > 0
    assert cm.corpus_bleu(cm.bleu_statistics(hyps, refs)) == pytest.approx(expected, abs=1e-9)


# ----------------------------------------------------------------- measures, hand-built


def _previous_same_document(doc):
    """For each sentence of a (possibly random-context) document: whether the sentence
    before it is of its own document (True for the first)."""
    ids = [_where(s)[0] for s in doc.src]
    return [j == 0 or ids[j - 1] == ids[j] for j in range(len(ids))]


def _translate(docs):
    """A 'model' that translates right only when its previous sentence is of its document."""
    out = []
    for doc in docs:
        ok = _previous_same_document(doc)
        out.append(
            [
                f"the t{_where(s)[0]} word{_where(s)[1]} here ." if good else "wrong"
                for s, good in zip(doc.src, ok, strict=True)
            ]
        )
    return out


def _score(docs):
    """log p = -1 per token with a same-document predecessor, -3 otherwise; 4 tokens."""
    logp = [np.where(_previous_same_document(d), -4.0, -12.0) for d in docs]
    return logp, [np.full(len(d), 4) for d in docs]


def test_measures_against_a_hand_built_context_model():
    lengths = [6, 5, 7, 4, 8, 6]
    docs = _documents(lengths)
    usage = cm.context_usage(docs, _translate, _score, 20, 1, draws=3, seed=5, progress=False)
    refs = [s for d in docs for s in d.tgt]
    assert usage.bleu_true == pytest.approx(100.0)
    expected_draws = []
    expected_logp = []
    for seed in (5, 6, 7):
        corpus = cm.random_context_corpus(docs, 20, 1, seed)
        ok = corpus.gather([_previous_same_document(d) for d in corpus.documents], lengths)
        flat_ok = [g for d in ok for g in d]
        hyps = [r if g else "wrong" for r, g in zip(refs, flat_ok, strict=True)]
        expected_draws.append(sacrebleu.corpus_bleu(hyps, [refs]).score)
        expected_logp.append(np.where(flat_ok, -4.0, -12.0))
    assert usage.bleu_random == pytest.approx(expected_draws, abs=1e-9)
    assert usage.delta_bleu == pytest.approx(100.0 - np.mean(expected_draws), abs=1e-9)
    # Delta^D: true -4 per sentence; random: log mean exp over the draws, per sentence
    estimate = np.log(np.mean(np.exp(np.stack(expected_logp).astype(np.longdouble)), axis=0))
    delta = -4.0 - estimate.astype(np.float64)
    covered = usage.covered
    assert usage.delta_loglik == pytest.approx(np.sum(delta[covered]) / (4 * covered.sum()))
    assert usage.delta_loglik > 0
    rows = cm.figure_table(usage, docs)
    assert [r["delta_sentence"] for r in rows] == sorted(
        (r["delta_sentence"] for r in rows), reverse=True
    )
    assert rows[-1]["cumulative_bleu_true"] == pytest.approx(
        sacrebleu.corpus_bleu(
            [refs[i] for i in np.flatnonzero(covered)], [[refs[i] for i in np.flatnonzero(covered)]]
        ).score
    )


def test_a_context_ignoring_model_has_zero_deltas():
    docs = _documents([6, 5, 7, 4])

    def translate(ds):
        return [[f"the t{_where(s)[0]} word{_where(s)[1]} ." for s in d.src] for d in ds]

    def score(ds):
        return [np.array([-1.5 * (_where(s)[1] + 1) for s in d.src]) for d in ds], [
            np.full(len(d), 3) for d in ds
        ]

    usage = cm.context_usage(docs, translate, score, 3, 0, draws=2, progress=False)
    assert usage.delta_bleu == 0.0 and usage.delta_loglik == 0.0
    assert np.all(usage.delta_sentence == 0.0)


def test_errors_are_one_line():
    with pytest.raises(cm.ContextUsageError, match="two documents"):
        cm.context_usage(_documents([4]), _translate, _score, 20, 1, progress=False)
    with pytest.raises(cm.ContextUsageError, match="draws = 0"):
        cm.context_usage(_documents([4, 4]), _translate, _score, 20, 1, draws=0, progress=False)


def test_figure_files(tmp_path):
    docs = _documents([6, 5, 7, 4, 8])
    usage = cm.context_usage(docs, _translate, _score, 20, 1, draws=2, progress=False)
    paths = cm.write_figure(cm.figure_table(usage, docs), str(tmp_path / "fig"), "toy")
    lines = open(paths[0], encoding="utf-8").read().splitlines()
    assert lines[0].split("\t")[:4] == ["rank", "doc_id", "sentence", "delta_sentence"]
    assert len(lines) == 1 + int(usage.covered.sum())
    assert open(paths[1], "rb").read(8) == b"\x89PNG\r\n\x1a\n"


# ----------------------------------------------------------------- random-context objective


def _tiny(name, **extra):
    return build_model(
        dict(
            name=name,
            d_model=16,
            num_heads=2,
            ffn_dim=32,
            num_encoder_layers=1,
            num_decoder_layers=1,
            **extra,
        ),
        vocab_size=40,
    )


def _grid_batch(rows=4, sentences=3, length=6, seed=0):
    rng = np.random.default_rng(seed)
    src = rng.integers(3, 40, size=(rows, sentences, length))
    tgt = rng.integers(3, 40, size=(rows, sentences, length))
    src[..., -1] = tgt[..., -1] = 0
    src[..., 4] = tgt[..., 4] = 2  # EOS
    src[..., 5] = tgt[..., 5] = 0
    if sentences > 2:
        src[-1, 2] = tgt[-1, 2] = 0  # a padding sentence
    return batch_from_grids(src.astype(np.int32), tgt.astype(np.int32))


def _random_context_losses(rows, sentences):
    """doc2doc, its parameters, a grid batch, the random_context objective's loss and metrics,
    and the model's own loss on the batch as it is."""
    model = _tiny("doc2doc")
    batch = _grid_batch(rows=rows, sentences=sentences)
    params = model.init(jax.random.PRNGKey(0), batch)["params"]
    objective = build_objective({"name": "random_context"}, model)
    loss, metrics = objective.loss(params, batch, None, False)
    ref, _ = model.loss(params, batch, None, False)
    return model, params, batch, loss, metrics, ref


def test_random_context_objective_on_a_context_free_model_is_its_loss():
    """doc2doc's loss depends on the chunk; with one sentence a row nothing else is seen,
    so moving sentences between rows must leave the loss unchanged."""
    model, params, batch, loss, metrics, ref = _random_context_losses(rows=5, sentences=1)
    np.testing.assert_allclose(float(loss), float(ref), rtol=1e-6)
    assert float(metrics["random_context_missed"].total) == 0.0


def test_random_context_objective_counts_a_lone_document_and_changes_a_chunk_loss():
    model, params, batch, loss, metrics, ref = _random_context_losses(rows=8, sentences=3)
    objective = build_objective({"name": "random_context"}, model)
    assert abs(float(loss) - float(ref)) > 1e-6  # chunk mates changed
    assert float(metrics["random_context_missed"].total) == 0.0
    one = {k: v[:1] for k, v in batch.items()}
    _, metrics = objective.loss(params, one, None, False)
    real = int(jnp.sum(jnp.any(one["tgt_mask"] > 0, -1)))
    assert float(metrics["random_context_missed"].total) == real  # nothing to swap with
    with pytest.raises(ObjectiveError, match="random contexts"):
        build_objective({"name": "random_context"}, _tiny("transformer"))


def test_a_window_model_measures_the_same_on_sentence_rows_and_chunks():
    """Random contexts of a window model do not depend on its layout: Jean & Cho on chunks of
    20 and on sentence rows translate and score every draw alike (random initialisation, a
    gate bias that makes the context count)."""
    from test_doct import WordTokenizer, _documents

    from docnmt_jax.decoding.search import SearchConfig
    from docnmt_jax.decoding.translator import Translator

    rng = np.random.default_rng(4)
    docs = _documents(
        [
            [(list(rng.integers(4, 40, 4)), list(rng.integers(4, 40, 4))) for _ in range(n)]
            for n in (3, 5, 2, 4, 3, 6)
        ]
    )
    usages = []
    for rows in (False, True):
        model = _tiny("jean_cho", sentence_rows=rows)
        if not usages:
            batch = _grid_batch(rows=2, sentences=2)
            params = model.init(jax.random.PRNGKey(3), batch)["params"]
            params["context_gate"]["bias"] = jnp.full((16,), 0.7, jnp.float32)
        translator = Translator(
            model, params, WordTokenizer(), SearchConfig(beam_size=2, max_len=8)
        )
        usages.append(cm.model_context_usage(translator, docs, 16, draws=2, progress=False))
    chunks, rows = usages
    assert chunks.hypotheses_random == rows.hypotheses_random
    assert chunks.hypotheses_true == rows.hypotheses_true
    np.testing.assert_allclose(chunks.delta_sentence, rows.delta_sentence, atol=1e-4)
    assert np.abs(chunks.delta_sentence).max() > 1e-3  # the context counts (can fail)
    with pytest.raises(cm.ContextUsageError, match="no context to replace"):
        model = _tiny("transformer")
        cm.model_context_usage(
            Translator(model, params, WordTokenizer(), SearchConfig()), docs, 16, progress=False
        )


@pytest.mark.parametrize(
    "name",
    [
        "doc2doc",  # one packed sequence a chunk
        "hmgdc",  # whole documents
        pytest.param("final", marks=pytest.mark.slow),  # slot by slot (the synthetic rows run it)
    ],
)
def test_every_kind_of_document_model_is_measured(name):
    """Chunk, whole-document and slot-by-slot models at random initialisation: every
    sentence translated back in place for every draw, finite per-sentence Deltas that the
    context moves, and a score of the true documents equal to the model's own loss."""
    from test_doct import WordTokenizer, _documents

    from docnmt_jax.decoding.search import SearchConfig
    from docnmt_jax.decoding.translator import Translator

    rng = np.random.default_rng(5)
    raw = [
        [(list(rng.integers(4, 40, 3)), list(rng.integers(4, 40, 3))) for _ in range(n)]
        for n in (3, 5, 2, 4, 3, 6)
    ]
    docs = _documents(raw)
    model = _tiny(name)
    params = model.init(jax.random.PRNGKey(1), _grid_batch(rows=2, sentences=2))["params"]
    translator = Translator(
        model, params, WordTokenizer(), SearchConfig(beam_size=2, max_len=6), max_sentences=4
    )
    usage = cm.model_context_usage(translator, docs, 16, draws=2, progress=False)
    assert [len(h) for h in usage.hypotheses_true] == [len(d) for d in docs]
    assert all([len(h) for h in draw] == [len(d) for d in docs] for draw in usage.hypotheses_random)
    assert np.all(np.isfinite(usage.delta_sentence)) and 0 < usage.coverage <= 1
    assert np.abs(usage.delta_sentence[usage.covered]).max() > 1e-4  # the context counts
    # Delta^D's true-context half: the summed scores equal the model's NLL on the same batches
    config = dataclasses.replace(
        translator.pipeline_config, max_src_len=16, max_tgt_len=16, sequential_sentences=False
    )
    logp, tokens = cm.sentence_scorer(model, params, translator.tokenizer, config)(docs)
    plan = P.plan_batches(docs, translator.tokenizer.encode_batch, config)
    nll = sum(
        float(model.loss(params, b, None, False)[1]["nll"].total) for b in P.numpy_batches(plan)
    )
    np.testing.assert_allclose(-np.sum(np.concatenate(logp)), nll, rtol=1e-5)
    assert int(np.sum(np.concatenate(tokens))) == sum(len(t) + 1 for d in raw for _, t in d)


# -------------------------------------------------------------------------- command lines


@pytest.fixture(scope="module")
def jean_cho_run(synthetic_dir, tmp_path_factory):
    """A tiny Jean & Cho model trained a few steps with the random-context objective."""
    from docnmt_jax.training import trainer

    config = tiny_config(synthetic_dir, num_steps=4)
    config.model.name = "jean_cho"
    config.model.context_sentences = 1
    config.model.gate = "sigmoid"
    config.objective.name = "random_context"
    config.data.max_sentences = 4
    workdir = str(tmp_path_factory.mktemp("jean_cho_random"))
    trainer.train_and_evaluate(config, workdir)
    return workdir


def _run(script, *args, folder="launch"):
    """``python FOLDER/SCRIPT ARGS`` from the repository root (``experiments/``: the
    experiment commands, e.g. gate_stats.py)."""
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, folder, script), *args],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )
    return result


@pytest.mark.slow  # 56 s (suite time); the library path is tested above
def test_evaluate_and_translate_measure_context_use(jean_cho_run, synthetic_dir, tmp_path):
    ref = os.path.join(synthetic_dir, "test.tsv")
    out = tmp_path / "context"
    r = _run(
        "evaluate.py",
        f"--workdir={jean_cho_run}",
        f"--ref={ref}",
        "--checkpoint=latest",
        "--context_draws=2",
        "--beam=1",
        f"--out_dir={out}",
        "--json",
    )
    assert r.returncode == 0, r.stderr[-2000:]
    result = json.loads(r.stdout)["context"]
    assert result["random_seeds"] == [0, 1] and len(result["bleu_random_draws"]) == 2
    assert result["context_marginalised_bleu"] == pytest.approx(
        np.mean(result["bleu_random_draws"])
    )
    assert result["delta_bleu"] == pytest.approx(
        result["bleu"] - result["context_marginalised_bleu"]
    )
    assert result["true_context"]["s_bleu"]["score"] == pytest.approx(result["bleu"], abs=1e-9)
    assert 0.5 < result["random_context_coverage"] <= 1.0  # twelve documents of 5-12 sentences
    assert np.isfinite(result["delta_loglik_per_token"])
    for name in (
        "hyp.true.tsv",
        "hyp.random_0.tsv",
        "hyp.random_1.tsv",
        "figure1.tsv",
        "figure1.png",
        "context.json",
    ):
        assert (out / name).exists(), name
    # translate.py's random draw 1 is evaluate.py's
    hyp = tmp_path / "random1.tsv"
    r = _run(
        "translate.py",
        f"--workdir={jean_cho_run}",
        f"--input={ref}",
        f"--output={hyp}",
        "--checkpoint=latest",
        "--beam=1",
        "--random_context_seed=1",
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert hyp.read_text(encoding="utf-8") == (out / "hyp.random_1.tsv").read_text(encoding="utf-8")


def test_evaluate_refuses_a_sentence_model_in_one_line(synthetic_dir, tmp_path):
    from docnmt_jax.training import trainer

    workdir = str(tmp_path / "transformer")
    trainer.train_and_evaluate(tiny_config(synthetic_dir, num_steps=1), workdir)
    r = _run(
        "evaluate.py",
        f"--workdir={workdir}",
        f"--ref={os.path.join(synthetic_dir, 'test.tsv')}",
        "--checkpoint=latest",
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1] == (
        "evaluate.py: error: model 'transformer' translates sentences alone: it has no "
        "context to replace"
    )
    r = _run(
        "gate_stats.py",
        f"--workdir={workdir}",
        f"--tsv={os.path.join(synthetic_dir, 'test.tsv')}",
        folder="experiments",
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert (
        r.stderr.strip().splitlines()[-1].endswith("model 'transformer' is not jean_cho (no gate)")
    )


@pytest.mark.slow  # 86 s with its fixture's training (suite time)
def test_gate_stats_counts_every_source_token_with_context(jean_cho_run, synthetic_dir):
    from docnmt_jax.data import readers
    from docnmt_jax.training import restore

    tsv = os.path.join(synthetic_dir, "test.tsv")
    r = _run(
        "gate_stats.py", f"--workdir={jean_cho_run}", f"--tsv={tsv}", "--json", folder="experiments"
    )
    assert r.returncode == 0, r.stderr[-2000:]
    result = json.loads(r.stdout)
    _, tokenizer, _ = restore.load_model(jean_cho_run)
    docs = readers.read_tsv(tsv)
    # Every sentence but a document's first has a context; each token plus its EOS.
    later = [s for d in docs for s in d.src[1:]]
    first = [d.src[0] for d in docs]
    count = sum(len(ids) + 1 for ids in tokenizer.encode_batch(later))
    assert result["tokens_with_context"] == count
    assert result["tokens_without_context"] == sum(
        len(ids) + 1 for ids in tokenizer.encode_batch(first)
    )
    quantiles = list(result["gate_quantiles"].values())
    assert 0.0 < quantiles[0] <= quantiles[-1] < 1.0  # sigmoid gate
    shares = list(result["context_share_quantiles"].values())
    assert 0.0 <= shares[0] <= result["context_share_mean"] <= shares[-1] <= 1.0
