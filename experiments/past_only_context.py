"""The BLEU cost of past-only context: a trained run's test documents translated sentence by
sentence as they would arrive (``docnmt-translate --interactive``, the server's next-sentence
endpoint: :meth:`docnmt_jax.api.TranslationModel.translate_next`, every document advancing one
sentence per batched call) against the same documents translated whole, scored with sacreBLEU
and compared by its paired bootstrap.

    python experiments/past_only_context.py --workdir RUN --test data/bible/test.tsv \\
        --documents 6 --beam 5 --out docs/log/past_only/NAME.json

Writes the JSON (scores, p-values, timings, sentences whose translation differs) and prints a
Markdown row.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from tqdm.auto import tqdm

from docnmt_jax import api
from docnmt_jax.data import readers
from docnmt_jax.evaluation.metrics import score_documents
from docnmt_jax.evaluation.significance import paired_documents
from docnmt_jax.files import write_atomic


def incremental(model: api.TranslationModel, sources: list[list[str]], beam: int) -> list:
    """Every document translated one sentence at a time, all documents advancing together."""
    contexts = [api.DocumentContext() for _ in sources]
    with tqdm(total=sum(map(len, sources)), unit="sent", desc="sentence by sentence") as bar:
        for k in range(max(map(len, sources))):
            live = [i for i, doc in enumerate(sources) if k < len(doc)]
            model.translate_next(
                [contexts[i] for i in live], [sources[i][k] for i in live], beam=beam
            )
            bar.update(len(live))
    return [ctx.translations for ctx in contexts]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--test", required=True)
    parser.add_argument("--documents", type=int, default=0, help="first N documents; 0: all")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    docs = readers.read_tsv(args.test)
    docs = docs[: args.documents] if args.documents else docs
    sources, refs = [list(d.src) for d in docs], [list(d.tgt) for d in docs]
    model = api.load(args.workdir)
    start = time.perf_counter()
    whole = model.translate(sources, progress="whole documents", beam=args.beam)
    whole_s = time.perf_counter() - start
    start = time.perf_counter()
    past_only = incremental(model, sources, args.beam)
    past_s = time.perf_counter() - start
    scores = {
        "whole": score_documents(whole, refs),
        "past_only": score_documents(past_only, refs),
    }
    paired = paired_documents(past_only, whole, refs, tests=("bs",))
    differ = sum(
        a != b for dw, dp in zip(whole, past_only, strict=True) for a, b in zip(dw, dp, strict=True)
    )
    result = {
        "workdir": args.workdir,
        "model": model.model.name,
        "step": model.step,
        "test": args.test,
        "documents": len(docs),
        "sentences": sum(map(len, sources)),
        "beam": args.beam,
        "seconds": {"whole": whole_s, "past_only": past_s},
        "sentences_differing": differ,
        "scores": {
            k: {m: v[m]["score"] for m in ("s_bleu", "d_bleu", "chrf")} for k, v in scores.items()
        },
        "paired_bootstrap": paired,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    write_atomic(args.out, json.dumps(result, indent=1) + "\n")
    s = result["scores"]
    p = paired["bs"]["s_bleu"]["p_value"]
    print(
        f"| {model.model.name} | {len(docs)} / {result['sentences']} | "
        f"{s['whole']['s_bleu']:.2f} | {s['past_only']['s_bleu']:.2f} | "
        f"{s['past_only']['s_bleu'] - s['whole']['s_bleu']:+.2f} | {p} | "
        f"{s['whole']['d_bleu']:.2f} | {s['past_only']['d_bleu']:.2f} | {differ} | "
        f"{whole_s:.0f} / {past_s:.0f} s |"
    )


if __name__ == "__main__":
    main()
