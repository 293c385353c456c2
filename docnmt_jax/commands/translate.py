"""Translate documents with a trained run (or an exported release).

    docnmt-translate --workdir runs/NAME [--input FILE|-] [--output FILE|-] \\
        [--beam 5 --alpha 0.6 --batch_tokens 4096 --checkpoint best|latest|STEP]
        [--nbest N] [--sample --temperature T --top_k K --top_p P --seed S]
        [--output_format auto|tsv|text] [--interactive] [--mesh DATA,FSDP,MODEL] [--sentences]
        [--document_unit chapter|book]

Input (``-``, standard input, by default): TSV ``doc_id<TAB>src[<TAB>tgt]`` (header
optional) or plain text with a blank line between documents, detected from the first
non-blank line. Output (``-``, standard output, by default) in the input's shape unless
``--output_format`` says otherwise: TSV ``doc_id<TAB>hyp`` with a header, or plain text
line for line with the input (``cat src.txt | docnmt-translate --workdir R | sacrebleu
ref.txt``); ``--nbest N`` writes the N best of every sentence with their scores
(:mod:`~docnmt_jax.commands.translate_io`). Messages go to standard error. A file input is
streamed block by block, so memory does not grow with its size; sentences/s, tokens/s and the
number of compilations are printed at the end.

``--sample`` draws ``--nbest`` samples per sentence (default one) from the model's distribution
(``--temperature``, ``--top_k``, ``--top_p``, ``--seed``) instead of searching; the best-scoring
one is the translation. ``--interactive`` translates each input line as it arrives, keeping
the document's earlier sentences as context until a blank line (past-only context:
:mod:`docnmt_jax.api`), and flushes after each line.

``--sentences`` translates every sentence as its own one-sentence document (no context:
Zheng et al. 2020, Table 2; ``--block_documents`` then counts one-sentence documents); the
output keeps the input's doc ids and order. ``docnmt-analyze single-sentence`` scores it
against the document translation.

``--document_unit=book`` translates the consecutive chapters of a book (TSV doc ids
``BOOK.CHAPTER``, e.g. ``Ps.23``) as one document (:mod:`docnmt_jax.data.document_units`); the
output keeps every chapter's doc id, so ``docnmt-evaluate`` scores it by chapter. Default: the
run's ``config.data.document_unit`` (chapter when it has none; a plain-text input's documents
stay as they are).

``--random_context_seed N`` translates a document model's input with draw ``N`` of random
contexts (Jean & Cho 2019: every sentence sees only other documents' sentences, as
:func:`~docnmt_jax.evaluation.context_marginal.random_context_corpus` lays them; the whole
input is read at once, since contexts are drawn from all of it); the output keeps the input's
documents and order. ``docnmt-evaluate --workdir`` runs the whole measurement.
"""

from __future__ import annotations

import collections
import os
import sys
from collections.abc import Iterable, Iterator
from typing import Any

from absl import app, flags, logging
from tqdm.auto import tqdm

from docnmt_jax import cli
from docnmt_jax.api import load
from docnmt_jax.commands.translate_io import (
    OUTPUT_FORMATS,
    OutputWriter,
    input_path,
    interactive_loop,
    output_stream,
    resolved_format,
)
from docnmt_jax.data import document_units, readers
from docnmt_jax.data.documents import Document, Origin
from docnmt_jax.data.readers import iter_source_documents
from docnmt_jax.decoding.search import SearchConfig
from docnmt_jax.decoding.translator import Translator
from docnmt_jax.errors import RunNotFoundError, UserError
from docnmt_jax.evaluation.analysis import single_sentence_stream
from docnmt_jax.evaluation.context_marginal import translate_with_random_context
from docnmt_jax.training.restore import load_config, load_translator

