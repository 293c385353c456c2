"""A sentencepiece model trained elsewhere (sentencepiece's default ids: unk=0, bos=1, eos=2, no
pad) used as docnmt_jax's tokenizer: its ids are mapped to the fixed internal ones, checked
against the model file read by ``sentencepiece`` directly (piece strings, not ids)."""

from __future__ import annotations

import os
import random

import jax
import numpy as np
import pytest
import sentencepiece as spm

from docnmt_jax.data.tokenizer import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    TokenizerError,
    load_tokenizer,
)
from docnmt_jax.errors import UserError

WORDS = (
    "the and of to in that he said lord god people king house day land son man came went "
    "zebra quick brown fox jumps over lazy dog winter summer river mountain valley"
)
FOREIGN_VOCAB = 100


def generated_lines(n: int = 300, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words = WORDS.split() + ["re" + w for w in WORDS.split()[:8]]
    return [" ".join(rng.choices(words, k=rng.randint(3, 12))).capitalize() + "." for _ in range(n)]


def train_default_ids_model(prefix: str, lines: list[str], vocab_size: int) -> str:
    """A model trained with sentencepiece's default ids, as a user brings one (every
    character of ``lines`` kept)."""
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_prefix=prefix,
        vocab_size=vocab_size,
        character_coverage=1.0,
        minloglevel=2,
    )
    return prefix + ".model"


@pytest.fixture(scope="module")
def foreign_path(tmp_path_factory) -> str:
    return train_default_ids_model(
        str(tmp_path_factory.mktemp("foreign") / "foreign"), generated_lines(), FOREIGN_VOCAB
    )


@pytest.fixture(scope="module")
def reference(foreign_path) -> spm.SentencePieceProcessor:
    """The foreign model read by sentencepiece itself: the independent reference."""
    sp = spm.SentencePieceProcessor(model_file=foreign_path)
    assert (sp.unk_id(), sp.bos_id(), sp.eos_id(), sp.pad_id()) == (0, 1, 2, -1)
    return sp


def test_loads_with_internal_special_ids(foreign_path, reference):
    tok = load_tokenizer(foreign_path)
    assert tok.maps_ids
    assert (tok.pad_id, tok.eos_id, tok.bos_id, tok.unk_id) == (PAD_ID, EOS_ID, BOS_ID, UNK_ID)
    # Its 100 pieces keep their ids' roles: unk, bos, eos at the fixed ids, a PAD slot added.
    assert tok.vocab_size == FOREIGN_VOCAB + 1
    assert tok.piece_to_id("<unk>") == UNK_ID
    assert tok.piece_to_id("<s>") == BOS_ID
    assert tok.piece_to_id("</s>") == EOS_ID
    assert [tok.id_to_piece(i) for i in (PAD_ID, EOS_ID, BOS_ID, UNK_ID)] == [
        "<pad>",
        "</s>",
        "<s>",
        "<unk>",
    ]


def test_every_piece_maps_to_one_internal_id(foreign_path, reference):
    tok = load_tokenizer(foreign_path)
    pieces = [reference.IdToPiece(i) for i in range(reference.GetPieceSize())]
    internal = [tok.piece_to_id(p) for p in pieces]
    assert sorted(internal + [PAD_ID]) == list(range(tok.vocab_size))
    assert [tok.id_to_piece(i) for i in internal] == pieces


def test_encode_decode_round_trip_and_pieces_match_the_model(foreign_path, reference):
    tok = load_tokenizer(foreign_path)
    texts = generated_lines()[:40] + ["The king said the lord came.", "Son went over."]
    batch = tok.encode_batch(texts)
    for text, ids in zip(texts, batch, strict=True):
        assert ids == tok.encode(text)
        assert ids and not {PAD_ID, EOS_ID, BOS_ID, UNK_ID} & set(ids)
        assert [tok.id_to_piece(i) for i in ids] == reference.EncodeAsPieces(text)
        assert tok.decode(ids) == text
        assert tok.decode(np.array([BOS_ID, *ids, EOS_ID, *ids, PAD_ID])) == text


