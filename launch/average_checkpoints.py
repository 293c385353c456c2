"""Runs ``docnmt_jax.commands.average_checkpoints`` (usage in its docstring)."""

from docnmt_jax import cli
from docnmt_jax.commands.average_checkpoints import main

if __name__ == "__main__":
    cli.run_argparse(main)
