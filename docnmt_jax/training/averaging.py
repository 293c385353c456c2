"""Checkpoint averaging: the element-wise mean of the parameters of a run's last N checkpoints.

``average_run(workdir, n)`` writes ``WORKDIR/averaged/<step>/state`` (``<step>``: the newest
averaged checkpoint's number) holding ``{"params": mean}`` and ``averaged.json`` naming the
steps; ``translate.py``/``evaluate.py --checkpoint averaged`` read it like any checkpoint.
The mean is taken in float64 and stored in the parameters' dtype. A new average replaces the
previous one (written beside it, then renamed: a kill leaves the old one or the new one).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from typing import Any

import numpy as np
import orbax.checkpoint as ocp

from docnmt_jax.errors import RunNotFoundError, UserError

PyTree = Any
AVERAGED = "averaged"


def step_dirs(workdir: str) -> list[tuple[int, str]]:
    """The finished steps of ``WORKDIR/checkpoints`` with their directories, oldest first."""
    root = os.path.join(workdir, "checkpoints")
    if not os.path.isdir(root):
        return []
    steps = sorted(int(d) for d in os.listdir(root) if d.isdigit())
    return [(s, os.path.join(root, str(s))) for s in steps]


def has_ema(workdir: str) -> bool:
    """Whether the run in ``workdir`` keeps an EMA of its parameters (its config says so)."""
    try:
        with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
            return float(json.load(f).get("train", {}).get("ema_decay", 0.0)) > 0
    except (OSError, ValueError):
        return False


def mean_of(trees: Sequence[PyTree]) -> PyTree:
    """The element-wise mean of parameter trees of one structure (float64 sum, original dtype)."""
    import jax

    if not trees:
        raise ValueError("no parameter trees to average")

    def mean(*leaves: Any) -> np.ndarray:
        total = np.zeros(np.shape(leaves[0]), np.float64)
        for leaf in leaves:
            total += np.asarray(leaf, np.float64)
        return (total / len(leaves)).astype(np.asarray(leaves[0]).dtype)

    return jax.tree.map(mean, *trees)


def read_params(step_dir: str, tree: str = "params") -> PyTree:
    """The ``tree`` entry (``params`` or ``ema``) of a checkpoint step directory, as numpy."""
    import jax

    saved = ocp.StandardCheckpointer().restore(os.path.join(step_dir, "state"))
    if tree not in saved:
        raise UserError(f"{step_dir}: the checkpoint holds no {tree!r} parameters")
    return jax.tree.map(np.asarray, saved[tree])


def average_run(workdir: str, last: int, tree: str = "params") -> tuple[str, list[int]]:
    """Averages the ``tree`` parameters of the ``last`` newest checkpoints of ``workdir`` into
    ``WORKDIR/averaged/<newest step>``; returns that directory and the steps averaged."""
    if last < 1:
        raise UserError(f"--last must be >= 1, got {last}")
    available = step_dirs(workdir)
    if not available:
        raise RunNotFoundError(f"{workdir}: no checkpoint in checkpoints/ to average")
    if len(available) < last:
        raise UserError(
            f"{workdir}: --last {last}, but checkpoints/ holds {len(available)} steps "
            f"({', '.join(str(s) for s, _ in available)}); keep more with "
            "train.keep_checkpoints"
        )
    chosen = available[-last:]
    averaged = mean_of([read_params(d, tree) for _, d in chosen])
    root = os.path.join(workdir, AVERAGED)
    newest = chosen[-1][0]
    staging = os.path.join(root, f".{newest}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(staging)
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(os.path.join(staging, "state"), {"params": averaged})
    checkpointer.wait_until_finished()
    steps = [s for s, _ in chosen]
    with open(os.path.join(staging, "averaged.json"), "w", encoding="utf-8") as f:
        json.dump({"steps": steps, "tree": tree}, f)
        f.write("\n")
    for old in os.listdir(root):
        if old.isdigit():
            shutil.rmtree(os.path.join(root, old))
    target = os.path.join(root, str(newest))
    os.rename(staging, target)
    return target, steps
