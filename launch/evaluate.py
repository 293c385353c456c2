"""Runs ``docnmt_jax.commands.evaluate`` (usage in its docstring)."""

from docnmt_jax import cli
from docnmt_jax.commands.evaluate import main

if __name__ == "__main__":
    cli.run(main)
