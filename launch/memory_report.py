"""Runs ``docnmt_jax.commands.memory_report`` (usage in its docstring)."""

from docnmt_jax import cli
from docnmt_jax.commands.memory_report import main

if __name__ == "__main__":
    cli.run_argparse(main)
