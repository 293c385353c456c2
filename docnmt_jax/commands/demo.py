"""The main job (``make demo``): what a document model does, in about 30 minutes on a CPU.

    python launch/demo.py [--out runs/demo] [--data_dir data/bible] [--train_minutes 12]
        [--proof_steps 1200] [--model final] [--test_books Ruth,Gal,Jas] [--test_chapters N]

1. **Synthetic context proof.** A corpus whose labelled words (a pronoun's gender, an
   ambiguous word's sense) are decided by a sentence one or two back; the sentence
   Transformer and a document model are trained on it at a tiny size and scored on those
   words: accuracy per antecedent distance (chance 1/3).
2. **The Bible.** The document model trained on the Bible for ``--train_minutes``; three of
   the five test books (Ruth, Galatians, James: 15 chapters, 342 verses; ``--test_books ''``
   for all five) translated (beam 5, alpha 0.6) with their true context and with the context
   of other chapters (Jean & Cho 2019): s-BLEU, d-BLEU, chrF (sacreBLEU), BLEU with random
   context and Delta_BLEU.
3. **Summary table.**

Every step runs the toolkit's own command, printed before it runs, so that it can be re-run
at full scale (more steps, another config); a finished step is not run again (its outputs
are kept under ``--out``), so an interrupted demo resumes.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time

from docnmt_jax import cli
from docnmt_jax.errors import RunNotFoundError

PY = sys.executable
DEMO_TASK = dict(
    p_pronoun="1", p_topic="1", distances="1,2", min_sentences="3", max_sentences="8"
)  # docnmt_jax.commands.context_proof.DENSE_TASK


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = cli.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", default="runs/demo")
    p.add_argument("--data_dir", default="data/bible", help="the prepared Bible corpus")
    p.add_argument("--model", default="final", help="the document model: a configs/ name")
    p.add_argument("--train_minutes", type=float, default=12.0, help="Bible training time")
    p.add_argument("--proof_steps", type=int, default=1200, help="synthetic training steps")
    p.add_argument("--proof_docs", type=int, default=2000, help="synthetic training documents")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument(
        "--test_books",
        default="Ruth,Gal,Jas",
        help="the test books translated (comma-separated book ids; '': all five)",
    )
    p.add_argument(
        "--test_chapters", type=int, default=0, help="only the first N of their chapters; 0: all"
    )
    return p.parse_args(argv)


def banner(text: str) -> None:
    print(f"\n{'=' * 78}\n{text}\n{'=' * 78}", flush=True)


def run(command: list[str], done: str, stdout: str | None = None) -> None:
    """Runs ``command`` (printed first) unless ``done`` exists; ``stdout`` captures it."""
    printable = " ".join(shlex.quote(c) for c in command).replace(shlex.quote(PY), "python", 1)
    print(f"$ {printable}" + (f" > {stdout}" if stdout else ""), flush=True)
    if os.path.exists(done):
        print(f"  (done before: {done})", flush=True)
        return
    start = time.monotonic()
    if stdout:
        with open(stdout + ".partial", "w", encoding="utf-8") as out:
            code = subprocess.call(command, stdout=out)
    else:
        code = subprocess.call(command)
    if code != 0:
        raise SystemExit(f"demo.py: the step above failed (exit status {code})")
    if stdout:
        os.replace(stdout + ".partial", stdout)
    print(f"  ({time.monotonic() - start:.0f} s)", flush=True)


def proof(args: argparse.Namespace) -> dict[str, dict]:
    """Step 1: the synthetic corpus, then each model trained and scored on it."""
    banner("1/3  Does the model use its context? The synthetic context task")
    data = os.path.join(args.out, "synthetic")
    flags = [f"--{k}={v}" for k, v in DEMO_TASK.items()]
    run(
        [
            PY,
            "-m",
            "docnmt_jax.data.synthetic",
            data,
            f"--train={args.proof_docs}",
            "--dev=50",
            "--test=300",
            *flags,
        ],
        os.path.join(data, "test.labels.jsonl"),
    )
    scores = {}
    for name in ("transformer", args.model):
        out = os.path.join(args.out, f"proof_{name}.json")
        run(
            [
                PY,
                "launch/context_proof.py",
                "--config",
                f"configs/{name}.py",
                "--workdir",
                os.path.join(args.out, f"proof_{name}"),
                "--data_dir",
                data,
                "--tiny",
                f"--num_steps={args.proof_steps}",
                "--lr_scale=0.5",
                "--json_out",
                out,
            ],
            out,
        )
        with open(out, encoding="utf-8") as f:
            scores[name] = json.load(f)
    return scores


def bible(args: argparse.Namespace) -> tuple[dict, dict, dict]:
    """Step 2: the document model trained on the Bible, translated and scored."""
    banner(
        f"2/3  {args.model} on the Bible: train {args.train_minutes:g} minutes, translate "
        "the test books, score with true and random context"
    )
    test = os.path.join(args.data_dir, "test.tsv")
    if not os.path.exists(test):
        raise RunNotFoundError(f"{test} not found: prepare the Bible first (`make data`)")
    if args.test_books or args.test_chapters:
        books = tuple(f"{b}." for b in args.test_books.split(",") if b)
        test = test_subset(test, books, args.test_chapters, os.path.join(args.out, "test.tsv"))
    workdir = os.path.join(args.out, f"bible_{args.model}")
    run(
        [
            PY,
            "launch/train.py",
            "--config",
            f"configs/{args.model}.py",
            "--workdir",
            workdir,
            f"--config.data.data_dir={args.data_dir}",
            f"--config.train.time_budget_minutes={args.train_minutes}",
            "--config.train.num_steps=100000",
            "--config.train.dev_bleu=False",
            "--config.train.best_metric=dev_loss",
            "--config.train.best_mode=min",
            "--config.train.eval_every=100000",
            "--config.train.checkpoint_every=200",
        ],
        os.path.join(workdir, "demo_trained"),
    )
    open(os.path.join(workdir, "demo_trained"), "w").close()
    context_dir = os.path.join(workdir, "context")
    scores = os.path.join(workdir, "scores.json")
    run(
        [
            PY,
            "launch/evaluate.py",
            "--workdir",
            workdir,
            "--ref",
            test,
            "--checkpoint",
            "latest",
            "--context_draws=1",
            f"--beam={args.beam}",
            "--alpha=0.6",
            "--out_dir",
            context_dir,
            "--pronouns",
            "--json",
        ],
        scores,
        stdout=scores,
    )
    with open(scores, encoding="utf-8") as f:
        result = json.load(f)
    log = train_summary(os.path.join(workdir, "train.log"))
    return result["context"], result["context"]["true_context"], log


def test_subset(path: str, books: tuple[str, ...], n: int, out: str) -> str:
    """The chapters of ``books`` (doc-id prefixes; all when empty) in the TSV ``path``, the
    first ``n`` of them when ``n`` > 0, written to ``out``."""
    from docnmt_jax.data.documents import write_tsv
    from docnmt_jax.data.readers import read_tsv

    docs = [d for d in read_tsv(path) if not books or d.doc_id.startswith(books)]
    write_tsv(docs[:n] if n else docs, out)
    return out


def train_summary(path: str) -> dict:
    """Steps, real target tokens/s and dev perplexity from ``train.log``."""
    from docnmt_jax.training.budget import train_speed

    out = train_speed(path)
    with open(path, encoding="utf-8") as f:
        for line in f:
            if " step=" in line and "dev_ppl=" in line:
                fields = dict(p.split("=", 1) for p in line.split() if "=" in p)
                out["step"], out["dev_ppl"] = int(fields["step"]), float(fields["dev_ppl"])
    return out


def summary(args: argparse.Namespace, proofs: dict, context: dict, scores: dict, log: dict) -> str:
    lines = [
        "| synthetic task: labelled words right | "
        + " | ".join(f"distance {d}" for d in proofs["transformer"]["by_distance"])
        + " | all | chance |",
        "|---|" + "---:|" * (len(proofs["transformer"]["by_distance"]) + 2),
    ]
    for name, s in proofs.items():
        cells = [f"{b['accuracy']:.3f}" for b in s["by_distance"].values()]
        lines.append(
            f"| {name} | "
            + " | ".join(cells)
            + f" | {s['accuracy']:.3f} | {s['chance_level']:.3f} |"
        )
    p = scores.get("pronouns", {})
    lines += [
        "",
        f"| {args.model} on the Bible | value |",
        "|---|---:|",
        f"| training | {log.get('step', 0):,} steps in {args.train_minutes:g} min, "
        f"{log['train_tokens_per_s']:,.0f} real target tokens/s, dev perplexity "
        f"{log.get('dev_ppl', float('nan')):.1f} |",
        f"| s-BLEU / d-BLEU / chrF | {scores['s_bleu']['score']:.2f} / "
        f"{scores['d_bleu']['score']:.2f} / {scores['chrf']['score']:.1f} |",
        f"| BLEU with true context / random context | {context['bleu']:.2f} / "
        f"{context['context_marginalised_bleu']:.2f} |",
        f"| Δ_BLEU (Jean & Cho 2019) | {context['delta_bleu']:+.2f} |",
        f"| Δ^D log-likelihood per token | {context['delta_loglik_per_token']:+.4f} |",
        f"| pronoun F1 | {p.get('f1', 0.0):.3f} |",
        "",
        f"sacreBLEU: {scores['s_bleu']['signature']}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    start = time.monotonic()
    proofs = proof(args)
    context, scores, log = bible(args)
    banner(f"3/3  Summary ({(time.monotonic() - start) / 60:.0f} min)")
    text = summary(args, proofs, context, scores, log)
    with open(os.path.join(args.out, "summary.md"), "w", encoding="utf-8") as f:
        f.write(text + "\n")
    print(text)
    print(
        f"\nwritten: {args.out}/summary.md. Every model on the Bible: `make results` "
        "(docs/results.md)."
    )


if __name__ == "__main__":
    cli.run_argparse(main)
