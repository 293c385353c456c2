"""Does a model use the context? Train it on the synthetic context task and score the labels.

``python launch/context_proof.py --config configs/final.py --workdir runs/proof_final``
generates the synthetic corpus (default generator settings) into ``WORKDIR/data`` unless
``--data_dir`` names one, trains the config there with ``train_and_evaluate`` (size and step
overrides below; dev BLEU off, best checkpoint by dev loss), translates the test split
greedily and prints :func:`~docnmt_jax.data.synthetic.context_accuracy` overall, per
phenomenon and per sentence distance as markdown tables, with the chance level.
A sentence-level model (``configs/transformer.py``) sees no context and stays at chance;
FINAL sees the whole chunk and can reach 100%. The library: ``docnmt_jax.evaluation.context_proof``.
"""

from __future__ import annotations

import json
import os

from docnmt_jax import cli
from docnmt_jax.config_files import load_config
from docnmt_jax.evaluation.context_proof import (
    CURRICULUM,
    TINY,
    make_corpus,
    markdown,
    proof_config,
    run,
    warm_start,
)
from docnmt_jax.files import write_atomic


def main(argv: list[str] | None = None) -> None:
    p = cli.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", required=True, help="config file, e.g. configs/final.py")
    p.add_argument("--workdir", required=True)
    p.add_argument("--data_dir", default="", help="synthetic corpus; default WORKDIR/data")
    p.add_argument("--train_docs", type=int, default=2000)
    p.add_argument("--test_docs", type=int, default=500)
    p.add_argument("--tiny", action="store_true", help="start from the TINY settings")
    p.add_argument("--json_out", default="", help="write the scores here as JSON")
    p.add_argument(
        "--track", action="store_true", help="log the dev forced choice at every evaluation"
    )
    p.add_argument(
        "--curriculum_steps",
        default="",
        help="comma-separated steps of the CURRICULUM stages ("
        + ", ".join(n for n, _ in CURRICULUM)
        + "), trained in order before the default task, e.g. 1500,1000,1000",
    )
    for key in (
        "d_model",
        "num_heads",
        "ffn_dim",
        "num_encoder_layers",
        "num_decoder_layers",
        "vocab_size",
        "batch_tokens",
        "num_steps",
        "eval_every",
        "warmup_steps",
        "seed",
    ):
        p.add_argument(f"--{key}", type=int, default=None)
    for key in ("dropout_rate", "lr_scale", "label_smoothing", "time_budget_minutes"):
        p.add_argument(f"--{key}", type=float, default=None)
    args = p.parse_args(argv)
    data_dir = make_corpus(
        args.data_dir or os.path.join(args.workdir, "data"), args.train_docs, test=args.test_docs
    )
    overrides = dict(TINY) if args.tiny else {}
    overrides.update(
        {
            k: v
            for k, v in vars(args).items()
            if v is not None
            and k
            not in (
                "config",
                "workdir",
                "data_dir",
                "train_docs",
                "test_docs",
                "tiny",
                "json_out",
                "curriculum_steps",
                "track",
            )
        }
    )
    config = proof_config(load_config(args.config), data_dir, **overrides)
    if args.curriculum_steps:
        try:
            stage_steps = [int(x) for x in args.curriculum_steps.split(",")]
        except ValueError:
            p.error(f"--curriculum_steps={args.curriculum_steps!r}: comma-separated integers")
        config = warm_start(config, args.workdir, stage_steps, config.train.seed)
    scores = run(config, os.path.join(args.workdir, "model"), track=args.track)
    print(markdown(scores, os.path.basename(args.config)))
    if args.json_out:
        write_atomic(args.json_out, json.dumps(scores, indent=2, default=str) + "\n")


if __name__ == "__main__":
    cli.run_argparse(main)
