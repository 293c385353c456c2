"""A joint source/target sentencepiece tokenizer with fixed special ids.

Special ids are the same for every model this module trains or accepts:

* ``PAD_ID = 0``: padding; never produced by :meth:`Tokenizer.encode`.
* ``EOS_ID = 1``: end of sequence; :meth:`Tokenizer.decode` stops at the first one.
* ``BOS_ID = 2``: beginning of sequence / decoder start; skipped by ``decode``.
* ``UNK_ID = 3``: unknown piece (rare: ``byte_fallback`` spells unseen characters as bytes).

Models are trained on the *training split only* (source and target sentences together) by
:func:`train_tokenizer`. Training is deterministic: the same documents and options give the
same model bytes (sentences are fed in corpus order, no sampling or shuffling, a fixed
thread count; note the model depends on ``num_threads``, so keep it fixed).

Vocabulary-size policy: the size is a hard limit. If the corpus cannot support the
requested size (too small for the required byte + special + character pieces, or too large
for the corpus), a :class:`ValueError` says which sizes are feasible.

Normalization is sentencepiece's default ``nmt_nfkc`` with whitespace collapsing, so
``decode(encode(x)) == x`` for text that is NFKC-normal with single spaces and no
leading/trailing whitespace; any character, seen in training or not, round-trips exactly
thanks to byte fallback.
"""

from __future__ import annotations

import errno
import os
import re
import tempfile
from collections.abc import Iterable, Iterator, Sequence

import sentencepiece as spm
from absl import logging

from docnmt_jax.data.documents import Document
from docnmt_jax.errors import RunNotFoundError, UserError

PAD_ID = 0
EOS_ID = 1
BOS_ID = 2
UNK_ID = 3

_SPECIAL_IDS = {"pad": PAD_ID, "eos": EOS_ID, "bos": BOS_ID, "unk": UNK_ID}


class TokenizerError(UserError, ValueError):
    """A tokenizer file is not ours or cannot be trained as asked (one line, no traceback)."""


class Tokenizer:
    """A loaded sentencepiece model whose special ids are :data:`PAD_ID` ... :data:`UNK_ID`."""

    def __init__(self, model_path: str | os.PathLike, num_threads: int = -1):
        """Loads ``model_path``; ``num_threads`` is for :meth:`encode_batch` (-1: all cores)."""
        self._model_path = os.fspath(model_path)
        self._num_threads = num_threads
        if not os.path.isfile(self._model_path):
            raise RunNotFoundError(errno.ENOENT, "sentencepiece model not found", self._model_path)
        sp = spm.SentencePieceProcessor()
        try:
            sp.Load(model_file=self._model_path)
        except (OSError, RuntimeError) as e:
            raise TokenizerError(
                f"{self._model_path}: not a sentencepiece model ({str(e).strip()})"
            ) from None
        actual = {"pad": sp.pad_id(), "eos": sp.eos_id(), "bos": sp.bos_id(), "unk": sp.unk_id()}
        if actual != _SPECIAL_IDS:
            raise TokenizerError(
                f"{self._model_path}: special ids are {actual}, expected {_SPECIAL_IDS} "
                "(the model was not trained by docnmt_jax.data.tokenizer)"
            )
        self._sp = sp

    @property
    def model_path(self) -> str:
        return self._model_path

    @property
    def vocab_size(self) -> int:
        return self._sp.GetPieceSize()

    @property
    def pad_id(self) -> int:
        return PAD_ID

    @property
    def eos_id(self) -> int:
        return EOS_ID

    @property
    def bos_id(self) -> int:
        return BOS_ID

    @property
    def unk_id(self) -> int:
        return UNK_ID

    @property
    def processor(self) -> spm.SentencePieceProcessor:
        """The underlying ``SentencePieceProcessor``."""
        return self._sp

    def encode(self, text: str) -> list[int]:
        """Piece ids of ``text``; no BOS/EOS is added."""
        return self._sp.EncodeAsIds(text)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Piece ids of each text (multi-threaded); no BOS/EOS is added."""
        if not texts:
            return []
        return self._sp.Encode(list(texts), out_type=int, num_threads=self._num_threads)

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids`` up to (excluding) the first EOS; PAD and BOS are ignored.

        Accepts any iterable of integers (lists, numpy/JAX arrays).
        """
        out: list[int] = []
        for i in ids:
            i = int(i)
            if i == EOS_ID:
                break
            if i != PAD_ID and i != BOS_ID:
                out.append(i)
        return self._sp.DecodeIds(out)

    def decode_batch(self, batch: Iterable[Iterable[int]]) -> list[str]:
        """:meth:`decode` applied to each row."""
        return [self.decode(ids) for ids in batch]

    def id_to_piece(self, i: int) -> str:
        return self._sp.IdToPiece(int(i))

    def __repr__(self) -> str:
        return f"Tokenizer({self._model_path!r}, vocab_size={self.vocab_size})"


def load_tokenizer(model_path: str | os.PathLike, num_threads: int = -1) -> Tokenizer:
    """Loads a model; FileNotFoundError if missing, ValueError if not a valid model for us."""
    return Tokenizer(model_path, num_threads=num_threads)


