"""No silent loss of text: translation grows its source buckets or stops
naming file, document and line; training follows ``data.on_long`` (error | skip | truncate)
and counts what it skipped or truncated in ``train.log``."""

import dataclasses
import json
import os
import shutil

import jax
import numpy as np
import pytest
from conftest import ROOT, run_launch, shipped_models, tiny_config

from docnmt_jax.data import readers
from docnmt_jax.data.documents import Document
from docnmt_jax.data.schema import dummy_batch
from docnmt_jax.data.tokenized import LongSentencesError, PipelineConfig, tokenize_corpus
from docnmt_jax.data.tokenizer import EOS_ID, PAD_ID, load_tokenizer
from docnmt_jax.decoding.search import SearchConfig
from docnmt_jax.decoding.translator import Translator, count_capped
from docnmt_jax.errors import ConfigError, TextTooLongError
from docnmt_jax.models import build_model
from docnmt_jax.training import trainer

GOLDEN_RUN = os.path.join(ROOT, "tests", "data", "golden", "transformer")
GOLDEN_SPM = os.path.join(GOLDEN_RUN, "spm.model")
V = 40  # vocabulary of the id tokenizer
TINY_MODEL = {"d_model": 16, "num_heads": 2, "ffn_dim": 32}
TINY_MODEL.update(num_encoder_layers=1, num_decoder_layers=1)


class IdTokenizer:
    """Sentences written as their token ids (``"5 9 12"``): lengths exactly as written."""

    vocab_size = V

    def encode_batch(self, texts):
        return [[int(w) for w in t.split()] for t in texts]

    def decode(self, ids):
        out = []
        for i in np.asarray(ids).tolist():
            if i == EOS_ID:
                break
            if i != PAD_ID:
                out.append(str(i))
        return " ".join(out)


def _sentence(n, seed):
    """``n`` token ids (EOS not included) in ``[4, V)``."""
    return " ".join(map(str, np.random.default_rng(seed).integers(4, V, n)))


def _model(name="transformer", **extra):
    model = build_model({"name": name, **TINY_MODEL, **extra}, V)
    params = model.init(jax.random.PRNGKey(0), dummy_batch(1, 4, vocab_size=V))["params"]
    return model, jax.tree_util.tree_map(np.asarray, params)


def _documents(lengths):
    """One document per list of sentence lengths (tokens without EOS), ids ``d0, d1, ...``."""
    docs = []
    for d, ns in enumerate(lengths):
        sentences = tuple(_sentence(n, 100 * d + k) for k, n in enumerate(ns))
        docs.append(Document(f"d{d}", sentences, ("",) * len(ns)))
    return docs


# ------------------------------------------------------------------------------ translation


def test_a_sentence_longer_than_the_default_bucket_translates_as_with_a_large_bucket():
    """A 31-token sentence, default bucket 8: the block's limit doubles to 32 (8 -> 16 -> 32)
    and the output cap of that bucket grows from 20 to len_a * 32 + len_b = 58; the
    translations equal those of a translator built with max_src_len=32 and that cap."""
    model, params = _model()
    docs = _documents([[5, 30], [3]])
    search = SearchConfig(beam_size=1, alpha=0.0, max_len=20)
    grown = Translator(model, params, IdTokenizer(), search, max_src_len=8)
    hyps = grown.translate(docs)
    wide = dataclasses.replace(search, max_len=int(1.5 * 32 + 10))
    reference = Translator(model, params, IdTokenizer(), wide, max_src_len=32)
    assert hyps == reference.translate(docs)
    assert len(hyps[0][1].split()) > 20  # more than the default cap would have allowed
    assert {t for _, _, t in grown.stats.shapes} == {8, 32}
    stats = grown.stats
    assert (stats.long_sentences, stats.largest_source_bucket, stats.output_capped) == (1, 32, 0)
    assert "1 sentences longer than 8 source tokens translated whole" in stats.summary()


RNN_MODEL = {"d_model": 16, "embed_dim": 16, "num_layers": 1}
MODEL_OPTIONS = {
    "rnnsearch": RNN_MODEL,
    "rnnsearch_hmgdc": {**RNN_MODEL, "num_heads": 2},
}


