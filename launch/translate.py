"""Runs ``docnmt_jax.commands.translate`` (usage in its docstring), as the installed
``docnmt-translate`` does."""

from docnmt_jax.commands.translate import main, run

__all__ = ["main", "run"]  # main: for callers that run it in-process (tests/cli_fuzz_worker.py)

if __name__ == "__main__":
    run()