_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Training run directory (config.json, spm.model) or an exported release."
)
_INPUT = flags.DEFINE_string(
    "input", "-", "File to translate (TSV or blank-line-separated text); - = standard input."
)
_OUTPUT = flags.DEFINE_string("output", "-", "Output file; - = standard output.")
_OUTPUT_FORMAT = flags.DEFINE_enum(
    "output_format", "auto", list(OUTPUT_FORMATS), "tsv, text, or auto: the input's format."
)
_INTERACTIVE = flags.DEFINE_bool(
    "interactive",
    False,
    "Translate each line as it arrives, the document's earlier lines as context until a "
    "blank line; flush after each line.",
)
_BEAM = flags.DEFINE_integer("beam", 5, "Beam size; 1 = greedy.")
_NBEST = flags.DEFINE_integer(
    "nbest", 1, "Write the N best hypotheses of every sentence with their scores (N <= beam)."
)
_SAMPLE = flags.DEFINE_bool(
    "sample", False, "Draw --nbest samples per sentence instead of searching."
)
_TEMPERATURE = flags.DEFINE_float("temperature", 1.0, "Sampling: divides the logits.")
_TOP_K = flags.DEFINE_integer("top_k", 0, "Sampling: keep the K most probable tokens; 0: all.")
_TOP_P = flags.DEFINE_float(
    "top_p", 1.0, "Sampling: keep the most probable tokens holding mass P; 1: all."
)
_SEED = flags.DEFINE_integer("seed", 0, "Sampling: the seed of the draws.")
_ALPHA = flags.DEFINE_float("alpha", 0.6, "Length penalty exponent: ((5 + len) / 6) ** alpha.")
_LEN_A = flags.DEFINE_float("len_a", 1.5, "Output limit: len_a * source tokens + len_b.")
_LEN_B = flags.DEFINE_integer("len_b", 10, "Output limit: len_a * source tokens + len_b.")
_MAX_LEN = flags.DEFINE_integer(
    "max_len",
    256,
    "Absolute output limit in tokens (incl. EOS); a batch of sentences longer than the default "
    "source bucket gets max(max_len, len_a * its length + len_b).",
)
_MAX_SOURCE = flags.DEFINE_integer(
    "max_source_tokens",
    1024,
    "Longest source sentence (tokens incl. EOS) translated; a longer one stops the run with an "
    "error naming its line (nothing is cut).",
)
_BATCH_TOKENS = flags.DEFINE_integer("batch_tokens", 4096, "Padded source tokens per batch.")
_BLOCK = flags.DEFINE_integer("block_documents", 256, "Documents read and translated at a time.")
_CHECKPOINT = flags.DEFINE_string(
    "checkpoint",
    "best",
    "best, latest, averaged (launch/average_checkpoints.py) or a step number.",
)
_PARAMS = flags.DEFINE_enum(
    "params",
    "auto",
    ["auto", "ema", "raw"],
    "Parameter set: the EMA when the run keeps one (auto), the EMA, or the raw parameters.",
)
_DTYPE = flags.DEFINE_enum(
    "dtype",
    "",
    ["", "float32", "bfloat16"],
    "Computation dtype of the search (parameters stay float32); empty: the run's model.dtype.",
)
_RANDOM_SEED = flags.DEFINE_integer(
    "random_context_seed", None, "Translate with this draw of random contexts (document models)."
)
_SENTENCES = flags.DEFINE_bool(
    "sentences",
    False,
    "Translate every sentence as its own one-sentence document (no context; Table 2).",
)
_DOCUMENT_UNIT = flags.DEFINE_enum(
    "document_unit",
    "",
    ["", *document_units.UNITS],
    "book: translate a book's consecutive chapters (TSV doc ids BOOK.CHAPTER) as one document, "
    "the output keeping the chapter doc ids; empty: the run's config.data.document_unit.",
)
_MESH = flags.DEFINE_string(
    "mesh",
    "",
    "Search on a device mesh: sizes DATA,FSDP,MODEL (-1: the rest of the devices), e.g. 8,1,1 "
    "or -1,1,2; empty: one device.",
)
flags.mark_flags_as_required(["workdir"])


