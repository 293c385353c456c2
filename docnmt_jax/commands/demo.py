"""The main job (``make demo``): a document model translating the Bible, beside the sentence
model it was finetuned from, in about 30 minutes on a 2-core CPU.

    python launch/demo.py [--out runs/demo] [--data_dir data/bible] [--model final]
        [--sentence_steps 1650] [--document_steps 300] [--beam 5]
        [--test_books Ruth,Gal,Jas] [--test_chapters N] [--examples 5] [--proof]

1. **Sentence Transformer** trained on the Bible for ``--sentence_steps`` with the configs'
   recipe (pre-LN, 1,024-token batches, the parameters' EMA: docs/recipe_study.md).
2. **The document model finetuned from it** (Zheng et al. 2020, Table 4: "source & target
   TL": every Transformer parameter copied from its EMA, the context parameters new) for
   ``--document_steps``, its schedule continued rather than restarted: a warm-up of
   ``--finetune_warmup`` steps to the learning rate the Transformer ended at, then the same
   inverse-square-root decay (a finetune of a few hundred steps that re-warms to the peak
   spends them all at a rate twice the Transformer's last one: docs/demo.md).
3. **Both translate the test books** (Ruth, Galatians, James: 15 chapters, 342 verses;
   ``--test_books ''`` for all five), beam 5, alpha 0.6; the document model also with the
   context of other chapters (Jean & Cho 2019). Scored with sacreBLEU: s-BLEU, d-BLEU, chrF,
   BLEU with random context, Delta_BLEU, Delta^D, pronoun F1, and the document model against
   the sentence model by sacreBLEU's paired bootstrap and approximate randomisation.
4. **Summary** (``OUT/summary.md``): both models side by side, the time against the main
   job's budget (30 minutes on a host whose Transformer trains 1,800 real target tokens/s,
   proportionally longer on a slower one, never over 60) with the host's float32 matmul peak,
   and the verses where the true context changed the document model's translation most
   (:mod:`docnmt_jax.commands.demo_report`).

``--proof`` first runs the synthetic context task (tiny sentence Transformer against the tiny
document model on words decided by an earlier sentence; ~11 more minutes).

Every step runs the toolkit's own command, printed before it runs, so that it can be re-run
at full scale; a finished step is not run again (its outputs are kept under ``--out``), so an
interrupted demo resumes. Training is counted in steps, not minutes, so that every host
trains the same models (a slower host takes proportionally longer, as the budget allows).
The document model has trained ``--document_steps`` more than the sentence model: the summary
says so (``make results`` compares them at the same tokens).
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
from docnmt_jax.commands import demo_report
from docnmt_jax.errors import RunNotFoundError

PY = sys.executable
DEMO_TASK = dict(
    p_pronoun="1", p_topic="1", distances="1,2", min_sentences="3", max_sentences="8"
)  # docnmt_jax.commands.context_proof.DENSE_TASK
SENTENCE_MODEL = "transformer"
#: seconds of the steps an earlier, interrupted run of the demo did (done path -> seconds)
EARLIER_SECONDS: dict[str, float] = {}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = cli.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", default="runs/demo")
    p.add_argument("--data_dir", default="data/bible", help="the prepared Bible corpus")
    p.add_argument("--model", default="final", help="the document model: a configs/ name")
    p.add_argument(
        "--sentence_steps", type=int, default=1650, help="the sentence Transformer's training"
    )
    p.add_argument(
        "--document_steps", type=int, default=300, help="the document model's finetuning"
    )
    p.add_argument(
        "--finetune_warmup",
        type=int,
        default=50,
        help="the document model's warm-up steps to the rate the Transformer ended at",
    )
    p.add_argument("--beam", type=int, default=5)
    p.add_argument(
        "--test_books",
        default="Ruth,Gal,Jas",
        help="the test books translated (comma-separated book ids; '': all five)",
    )
    p.add_argument(
        "--test_chapters", type=int, default=0, help="only the first N of their chapters; 0: all"
    )
    p.add_argument("--examples", type=int, default=5, help="verses shown in the summary")
    p.add_argument("--proof", action="store_true", help="first the synthetic context task")
    p.add_argument("--proof_steps", type=int, default=1200, help="synthetic training steps")
    p.add_argument("--proof_docs", type=int, default=2000, help="synthetic training documents")
    args = p.parse_args(argv)
    if args.sentence_steps <= 0 or args.document_steps <= 0:
        p.error("--sentence_steps and --document_steps must be > 0")
    if args.examples < 0:
        p.error("--examples must be >= 0")
    return args


def banner(text: str) -> None:
    print(f"\n{'=' * 78}\n{text}\n{'=' * 78}", flush=True)


def run(command: list[str], done: str, stdout: str | None = None) -> None:
    """Runs ``command`` (printed first) unless ``done`` exists; ``stdout`` captures it. The
    seconds it took are kept beside ``done`` (read into ``EARLIER_SECONDS`` when a resumed demo
    skips the step), so that a resumed demo still states its whole time."""
    printable = " ".join(shlex.quote(c) for c in command).replace(shlex.quote(PY), "python", 1)
    print(f"$ {printable}" + (f" > {stdout}" if stdout else ""), flush=True)
    record = done + ".seconds"
    if os.path.exists(done):
        print(f"  (done before: {done})", flush=True)
        if os.path.exists(record):
            with open(record, encoding="utf-8") as f:
                EARLIER_SECONDS[done] = float(f.read())
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
    seconds = time.monotonic() - start
    os.makedirs(os.path.dirname(record) or ".", exist_ok=True)
    with open(record, "w", encoding="utf-8") as f:
        f.write(f"{seconds:.1f}\n")
    print(f"  ({seconds:.0f} s)", flush=True)


def read_json(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def proof(args: argparse.Namespace) -> dict[str, dict]:
    """``--proof``: the synthetic corpus, then each model trained and scored on it."""
    banner("Does the model use its context? The synthetic context task")
    data = os.path.join(args.out, "synthetic")
    flags = [f"--{k}={v}" for k, v in DEMO_TASK.items()]
    run(
        [PY, "-m", "docnmt_jax.data.synthetic", data, f"--train={args.proof_docs}",
         "--dev=50", "--test=300", *flags],
        os.path.join(data, "test.labels.jsonl"),
    )  # fmt: skip
    scores = {}
    for name in (SENTENCE_MODEL, args.model):
        out = os.path.join(args.out, f"proof_{name}.json")
        run(
            [PY, "launch/context_proof.py", "--config", f"configs/{name}.py",
             "--workdir", os.path.join(args.out, f"proof_{name}"), "--data_dir", data,
             "--tiny", f"--num_steps={args.proof_steps}", "--lr_scale=0.5", "--json_out", out],
            out,
        )  # fmt: skip
        scores[name] = read_json(out)
    return scores


def train(args: argparse.Namespace, name: str, steps: int, extra: list[str]) -> str:
    """``launch/train.py`` of ``configs/NAME.py`` for ``steps`` (its dev loss at the end);
    returns the workdir."""
    workdir = os.path.join(args.out, f"bible_{name}")
    done = os.path.join(workdir, "demo_trained")
    run(
        [PY, "launch/train.py", "--config", f"configs/{name}.py", "--workdir", workdir,
         f"--config.data.data_dir={args.data_dir}",
         f"--config.train.num_steps={steps}", "--config.train.dev_bleu=False",
         "--config.train.best_metric=dev_loss", "--config.train.best_mode=min",
         f"--config.train.eval_every={steps}",
         "--config.train.checkpoint_every=200", *extra],
        done,
    )  # fmt: skip
    open(done, "w").close()
    return workdir


def last_learning_rate(log_path: str) -> float:
    """The learning rate of the last logged training step in ``train.log``."""
    rate = None
    with open(log_path, encoding="utf-8") as f:
        for line in f:
            for field in line.split():
                if field.startswith("train/lr="):
                    rate = float(field.split("=", 1)[1])
    if rate is None:
        raise RunNotFoundError(f"{log_path}: no training step logged (train it again)")
    return rate


def test_file(args: argparse.Namespace) -> str:
    """The test books' TSV the demo translates."""
    test = os.path.join(args.data_dir, "test.tsv")
    if not os.path.exists(test):
        raise RunNotFoundError(f"{test} not found: prepare the Bible first (`make data`)")
    if args.test_books or args.test_chapters:
        books = tuple(f"{b}." for b in args.test_books.split(",") if b)
        test = test_subset(test, books, args.test_chapters, os.path.join(args.out, "test.tsv"))
    return test