@pytest.mark.slow  # one search compiled per model: ~1.5 min on 2 busy cores
@pytest.mark.parametrize(
    "name",  # the models the package ships, not toys other test files register
    sorted(shipped_models()),
)
def test_every_model_translates_a_sentence_beyond_the_default_bucket(name):
    """Chunks of 4 with a 21-token sentence, default bucket 8: the bucket grows to 32 and the
    sentence's translation is as the model would give it in a bucket of 32 from the start."""
    options = MODEL_OPTIONS.get(name)
    if options is None:
        model, params = _model(name)
    else:
        model = build_model({"name": name, **options}, V)
        params = model.init(jax.random.PRNGKey(0), dummy_batch(1, 4, vocab_size=V))["params"]
    docs = _documents([[3, 20, 4], [5]])
    search = SearchConfig(beam_size=1, alpha=0.0, max_len=64)
    grown = Translator(model, params, IdTokenizer(), search, max_src_len=8, max_sentences=4)
    reference = Translator(model, params, IdTokenizer(), search, max_src_len=32, max_sentences=4)
    assert grown.translate(docs) == reference.translate(docs)
    assert grown.stats.long_sentences == 1 and grown.stats.largest_source_bucket == 32


def test_count_capped_known_answers():
    """Sentences whose output fills the L slots while len_a * tokens + len_b > L are counted
    (rows of padding and padding sentences are not); a model's own flags win."""
    search = SearchConfig(len_a=1.0, len_b=2, max_len=6)
    src_mask = np.zeros((3, 2, 8), np.int32)
    src_mask[0, 0, :5] = 1  # budget 7 > 6: capped when its output fills 6
    src_mask[0, 1, :3] = 1  # budget 5 <= 6: never capped
    src_mask[1, 0, :8] = 1  # budget 10, output shorter: not capped
    src_mask[2, 0, :8] = 1  # a padding row
    batch = {
        "src_mask": src_mask,
        "sentence_mask": (src_mask.sum(-1) > 0).astype(np.int32),
        "doc_index": np.array([0, 1, -1]),
    }
    ids = np.zeros((3, 2, 6), np.int32)
    ids[0, 0], ids[0, 1, :5], ids[1, 0, :4], ids[2, 0] = 7, 7, 7, 7
    assert count_capped(batch, ids, {}, search) == 1
    ids[0, 1] = 7  # fills L too, but its budget (5) is within it
    assert count_capped(batch, ids, {}, search) == 1
    aux = {"output_capped": np.array([True, True, True])}
    assert count_capped(batch, ids, aux, search) == 2


def test_a_translation_stopped_at_the_cap_is_reported():
    model, params = _model()
    translator = Translator(model, params, IdTokenizer(), SearchConfig(beam_size=1, max_len=3))
    hyps = translator.translate(_documents([[6, 6, 6]]))
    capped = translator.stats.output_capped
    # Outputs of 2 tokens + EOS filled the 3 slots below a budget of 1.5 * 7 + 10 tokens.
    assert capped == sum(len(h.split()) == 2 for h in hyps[0]) > 0
    assert f"WARNING: {capped} translations stopped at the output cap max_len=3" in (
        translator.stats.summary()
    )


def _doc2doc_translator(max_len=64, max_sentences=4):
    """Doc2Doc over chunks of 4: sentences of at most ``max_len // 4`` tokens."""
    model, params = _model("doc2doc", max_len=max_len)
    return Translator(
        model,
        params,
        IdTokenizer(),
        SearchConfig(beam_size=1, max_len=20),
        max_sentences=max_sentences,
    )


