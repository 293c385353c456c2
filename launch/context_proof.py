"""Runs ``docnmt_jax.commands.context_proof`` (usage in its docstring)."""

from docnmt_jax import cli
from docnmt_jax.commands.context_proof import main

if __name__ == "__main__":
    cli.run_argparse(main)
