"""Context across the chunk boundary, measured: the long-document synthetic task
(:mod:`docnmt_jax.data.synthetic_long`) trained, translated and scored through the default
commands, for the sentence Transformer, the paper's chunked FINAL and recurrent FINAL.

Every row is the same tiny model (the context-proof size: d_model 64, 2+2 layers, word-level
vocabulary, no dropout, no label smoothing, no EMA, best checkpoint by dev loss) trained for
the same number of steps of 2,048 source tokens on the same corpus; the three configs differ
only as their files do (``transformer.py``; ``final.py``, multi-resolution chunks, packed;
``final.py:recurrent``, document streams). Each run is translated greedily
(``docnmt-translate``) and scored with ``docnmt-evaluate --labels``: accuracy per register
distance 1-60 (the register is set by the document's first sentence) and on the elided verb
at chunk starts (its antecedent is the previous chunk's last sentence).

    python experiments/long_context.py --out runs/long_context [--steps 3000] \
        [--rows sentence,chunked,recurrent] [--train_docs 600 --dev_docs 30 --test_docs 150]

Writes ``OUT/data`` (the corpus), ``OUT/runs/ROW`` (the runs), ``OUT/ROW.test.tsv`` (the
translations), ``OUT/results.json`` (every row's label scores and its train time) and
``OUT/results.md`` (the per-distance table). Resumable: a finished step is not redone.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from docnmt_jax.data import synthetic, synthetic_long  # noqa: E402
from docnmt_jax.data.readers import read_tsv  # noqa: E402

ROWS = {
    "sentence": "transformer.py",
    "chunked": "final.py",
    "recurrent": "final.py:recurrent",
}

#: The overrides every row shares (the context-proof model size and schedule).
SHARED = [
    "--config.data.batch_src_tokens=2048",
    "--config.data.batch_tgt_tokens=2048",
    "--config.model.d_model=64",
    "--config.model.num_heads=2",
    "--config.model.ffn_dim=128",
    "--config.model.num_encoder_layers=2",
    "--config.model.num_decoder_layers=2",
    "--config.model.dropout_rate=0.0",
    "--config.train.dev_bleu=False",
    "--config.train.best_metric=dev_loss",
    "--config.train.best_mode=min",
    "--config.train.warmup_steps=300",
    "--config.train.label_smoothing=0.0",
    "--config.train.ema_decay=0.0",
    "--config.train.log_every=100",
]


def run(argv: list[str], log: str) -> None:
    """Runs a command of the repository, its output appended to ``log``; exits on failure."""
    with open(log, "a") as out:
        out.write(f"$ {' '.join(argv)}\n")
        out.flush()
        code = subprocess.call(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    if code:
        sys.exit(f"long_context: {' '.join(argv[:3])} failed (status {code}); see {log}")


def prepare(out: str, args: argparse.Namespace) -> str:
    data = os.path.join(out, "data")
    if not os.path.exists(os.path.join(data, "test.labels.jsonl")):
        run(
            [
                sys.executable,
                "launch/prepare_data.py",
                "--corpus=synthetic_long",
                f"--out={data}",
                f"--synthetic_long_train_documents={args.train_docs}",
                f"--synthetic_long_dev_documents={args.dev_docs}",
                f"--synthetic_long_test_documents={args.test_docs}",
            ],
            os.path.join(out, "prepare.log"),
        )
    return data


def train(out: str, data: str, row: str, steps: int) -> float:
    """Trains ``row`` (if not done); returns its wall time in seconds (0 when it was done)."""
    workdir = os.path.join(out, "runs", row)
    if os.path.exists(os.path.join(workdir, "done")):
        return float(open(os.path.join(workdir, "done")).read() or 0)
    vocab = synthetic.word_level_vocab_size(read_tsv(os.path.join(data, "train.tsv")))
    start = time.time()
    run(
        [
            sys.executable,
            "launch/train.py",
            f"--config={ROWS[row]}",
            f"--workdir={workdir}",
            f"--config.data.data_dir={data}",
            "--config.data.corpus=synthetic_long",
            f"--config.data.vocab_size={vocab}",
            f"--config.train.num_steps={steps}",
            f"--config.train.eval_every={max(steps // 6, 1)}",
            f"--config.train.checkpoint_every={max(steps // 6, 1)}",
            *SHARED,
        ],
        os.path.join(out, f"{row}.train.log"),
    )
    seconds = time.time() - start
    with open(os.path.join(workdir, "done"), "w") as f:
        f.write(f"{seconds:.0f}")
    return seconds


def score(out: str, data: str, row: str) -> dict:
    hyp = os.path.join(out, f"{row}.test.tsv")
    log = os.path.join(out, f"{row}.eval.log")
    if not os.path.exists(hyp):
        start = time.time()
        run(
            [
                sys.executable,
                "launch/translate.py",
                f"--workdir={os.path.join(out, 'runs', row)}",
                f"--input={os.path.join(data, 'test.tsv')}",
                f"--output={hyp}.part",
                "--beam=1",
            ],
            log,
        )
        os.replace(f"{hyp}.part", hyp)
        with open(f"{hyp}.seconds", "w") as f:
            f.write(f"{time.time() - start:.0f}")
    result = subprocess.run(
        [
            sys.executable,
            "launch/evaluate.py",
            f"--hyp={hyp}",
            f"--ref={os.path.join(data, 'test.tsv')}",
            f"--labels={os.path.join(data, 'test.labels.jsonl')}",
            "--json",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    scores = json.loads(result.stdout)
    scores["translate_seconds"] = float(open(f"{hyp}.seconds").read())
    return scores


def markdown(results: dict) -> str:
    labels = {row: r["context_labels"] for row, r in results.items()}
    lines = ["| | " + " | ".join(labels) + " |", "|---|" + "---:|" * len(labels)]

    def cells(get) -> str:
        return " | ".join(get(r) for r in labels.values())

    def pct(bucket: dict) -> str:
        return f"{100 * bucket['accuracy']:.1f} ({bucket['total']})" if bucket["total"] else "-"

    lines.append("| BLEU | " + cells(lambda r: "") + " |")
    for name in ("1-19", "20-39", "40-59", "60-79"):
        row = cells(lambda r, n=name: pct(r["register_by_bucket"].get(n, {"total": 0})))
        lines.append(f"| register, distance {name} | {row} |")
    for pos in ("chunk_start", "elsewhere"):
        row = cells(lambda r, p=pos: pct(r["elided_verb_by_position"][p]))
        lines.append(f"| elided verb, {pos.replace('_', ' ')} | {row} |")
    bleu = {row: f"{r.get('bleu', float('nan')):.1f}" for row, r in results.items()}
    lines[2] = "| BLEU | " + " | ".join(bleu.values()) + " |"
    table = synthetic_long.register_distance_table(labels)
    return "\n".join(lines) + "\n\nRegister accuracy (%) per distance:\n\n" + table + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--train_docs", type=int, default=600)
    parser.add_argument("--dev_docs", type=int, default=30)
    parser.add_argument("--test_docs", type=int, default=150)
    args = parser.parse_args()
    rows = [r for r in args.rows.split(",") if r]
    unknown = sorted(set(rows) - set(ROWS))
    if unknown:
        parser.error(f"--rows: unknown {unknown}; known: {sorted(ROWS)}")
    os.makedirs(args.out, exist_ok=True)
    data = prepare(args.out, args)
    results = {}
    for row in rows:
        seconds = train(args.out, data, row, args.steps)
        results[row] = dict(score(args.out, data, row), train_seconds=seconds, steps=args.steps)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1, sort_keys=True)
    table = markdown(results)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(table)
    print(table)


if __name__ == "__main__":
    main()