def test_doc2doc_takes_sentences_up_to_its_packed_length(tmp_path):
    """Doc2Doc packs a chunk of S sentences of T slots into S*T <= max_len positions: the
    source limit is 16 tokens (EOS included) for chunks of 4 (not the default 256, which would
    break its guard), and a longer sentence stops with the one-line error, naming the file's
    line when the translator knows the file (its header counted)."""
    translator = _doc2doc_translator()
    assert translator.model.max_source_len(4) == 16
    ok = translator.translate(_documents([[15, 3, 2, 9, 4]]))
    assert len(ok[0]) == 5 and max(t for _, _, t in translator.stats.shapes) == 16
    docs = _documents([[3, 4], [5, 16, 2]])
    with pytest.raises(TextTooLongError) as error:
        translator.translate(docs)
    assert str(error.value) == (
        "document 'd1' sentence 2 has 17 source tokens (EOS included); the model takes at "
        "most 16 in chunks of 4 sentences"
    )
    path = tmp_path / "input.tsv"
    rows = [(d.doc_id, s) for d in docs for s in d.src]
    lines = ["doc_id\tsrc"] + [f"{i}\t{s}" for i, s in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    translator.source_file = str(path)
    stream = translator.translate_stream(((d.doc_id, list(d.src)) for d in docs), 8)
    with pytest.raises(TextTooLongError, match=rf"^{path}:5: document 'd1' sentence 2 has 17"):
        list(stream)


@pytest.fixture(scope="module")
def doc2doc_workdir(tmp_path_factory):
    """The golden sentence-Transformer run read as Doc2Doc (the same parameters) with
    ``model.max_len = 64`` over chunks of 4: at most 16 source tokens a sentence."""
    workdir = tmp_path_factory.mktemp("doc2doc") / "run"
    shutil.copytree(GOLDEN_RUN, workdir)
    config = json.loads((workdir / "config.json").read_text())
    config["model"].update(name="doc2doc", max_len=64)
    config["data"].update(max_sentences=4, tokenizer=GOLDEN_SPM)
    (workdir / "config.json").write_text(json.dumps(config))
    return workdir


def test_translate_py_names_file_document_and_line_of_a_sentence_too_long(
    doc2doc_workdir, tmp_path
):
    tokenizer = load_tokenizer(GOLDEN_SPM)
    short, long = "bo", "giru koni kiri somuti timi kogudi"
    assert len(tokenizer.encode_batch([short])[0]) + 1 <= 16
    tokens = len(tokenizer.encode_batch([long])[0]) + 1
    assert tokens > 16
    text = tmp_path / "input.txt"  # plain text: documents input.txt:0 (line 1), :1 (lines 3-5)
    text.write_text(f"{short}\n\n{short}\n{short}\n{long}\n", encoding="utf-8")
    out = tmp_path / "out.tsv"
    result = run_launch(
        "translate.py",
        f"--workdir={doc2doc_workdir}",
        f"--input={text}",
        f"--output={out}",
        "--beam=1",
        "--checkpoint=latest",
    )
    assert result.returncode != 0, result.stdout
    message = (
        f"{text}:5: document 'input.txt:1' sentence 3 has {tokens} source tokens (EOS "
        "included); the model takes at most 16 in chunks of 4 sentences"
    )
    assert message in result.stderr, result.stderr[-3000:]
    assert not out.exists()


# --------------------------------------------------------------------------------- training

WORDS = ("bo", "ka", "mi", "tu", "sa", "ne")


def _write_corpus(directory, long_at):
    """``train.tsv`` (8 documents of 3 short sentence pairs; the pairs in ``long_at`` (doc,
    sentence, side) get a 60-word side) and ``dev.tsv`` (its documents 1 and 2); returns the
    train path."""
    rng = np.random.default_rng(5)

    def text(n):
        return " ".join(rng.choice(WORDS, n))

    rows = []
    for d in range(8):
        for k in range(3):
            src, tgt = text(3), text(3)
            if (d, k, "src") in long_at:
                src = text(60)
            if (d, k, "tgt") in long_at:
                tgt = text(60)
            rows.append(f"doc{d}\t{src}\t{tgt}")
    os.makedirs(directory, exist_ok=True)
    train = os.path.join(directory, "train.tsv")
    with open(train, "w", encoding="utf-8") as f:
        f.write("doc_id\tsrc\ttgt\n" + "\n".join(rows) + "\n")
    with open(os.path.join(directory, "dev.tsv"), "w", encoding="utf-8") as f:
        f.write("doc_id\tsrc\ttgt\n" + "\n".join(rows[3:9]) + "\n")  # doc1, doc2
    return train


def _config(data_dir, on_long):
    config = tiny_config(str(data_dir), num_steps=1, aot_compile=False)
    config.data.tokenizer = GOLDEN_SPM
    config.data.max_src_len = config.data.max_tgt_len = 48
    config.data.on_long = on_long
    return config


LONG = {(2, 1, "src"), (5, 0, "tgt"), (5, 2, "src"), (5, 2, "tgt")}


def test_on_long_error_names_file_document_line_and_count(tmp_path):
    train = _write_corpus(tmp_path / "data", LONG)
    with pytest.raises(TextTooLongError) as error:
        trainer.train_and_evaluate(_config(tmp_path / "data", "error"), str(tmp_path / "run"))
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"{train}:9: document 'doc2' sentence 2 has ")
    assert "source tokens (EOS included), more than data.max_src_len=48; 3 sentence pairs" in (
        message
    )
    assert "(source 2, target 2)" in message and "data.on_long=skip or truncate" in message


def test_on_long_is_validated(tmp_path):
    _write_corpus(tmp_path / "data", LONG)
    with pytest.raises(ConfigError, match=r"^config.data.on_long must be one of error, skip"):
        trainer.train_and_evaluate(_config(tmp_path / "data", "drop"), str(tmp_path / "run"))


