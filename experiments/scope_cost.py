"""What a chunk-only scope costs a whole-document model (HM-GDC): one run's parameters scored
on a corpus with the context of whole documents and with the context cut to chunks of
``--max_sentences`` (``model.document_scope`` False), both at once.

  python experiments/scope_cost.py --workdir runs/hmgdc_bible/hmgdc_document \
      --tsv data/bible/test.tsv [--max_sentences 20] [--translate OUT_PREFIX] [--json]

Prints per-token NLL and perplexity of the references for each scope; with ``--translate``
also translates with each scope (beam 5, alpha 0.6) into ``OUT_PREFIX.{document,chunk}.tsv``
and scores them with sacreBLEU (s-BLEU, d-BLEU, chrF) and the pronoun overlap.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import jax

from docnmt_jax import cli
from docnmt_jax.data import builder, readers
from docnmt_jax.data import pipeline as pipeline_lib
from docnmt_jax.decoding.search import SearchConfig
from docnmt_jax.decoding.translator import Translator
from docnmt_jax.errors import UserError
from docnmt_jax.evaluation.analysis import write_hypotheses
from docnmt_jax.evaluation.metrics import evaluate_files
from docnmt_jax.training import restore


def reference_nll(
    model: Any, params: Any, tokenizer: Any, docs: list, config: Any, max_sentences: int
) -> dict[str, float]:
    """Summed NLL and token count of the references of ``docs`` under ``model``'s scope."""
    settings = pipeline_lib.PipelineConfig(
        max_sentences=max_sentences,
        max_src_len=config.data.max_src_len,
        max_tgt_len=config.data.max_tgt_len,
        batch_src_tokens=config.data.eval_batch_tokens,
        batch_tgt_tokens=config.data.eval_batch_tokens,
        shuffle=False,
        num_epochs=1,
        pad_batch=True,
    )
    plan = builder.build_plan(model.data_spec(), settings, docs, tokenizer.encode_batch)
    loss = jax.jit(lambda p, b: model.loss(p, b, None, False)[1])
    nll = tokens = 0.0
    for batch in pipeline_lib.numpy_batches(plan):
        metrics = loss(params, batch)
        nll += float(metrics["nll"].total)
        tokens += float(metrics["tokens"].total)
    return {"nll": nll / tokens, "ppl": math.exp(nll / tokens), "tokens": tokens}


def main(argv: list[str] | None = None) -> None:
    p = cli.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", required=True)
    p.add_argument("--tsv", required=True, help="corpus TSV doc_id<TAB>src<TAB>tgt")
    p.add_argument("--checkpoint", default="latest")
    p.add_argument("--max_sentences", type=int, default=20)
    p.add_argument("--translate", default="", help="write OUT_PREFIX.{document,chunk}.tsv")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    model, tokenizer, config = restore.load_model(args.workdir)
    if "document_scope" not in {f.name for f in dataclasses.fields(model.config)}:
        raise UserError(f"{args.workdir}: model {model.name!r} has no document_scope switch")
    params, step = restore.load_params(model, args.workdir, args.checkpoint)
    docs = readers.read_tsv(args.tsv)
    result: dict = {"workdir": args.workdir, "step": step, "max_sentences": args.max_sentences}
    for scope, document in (("document", True), ("chunk", False)):
        scoped = type(model)(dataclasses.replace(model.config, document_scope=document))
        scores = reference_nll(scoped, params, tokenizer, docs, config, args.max_sentences)
        if args.translate:
            search = SearchConfig(beam_size=5, alpha=0.6)
            translator = Translator(
                scoped, params, tokenizer, search, max_sentences=args.max_sentences
            )
            hyps = translator.translate(docs)
            path = f"{args.translate}.{scope}.tsv"
            write_hypotheses(path, docs, hyps)  # translate.py's format, atomically
            scores["translation"] = evaluate_files(path, args.tsv, pronouns="en")
        result[scope] = scores
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for scope in ("document", "chunk"):
        s = result[scope]
        line = f"{scope:>8} scope: NLL {s['nll']:.4f}, ppl {s['ppl']:.2f} over {s['tokens']:.0f}"
        if "translation" in s:
            t = s["translation"]
            line += (
                f"; s-BLEU {t['s_bleu']['score']:.2f}, d-BLEU {t['d_bleu']['score']:.2f}, "
                f"chrF {t['chrf']['score']:.2f}, pronoun F1 {t['pronouns']['f1']:.3f}"
            )
        print(line)


if __name__ == "__main__":
    cli.run_argparse(main)
