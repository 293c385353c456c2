"""Runs ``docnmt_jax.commands.analyze`` (usage in its docstring), as the installed
``docnmt-analyze`` does."""

from docnmt_jax.commands.analyze import main, run

__all__ = ["main", "run"]  # main: for callers that run it in-process (tests/cli_fuzz_worker.py)

if __name__ == "__main__":
    run()
