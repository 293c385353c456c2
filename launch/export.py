"""Runs ``docnmt_jax.commands.export`` (usage in its docstring), as the installed
``docnmt-export`` does."""

from docnmt_jax.commands.export import main, run

__all__ = ["main", "run"]  # main: for callers that run it in-process

if __name__ == "__main__":
    run()
