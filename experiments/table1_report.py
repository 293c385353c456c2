"""Jean & Cho (2019)'s Table 1 as a markdown table from the rows of
``experiments/recipes/table1_bible.sh`` or ``experiments/recipes/table1_synthetic.sh``.

  python experiments/table1_report.py --out runs/table1_synthetic [--labels DATA/test.labels.jsonl]

Reads ``OUT/ROW/context/context.json`` (``evaluate.py --workdir``) or, for a row without
context (the sentence Transformer), ``OUT/ROW/context/scores.json`` (``evaluate.py --hyp``),
and prints one line per row: BLEU with the true context, the context-marginalised BLEU (mean
over the random draws), Delta_BLEU, Delta^D per token and the foreign-context coverage. With
``--labels`` (the synthetic task's labelled words) it adds the accuracy on the labelled words
with the true context and with random contexts (mean over the draws' ``hyp.random_*.tsv``).
"""

from __future__ import annotations

import glob
import json
import os

import numpy as np

from docnmt_jax import cli
from docnmt_jax.data.context_labels import context_accuracy, read_labels
from docnmt_jax.evaluation.metrics import read_hypotheses

ROWS = {
    "transformer": "(a) sentence Transformer",
    "jean_cho_random": "(b) Jean & Cho, random context in training",
    "jean_cho": "(c) Jean & Cho, true context",
    "jean_cho_margin": "(d) Jean & Cho, true context + margin regulariser",
    "jean_cho_linear": "(c) Jean & Cho, linear gate (as printed), true context",
    "jean_cho_linear_margin": "(d) Jean & Cho, linear gate, + margin regulariser",
    "final": "(c) FINAL, true context",
    "final_margin": "(d) FINAL, true context + margin regulariser",
    "final_grid": "(c) FINAL, true context, on the grid of (d)",
    "final_margin_stopgrad": "(d) FINAL + margin regulariser, no gradient through random context",
}


def label_accuracy(path: str, labels: list) -> float:
    hyps = {doc.doc_id: list(doc.sentences) for doc in read_hypotheses(path)}
    return context_accuracy(hyps, labels)["accuracy"]


def row_line(out: str, row: str, labels: list | None) -> str | None:
    folder = os.path.join(out, row, "context")
    cells = [ROWS.get(row, row)]
    if os.path.exists(os.path.join(folder, "context.json")):
        with open(os.path.join(folder, "context.json"), encoding="utf-8") as f:
            r = json.load(f)
        draws = ", ".join(f"{b:.2f}" for b in r["bleu_random_draws"])
        cells += [
            f"{r['bleu']:.2f}",
            f"{r['context_marginalised_bleu']:.2f} ({draws})",
            f"{r['delta_bleu']:.2f}",
            f"{r['delta_loglik_per_token']:+.4f}",
            f"{100 * r['random_context_coverage']:.1f}%",
        ]
    elif os.path.exists(os.path.join(folder, "scores.json")):
        with open(os.path.join(folder, "scores.json"), encoding="utf-8") as f:
            r = json.load(f)
        cells += [f"{r['s_bleu']['score']:.2f}", "-", "-", "-", "-"]
    else:
        return None
    if labels is not None:
        true = os.path.join(folder, "hyp.true.tsv")
        cells.append(f"{label_accuracy(true, labels):.3f}" if os.path.exists(true) else "-")
        random = sorted(glob.glob(os.path.join(folder, "hyp.random_*.tsv")))
        mean = np.mean([label_accuracy(p, labels) for p in random]) if random else None
        cells.append(f"{mean:.3f}" if mean is not None else "-")
    return "| " + " | ".join(cells) + " |"


def main(argv: list[str] | None = None) -> None:
    p = cli.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="the rows' parent directory")
    p.add_argument("--labels", default="", help="labelled words (synthetic test.labels.jsonl)")
    args = p.parse_args(argv)
    labels = read_labels(args.labels) if args.labels else None
    header = [
        "row",
        "BLEU",
        "context-marginalised BLEU (draws)",
        "Δ_BLEU",
        "Δ^D per token",
        "foreign context",
    ]
    if labels is not None:
        header += ["labelled words, true context", "labelled words, random context"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in ROWS:
        line = row_line(args.out, row, labels)
        if line is not None:
            print(line)
    if labels is not None:
        chance = context_accuracy({}, labels)["chance_level"]
        print(f"\nlabelled words: {len(labels)}, chance level {chance:.3f}")


if __name__ == "__main__":
    cli.run_argparse(main)