def test_skip_drops_exactly_the_long_pairs_and_splits_their_documents(tmp_path):
    train = _write_corpus(tmp_path, LONG)
    docs = readers.read_tsv(train)
    tokenizer = load_tokenizer(GOLDEN_SPM)
    config = PipelineConfig(max_src_len=48, max_tgt_len=48, on_long="skip")
    corpus = tokenize_corpus(docs, tokenizer.encode_batch, config)

    def fits(text):
        return len(tokenizer.encode_batch([text])[0]) + 1 <= 48

    kept = [
        (d.doc_id, k, s, t)
        for d in docs
        for k, (s, t) in enumerate(zip(d.src, d.tgt, strict=True))
        if fits(s) and fits(t)
    ]
    assert corpus.num_sentences == len(kept) == 24 - 3
    assert corpus.skipped_pairs == 3 and (corpus.src.skipped, corpus.tgt.skipped) == (2, 2)
    for k, (_, _, s, t) in enumerate(kept):
        assert corpus.src.sentence(k).tolist() == tokenizer.encode_batch([s])[0] + [EOS_ID]
        assert corpus.tgt.sentence(k).tolist() == tokenizer.encode_batch([t])[0] + [EOS_ID]
    # doc2 loses its sentence 1: split into doc2 (sentence 0) and doc2~2 (sentence 2); doc5
    # loses sentences 0 and 2: sentence 1 remains, as doc5.
    sizes = dict(zip(corpus.doc_ids, np.diff(corpus.sentence_starts).tolist(), strict=True))
    assert sizes == {**{f"doc{d}": 3 for d in range(8)}, "doc2": 1, "doc2~2": 1, "doc5": 1}
    assert list(corpus.doc_ids[:4]) == ["doc0", "doc1", "doc2", "doc2~2"]
    stats = corpus.stats
    assert (stats.skipped_pairs, stats.src_skipped, stats.tgt_skipped) == (3, 2, 2)


def test_truncate_keeps_todays_tokens(tmp_path):
    train = _write_corpus(tmp_path, LONG)
    docs = readers.read_tsv(train)
    tokenizer = load_tokenizer(GOLDEN_SPM)
    config = PipelineConfig(max_src_len=48, max_tgt_len=48, on_long="truncate")
    corpus = tokenize_corpus(docs, tokenizer.encode_batch, config)
    pairs = [(s, t) for d in docs for s, t in zip(d.src, d.tgt, strict=True)]
    assert corpus.num_sentences == 24
    for k, (s, t) in enumerate(pairs):
        assert corpus.src.sentence(k).tolist() == tokenizer.encode_batch([s])[0][:47] + [EOS_ID]
        assert corpus.tgt.sentence(k).tolist() == tokenizer.encode_batch([t])[0][:47] + [EOS_ID]
    assert (corpus.src.truncated, corpus.tgt.truncated, corpus.skipped_pairs) == (2, 2, 0)


def test_a_target_side_error_names_the_target_file_of_a_two_file_corpus(tmp_path):
    """Aligned plain text: the lines of each side's file (their blank-line runs differ)."""
    src, tgt = tmp_path / "c.src", tmp_path / "c.tgt"
    src.write_text("bo ka\nmi\n\ntu\nsa\n", encoding="utf-8")
    tgt.write_text("\nbo ka\nmi\n\n\ntu\n" + " ".join(["ne"] * 60) + "\n", encoding="utf-8")
    docs = readers.read_corpus(f"{src},{tgt}")
    tokenizer = load_tokenizer(GOLDEN_SPM)
    config = PipelineConfig(max_src_len=48, max_tgt_len=48, on_long="error")
    with pytest.raises(LongSentencesError) as error:
        tokenize_corpus(docs, tokenizer.encode_batch, config)
    assert str(error.value).startswith(f"{tgt}:7: document 'c.src:1' sentence 2 has ")
    assert "target tokens" in str(error.value)


@pytest.mark.parametrize("on_long", ["skip", "truncate"])
def test_the_start_up_log_counts_what_was_skipped_or_truncated(tmp_path, on_long):
    _write_corpus(tmp_path / "data", LONG)
    workdir = tmp_path / "run"
    trainer.train_and_evaluate(_config(tmp_path / "data", on_long), str(workdir))
    log = (workdir / "train.log").read_text(encoding="utf-8")
    head = "data: sentences over data.max_src_len=48 / max_tgt_len=48 (data.on_long="
    expected = {
        "skip": "skip): train: 3 sentence pairs skipped (source 2, target 2 over the limit); "
        "dev: 1 sentence pairs skipped (source 1, target 0 over the limit)",
        "truncate": "truncate): train: truncated 2 source, 2 target sentences; dev: truncated 1 "
        "source, 0 target sentences",
    }[on_long]
    assert head + expected in log
