"""Runs ``docnmt_jax.commands.evaluate`` (usage in its docstring), as the installed
``docnmt-evaluate`` does."""

from docnmt_jax.commands.evaluate import main, run

__all__ = ["main", "run"]  # main: for callers that run it in-process (tests/cli_fuzz_worker.py)

if __name__ == "__main__":
    run()
