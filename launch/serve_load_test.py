"""Runs ``docnmt_jax.commands.serve_load_test`` (usage in its docstring): a load test of a
running ``docnmt-serve``."""

from docnmt_jax.commands.serve_load_test import main, run

__all__ = ["main", "run"]  # main: for callers that run it in-process

if __name__ == "__main__":
    run()