def test_subset(path: str, books: tuple[str, ...], n: int, out: str) -> str:
    """The chapters of ``books`` (doc-id prefixes; all when empty) in the TSV ``path``, the
    first ``n`` of them when ``n`` > 0, written to ``out``."""
    from docnmt_jax.data.documents import write_tsv
    from docnmt_jax.data.readers import read_tsv

    docs = [d for d in read_tsv(path) if not books or d.doc_id.startswith(books)]
    write_tsv(docs[:n] if n else docs, out)
    return out


def search_flags(args: argparse.Namespace) -> list[str]:
    return ["--checkpoint", "latest", f"--beam={args.beam}", "--alpha=0.6"]


def translate_and_score(args: argparse.Namespace, sentence: str, document: str) -> dict:
    """Step 3: both models translate the test books; the document model also with random
    context; both scored, the document model against the sentence model (paired)."""
    banner("3/4  Both translate the test books; the document model also with random context")
    test = test_file(args)
    sentence_hyp = os.path.join(sentence, "test.hyp.tsv")
    run(
        [PY, "launch/translate.py", "--workdir", sentence, "--input", test,
         "--output", sentence_hyp, *search_flags(args)],
        sentence_hyp,
    )  # fmt: skip
    context_dir = os.path.join(document, "context")
    context_scores = os.path.join(document, "context_scores.json")
    run(
        [PY, "launch/evaluate.py", "--workdir", document, "--ref", test, "--context_draws=1",
         *search_flags(args), "--out_dir", context_dir, "--json"],
        context_scores,
        stdout=context_scores,
    )  # fmt: skip
    document_hyp = os.path.join(context_dir, "hyp.true.tsv")
    scores = {}
    for name, hyp, extra in (
        (SENTENCE_MODEL, sentence_hyp, []),
        (args.model, document_hyp, ["--baseline", sentence_hyp, "--paired", "bs,ar"]),
    ):
        out = os.path.join(os.path.dirname(hyp), "scores.json")
        run(
            [PY, "launch/evaluate.py", "--hyp", hyp, "--ref", test, "--pronouns", "--json",
             *extra],
            out,
            stdout=out,
        )  # fmt: skip
        scores[name] = read_json(out)
    return {
        "test": test,
        "scores": scores,
        "context": read_json(context_scores)["context"],
        "hyps": {
            SENTENCE_MODEL: sentence_hyp,
            args.model: document_hyp,
            "random": os.path.join(context_dir, "hyp.random_0.tsv"),
        },
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    start = time.monotonic()
    proofs = proof(args) if args.proof else {}
    banner(f"1/4  The sentence Transformer on the Bible: {args.sentence_steps:,} steps")
    sentence = train(args, SENTENCE_MODEL, args.sentence_steps, [])
    banner(f"2/4  {args.model} finetuned from it (source & target TL): {args.document_steps} steps")
    rate = last_learning_rate(os.path.join(sentence, "train.log"))
    document = train(
        args,
        args.model,
        args.document_steps,
        [
            f"--config.init_from={sentence}",
            "--config.init_from_which=latest",
            "--config.init_from_rules=all",
            "--config.init_from_params=auto",
            f"--config.data.tokenizer={os.path.join(sentence, 'spm.model')}",
            f"--config.train.learning_rate={rate:.3g}",
            f"--config.train.warmup_steps={args.finetune_warmup}",
        ],
    )
    result = translate_and_score(args, sentence, document)
    minutes = (time.monotonic() - start + sum(EARLIER_SECONDS.values())) / 60
    banner(f"4/4  Summary ({minutes:.0f} min)")
    text = demo_report.summary(
        args.model,
        {SENTENCE_MODEL: sentence, args.model: document},
        result,
        minutes,
        args.examples,
        proofs,
    )
    with open(os.path.join(args.out, "summary.md"), "w", encoding="utf-8") as f:
        f.write(text + "\n")
    print(text)
    print(
        f"\nwritten: {args.out}/summary.md. Every model at the same tokens, with significance: "
        "`make results` (docs/results.md)."
    )


if __name__ == "__main__":
    cli.run_argparse(main)
