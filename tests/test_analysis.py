"""Zheng et al. (2020)'s analyses: the context windows of Fig. 3 against
brute force, the sentence-to-sentence attention of Fig. 4 (rows sum to 1; doc2doc against a
naive loop over its raw token weights), single-sentence translation (Table 2), and the
commands (``launch/analyze.py``, ``translate.py --sentences``) on a tiny trained run."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys

import flax.linen as nn
import jax
import numpy as np
import pytest
from conftest import ROOT, tiny_config

from docnmt_jax import cli
from docnmt_jax.data import readers
from docnmt_jax.data.documents import Document, write_tsv
from docnmt_jax.data.schema import batch_from_grids
from docnmt_jax.decoding.search import SearchConfig
from docnmt_jax.evaluation import analysis
from docnmt_jax.evaluation.metrics import read_hypotheses
from docnmt_jax.models import BatchLayout, ModelError, build_model
from docnmt_jax.models.base import captured_attention
from docnmt_jax.training import restore, trainer

# ------------------------------------------------------------------------ Fig. 3 windows


def _documents(lengths):
    return [
        Document(
            f"d{d}", tuple(f"s{d}.{i}" for i in range(n)), tuple(f"t{d}.{i}" for i in range(n))
        )
        for d, n in enumerate(lengths)
    ]


def _previous(doc, i, k):
    """Brute force: walk back from sentence ``i`` collecting at most ``k`` sentences."""
    window, j = [doc.src[i]], i - 1
    while j >= 0 and len(window) <= k:
        window.insert(0, doc.src[j])
        j -= 1
    return window


def test_window_documents_against_brute_force():
    docs = _documents([1, 3, 7, 12])
    for k in range(0, 14):
        for limit in (None, 0, 2, 5):
            windows = analysis.window_documents(docs, k, limit)
            expected = [
                _previous(doc, i, k if limit is None else min(k, limit))
                for doc in docs
                for i in range(len(doc))
            ]
            assert [list(w.src) for w in windows] == expected, (k, limit)
            assert all(w.tgt == tuple(s.replace("s", "t") for s in w.src) for w in windows)
            assert [w.doc_id for w in windows] == [
                f"{doc.doc_id}#{i}" for doc in docs for i in range(len(doc))
            ]


class _Config:
    max_sentences = 4


class _FakeModel:
    def __init__(self, name, layout, context_sentences=0, whole_documents=False):
        self.name, self.layout = name, layout
        self.context_sentences, self.whole_documents = context_sentences, whole_documents
        self.uses_context = not (layout.sentence_level and context_sentences == 0)


class _FakeTranslator:
    """Translates sentence ``j`` of a document into ``src[j] < what it saw``: its chunk's
    previous sentences (chunks of 4 from the document's start), its ``K`` predecessors (a
    window model), everything before it (whole documents) or nothing (sentence model)."""

    pipeline_config = _Config()

    def __init__(self, model):
        self.model, self.calls = model, []

    def translate(self, documents):
        self.calls.append([d.doc_id for d in documents])
        m = self.model
        out = []
        for doc in documents:
            hyps = []
            for j in range(len(doc)):
                if m.layout.sentence_level and m.context_sentences == 0:
                    start = j
                elif m.context_sentences:
                    start = max(0, j - m.context_sentences)
                elif m.whole_documents:
                    start = 0
                else:
                    start = j - j % self.pipeline_config.max_sentences
                hyps.append(doc.src[j] + "<" + ",".join(doc.src[start:j]))
            out.append(hyps)
        return out


@pytest.mark.parametrize(
    "model, limit",
    [
        (_FakeModel("chunks", BatchLayout.CHUNKS), 3),
        (_FakeModel("final", BatchLayout.SEQUENTIAL_CHUNKS), 3),
        (_FakeModel("hmgdc", BatchLayout.CHUNKS, whole_documents=True), None),
        (_FakeModel("doct", BatchLayout.CHUNKS, context_sentences=2), 2),
        (_FakeModel("doct_rows", BatchLayout.SENTENCES, context_sentences=2), 2),
        (_FakeModel("transformer", BatchLayout.SENTENCES), 0),
    ],
)
def test_every_sentence_sees_exactly_its_previous_k_sentences(model, limit):
    """With a context model that reads what its layout gives it, the kept translation of
    sentence i saw exactly sentences i-k .. i-1 (capped by what the model can see), in place;
    plans that give the same translation are translated once."""
    docs = _documents([2, 5, 9, 6])
    sizes = [0, 1, 2, 3, 5, 8]
    translator = _FakeTranslator(model)
    points = analysis.context_curve(translator, docs, sizes, progress=False)
    for k, point in zip(sizes, points, strict=True):
        seen = k if limit is None else min(k, limit)
        expected = [
            [doc.src[i] + "<" + ",".join(_previous(doc, i, seen)[:-1]) for i in range(len(doc))]
            for doc in docs
        ]
        assert point.hypotheses == expected, (model.name, k)
        assert point.sentences == 22
        counts = [min(i, seen) for doc in docs for i in range(len(doc))]
        assert point.mean_context == pytest.approx(np.mean(counts))
        assert 0.0 <= point.s_bleu <= 100.0 and 0.0 <= point.d_bleu <= 100.0
    if model.name == "transformer":  # no context: translated once, the documents themselves
        assert translator.calls == [[d.doc_id for d in docs]]
        assert len({(p.s_bleu, p.d_bleu) for p in points}) == 1
        assert "flat curve" in points[0].note
    if model.context_sentences:  # k >= K: the document translation, once
        assert [d.doc_id for d in docs] in translator.calls
        assert sum(c == [d.doc_id for d in docs] for c in translator.calls) == 1


def test_single_sentence_comparison_and_stream():
    docs = _documents([3, 1, 5])
    translator = _FakeTranslator(_FakeModel("chunks", BatchLayout.CHUNKS))
    result = analysis.single_sentence_comparison(translator, docs, progress=False)
    assert result["single_sentence"]["hypotheses"] == [[s + "<" for s in d.src] for d in docs]
    assert result["document"]["hypotheses"] == translator.translate(docs)
    assert result["sentences"] == 9
    table = analysis.format_single_sentence(result)
    assert "document" in table and "single sentences" in table and "difference" in table

    class Streaming(_FakeTranslator):
        def translate_stream(self, documents, block):
            documents = list(documents)
            for start in range(0, len(documents), block):
                part = [
                    Document(i, tuple(s), ("",) * len(s))
                    for i, s in documents[start : start + block]
                ]
                yield from zip((d.doc_id for d in part), self.translate(part), strict=True)

    stream = Streaming(translator.model)
    got = list(analysis.single_sentence_stream(stream, ((d.doc_id, list(d.src)) for d in docs), 2))
    assert got == [(d.doc_id, [s + "<" for s in d.src]) for d in docs]
    assert all(len(call) <= 2 for call in stream.calls)  # one-sentence documents, in blocks


# ----------------------------------------------------------------------- Fig. 4 attention


# The machine running the tests may be loaded: compile without XLA's expensive CPU passes.
FAST = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def _fast(fn, *args):
    """``jax.jit(fn)(*args)`` compiled quickly."""
    return jax.jit(fn).lower(*args).compile(compiler_options=FAST)(*args)


def _init(model, batch, seed=0):
    return _fast(lambda b: model.init(jax.random.PRNGKey(seed), b), batch)["params"]


def _tiny(name, **extra):
    sizes = dict(d_model=16, num_heads=2, ffn_dim=32, num_encoder_layers=2, num_decoder_layers=1)
    if name.startswith("rnnsearch"):
        sizes = dict(d_model=16, embed_dim=16)
    return build_model(dict(name=name, **sizes, **extra), vocab_size=40)


def _grid(rows=2, sentences=4, length=7, seed=0):
    """Sentences of 2..6 tokens (EOS last), a padding sentence in the last row."""
    rng = np.random.default_rng(seed)
    src = np.zeros((rows, sentences, length), np.int32)
    for b in range(rows):
        for s in range(sentences - (b == rows - 1)):
            n = int(rng.integers(2, length))
            src[b, s, : n - 1] = rng.integers(3, 40, n - 1)
            src[b, s, n - 1] = 2
    return batch_from_grids(src, src.copy())


WINDOW_MODELS = {"doct": 2, "jean_cho": 2}


@pytest.mark.parametrize(
    "name", ["final", "doc2doc", "hmgdc", "rnnsearch_hmgdc", "doct", "jean_cho"]
)
def test_sentence_attention_rows_sum_to_one(name):
    model = _tiny(name, **({"context_sentences": 2} if name == "jean_cho" else {}))
    batch = _grid()
    params = _init(model, batch, 1)
    att = np.asarray(_fast(model.sentence_attention, params, batch))
    real = batch["sentence_mask"] > 0
    assert att.shape == (2, 4, 4) and np.all(att >= 0) and np.all(att <= 1 + 1e-6)
    assert np.all(att[~real] == 0) and np.all(att[~real[:, None, :].repeat(4, 1)] == 0)
    rows = att.sum(-1)
    if name in WINDOW_MODELS:  # a sentence attends only to its K predecessors
        K = WINDOW_MODELS[name]
        s, c = np.meshgrid(np.arange(4), np.arange(4), indexing="ij")
        assert np.all(att[:, (c >= s) | (c < s - K)] == 0)
        np.testing.assert_allclose(rows[:, 0], 0.0)  # the document's first sentence: no context
        np.testing.assert_allclose(rows[:, 1:][real[:, 1:]], 1.0, atol=1e-5)
    else:
        np.testing.assert_allclose(rows[real], 1.0, atol=1e-5)
    assert len(np.unique(np.round(att[real], 4))) > 2  # not a constant matrix


def test_doc2doc_attention_against_a_naive_loop_over_raw_weights():
    """The raw weights the model exposes are the last encoder layer's softmax(QK^T/sqrt(d))
    (recomputed in numpy from that layer's input), and the matrix is Fig. 4's formula over
    the packed chunk, by explicit loops."""
    model = _tiny("doc2doc")
    batch = _grid(rows=3, sentences=3, length=6, seed=2)
    params = _init(model, batch, 0)
    rows = model.rows(batch)
    module = model.eval_module

    def raw_and_input(params, src, mask):
        _, weights = captured_attention(
            lambda: module.apply({"params": params}, src, mask, method=module.encode),
            ("encoder_layers_1", "self_attention"),
        )
        _, state = module.apply(
            {"params": params}, src, mask, method=module.encode, capture_intermediates=True
        )
        return weights, state["intermediates"]["encoder_layers_0"]["__call__"][0]

    weights, x = _fast(raw_and_input, params, rows["src"], rows["src_mask"])
    x = np.asarray(x, np.float64)
    p = nn.meta.unbox(params)["encoder_layers_1"]["self_attention"]
    q = np.einsum("bld,dhk->blhk", x, p["query"]["kernel"]) + np.asarray(p["query"]["bias"])
    k = np.einsum("bld,dhk->blhk", x, p["key"]["kernel"]) + np.asarray(p["key"]["bias"])
    logits = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
    key_real = np.asarray(rows["src_mask"])[:, None, None, :] > 0
    logits = np.where(key_real, logits, -np.inf)
    raw = np.exp(logits - logits.max(-1, keepdims=True))
    raw /= raw.sum(-1, keepdims=True)
    query_real = np.asarray(rows["src_mask"]) > 0
    w = np.asarray(weights)
    np.testing.assert_allclose(
        w.transpose(0, 2, 1, 3)[query_real], raw.transpose(0, 2, 1, 3)[query_real], atol=1e-5
    )

    att = np.asarray(_fast(model.sentence_attention, params, batch))
    mean = raw.mean(axis=1)  # over heads
    B, S, _ = batch["src"].shape
    for b in range(B):
        positions, p = [], 0  # packed positions of each sentence's tokens
        for s in range(S):
            n = int(batch["src_mask"][b, s].sum())
            positions.append(list(range(p, p + n)))
            p += n
        for s in range(S):
            for c in range(S):
                if not positions[s]:
                    assert att[b, s, c] == 0
                    continue
                total = sum(mean[b, i, j] for i in positions[s] for j in positions[c])
                assert att[b, s, c] == pytest.approx(total / len(positions[s]), abs=1e-5)


def test_window_attention_against_a_naive_loop():
    """Jean & Cho: window slot j of sentence s (tokens j*T .. j*T+T-1 of its context) is
    sentence s - K + j; the row is the mean over s's tokens of the weights summed per slot."""
    model = _tiny("jean_cho", context_sentences=2)
    batch = _grid(rows=2, sentences=4, length=5, seed=3)
    params = _init(model, batch, 0)
    rows = model.rows(batch)
    module = model.eval_module

    def raw(params, rows):
        inputs = (rows["src"], rows["src_mask"], rows["context"], rows["context_mask"])
        return captured_attention(
            lambda: module.apply({"params": params}, *inputs, method=module.encode),
            ("context_attention",),
        )[1]

    w = np.asarray(_fast(raw, params, rows)).mean(1)  # [B*S, T, 2T]
    att = np.asarray(_fast(model.sentence_attention, params, batch))
    B, S, T = batch["src"].shape
    for b in range(B):
        for s in range(S):
            r = b * S + s
            tokens = np.flatnonzero(batch["src_mask"][b, s])
            has_context = rows["context_mask"][r].any()
            for c in range(S):
                expected = 0.0
                if has_context and tokens.size and s - 2 <= c < s:
                    j = c - (s - 2)
                    expected = w[r][tokens][:, j * T : (j + 1) * T].sum() / tokens.size
                assert att[b, s, c] == pytest.approx(expected, abs=1e-5), (b, s, c)


@pytest.mark.parametrize(
    "name, extra, words",
    [
        ("transformer", {}, "no attention across sentences"),
        ("rnnsearch", {}, "no attention across sentences"),
        ("final", {"segment_relative_attention": False}, "segment_relative_attention=False"),
        ("hmgdc", {"context_in_encoder": False}, "context_in_encoder=False"),
        ("doct", {"context_in_encoder": False}, "context_in_encoder=False"),
    ],
)
def test_models_without_sentence_attention_say_so(name, extra, words):
    model = _tiny(name, **extra)
    with pytest.raises(ModelError, match=words) as error:  # said before any parameter is read
        model.sentence_attention(None, _grid())
    assert "\n" not in str(error.value) and repr(name) in str(error.value)


def test_captured_attention_needs_exactly_one_call():
    model = _tiny("doc2doc")
    batch = _grid()
    params = _init(model, batch, 0)
    rows, module = model.rows(batch), model.eval_module

    def run():
        return module.apply({"params": params}, rows["src"], rows["src_mask"], method=module.encode)

    with pytest.raises(RuntimeError, match="attended 0 times"):
        jax.eval_shape(lambda: captured_attention(run, ("encoder_layers_7", "self_attention")))
    plain, (out, _) = _fast(
        lambda: (run(), captured_attention(run, ("encoder_layers_0", "self_attention")))
    )
    np.testing.assert_allclose(np.asarray(out), np.asarray(plain), atol=1e-6)  # nothing changed


# ----------------------------------------------------------------------------- commands


@pytest.fixture(scope="module")
def doc2doc_run(synthetic_dir, tmp_path_factory):
    """A tiny doc2doc run (chunks of 4 sentences) and a small test file of 3 documents."""
    workdir = str(tmp_path_factory.mktemp("analysis_doc2doc"))
    config = tiny_config(synthetic_dir, num_steps=3)
    config.model.name = "doc2doc"
    config.model.max_len = 512
    config.data.max_sentences = 4
    trainer.train_and_evaluate(config, workdir)
    # Two documents of six sentences of at most 30 tokens: one length bucket, few shapes.
    _, tokenizer, _ = restore.load_model(workdir)
    docs = []
    for doc in readers.read_tsv(os.path.join(synthetic_dir, "test.tsv")):
        lengths = [len(ids) for ids in tokenizer.encode_batch(list(doc.src))]
        keep = [i for i, n in enumerate(lengths) if n <= 30][:6]
        if len(keep) == 6:
            docs.append(
                Document(doc.doc_id, *(tuple(side[i] for i in keep) for side in (doc.src, doc.tgt)))
            )
        if len(docs) == 2:
            break
    test = os.path.join(workdir, "small_test.tsv")
    write_tsv(docs, test)
    return workdir, test, docs


def _run(script, *args):
    """Runs ``launch/SCRIPT`` (compiling with the suite's fast XLA flags, inherited)."""
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, "launch", script), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=900,
    )