def test_unseen_characters_become_the_unknown_piece(foreign_path, reference):
    tok = load_tokenizer(foreign_path)
    text = "The ζ king Ω."
    ids = tok.encode(text)
    assert UNK_ID in ids
    assert [tok.id_to_piece(i) for i in ids] == [
        reference.IdToPiece(i) for i in reference.EncodeAsIds(text)
    ]
    assert tok.decode(ids) == reference.DecodeIds(reference.EncodeAsIds(text))


def test_a_model_without_an_unknown_piece_is_one_clear_error(tmp_path, foreign_path):
    model_pb2 = pytest.importorskip("sentencepiece.sentencepiece_model_pb2")
    proto = model_pb2.ModelProto()
    with open(foreign_path, "rb") as f:
        proto.ParseFromString(f.read())
    assert proto.pieces[0].type == model_pb2.ModelProto.SentencePiece.UNKNOWN
    proto.pieces[0].type = model_pb2.ModelProto.SentencePiece.USER_DEFINED
    path = tmp_path / "no_unk.model"
    path.write_bytes(proto.SerializeToString())
    with pytest.raises(TokenizerError) as e:
        load_tokenizer(path)
    assert isinstance(e.value, UserError)
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: the sentencepiece model has no unknown piece")


def test_translator_and_model_built_on_a_foreign_tokenizer(tmp_path, foreign_path, reference):
    """``config.data.tokenizer=PATH`` reaches the run's tokenizer (nothing is trained), and the
    model and Translator are sized by the mapped vocabulary: one embedding row per internal id."""
    from conftest import tiny_config

    from docnmt_jax.data.schema import dummy_batch
    from docnmt_jax.decoding.search import SearchConfig
    from docnmt_jax.decoding.translator import Translator
    from docnmt_jax.models import build_model
    from docnmt_jax.training import data_setup

    config = tiny_config(str(tmp_path))
    config.data.tokenizer = foreign_path
    tok = data_setup.get_tokenizer(config, str(tmp_path), [])
    copy = (tmp_path / "spm.model").read_bytes()  # copied into the workdir, not trained
    assert tok.maps_ids and copy == open(foreign_path, "rb").read()
    model = build_model(config.model, tok.vocab_size)
    params = jax.eval_shape(model.init, jax.random.PRNGKey(0), dummy_batch())["params"]
    rows = {leaf.shape[0] for leaf in jax.tree_util.tree_leaves(params) if leaf.ndim == 2}
    assert reference.GetPieceSize() + 1 in rows
    translator = Translator(model, params, tok, SearchConfig(beam_size=1))
    assert translator.tokenizer.vocab_size == reference.GetPieceSize() + 1


@pytest.mark.slow
def test_a_training_run_with_a_foreign_tokenizer_translates(synthetic_dir, tmp_path):
    """Two training steps with ``config.data.tokenizer`` = a default-ids model, then the run's
    checkpoint restored (its embedding sized by the mapped vocabulary) and translating."""
    from conftest import tiny_config

    from docnmt_jax.data import readers
    from docnmt_jax.decoding.search import SearchConfig
    from docnmt_jax.training import restore, trainer

    train = readers.read_tsv(os.path.join(synthetic_dir, "train.tsv"))
    lines = [s for d in train for s in (*d.src, *d.tgt)]
    path = train_default_ids_model(str(tmp_path / "foreign"), lines, 200)
    config = tiny_config(synthetic_dir, num_steps=2)
    config.data.tokenizer = path
    workdir = str(tmp_path / "run")
    trainer.train_and_evaluate(config, workdir)
    translator, step = restore.load_translator(workdir, "latest", SearchConfig(beam_size=1))
    assert step == 2 and translator.tokenizer.vocab_size == 201
    leaves = jax.tree_util.tree_leaves(translator.params)
    assert 201 in {leaf.shape[0] for leaf in leaves if leaf.ndim == 2}  # one row per internal id
    (hyps,) = translator.translate([train[0]])
    assert len(hyps) == len(train[0].src) and all(isinstance(h, str) for h in hyps)
