"""Tests for docnmt_jax.data.tokenizer (small vocabularies, a few seconds in total)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from docnmt_jax.data import tokenizer as tok_lib
from docnmt_jax.data.documents import Document
from docnmt_jax.data.tokenizer import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    Tokenizer,
    get_or_train_tokenizer,
    load_tokenizer,
    train_tokenizer,
)

VOCAB = 400
EN_WORDS = "the and of to in that he said lord god people king house day land son man came went"
DE_WORDS = "der die das und von zu in dass er sagte herr gott volk könig haus tag land sohn ging"
EN = EN_WORDS.split() + [a + b for a in ("pre", "re", "un", "de") for b in ("mark", "turn", "wind")]
DE = DE_WORDS.split() + [
    a + b for a in ("ver", "be", "ent", "zer") for b in ("gehen", "lauf", "tür")
]


def make_corpus(num_docs: int = 30, doc_len: int = 10, seed: int = 0) -> list[Document]:
    rng = random.Random(seed)
    docs = []
    for d in range(num_docs):
        src = tuple(
            " ".join(rng.choices(EN, k=rng.randint(4, 12))).capitalize() + "."
            for _ in range(doc_len)
        )
        tgt = tuple(
            " ".join(rng.choices(DE, k=rng.randint(4, 12))).capitalize() + "."
            for _ in range(doc_len)
        )
        docs.append(Document(f"doc{d}", src, tgt))
    return docs


@pytest.fixture(scope="module")
def corpus() -> list[Document]:
    return make_corpus()


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory, corpus) -> Tokenizer:
    return train_tokenizer(corpus, tmp_path_factory.mktemp("spm") / "spm.model", vocab_size=VOCAB)


def test_special_ids_are_fixed(tokenizer):
    assert (PAD_ID, EOS_ID, BOS_ID, UNK_ID) == (0, 1, 2, 3)
    assert (tokenizer.pad_id, tokenizer.eos_id, tokenizer.bos_id, tokenizer.unk_id) == (0, 1, 2, 3)
    sp = tokenizer.processor
    assert (sp.pad_id(), sp.eos_id(), sp.bos_id(), sp.unk_id()) == (0, 1, 2, 3)
    assert tokenizer.vocab_size == VOCAB


def test_round_trip_normal_text(tokenizer, corpus):
    texts = [s for d in corpus[:5] for s in d.src + d.tgt] + ["Der König sagte: and the land."]
    for text in texts:
        ids = tokenizer.encode(text)
        assert ids and all(i not in (PAD_ID, EOS_ID, BOS_ID) for i in ids)
        assert tokenizer.decode(ids) == text


@pytest.mark.parametrize(
    "text", ["Ωμέγα 日本語 😀 — “quoted” ñ", "Zebra QUIZ xylophone 12345 #@!", "ß"]
)
def test_round_trip_unseen_characters_via_byte_fallback(tokenizer, text):
    ids = tokenizer.encode(text)
    assert UNK_ID not in ids
    assert tokenizer.decode(ids) == text


def test_encode_batch_matches_encode(tokenizer, corpus):
    texts = [s for d in corpus for s in d.src]
    assert tokenizer.encode_batch(texts) == [tokenizer.encode(t) for t in texts]
    assert tokenizer.encode_batch([]) == []


def test_decode_stops_at_eos_and_skips_pad_and_bos(tokenizer):
    a, b = tokenizer.encode("The king."), tokenizer.encode("He went.")
    assert tokenizer.decode([BOS_ID] + a + [EOS_ID] + b + [PAD_ID]) == "The king."
    assert tokenizer.decode([PAD_ID, BOS_ID] + a[:1] + [PAD_ID] + a[1:]) == "The king."
    assert tokenizer.decode(np.array([BOS_ID, *a, EOS_ID, PAD_ID, PAD_ID])) == "The king."
    assert tokenizer.decode([EOS_ID] + a) == ""
    assert tokenizer.decode_batch([a + [EOS_ID], b]) == ["The king.", "He went."]


def test_training_is_deterministic(tmp_path, corpus, tokenizer):
    again = train_tokenizer(corpus, tmp_path / "again.model", vocab_size=VOCAB)
    with open(tokenizer.model_path, "rb") as f1, open(again.model_path, "rb") as f2:
        assert f1.read() == f2.read()


def test_bpe_model_type(tmp_path, corpus):
    bpe = train_tokenizer(corpus, tmp_path / "bpe.model", vocab_size=350, model_type="bpe")
    assert bpe.vocab_size == 350 and bpe.decode(bpe.encode("The lord.")) == "The lord."


def test_infeasible_vocab_sizes_give_clear_errors(tmp_path, corpus):
    with pytest.raises(ValueError, match=r"vocab_size=100000 is too large.*largest feasible"):
        train_tokenizer(corpus, tmp_path / "big.model", vocab_size=100_000)
    with pytest.raises(ValueError, match=r"vocab_size=100 is too small.*at least \d+"):
        train_tokenizer(corpus, tmp_path / "small.model", vocab_size=100)
    with pytest.raises(ValueError, match="empty corpus"):
        train_tokenizer([], tmp_path / "empty.model", vocab_size=300)
    assert not list(tmp_path.iterdir())  # Nothing half-written.


def test_load_errors(tmp_path, tokenizer):
    with pytest.raises(FileNotFoundError, match="missing.model"):
        load_tokenizer(tmp_path / "missing.model")
    junk = tmp_path / "junk.model"
    junk.write_bytes(b"not a model")
    with pytest.raises(ValueError, match=f"{junk}: not a sentencepiece model"):
        load_tokenizer(junk)
    loaded = load_tokenizer(tokenizer.model_path)
    assert loaded.model_path == tokenizer.model_path
    assert loaded.encode("The land.") == tokenizer.encode("The land.")


def test_get_or_train_reuses_existing_model(tmp_path, corpus, monkeypatch):
    path = tmp_path / "work" / "spm.model"
    first = get_or_train_tokenizer(path, corpus, vocab_size=VOCAB)
    assert path.exists()
    # Second call must not train (and must not even look at the documents).
    monkeypatch.setattr(tok_lib, "train_tokenizer", lambda *a, **k: pytest.fail("retrained"))
    second = get_or_train_tokenizer(path, [], vocab_size=VOCAB)
    assert second.encode("The day.") == first.encode("The day.")
    with pytest.raises(ValueError, match="existing tokenizer has vocab size 400"):
        get_or_train_tokenizer(path, corpus, vocab_size=500)
