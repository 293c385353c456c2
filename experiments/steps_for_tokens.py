"""How many optimiser steps give a model as many real target tokens as ``--reference_steps``
steps of a reference model, each on its own batch plan of the Bible's training split (its
packing or grid, its padding): the budget of ``experiments/recipes/doct_bible.sh``. Prints the
steps and, on stderr, each plan's real target tokens per step.

  python experiments/steps_for_tokens.py --config configs/doct.py --reference configs/transformer.py
      --reference_steps 450 --tokenizer runs/table4/pretrain_sentences/spm.model
      [--set model.sentence_rows=True ...]
"""

from __future__ import annotations

import sys

from docnmt_jax import cli
from docnmt_jax.config_files import load_config
from docnmt_jax.data.tokenizer import load_tokenizer
from docnmt_jax.training.budget import tokens_per_step as plan_tokens_per_step


def tokens_per_step(config_path: str, sets: list[str], tokenizer_path: str) -> float:
    """Mean real target tokens of one training step of ``config_path`` (with ``sets``): the
    results table's own budget measure (:func:`docnmt_jax.training.budget.tokens_per_step`)."""
    config = load_config(config_path)
    for item in sets:
        key, _, value = item.partition("=")
        section, _, name = key.partition(".")
        config[section][name] = type(config[section][name])(
            value == "True" if isinstance(config[section][name], bool) else value
        )
    return plan_tokens_per_step(config, load_tokenizer(tokenizer_path))[0]


def main(argv: list[str] | None = None) -> None:
    p = cli.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True)
    p.add_argument("--reference", required=True)
    p.add_argument("--reference_steps", type=int, required=True)
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--set", action="append", default=[], help="SECTION.KEY=VALUE of --config")
    args = p.parse_args(argv)
    model_tokens = tokens_per_step(args.config, args.set, args.tokenizer)
    reference = tokens_per_step(args.reference, [], args.tokenizer)
    steps = round(args.reference_steps * reference / model_tokens)
    print(
        f"{args.reference}: {reference:.0f} real target tokens per step; {args.config} "
        f"{' '.join(args.set)}: {model_tokens:.0f}; {steps} steps",
        file=sys.stderr,
    )
    print(steps)


if __name__ == "__main__":
    cli.run_argparse(main)