def parse_mesh(text: str) -> dict[str, int] | None:
    """``"DATA,FSDP,MODEL"`` -> ``{"data", "fsdp", "model"}`` sizes; ``""`` -> ``None``."""
    if not text:
        return None
    parts = text.split(",")
    try:
        sizes = [int(p) for p in parts]
    except ValueError:
        sizes = []
    if len(sizes) != 3:
        raise app.UsageError(f"--mesh={text!r}: expected three integers DATA,FSDP,MODEL")
    return dict(zip(("data", "fsdp", "model"), sizes, strict=True))


def random_context_stream(
    translator: Translator, documents: list[tuple[str, list[str]]], seed: int
) -> Iterator[tuple[str, list[str]]]:
    """``(doc_id, translations)`` of ``documents`` translated with random-context draw
    ``seed``; a sentence-level model raises ``ContextUsageError`` (a user error)."""
    docs = [Document(doc_id, tuple(s), ("",) * len(s)) for doc_id, s in documents]
    hyps, coverage = translate_with_random_context(translator, docs, seed)
    print(
        f"random contexts (seed {seed}): {100 * coverage:.1f}% of sentences saw other documents",
        file=sys.stderr,
    )
    return zip((d.doc_id for d in docs), hyps, strict=True)


def search_options() -> dict[str, Any]:
    """The search flags as :class:`SearchConfig` fields (a bad combination: one line)."""
    options = dict(
        beam_size=_BEAM.value,
        alpha=_ALPHA.value,
        len_a=_LEN_A.value,
        len_b=_LEN_B.value,
        max_len=_MAX_LEN.value,
        nbest=_NBEST.value,
        sample=_SAMPLE.value,
        temperature=_TEMPERATURE.value,
        top_k=_TOP_K.value,
        top_p=_TOP_P.value,
        seed=_SEED.value,
    )
    try:
        SearchConfig(**options)
    except ValueError as e:
        raise app.UsageError(str(e)) from None
    return options


def check_flags(argv: list[str]) -> None:
    """Flag combinations that cannot work, before the model loads."""
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    alone = _SENTENCES.value or _RANDOM_SEED.value is not None
    if _SENTENCES.value and _RANDOM_SEED.value is not None:
        raise app.UsageError("--sentences translates without context: no --random_context_seed")
    if _NBEST.value > 1 and alone:
        raise app.UsageError("--nbest goes with a plain translation: no --sentences or random")
    if _INTERACTIVE.value and (
        alone or _NBEST.value > 1 or _INPUT.value != "-" or _DOCUMENT_UNIT.value == "book"
    ):
        raise app.UsageError(
            "--interactive reads standard input and writes one translation per line: no "
            "--input, --nbest, --sentences, --random_context_seed or --document_unit=book"
        )
    if _NBEST.value > 1 and _OUTPUT_FORMAT.value == "text":
        raise app.UsageError("--nbest writes its own TSV (with scores): no --output_format=text")
    if _INPUT.value not in ("-", "/dev/stdin") and not os.path.isfile(_INPUT.value):
        raise RunNotFoundError(f"--input={_INPUT.value}: no such file")


def say(text: str) -> None:
    """A message on standard error (standard output may be the translation)."""
    print(text, file=sys.stderr, flush=True)