def _sentences(documents: Sequence[Document]) -> Iterator[str]:
    for doc in documents:
        yield from doc.src
        yield from doc.tgt


_TOO_HIGH = re.compile(r"Vocabulary size too high \((\d+)\).*<= (\d+)")
_TOO_LOW = re.compile(r"Vocabulary size is smaller than required_chars\. (\d+) vs (\d+)")


def train_tokenizer(
    documents: Sequence[Document],
    model_path: str | os.PathLike,
    vocab_size: int = 8000,
    model_type: str = "unigram",
    character_coverage: float = 1.0,
    num_threads: int = 1,
    max_sentence_length: int = 1 << 16,
    normalization_rule_name: str = "nmt_nfkc",
    user_defined_symbols: Sequence[str] = (),
) -> Tokenizer:
    """Trains a joint model on the source and target sentences of ``documents``.

    Pass the *training split only*. Writes ``model_path`` atomically (the ``.vocab`` file
    is not written) and returns it loaded. Deterministic for fixed inputs and options.
    Raises ValueError if ``vocab_size`` is infeasible for this corpus, naming the feasible
    bound.
    """
    model_path = os.fspath(model_path)
    n_sentences = sum(2 * len(d) for d in documents)
    if n_sentences == 0:
        raise TokenizerError(f"{model_path}: cannot train a tokenizer on an empty corpus")
    options = dict(
        model_type=model_type,
        vocab_size=vocab_size,
        character_coverage=character_coverage,
        byte_fallback=True,
        pad_id=PAD_ID,
        eos_id=EOS_ID,
        bos_id=BOS_ID,
        unk_id=UNK_ID,
        pad_piece="<pad>",
        eos_piece="</s>",
        bos_piece="<s>",
        unk_piece="<unk>",
        hard_vocab_limit=True,
        input_sentence_size=0,
        shuffle_input_sentence=False,
        num_threads=num_threads,
        max_sentence_length=max_sentence_length,
        normalization_rule_name=normalization_rule_name,
        minloglevel=2,
    )
    if user_defined_symbols:
        options["user_defined_symbols"] = list(user_defined_symbols)
    _write_atomically(model_path, _train_model_bytes(documents, options, n_sentences))
    tok = Tokenizer(model_path)
    logging.info(
        "Trained %s sentencepiece model %s: vocab size %d, %d training sentences.",
        model_type,
        model_path,
        tok.vocab_size,
        n_sentences,
    )
    return tok


def _train_model_bytes(documents: Sequence[Document], options: dict, n_sentences: int) -> bytes:
    """The serialised sentencepiece model trained on ``documents`` with ``options``; an
    infeasible vocabulary size is a TokenizerError naming the feasible bound."""
    vocab_size = options["vocab_size"]
    writer = _BytesSink()
    try:
        spm.SentencePieceTrainer.Train(
            sentence_iterator=_sentences(documents), model_writer=writer, **options
        )
    except RuntimeError as e:
        msg = str(e)
        if m := _TOO_HIGH.search(msg):
            raise TokenizerError(
                f"vocab_size={vocab_size} is too large for this training corpus "
                f"({n_sentences} sentences): the largest feasible size is {m.group(2)}"
            ) from None
        if m := _TOO_LOW.search(msg):
            raise TokenizerError(
                f"vocab_size={vocab_size} is too small for this training corpus: "
                f"byte_fallback (256 byte pieces), 4 special pieces and the corpus's characters "
                f"need at least {m.group(2)}"
            ) from None
        raise TokenizerError(f"sentencepiece training failed: {msg.strip()}") from None
    return writer.data


def _write_atomically(model_path: str, data: bytes) -> None:
    """Write ``data`` to ``model_path`` through a temporary file and a rename."""
    directory = os.path.dirname(os.path.abspath(model_path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".spm-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, model_path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


class _BytesSink:
    """A minimal ``model_writer`` for ``SentencePieceTrainer``."""

    def __init__(self) -> None:
        self.data = b""

    def write(self, data: bytes) -> None:
        self.data += data


def get_or_train_tokenizer(
    model_path: str | os.PathLike,
    documents: Sequence[Document],
    vocab_size: int = 8000,
    **train_kwargs,
) -> Tokenizer:
    """Loads ``model_path`` if it exists (e.g. on resume), else trains it on ``documents``.

    A reused model must have ``vocab_size`` pieces; otherwise ValueError (delete the file or
    fix the configuration). ``train_kwargs`` go to :func:`train_tokenizer`.
    """
    model_path = os.fspath(model_path)
    if os.path.exists(model_path):
        tok = Tokenizer(model_path)
        if tok.vocab_size != vocab_size:
            raise TokenizerError(
                f"{model_path}: existing tokenizer has vocab size {tok.vocab_size}, but "
                f"{vocab_size} was requested; delete the file to retrain or fix the config"
            )
        logging.info("Reusing sentencepiece model %s (vocab size %d).", model_path, vocab_size)
        return tok
    return train_tokenizer(documents, model_path, vocab_size=vocab_size, **train_kwargs)
