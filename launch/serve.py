"""Runs ``docnmt_jax.commands.serve`` (usage in its docstring), as the installed
``docnmt-serve`` does."""

from docnmt_jax.commands.serve import main, run

__all__ = ["main", "run"]  # main: for callers that run it in-process

if __name__ == "__main__":
    run()