def main(argv: list[str]) -> None:
    check_flags(argv)
    logging.set_verbosity(logging.WARNING)
    options = search_options()
    if _INTERACTIVE.value:
        model = load(
            _WORKDIR.value, _CHECKPOINT.value, _PARAMS.value, _DTYPE.value, _BATCH_TOKENS.value
        )
        say(f"translating standard input line by line with {_WORKDIR.value} step {model.step}")
        interactive_loop(model, options, sys.stdin, sys.stdout)
        return
    translator, step = load_translator(
        _WORKDIR.value,
        _CHECKPOINT.value,
        SearchConfig(**options),
        batch_tokens=_BATCH_TOKENS.value,
        mesh=parse_mesh(_MESH.value),
        max_source_tokens=_MAX_SOURCE.value,
        params=_PARAMS.value,
        dtype=_DTYPE.value,
    )
    with input_path(_INPUT.value) as path:
        try:
            translate_file(translator, step, path)
        except UserError as e:  # name standard input as the user knows it
            if path == _INPUT.value:
                raise
            raise UserError(str(e).replace(path, "<stdin>")) from None
    target = "standard output" if _OUTPUT.value == "-" else _OUTPUT.value
    say(f"wrote {target}: {translator.stats.summary()}")


def document_unit(path: str) -> str:
    """The unit ``path``'s documents are translated in: ``--document_unit``, else the run's
    ``config.data.document_unit`` (a plain-text input: its own documents), else chapter."""
    if _DOCUMENT_UNIT.value == "book" and not readers.is_tsv(path):
        raise UserError(
            f"{path}: --document_unit=book needs a TSV input (doc ids BOOK.CHAPTER); plain text "
            "has no books"
        )
    if _DOCUMENT_UNIT.value:
        return _DOCUMENT_UNIT.value
    unit = load_config(_WORKDIR.value).data.get("document_unit", "chapter")
    return unit if readers.is_tsv(path) else "document"


def translate_file(translator: Translator, step: int, path: str) -> None:
    """Translates the file at ``path`` to ``--output`` in the chosen format."""
    translator.source_file = path  # a sentence too long for the model: FILE:LINE
    unit = document_unit(path)
    alone = ", every sentence alone" if _SENTENCES.value else ""
    books = ", a book as one document" if unit == "book" else ""
    name = "standard input" if _INPUT.value in ("-", "/dev/stdin") else _INPUT.value
    say(f"translating {name} with {_WORKDIR.value} step {step}, beam {_BEAM.value}{alone}{books}")
    fmt = resolved_format(_OUTPUT_FORMAT.value, path)
    first_lines: collections.deque[int] = collections.deque()

    def files_documents() -> Iterator[Document]:
        for doc_id, sentences, first_line in iter_source_documents(path):
            first_lines.append(first_line)
            origin = Origin(path, first_line, path, first_line)
            yield Document(doc_id, tuple(sentences), ("",) * len(sentences), origin)

    def translated(documents: Iterator[tuple[str, list[str]]]) -> Iterable[tuple[str, list[Any]]]:
        if _RANDOM_SEED.value is not None:
            return random_context_stream(translator, list(documents), _RANDOM_SEED.value)
        if _SENTENCES.value:
            return single_sentence_stream(translator, documents, _BLOCK.value)
        return translator.translate_stream(documents, _BLOCK.value, _NBEST.value > 1)

    stream: Iterable[tuple[str, list[Any]]]
    if unit == "book":  # books translated, written back as their chapters
        stream = document_units.translated_by_book(files_documents(), translated)
    else:
        stream = translated((d.doc_id, list(d.src)) for d in files_documents())
    with output_stream(_OUTPUT.value) as out, tqdm(unit="doc", file=sys.stderr) as bar:
        writer = OutputWriter(out, fmt, _NBEST.value > 1, line_aligned=not readers.is_tsv(path))
        for doc_id, hyps in stream:
            writer.write(doc_id, hyps, first_lines.popleft())
            bar.update(1)
        if bar.n == 0:  # nothing to translate: no output file either
            raise UserError(f"{path}: {readers.NO_DOCUMENTS}")
    if writer.empty_lines:
        say(f"note: {writer.empty_lines} empty translations are blank lines in the text output")


def run() -> None:
    """The ``docnmt-translate`` command (``python launch/translate.py``)."""
    cli.run(main)


if __name__ == "__main__":
    run()
