"""Runs ``docnmt_jax.commands.translate`` (usage in its docstring)."""

from docnmt_jax import cli
from docnmt_jax.commands.translate import main

if __name__ == "__main__":
    cli.run(main)