def _analyze():
    spec = importlib.util.spec_from_file_location(
        "analyze", os.path.join(ROOT, "launch", "analyze.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _read_tsv(path):
    lines = open(path, encoding="utf-8").read().splitlines()
    header = lines[0].split("\t")
    return [dict(zip(header, line.split("\t"), strict=True)) for line in lines[1:]]


def test_context_curve_command(doc2doc_run, tmp_path):
    workdir, test, docs = doc2doc_run
    out = tmp_path / "curve"
    r = _run(
        "analyze.py",
        "context-curve",
        f"--workdir={workdir}",
        f"--input={test}",
        "--sizes=0,1,5",
        "--beam=1",
        "--checkpoint=latest",
        f"--out={out}",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    rows = _read_tsv(out / "context_curve.tsv")
    assert [int(row["k"]) for row in rows] == [0, 1, 5]
    n = sum(len(d) for d in docs)
    for row in rows:
        assert 0.0 <= float(row["s_bleu"]) <= 100.0 and 0.0 <= float(row["d_bleu"]) <= 100.0
        assert int(row["sentences"]) == n
    seen = {k: np.mean([min(i, k, 3) for d in docs for i in range(len(d))]) for k in (0, 1, 5)}
    assert [float(row["mean_context"]) for row in rows] == pytest.approx(
        [seen[0], seen[1], seen[5]], abs=1e-4
    )
    assert "at most 3 previous sentences" in r.stdout  # chunks of 4: k = 5 is capped
    assert (out / "context_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for k in (0, 1, 5):
        hyps = read_hypotheses(out / f"hyp.k{k}.tsv")
        assert [(h.doc_id, len(h)) for h in hyps] == [(d.doc_id, len(d)) for d in docs]
    assert not list(out.glob("*.partial"))
    # k = 0: every sentence alone, as translate.py --sentences translates it
    hyp = tmp_path / "sentences.tsv"
    r = _run(
        "translate.py",
        f"--workdir={workdir}",
        f"--input={test}",
        f"--output={hyp}",
        "--beam=1",
        "--checkpoint=latest",
        "--sentences",
        "--block_documents=5",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert hyp.read_text() == (out / "hyp.k0.tsv").read_text()


def test_single_sentence_command_and_translate_sentences(doc2doc_run, tmp_path, capsys):
    """Table 2 side by side; every sentence's single-sentence output is its translation as a
    one-sentence document of its own."""
    workdir, test, docs = doc2doc_run
    single = tmp_path / "single"
    _analyze().main(
        [
            "single-sentence",
            f"--workdir={workdir}",
            f"--input={test}",
            "--beam=1",
            "--checkpoint=latest",
            f"--out={single}",
            "--quiet",
        ]
    )
    printed = capsys.readouterr().out
    assert "single sentences" in printed and "document" in printed
    table = _read_tsv(single / "single_sentence.tsv")
    assert [row["translation"] for row in table] == ["document", "single_sentence"]
    assert all(0.0 <= float(row["s_bleu"]) <= 100.0 for row in table)
    document = read_hypotheses(single / "hyp.document.tsv")
    assert [(h.doc_id, len(h)) for h in document] == [(d.doc_id, len(d)) for d in docs]
    translator, _ = restore.load_translator(workdir, "latest", SearchConfig(beam_size=1))
    outputs = read_hypotheses(single / "hyp.single_sentence.tsv")
    for doc, out_doc in zip(docs, outputs, strict=True):
        for i, sentence in enumerate(doc.src[:3]):
            alone = translator.translate([Document("alone", (sentence,), ("",))])
            assert alone == [[out_doc.sentences[i]]]
    r = _run(
        "translate.py",
        f"--workdir={workdir}",
        f"--input={test}",
        f"--output={tmp_path / 'bad.tsv'}",
        "--sentences",
        "--random_context_seed=0",
    )
    assert r.returncode != 0 and "no --random_context_seed" in r.stderr


def test_attention_map_of_a_trained_run(doc2doc_run, tmp_path, capsys):
    workdir, test, docs = doc2doc_run
    analyze = _analyze()
    doc = docs[1]
    out = tmp_path / "att"
    for chunk in (0, 1):
        analyze.main(
            [
                "attention",
                f"--workdir={workdir}",
                f"--input={test}",
                f"--doc={doc.doc_id}",
                f"--chunk={chunk}",
                "--checkpoint=latest",
                f"--out={out}",
            ]
        )
        prefix = out / f"attention.{analysis.file_name(doc.doc_id)}.chunk{chunk}"
        rows = _read_tsv(f"{prefix}.tsv")
        n = min(4, len(doc) - 4 * chunk)
        assert [int(r["sentence"]) for r in rows] == list(range(4 * chunk, 4 * chunk + n))
        matrix = np.array([[float(r[f"alpha_{c}"]) for c in range(n)] for r in rows])
        assert matrix.shape == (n, n) and np.all((matrix >= 0) & (matrix <= 1))
        np.testing.assert_allclose(matrix.sum(1), 1.0, atol=1e-4)
        assert [r["source"] for r in rows] == list(doc.src[4 * chunk : 4 * chunk + n])
        assert open(f"{prefix}.png", "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert "Fig. 4" in capsys.readouterr().out


def _error(analyze, capsys, *argv):
    with pytest.raises(SystemExit) as exit_:
        cli.run_argparse(analyze.main, list(argv))
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("analyze.py: error: ") and "Traceback" not in err
    return err


def test_user_mistakes_and_models_without_the_analysis_are_one_line(doc2doc_run, tmp_path, capsys):
    workdir, test, docs = doc2doc_run
    analyze = _analyze()
    common = [f"--input={test}", "--checkpoint=latest", f"--out={tmp_path}"]
    assert "not a training run" in _error(
        analyze, capsys, "context-curve", f"--workdir={tmp_path / 'nope'}", *common
    )
    for sizes, words in (
        ("0,-1", ">= 0"),
        ("a,1", "integers"),
        ("1,1", "repeated"),
        ("", "integers"),
    ):
        assert words in _error(
            analyze, capsys, "context-curve", f"--workdir={workdir}", f"--sizes={sizes}", *common
        )
    assert "is not a document of" in _error(
        analyze, capsys, "attention", f"--workdir={workdir}", "--doc=nope", *common
    )
    err = _error(
        analyze,
        capsys,
        "attention",
        f"--workdir={workdir}",
        f"--doc={docs[0].doc_id}",
        "--chunk=5",
        *common,
    )
    assert "has 2 chunk(s) (0..1)" in err and "not chunk 5" in err
    assert "required" in _error(analyze, capsys, "attention", f"--workdir={workdir}", *common)
    assert "invalid choice" in _error(analyze, capsys, "curve", f"--workdir={workdir}", *common)

    # The same parameters as a sentence Transformer (doc2doc's module is the Transformer):
    # no sentence attention (one line), and a flat context curve.
    sentence_run = tmp_path / "transformer"
    shutil.copytree(workdir, sentence_run)
    config = json.loads((sentence_run / "config.json").read_text())
    config["model"]["name"] = "transformer"
    del config["model"]["max_len"]
    (sentence_run / "config.json").write_text(json.dumps(config))
    err = _error(
        analyze,
        capsys,
        "attention",
        f"--workdir={sentence_run}",
        f"--doc={docs[0].doc_id}",
        *common,
    )
    assert "model 'transformer' has no attention across sentences" in err
    analyze.main(
        [
            "context-curve",
            f"--workdir={sentence_run}",
            "--sizes=0,3",
            "--beam=1",
            "--quiet",
            *common,
        ]
    )
    printed = capsys.readouterr().out
    assert "no context, a flat curve" in printed
    rows = _read_tsv(tmp_path / "context_curve.tsv")
    assert rows[0]["s_bleu"] == rows[1]["s_bleu"] and rows[0]["d_bleu"] == rows[1]["d_bleu"]


def test_source_use_command(doc2doc_run, tmp_path, capsys):
    workdir, test, docs = doc2doc_run
    out = tmp_path / "use.json"
    _analyze().main(
        [
            "source-use",
            f"--workdir={workdir}",
            f"--input={test}",
            "--checkpoint=latest",
            f"--json={out}",
        ]
    )
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result["model"] == "doc2doc" and result["documents"] == len(docs) == 2
    for key in ("loglik_true", "loglik_other_sources", "loglik_blank_sources"):
        assert result[key] < 0 and f"{result[key]:.4f}" in printed
    assert result["drop_other_sources"] == pytest.approx(
        result["loglik_true"] - result["loglik_other_sources"]
    )
    assert 0.0 <= result["token_variance_share"] <= 1.0
    # The largest chunk: doc2doc encodes a chunk of 4 sentences as one sequence.
    _, tokenizer, _ = restore.load_model(workdir)
    lengths = [len(ids) for d in docs for ids in tokenizer.encode_batch(list(d.src[:4]))]
    assert result["largest_chunk_tokens"] <= sum(lengths)
    err = _error(
        _analyze(), capsys, "source-use", f"--workdir={workdir}", f"--input={test}", "--docs=1"
    )
    assert "--docs=1" in err
