"""Contrastive scoring: batched, padded scores against a naive one-document-at-a-time loop."""

import os

import jax
import numpy as np
import pytest
from flax import linen as nn

from docnmt_jax.data import synthetic
from docnmt_jax.data.readers import read_tsv
from docnmt_jax.data.tokenizer import train_tokenizer
from docnmt_jax.evaluation import contrastive
from docnmt_jax.models import build_model

MODELS = {
    "transformer": dict(name="transformer"),
    "final": dict(name="final", max_segments=20, max_relative_distance=20),
}


@pytest.fixture(scope="module")
def corpus(synthetic_dir, tmp_path_factory):
    docs = read_tsv(os.path.join(synthetic_dir, "test.tsv"))
    labels = synthetic.read_labels(os.path.join(synthetic_dir, "test.labels.jsonl"))
    train = read_tsv(os.path.join(synthetic_dir, "train.tsv"))
    path = tmp_path_factory.mktemp("spm") / "spm.model"
    tokenizer = train_tokenizer(train, str(path), vocab_size=300)
    return docs, labels[:5], tokenizer


def _task(name: str, vocab_size: int):
    values = dict(
        MODELS[name],
        d_model=16,
        num_heads=2,
        ffn_dim=32,
        num_encoder_layers=2,
        num_decoder_layers=2,
        dropout_rate=0.0,
        attention_dropout_rate=0.0,
        relu_dropout_rate=0.0,
    )
    task = build_model(values, vocab_size)
    batch = {k: np.ones((1, 2, 4), np.int32) for k in ("src", "tgt", "src_mask", "tgt_mask")}
    params = nn.meta.unbox(task.init(jax.random.PRNGKey(3), batch)["params"])
    return task, params


def _naive_score(task, params, tokenizer, src_sents, tgt_sents, k):
    """log p of target sentence ``k`` given exactly these sentences, float64 in NumPy."""
    src = [tokenizer.encode(s) + [tokenizer.eos_id] for s in src_sents]
    tgt = [tokenizer.encode(s) + [tokenizer.eos_id] for s in tgt_sents]
    length = max(len(x) for x in src + tgt)
    batch = {}
    for side, ids in (("src", src), ("tgt", tgt)):
        grid = np.zeros((1, len(ids), length), np.int32)
        for i, row in enumerate(ids):
            grid[0, i, : len(row)] = row
        batch[side] = grid
        batch[f"{side}_mask"] = (grid > 0).astype(np.int32)
    logits, _, _ = task.forward(params, batch, None, False)
    logits = np.asarray(logits, np.float64).reshape(len(tgt), length, -1)[k]
    top = logits.max(-1, keepdims=True)
    logp = logits - (top + np.log(np.exp(logits - top).sum(-1, keepdims=True)))
    return sum(logp[t, tok] for t, tok in enumerate(tgt[k]))


@pytest.mark.parametrize(
    "name",
    [
        # The sentence path (30 s) also runs in test_contrastive_sets (Bawden at 50%): slow.
        pytest.param("transformer", marks=pytest.mark.slow),
        # The grid path (47 s) is slow (suite time); test_contrastive_sets
        # scores FINAL's fixtures through the same code in the default suite.
        pytest.param("final", marks=pytest.mark.slow),
    ],
)
def test_candidate_scores_equal_a_naive_loop(corpus, name):
    docs, labels, tokenizer = corpus
    task, params = _task(name, tokenizer.vocab_size)
    by_id = {d.doc_id: d for d in docs}
    got = contrastive.candidate_scores(task, params, tokenizer, docs, labels, rows=5)
    naive_correct = 0
    for lb, scores in zip(labels, got, strict=True):
        doc = by_id[lb.doc_id]
        expected = []
        for word in lb.candidates:
            tgt = list(doc.tgt)
            words = tgt[lb.segment].split()
            words[lb.token_index] = word
            tgt[lb.segment] = " ".join(words)
            if name == "transformer":  # the sentence alone
                src_s, tgt_s, k = [doc.src[lb.segment]], [tgt[lb.segment]], 0
            else:  # the whole document: synthetic documents fit in one chunk
                src_s, tgt_s, k = list(doc.src), tgt, lb.segment
            expected.append(_naive_score(task, params, tokenizer, src_s, tgt_s, k))
        np.testing.assert_allclose(scores, expected, atol=2e-4, rtol=1e-5)
        naive_correct += int(np.argmax(expected) == lb.candidates.index(lb.correct))
    result = contrastive.contrastive_accuracy(task, params, tokenizer, docs, labels, rows=7)
    assert result["total"] == len(labels)
    assert result["correct"] == naive_correct
    assert sum(b["total"] for b in result["by_distance"].values()) == len(labels)


def test_items_replace_only_the_labelled_word(corpus):
    docs, labels, tokenizer = corpus
    lb = labels[0]
    doc = next(d for d in docs if d.doc_id == lb.doc_id)
    items = contrastive.make_items(docs, [lb], tokenizer, 20, sentence_level=False)
    assert [it.candidate for it in items] == list(range(len(lb.candidates)))
    for item, word in zip(items, lb.candidates, strict=True):
        assert len(item.tgt) == len(doc.tgt) and item.segment == lb.segment
        for k, ids in enumerate(item.tgt):
            text = tokenizer.decode(ids)
            if k != lb.segment:
                assert text == doc.tgt[k]
            else:
                words = doc.tgt[k].split()
                assert text.split()[lb.token_index] == word
                assert text.split()[: lb.token_index] == words[: lb.token_index]
                assert text.split()[lb.token_index + 1 :] == words[lb.token_index + 1 :]


def test_long_documents_are_scored_in_the_chunk_of_the_label(corpus):
    docs, labels, tokenizer = corpus
    lb = labels[0]
    doc = next(d for d in docs if d.doc_id == lb.doc_id)
    chunk = 2
    items = contrastive.make_items([doc], [lb], tokenizer, chunk, sentence_level=False)
    start = (lb.segment // chunk) * chunk
    assert items[0].segment == lb.segment - start
    assert len(items[0].src) == len(doc.src[start : start + chunk])
    assert tokenizer.decode(items[0].src[0]) == doc.src[start]


def test_sentence_model_ignores_the_other_sentences(corpus):
    docs, labels, tokenizer = corpus
    lb = labels[0]
    doc = next(d for d in docs if d.doc_id == lb.doc_id)
    other = (lb.segment + 1) % len(doc.src)
    src = list(doc.src)
    src[other] = doc.src[lb.segment]
    changed = type(doc)(doc.doc_id, tuple(src), doc.tgt)
    for name, same in (("transformer", True), ("final", False)):
        task, params = _task(name, tokenizer.vocab_size)
        a = contrastive.candidate_scores(task, params, tokenizer, [doc], [lb])[0]
        b = contrastive.candidate_scores(task, params, tokenizer, [changed], [lb])[0]
        assert np.allclose(a, b, atol=1e-5) == same
