"""Context across the chunk boundary, measured: the long-document synthetic task
(:mod:`docnmt_jax.data.synthetic_long`) trained, translated and scored through the default
commands, for the sentence Transformer, the paper's chunked FINAL and recurrent FINAL.

Every row is the same tiny model (the context-proof size: d_model 64, 2+2 layers, word-level
vocabulary, no dropout, no label smoothing, no EMA, best checkpoint by dev loss) trained for
the same number of steps of 2,048 source tokens on the same corpus; the three configs differ
only as their files do (``transformer.py``; ``final.py``, multi-resolution chunks, packed;
``final.py:recurrent``, document streams; ``recurrent_bptt2``/``_bptt4``: back-propagated
through 2 or 4 chunks of a stream, ``model.bptt_chunks``). Each run is translated greedily
(``docnmt-translate``) and scored with ``docnmt-evaluate --labels``: accuracy per register
distance 1-60 (the register is set by the document's first sentence) and on the elided verb
at chunk starts (its antecedent is the previous chunk's last sentence).

    python experiments/long_context.py --out runs/long_context [--steps 3000] \
        [--curriculum_steps 800] [--rows sentence,chunked,recurrent,recurrent_bptt2] \
        [--train_docs 600 --dev_docs 30 --test_docs 150]

Every row first trains ``--curriculum_steps`` of its ``--steps`` on short dense documents of
the same lexicon (:data:`CURRICULUM`), then the rest on the long documents from those
parameters (``init_from``).

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
from docnmt_jax.data.tokenizer import get_or_train_tokenizer  # noqa: E402

ROWS = {
    "sentence": "transformer.py",
    "chunked": "final.py",
    "recurrent": "final.py:recurrent",
    "recurrent_bptt2": "final.py:recurrent",
    "recurrent_bptt4": "final.py:recurrent",
}
#: The rows run unless ``--rows`` names others.
DEFAULT_ROWS = ("sentence", "chunked", "recurrent")
#: A row's own overrides: recurrent FINAL back-propagated through k chunks of a stream.
ROW_OVERRIDES = {
    "recurrent_bptt2": ("--config.model.bptt_chunks=2",),
    "recurrent_bptt4": ("--config.model.bptt_chunks=4",),
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


#: The curriculum's first stage: short documents (2-12 sentences) with a register word in
#: every sentence after the first, an elided verb at every 4th sentence, cut into chunks of 4
#: (:data:`CURRICULUM_CHUNK`), the same lexicon: every document crosses chunk boundaries
#: within a few sentences. On the long documents alone a tiny model learns the elided verb and
#: stays at chance on the register, even within the first chunk; after short documents
#: without boundaries (2-6 sentences) it reads sentence 0 within a chunk (100%) but not across
#: one (chance) (docs/log/2026-11-29-long-documents.md).
CURRICULUM = dict(min_sentences=2, max_sentences=12, p_register=1.0, p_elided=0.3, chunk_size=4)
CURRICULUM_CHUNK = 4


def curriculum_data(out: str, args: argparse.Namespace) -> str:
    data = os.path.join(out, "curriculum_data")
    if not os.path.exists(os.path.join(data, "config.json")):
        config = synthetic_long.LongSyntheticConfig(num_documents=args.train_docs * 5, **CURRICULUM)
        synthetic_long.write_corpus(data, config, {"train": args.train_docs * 5, "dev": 60})
    return data


def tokenizer(out: str, data: str) -> str:
    """The word-level sentencepiece model every row and stage shares (trained on the long
    documents' training split)."""
    path = os.path.join(out, "spm.model")
    if not os.path.exists(path):
        docs = read_tsv(os.path.join(data, "train.tsv"))
        get_or_train_tokenizer(path, docs, vocab_size=synthetic.word_level_vocab_size(docs))
    return path


def train(
    out: str,
    data: str,
    row: str,
    steps: int,
    name: str = "",
    init_from: str = "",
    overrides: tuple[str, ...] = (),
) -> float:
    """Trains ``row`` on ``data`` as run ``name`` (default: the row), from the ``init_from``
    run's parameters if given (if not done); returns its wall time in seconds."""
    workdir = os.path.join(out, "runs", name or row)
    if os.path.exists(os.path.join(workdir, "done")):
        return float(open(os.path.join(workdir, "done")).read() or 0)
    start = time.time()
    extra = [f"--config.init_from={init_from}", "--config.init_from_rules=all"] if init_from else []
    run(
        [
            sys.executable,
            "launch/train.py",
            f"--config={ROWS[row]}",
            f"--workdir={workdir}",
            f"--config.data.data_dir={data}",
            "--config.data.corpus=synthetic_long",
            f"--config.data.tokenizer={tokenizer(out, os.path.join(out, 'data'))}",
            f"--config.train.num_steps={steps}",
            f"--config.train.eval_every={max(steps // 4, 1)}",
            f"--config.train.checkpoint_every={max(steps // 4, 1)}",
            *SHARED,
            *ROW_OVERRIDES.get(row, ()),
            *extra,
            *overrides,
        ],
        os.path.join(out, f"{name or row}.train.log"),
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

    for name in ("1-19", "20-39", "40-59", "60-79"):
        row = cells(lambda r, n=name: pct(r["register_by_bucket"].get(n, {"total": 0})))
        lines.append(f"| register, distance {name} | {row} |")
    for pos in ("chunk_start", "elsewhere"):
        row = cells(lambda r, p=pos: pct(r["elided_verb_by_position"][p]))
        lines.append(f"| elided verb, {pos.replace('_', ' ')} | {row} |")
    for key in ("s_bleu", "d_bleu"):
        values = " | ".join(f"{r[key]['score']:.1f}" for r in results.values())
        lines.append(f"| {key.replace('_', '-')} | {values} |")
    table = synthetic_long.register_distance_table(labels)
    return "\n".join(lines) + "\n\nRegister accuracy (%) per distance:\n\n" + table + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--rows", default=",".join(DEFAULT_ROWS), help=f"of {', '.join(ROWS)}")
    parser.add_argument("--train_docs", type=int, default=600)
    parser.add_argument("--dev_docs", type=int, default=30)
    parser.add_argument("--test_docs", type=int, default=150)
    parser.add_argument(
        "--curriculum_steps",
        type=int,
        default=800,
        help="of --steps, on short dense documents first (CURRICULUM); 0: none",
    )
    args = parser.parse_args()
    rows = [r for r in args.rows.split(",") if r]
    unknown = sorted(set(rows) - set(ROWS))
    if unknown:
        parser.error(f"--rows: unknown {unknown}; known: {sorted(ROWS)}")
    os.makedirs(args.out, exist_ok=True)
    data = prepare(args.out, args)
    results = {}
    for row in rows:
        seconds, init_from = 0.0, ""
        if args.curriculum_steps:
            stage = curriculum_data(args.out, args)
            name = f"{row}_curriculum"
            short = (f"--config.data.max_sentences={CURRICULUM_CHUNK}",)
            seconds = train(args.out, stage, row, args.curriculum_steps, name, overrides=short)
            init_from = os.path.join(args.out, "runs", name)
        steps = args.steps - args.curriculum_steps
        seconds += train(args.out, data, row, steps, init_from=init_from)
        results[row] = dict(
            score(args.out, data, row),
            train_seconds=seconds,
            steps=args.steps,
            curriculum_steps=args.curriculum_steps,
        )
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1, sort_keys=True)
    table = markdown(results)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(table)
    print(table)


if __name__ == "__main__":
    main()
