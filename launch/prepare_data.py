"""Runs ``docnmt_jax.commands.prepare_data`` (usage in its docstring)."""

from docnmt_jax import cli
from docnmt_jax.commands.prepare_data import main

if __name__ == "__main__":
    cli.run(main)
