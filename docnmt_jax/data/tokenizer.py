"""A joint source/target sentencepiece tokenizer with fixed special ids.

Special ids are the same for every model this module trains or accepts:

* ``PAD_ID = 0``: padding; never produced by :meth:`Tokenizer.encode`.
* ``EOS_ID = 1``: end of sequence; :meth:`Tokenizer.decode` stops at the first one.
* ``BOS_ID = 2``: beginning of sequence / decoder start; skipped by ``decode``.
* ``UNK_ID = 3``: unknown piece (rare: ``byte_fallback`` spells unseen characters as bytes).

A model trained elsewhere (``config.data.tokenizer=PATH``) with other special ids -- e.g.
sentencepiece's defaults ``unk=0, bos=1, eos=2`` and no pad -- is accepted by mapping ids: its
unk/bos/eos/pad pieces take the ids above, its other pieces ``4, 5, ...`` in the model's own
order (:class:`Tokenizer` holds the two numpy tables), so every model, the vocabulary size
(the mapped one) and checkpoints see only the ids above. Such a model round-trips unseen
characters only if it was trained with ``byte_fallback``; its unknown text decodes as its unk
piece. A model without an unknown piece cannot be mapped (sentencepiece refuses it too): a
:class:`TokenizerError` says so.

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

import numpy as np
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


#: The pieces of the fixed ids, for a mapped model that has no piece of that role.
_SPECIAL_PIECES = {PAD_ID: "<pad>", EOS_ID: "</s>", BOS_ID: "<s>", UNK_ID: "<unk>"}


def _load_processor(model_path: str) -> spm.SentencePieceProcessor:
    """The sentencepiece model at ``model_path``; not one, or one without an unknown piece, is
    a one-line :class:`TokenizerError`."""
    sp = spm.SentencePieceProcessor()
    try:
        sp.Load(model_file=model_path)
    except (OSError, RuntimeError) as e:
        reason = str(e).strip()
        if "unk is not defined" in reason:
            raise TokenizerError(
                f"{model_path}: the sentencepiece model has no unknown piece (type UNKNOWN, "
                "e.g. <unk>), so its ids cannot be mapped to docnmt_jax's (which need one for "
                "unseen text); retrain it with an unk piece"
            ) from None
        raise TokenizerError(f"{model_path}: not a sentencepiece model ({reason})") from None
    return sp


def _id_tables(sp: spm.SentencePieceProcessor) -> tuple[np.ndarray, np.ndarray] | None:
    """``(to_internal, to_model)``: the internal id of each of the model's piece ids and the
    model's id of each internal id (-1: an internal special the model has no piece for); None
    when the model already has the fixed ids."""
    roles = {"pad": sp.pad_id(), "eos": sp.eos_id(), "bos": sp.bos_id(), "unk": sp.unk_id()}
    if roles == _SPECIAL_IDS:
        return None
    special = {model_id: _SPECIAL_IDS[role] for role, model_id in roles.items() if model_id >= 0}
    to_internal = np.empty(sp.GetPieceSize(), dtype=np.int64)
    next_id = len(_SPECIAL_IDS)
    for model_id in range(sp.GetPieceSize()):
        if model_id in special:
            to_internal[model_id] = special[model_id]
        else:
            to_internal[model_id], next_id = next_id, next_id + 1
    to_model = np.full(next_id, -1, dtype=np.int64)
    to_model[to_internal] = np.arange(sp.GetPieceSize())
    return to_internal, to_model


class Tokenizer:
    """A loaded sentencepiece model; its ids are :data:`PAD_ID` ... :data:`UNK_ID` then the
    other pieces (a model trained elsewhere is mapped: see the module doc)."""

    def __init__(self, model_path: str | os.PathLike, num_threads: int = -1):
        """Loads ``model_path``; ``num_threads`` is for :meth:`encode_batch` (-1: all cores)."""
        self._model_path = os.fspath(model_path)
        self._num_threads = num_threads
        if not os.path.isfile(self._model_path):
            raise RunNotFoundError(errno.ENOENT, "sentencepiece model not found", self._model_path)
        self._sp = _load_processor(self._model_path)
        tables = _id_tables(self._sp)
        self._to_internal, self._to_model = tables if tables is not None else (None, None)
        if tables is not None:
            logging.info(
                "Tokenizer %s: special ids unk=%d bos=%d eos=%d pad=%d mapped to docnmt_jax's "
                "(vocab size %d).",
                self._model_path,
                self._sp.unk_id(),
                self._sp.bos_id(),
                self._sp.eos_id(),
                self._sp.pad_id(),
                self.vocab_size,
            )

    @property
    def model_path(self) -> str:
        return self._model_path

    @property
    def vocab_size(self) -> int:
        """The number of internal ids (a mapped model: its pieces plus the fixed ids it lacks)."""
        if self._to_model is not None:
            return len(self._to_model)
        return self._sp.GetPieceSize()

    @property
    def maps_ids(self) -> bool:
        """Whether the model's own ids differ from the internal ones (a model trained elsewhere)."""
        return self._to_internal is not None

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
        """The underlying ``SentencePieceProcessor``: its ids are the model file's own (see
        :attr:`maps_ids`); use this class's methods for internal ids."""
        return self._sp

    def _internal(self, ids: list[int]) -> list[int]:
        if self._to_internal is None or not ids:
            return ids
        return self._to_internal[np.asarray(ids, dtype=np.int64)].tolist()

    def encode(self, text: str) -> list[int]:
        """Piece ids of ``text``; no BOS/EOS is added."""
        return self._internal(self._sp.EncodeAsIds(text))

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Piece ids of each text (multi-threaded); no BOS/EOS is added."""
        if not texts:
            return []
        rows = self._sp.Encode(list(texts), out_type=int, num_threads=self._num_threads)
        return rows if self._to_internal is None else [self._internal(r) for r in rows]

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
        if self._to_model is not None and out:
            out = self._to_model[np.asarray(out, dtype=np.int64)].tolist()
        return self._sp.DecodeIds(out)

    def decode_batch(self, batch: Iterable[Iterable[int]]) -> list[str]:
        """:meth:`decode` applied to each row."""
        return [self.decode(ids) for ids in batch]

    def id_to_piece(self, i: int) -> str:
        """The piece of internal id ``i``."""
        if self._to_model is None:
            return self._sp.IdToPiece(int(i))
        model_id = int(self._to_model[int(i)])
        return self._sp.IdToPiece(model_id) if model_id >= 0 else _SPECIAL_PIECES[int(i)]

    def piece_to_id(self, piece: str) -> int:
        """The internal id of ``piece`` (:data:`UNK_ID` for a piece not in the model)."""
        return self._internal([self._sp.PieceToId(piece)])[0]

    def __repr__(self) -> str:
        return f"Tokenizer({self._model_path!r}, vocab_size={self.vocab_size})"


def load_tokenizer(model_path: str | os.PathLike, num_threads: int = -1) -> Tokenizer:
    """Loads a model; FileNotFoundError if missing, ValueError (:class:`TokenizerError`) if
    it is not a sentencepiece model or cannot be mapped to the fixed ids."""
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
