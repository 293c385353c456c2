"""Executes a committed notebook in a fresh kernel at tiny settings (the notebook tests)."""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
# Generous: CI machines may be busy; a tiny notebook takes a few minutes on 2 idle cores.
CELL_TIMEOUT_S = 1500


def assert_clean(name: str) -> nbformat.NotebookNode:
    """The committed notebook ``notebooks/NAME``, asserting it carries no outputs."""
    nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    nbformat.validate(nb)
    for n, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert not cell.outputs, f"{name}: cell {n} has committed outputs"
            assert cell.execution_count is None, f"{name}: cell {n} has an execution count"
    return nb


def execute_notebook(nb: nbformat.NotebookNode, workdir: Path) -> nbformat.NotebookNode:
    """Runs every cell from the repository root with ``DOCNMT_NOTEBOOK_QUICK=1`` and the
    notebook's outputs under ``workdir``; a failing cell raises ``CellExecutionError``."""
    env = {"DOCNMT_NOTEBOOK_QUICK": "1", "DOCNMT_NOTEBOOK_WORKDIR": str(workdir)}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the kernel inherits the test process's environment
    try:
        client = NotebookClient(
            nb,
            timeout=CELL_TIMEOUT_S,
            kernel_name="python3",
            resources={"metadata": {"path": str(ROOT)}},
        )
        return client.execute()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
