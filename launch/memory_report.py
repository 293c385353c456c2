"""Runs ``docnmt_jax.commands.memory_report`` (usage in its docstring)."""

from docnmt_jax.commands.memory_report import main, run

__all__ = ["main", "run"]  # main: for callers that run it in-process (tests/cli_fuzz_worker.py)

if __name__ == "__main__":
    run()
