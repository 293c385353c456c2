"""Does CTranslate2 translate our sentence Transformer as we do? The same weights converted
(``docnmt-export --format ctranslate2``), the same test sentences, greedy and beam search at
length penalty 0, token for token (:mod:`docnmt_jax.export.ctranslate2_equality`).

    python experiments/ctranslate2_equality.py --workdir releases/bible-transformer \\
        [--test data/bible/test.tsv] [--out runs/ctranslate2_equality.json] [--beam 5] \\
        [--threads 2] [--docs N] [--checkpoint best] [--params auto]

Writes the JSON of both comparisons: sentences, identical ones, the reasons of the others
(``limit``, ``tie``, or the engine whose output is the more probable) and the first
differences in full. The targets (docs/export.md): greedy identical on every sentence, beam 5
identical on at least 99% with the rest explained.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

GREEDY_TARGET = 1.0
BEAM_TARGET = 0.99


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", required=True, help="a sentence Transformer run or release")
    p.add_argument("--test", default="data/bible/test.tsv", help="documents to translate")
    p.add_argument("--out", default="runs/ctranslate2_equality.json", help="the JSON to write")
    p.add_argument("--beam", type=int, default=5, help="beam size of the beam comparison")
    p.add_argument("--threads", type=int, default=2, help="CTranslate2 intra_threads")
    p.add_argument("--docs", type=int, default=0, help="the first N documents; 0: all")
    p.add_argument("--checkpoint", default="best", help="best, latest, averaged or a step")
    p.add_argument("--params", default="auto", choices=("auto", "ema", "raw"))
    return p.parse_args(argv)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Both comparisons of ``args.workdir`` on ``args.test`` (module docstring)."""
    import ctranslate2

    from docnmt_jax.data.documents import Document
    from docnmt_jax.data.readers import iter_source_documents
    from docnmt_jax.decoding.search import SearchConfig
    from docnmt_jax.export import ctranslate2 as conversion
    from docnmt_jax.export import ctranslate2_equality as equality
    from docnmt_jax.export import release
    from docnmt_jax.training import restore

    model, tokenizer, _ = restore.load_model(args.workdir)
    conversion.check_convertible(model)
    params, step = restore.load_params(
        model, args.workdir, args.checkpoint, tokenizer.model_path, args.params
    )
    documents = [
        Document(d, tuple(src), ("",) * len(src)) for d, src, _ in iter_source_documents(args.test)
    ]
    documents = documents[: args.docs] if args.docs else documents
    result: dict[str, Any] = {
        "workdir": os.path.abspath(args.workdir),
        "step": step,
        "test": args.test,
        "documents": len(documents),
        "ctranslate2": ctranslate2.__version__,
        "threads": args.threads,
        "host": platform.node(),
        "date": datetime.date.today().isoformat(),
    }
    with tempfile.TemporaryDirectory() as directory:
        out_dir = os.path.join(directory, "model")
        flat = release.flatten_params(params)
        converter = conversion.converter(model.config, flat, tokenizer, conversion.MAX_POSITIONS)
        converter.convert(out_dir)
        translator = ctranslate2.Translator(out_dir, intra_threads=args.threads)
        for name, beam in (("greedy", 1), ("beam", args.beam)):
            start = time.perf_counter()
            search = SearchConfig(beam_size=beam, alpha=0.0)
            compared = equality.compare(model, params, tokenizer, translator, documents, search)
            result[name] = {**compared, "seconds": time.perf_counter() - start}
    result["greedy_target_met"] = result["greedy"]["identical_fraction"] >= GREEDY_TARGET
    result["beam_target_met"] = result["beam"]["identical_fraction"] >= BEAM_TARGET
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(json.dumps(result, indent=2) + "\n")
    for name in ("greedy", "beam"):
        r = result[name]
        print(
            f"{name} (beam {r['beam']}, alpha 0): {r['identical']}/{r['sentences']} identical "
            f"({100 * r['identical_fraction']:.2f}%), others: {r['reasons'] or 'none'}"
        )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
