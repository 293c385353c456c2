"""Translate documents with a trained run.

    python launch/translate.py --workdir runs/NAME --input FILE --output FILE \\
        [--beam 5 --alpha 0.6 --batch_tokens 4096 --checkpoint best|latest|STEP]
        [--mesh DATA,FSDP,MODEL] [--sentences]

Input: TSV ``doc_id<TAB>src[<TAB>tgt]`` (header optional) or plain text with a blank line
between documents. Output: TSV ``doc_id<TAB>hyp`` with a header, one row per input sentence, in
input order, detokenised. The input is streamed block by block, so memory does not grow with
its size; sentences/s, tokens/s and the number of compilations are printed at the end.

``--sentences`` translates every sentence as its own one-sentence document (no context:
Zheng et al. 2020, Table 2; ``--block_documents`` then counts one-sentence documents); the
output keeps the input's doc ids and order. ``launch/analyze.py single-sentence`` scores it
against the document translation.

``--random_context_seed N`` translates a document model's input with draw ``N`` of random
contexts (Jean & Cho 2019: every sentence sees only other documents' sentences, as
:func:`~docnmt_jax.evaluation.context_marginal.random_context_corpus` lays them; the whole
input is read at once, since contexts are drawn from all of it); the output keeps the input's
documents and order. ``launch/evaluate.py --workdir`` runs the whole measurement.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from absl import app, flags, logging
from tqdm.auto import tqdm

from docnmt_jax import cli
from docnmt_jax.data.documents import Document
from docnmt_jax.data.readers import iter_source_documents
from docnmt_jax.decoding.search import SearchConfig
from docnmt_jax.decoding.translator import Translator
from docnmt_jax.errors import RunNotFoundError, UserError
from docnmt_jax.evaluation.analysis import single_sentence_stream
from docnmt_jax.evaluation.context_marginal import translate_with_random_context
from docnmt_jax.files import atomic_open
from docnmt_jax.training.restore import load_translator

_WORKDIR = flags.DEFINE_string("workdir", None, "Training run directory (config.json, spm.model).")
_INPUT = flags.DEFINE_string("input", None, "File to translate (TSV or blank-line-separated text).")
_OUTPUT = flags.DEFINE_string("output", None, "Output TSV doc_id<TAB>hyp.")
_BEAM = flags.DEFINE_integer("beam", 5, "Beam size; 1 = greedy.")
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
_MESH = flags.DEFINE_string(
    "mesh",
    "",
    "Search on a device mesh: sizes DATA,FSDP,MODEL (-1: the rest of the devices), e.g. 8,1,1 "
    "or -1,1,2; empty: one device.",
)
flags.mark_flags_as_required(["workdir", "input", "output"])


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
    print(f"random contexts (seed {seed}): {100 * coverage:.1f}% of sentences saw other documents")
    return zip((d.doc_id for d in docs), hyps, strict=True)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    logging.set_verbosity(logging.WARNING)
    if _SENTENCES.value and _RANDOM_SEED.value is not None:
        raise app.UsageError("--sentences translates without context: no --random_context_seed")
    search = SearchConfig(
        beam_size=_BEAM.value,
        alpha=_ALPHA.value,
        len_a=_LEN_A.value,
        len_b=_LEN_B.value,
        max_len=_MAX_LEN.value,
    )
    if not os.path.isfile(_INPUT.value):  # before the model loads
        raise RunNotFoundError(f"--input={_INPUT.value}: no such file")
    translator, step = load_translator(
        _WORKDIR.value,
        _CHECKPOINT.value,
        search,
        batch_tokens=_BATCH_TOKENS.value,
        mesh=parse_mesh(_MESH.value),
        max_source_tokens=_MAX_SOURCE.value,
        params=_PARAMS.value,
        dtype=_DTYPE.value,
    )
    translator.source_file = _INPUT.value  # a sentence too long for the model: FILE:LINE
    alone = ", every sentence alone" if _SENTENCES.value else ""
    print(
        f"translating {_INPUT.value} with {_WORKDIR.value} step {step}, beam "
        f"{search.beam_size}{alone}"
    )
    documents = ((doc_id, sents) for doc_id, sents, _ in iter_source_documents(_INPUT.value))
    if _RANDOM_SEED.value is not None:
        documents = random_context_stream(translator, list(documents), _RANDOM_SEED.value)
    with atomic_open(_OUTPUT.value) as out, tqdm(unit="doc") as bar:
        out.write("doc_id\thyp\n")
        if _RANDOM_SEED.value is not None:
            stream = documents
        elif _SENTENCES.value:
            stream = single_sentence_stream(translator, documents, _BLOCK.value)
        else:
            stream = translator.translate_stream(documents, _BLOCK.value)
        for doc_id, hyps in stream:
            for hyp in hyps:
                out.write(f"{doc_id}\t{hyp.replace(chr(9), ' ')}\n")
            bar.update(1)
        if bar.n == 0:  # nothing to translate: no output file either
            raise UserError(f"{_INPUT.value}: no documents (the file is empty or blank)")
    print(f"wrote {_OUTPUT.value}: {translator.stats.summary()}")


if __name__ == "__main__":
    cli.run(main)


def run() -> None:
    """The ``docnmt-translate`` command (``python launch/translate.py``)."""
    cli.run(main)
