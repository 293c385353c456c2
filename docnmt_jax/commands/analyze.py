"""Zheng et al. (2020)'s analyses of a trained run, for any registered model.

    python launch/analyze.py context-curve --workdir RUN --input TEST.tsv \\
        [--sizes 0,1,2,4,8,16,20] [--beam 5 --alpha 0.6 --checkpoint best] [--out DIR]
    python launch/analyze.py attention --workdir RUN --input TEST.tsv --doc DOC_ID \\
        [--chunk 0] [--checkpoint best] [--out DIR]
    python launch/analyze.py single-sentence --workdir RUN --input TEST.tsv \\
        [--beam 5 --alpha 0.6 --checkpoint best] [--out DIR]
    python launch/analyze.py source-use --workdir RUN --input TEST.tsv [--docs 6] \\
        [--max_len 128] [--checkpoint best] [--json FILE]

* ``context-curve`` (Fig. 3): every sentence translated with its previous ``k`` sentences as
  context, for every ``k`` of ``--sizes`` (the window document ``[i-k .. i]``, its last
  translation kept); writes ``context_curve.tsv`` (k, s_bleu, d_bleu, sentences,
  mean_context), ``context_curve.png`` and ``hyp.k{K}.tsv``, prints the table.
* ``attention`` (Fig. 4): the sentence-to-sentence attention of chunk ``--chunk`` (default:
  the first) of document ``--doc``; writes ``attention.DOC.chunkN.tsv`` and ``.png``.
* ``single-sentence`` (Table 2): the input translated as documents and every sentence as its
  own one-sentence document; prints s-BLEU and d-BLEU side by side, writes
  ``single_sentence.tsv`` and both translations.
* ``source-use``: does the model read its source? The teacher-forced log-likelihood per target
  token of the first ``--docs`` documents with their true sources, another document's and
  blank ones, and the encoder's token variance share on their largest chunk
  (:mod:`docnmt_jax.evaluation.source_use`); prints them, ``--json`` also writes them.

``--input`` is a corpus TSV ``doc_id<TAB>src<TAB>tgt`` (``attention`` reads only sources: also
``doc_id<TAB>src`` or plain text). Outputs go to ``--out`` (default ``RUN/analysis``), each
written through a temporary file. Readings, costs and what each model provides:
:mod:`docnmt_jax.evaluation.analysis` and docs/evaluation.md. A user mistake or a model that
cannot provide the analysis (e.g. a sentence model has no sentence attention) exits with
status 2 and one line ``analyze.py: error: ...``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os

from absl import logging

from docnmt_jax import cli
from docnmt_jax.data import readers
from docnmt_jax.data.documents import Document
from docnmt_jax.decoding.search import SearchConfig
from docnmt_jax.errors import UserError
from docnmt_jax.evaluation import analysis, context_marginal, source_use
from docnmt_jax.files import write_atomic
from docnmt_jax.training import restore

PROG = "analyze.py"


def parse_sizes(text: str) -> list[int]:
    """``"0,1,2"`` -> ``[0, 1, 2]``: distinct integers >= 0."""
    try:
        sizes = [int(part) for part in text.split(",")]
    except ValueError:
        raise UserError(f"--sizes={text!r}: expected integers separated by commas") from None
    if any(k < 0 for k in sizes):
        raise UserError(f"--sizes={text!r}: context sizes must be >= 0")
    if len(set(sizes)) != len(sizes):
        raise UserError(f"--sizes={text!r}: a size is repeated")
    return sizes


def build_parser() -> cli.ArgumentParser:
    parser = cli.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, text: str, search: bool) -> argparse.ArgumentParser:
        p = commands.add_parser(name, help=text, description=text)
        p.add_argument("--workdir", required=True, help="training run (config.json, checkpoints)")
        p.add_argument("--input", required=True, help="corpus TSV doc_id<TAB>src<TAB>tgt")
        p.add_argument("--checkpoint", default="best", help="best, latest or a step number")
        p.add_argument("--out", default=None, help="output directory (default RUN/analysis)")
        if search:
            p.add_argument("--beam", type=int, default=5, help="beam size; 1 = greedy")
            p.add_argument("--alpha", type=float, default=0.6, help="length penalty exponent")
            p.add_argument("--batch_tokens", type=int, default=4096, help="source tokens a batch")
        return p

    curve = command("context-curve", "Fig. 3: BLEU against the previous k sentences", True)
    curve.add_argument(
        "--sizes",
        default=",".join(map(str, analysis.DEFAULT_SIZES)),
        help="context sizes k, comma separated",
    )
    curve.add_argument("--quiet", action="store_true", help="no progress bars")
    attention = command("attention", "Fig. 4: sentence-to-sentence attention of a chunk", False)
    attention.add_argument("--doc", required=True, help="document id in --input")
    attention.add_argument("--chunk", type=int, default=0, help="chunk of the document (0: first)")
    single = command("single-sentence", "Table 2: document vs single-sentence BLEU", True)
    single.add_argument("--quiet", action="store_true", help="no progress bars")
    use = command("source-use", "does the model read its source? (likelihood, encodings)", False)
    use.add_argument("--docs", type=int, default=6, help="first documents of --input probed")
    use.add_argument("--max_len", type=int, default=128, help="longest sentence scored (tokens)")
    use.add_argument("--json", default="", help="also write the measures to this JSON file")
    return parser


def check_workdir(workdir: str) -> None:
    if not os.path.isfile(os.path.join(workdir, "config.json")):
        raise UserError(f"--workdir={workdir!r}: no config.json there (not a training run)")


def read_references(path: str) -> list[Document]:
    if not os.path.isfile(path):
        raise UserError(f"--input={path!r}: no such file")
    return readers.read_tsv(path)  # a file without documents: readers.NO_DOCUMENTS


def search_config(args: argparse.Namespace) -> SearchConfig:
    if args.beam < 1:
        raise UserError(f"--beam={args.beam}: must be >= 1")
    return SearchConfig(beam_size=args.beam, alpha=args.alpha)


def title(args: argparse.Namespace, model_name: str, step: int, what: str) -> str:
    run = os.path.basename(os.path.normpath(args.workdir))
    return f"{run} ({model_name}, step {step}): {what}"


def run_context_curve(args: argparse.Namespace) -> None:
    sizes = parse_sizes(args.sizes)
    search = search_config(args)
    check_workdir(args.workdir)
    documents = read_references(args.input)
    translator, step = restore.load_translator(
        args.workdir, args.checkpoint, search, batch_tokens=args.batch_tokens
    )
    model = translator.model
    print(
        f"context curve of {args.workdir} step {step} ({model.name}) on {args.input}, k = {sizes}"
    )
    points = analysis.context_curve(translator, documents, sizes, progress=not args.quiet)
    out = args.out or os.path.join(args.workdir, "analysis")
    paths = analysis.write_curve(
        points, documents, out, title(args, model.name, step, "BLEU against context size (Fig. 3)")
    )
    print(analysis.format_curve(points))
    print(f"wrote {', '.join(paths[:1] + paths[-1:])} and {len(paths) - 2} hypothesis files")


def run_attention(args: argparse.Namespace) -> None:
    check_workdir(args.workdir)
    if not os.path.isfile(args.input):
        raise UserError(f"--input={args.input!r}: no such file")
    found = None
    ids = []
    for doc_id, sentences, _ in readers.iter_source_documents(args.input):
        ids.append(doc_id)
        if doc_id == args.doc:
            found = Document(doc_id, tuple(sentences), ("",) * len(sentences))
            break
    if found is None:
        shown = ", ".join(repr(i) for i in ids[:5]) + (" ..." if len(ids) > 5 else "")
        raise UserError(f"--doc={args.doc!r} is not a document of {args.input} ({shown})")
    translator, step = restore.load_translator(args.workdir, args.checkpoint, SearchConfig())
    model = translator.model
    amap = analysis.attention_map(
        model,
        translator.params,
        translator.tokenizer.encode_batch,
        translator.pipeline_config,
        found,
        args.chunk,
    )
    out = args.out or os.path.join(args.workdir, "analysis")
    prefix = os.path.join(out, f"attention.{analysis.file_name(args.doc)}.chunk{args.chunk}")
    first, last = amap.sentences[0], amap.sentences[-1]
    what = (
        f"sentence attention, {args.doc} sentences {first}-{last} "
        f"(chunk {args.chunk + 1} of {amap.chunks}; Fig. 4)"
    )
    paths = analysis.write_attention(amap, prefix, title(args, model.name, step, what))
    print(f"{what}: {len(amap.sentences)} sentences")
    print(f"wrote {paths[0]}, {paths[1]}")


def run_single_sentence(args: argparse.Namespace) -> None:
    search = search_config(args)
    check_workdir(args.workdir)
    documents = read_references(args.input)
    translator, step = restore.load_translator(
        args.workdir, args.checkpoint, search, batch_tokens=args.batch_tokens
    )
    print(f"single-sentence translation of {args.input} with {args.workdir} step {step}")
    result = analysis.single_sentence_comparison(translator, documents, progress=not args.quiet)
    out = args.out or os.path.join(args.workdir, "analysis")
    paths = analysis.write_single_sentence(result, documents, out)
    print(analysis.format_single_sentence(result))
    print(f"wrote {', '.join(paths)}")


def run_source_use(args: argparse.Namespace) -> None:
    if args.docs < 2:
        raise UserError(f"--docs={args.docs}: needs at least 2 documents to swap sources")
    check_workdir(args.workdir)
    documents = read_references(args.input)[: args.docs]
    if len(documents) < 2:
        raise UserError(f"--input={args.input!r}: needs at least 2 documents to swap sources")
    translator, step = restore.load_translator(args.workdir, args.checkpoint, SearchConfig())
    model, params = translator.model, translator.params
    config = dataclasses.replace(
        translator.pipeline_config,
        max_src_len=args.max_len,
        max_tgt_len=args.max_len,
        sequential_sentences=False,
    )
    score = context_marginal.sentence_scorer(model, params, translator.tokenizer, config)
    measured = source_use.source_sensitivity(score, documents)
    share, tokens = source_use.largest_chunk_share(
        model, params, translator.tokenizer.encode_batch, config, documents
    )
    result = {
        "workdir": args.workdir,
        "step": step,
        "model": model.name,
        "documents": len(documents),
        "target_tokens": measured.tokens,
        "loglik_true": measured.true,
        "loglik_other_sources": measured.other,
        "loglik_blank_sources": measured.blank,
        "drop_other_sources": measured.drop_other,
        "drop_blank_sources": measured.drop_blank,
        "token_variance_share": share,
        "largest_chunk_tokens": tokens,
    }
    print(
        f"{args.workdir} step {step} ({model.name}), first {len(documents)} documents of "
        f"{args.input}, {measured.tokens} target tokens\n"
        f"log-likelihood per target token: true sources {measured.true:.4f}, another "
        f"document's {measured.other:.4f} (drop {measured.drop_other:.4f}), blank "
        f"{measured.blank:.4f} (drop {measured.drop_blank:.4f})\n"
        f"encoder token variance share on the largest chunk ({tokens} source tokens): "
        f"{share:.4f}"
    )
    if args.json:
        write_atomic(args.json, json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.json}")


COMMANDS = {
    "context-curve": run_context_curve,
    "attention": run_attention,
    "single-sentence": run_single_sentence,
    "source-use": run_source_use,
}


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    logging.set_verbosity(logging.WARNING)
    COMMANDS[args.command](args)


def run() -> None:
    """The ``docnmt-analyze`` command (``python launch/analyze.py``)."""
    cli.run_argparse(main)


if __name__ == "__main__":
    run()
