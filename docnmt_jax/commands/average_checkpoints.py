"""Averages the parameters of a run's last N checkpoints into one that translate/evaluate read.

    python launch/average_checkpoints.py --workdir runs/NAME --last 5 [--tree params|ema]
    python launch/translate.py --workdir runs/NAME --checkpoint averaged ...

Writes ``WORKDIR/averaged/<newest step>`` (:mod:`docnmt_jax.training.averaging`); keep enough
checkpoints while training (``train.keep_checkpoints``, ``train.checkpoint_every``).
"""

from __future__ import annotations

import argparse

from docnmt_jax import cli


def main(argv: list[str] | None = None) -> int:
    p = cli.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--workdir", required=True, help="the training run")
    p.add_argument("--last", type=int, default=5, help="how many newest checkpoints")
    p.add_argument(
        "--tree", default="params", choices=("params", "ema"), help="which parameters to average"
    )
    args = p.parse_args(argv)
    from docnmt_jax.training import averaging

    target, steps = averaging.average_run(args.workdir, args.last, args.tree)
    print(f"averaged steps {', '.join(map(str, steps))} of {args.workdir} into {target}")
    return 0


def run() -> None:
    """The command line: ``python launch/average_checkpoints.py``."""
    cli.run_argparse(main)


if __name__ == "__main__":
    run()
