"""Does decoding in bfloat16 give float32's translations? One trained run, the same parameters,
the same search, both dtypes; the share of identical output sentences and each one's scores.

    python experiments/bf16_decode.py --workdir RUN --input data/bible/test.tsv --out DIR \
        [--checkpoint latest] [--beam 5] [--alpha 0.6] [--doc docs/bf16_decode.md]

Writes ``DIR/test.DTYPE.hyp.tsv`` (reused when present: rerun to resume), ``DIR/bf16_decode.json``
and a short report (``--doc``). The toolkit's target: at least 95% of the sentences identical.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TARGET = 0.95
DTYPES = ("float32", "bfloat16")


def translate(args: argparse.Namespace, dtype: str, documents: list) -> list[list[str]]:
    """The run's translation of ``documents`` computed in ``dtype`` (cached in ``--out``)."""
    from docnmt_jax.decoding.search import SearchConfig
    from docnmt_jax.files import write_hypotheses
    from docnmt_jax.training import restore

    path = os.path.join(args.out, f"test.{dtype}.hyp.tsv")
    if os.path.exists(path):  # doc_id<TAB>hyp, one line per sentence in input order
        with open(path, encoding="utf-8") as f:
            lines = [line.rstrip("\n").split("\t", 1)[1] for line in list(f)[1:]]
        ends = [0]
        for doc in documents:
            ends.append(ends[-1] + len(doc.src))
        return [lines[a:b] for a, b in zip(ends, ends[1:], strict=False)]
    search = SearchConfig(beam_size=args.beam, alpha=args.alpha)
    translator, _ = restore.load_translator(args.workdir, args.checkpoint, search, dtype=dtype)
    hyps = translator.translate(documents, progress=dtype)
    write_hypotheses(path, documents, hyps)
    return hyps


def compare(hyps: dict[str, list[list[str]]], documents: list) -> dict:
    from docnmt_jax.evaluation.metrics import score_documents

    pairs = [
        (a, b)
        for doc32, doc16 in zip(hyps["float32"], hyps["bfloat16"], strict=True)
        for a, b in zip(doc32, doc16, strict=True)
    ]
    refs = [list(d.tgt) for d in documents]
    scores = {}
    for dtype in DTYPES:
        s = score_documents(hyps[dtype], refs)
        scores[dtype] = {k: s[k]["score"] for k in ("s_bleu", "d_bleu", "chrf")}
    identical = sum(a == b for a, b in pairs) / len(pairs)
    return {"sentences": len(pairs), "identical": identical, "scores": scores}


def report(result: dict, args: argparse.Namespace) -> str:
    s32, s16 = result["scores"]["float32"], result["scores"]["bfloat16"]
    verdict = "holds" if result["identical"] >= TARGET else "does not hold"
    return (
        "# bfloat16 decoding against float32\n\n"
        f"Command: `python experiments/bf16_decode.py --workdir {args.workdir} --input "
        f"{args.input} --out {args.out} --checkpoint {args.checkpoint} --beam {args.beam}` "
        f"({datetime.date.today().isoformat()}, {platform.machine()}, CPU). The same "
        "parameters (float32 in the checkpoint) searched with the model computing in float32 "
        "and in bfloat16 (softmaxes and the search's scores in float32 either way).\n\n"
        f"**{result['identical']:.1%} of {result['sentences']:,} sentences identical** (target "
        f"{TARGET:.0%}: {verdict}). float32: s-BLEU {s32['s_bleu']:.2f}, d-BLEU "
        f"{s32['d_bleu']:.2f}, chrF {s32['chrf']:.1f}; bfloat16: s-BLEU {s16['s_bleu']:.2f}, "
        f"d-BLEU {s16['d_bleu']:.2f}, chrF {s16['chrf']:.1f}.\n"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--workdir", required=True)
    p.add_argument("--input", default="data/bible/test.tsv")
    p.add_argument("--out", required=True)
    p.add_argument("--checkpoint", default="latest")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--alpha", type=float, default=0.6)
    p.add_argument("--doc", default="", help="also write the report here")
    args = p.parse_args(argv)
    from docnmt_jax.data import readers
    from docnmt_jax.files import write_atomic

    os.makedirs(args.out, exist_ok=True)
    documents = readers.read_tsv(args.input)
    hyps = {dtype: translate(args, dtype, documents) for dtype in DTYPES}
    result = compare(hyps, documents)
    with open(os.path.join(args.out, "bf16_decode.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)
    text = report(result, args)
    for path in [os.path.join(args.out, "bf16_decode.md")] + ([args.doc] if args.doc else []):
        write_atomic(path, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
