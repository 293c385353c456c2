"""Orbax checkpoints: the last N, the best by a dev metric, and params-only initialisation.

Layout of a workdir::

    checkpoints/<step>/{state,meta}   the last ``keep`` checkpoints (asynchronous saves)
    best/<step>/{state,meta}          the single best checkpoint by the dev metric

``state`` is the train state as a state dict (params, optimiser state, step); ``meta`` is JSON:
the step, the data-iterator position (global batches consumed), the dev metrics and the config.
Restore order for a run: resume the latest checkpoint of this workdir; else, with
``init_from``, take parameters only from another run (pretrain-then-finetune, mapped by
:mod:`docnmt_jax.training.param_mapping`); else start fresh.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from flax import traverse_util

PyTree = Any


def _manager(directory: str, keep: int, use_async: bool, name: str) -> ocp.CheckpointManager:
    """A manager whose multi-process barriers carry ``name``: Orbax keys the barrier of its
    save-progress flag by a fixed string, so two managers of one process without their own
    prefix meet at the same barrier from two threads and abort ("barrier ... already ongoing")."""
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep,
        enable_async_checkpointing=use_async,
        create=True,
        multiprocessing_options=ocp.options.MultiprocessingOptions(
            barrier_sync_key_prefix=f"docnmt_{name}"
        ),
    )
    return ocp.CheckpointManager(
        os.path.abspath(directory), options=options, item_names=("state", "meta")
    )


def _abstract(tree: PyTree) -> PyTree:
    return jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, tree)


class Checkpointer:
    """The ``latest`` and ``best`` checkpoint managers of one workdir."""

    def __init__(self, workdir: str, keep: int = 3, use_async: bool = True):
        self.latest = _manager(os.path.join(workdir, "checkpoints"), keep, use_async, "latest")
        self.best = _manager(os.path.join(workdir, "best"), 1, use_async, "best")

    def save(
        self,
        step: int,
        state: PyTree,
        meta: dict[str, Any],
        best: bool = False,
        latest: bool = True,
    ) -> None:
        """Saves to ``latest`` (unless ``latest=False``: that step is saved there already) and
        to ``best`` when ``best``; ``meta`` must be JSON-able.

        The two saves never run at once: the ``best`` save waits for the ``latest`` one to
        finish, since JAX collectives (Orbax's barriers among them) must not run concurrently
        from two threads of one process.
        """
        args = ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta))
        if latest:
            self.latest.save(step, args=args, force=True)
        if best:
            self.latest.wait_until_finished()
            self.best.save(step, args=args, force=True)

    def restore(self, which: str | int, target: PyTree) -> tuple[PyTree, dict[str, Any]] | None:
        """Restores ``'latest'``, ``'best'`` or a step number onto the structure of ``target``.

        Returns ``None`` when there is no such checkpoint.
        """
        manager = self.best if which == "best" else self.latest
        step = manager.latest_step() if which in ("best", "latest") else int(which)
        if step is None or step not in manager.all_steps():
            return None
        restored = manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(_abstract(target)), meta=ocp.args.JsonRestore()
            ),
        )
        return restored.state, restored.meta

    def wait(self) -> None:
        self.latest.wait_until_finished()
        self.best.wait_until_finished()

    def close(self) -> None:
        self.latest.close()
        self.best.close()


def _steps(directory: str) -> list[int]:
    """The numbered (finished) steps of a checkpoint directory, ascending."""
    if not os.path.isdir(directory):
        return []
    return sorted(int(d) for d in os.listdir(directory) if d.isdigit())


def has_steps(workdir: str) -> bool:
    """Whether ``workdir`` holds a finished latest checkpoint (the run would resume)."""
    return bool(_steps(os.path.join(workdir, "checkpoints")))


def resolve_state_dir(path: str, which: str = "best") -> str:
    """The ``.../<step>/state`` directory behind a step directory, a checkpoint directory (its
    newest step, or step ``which`` when a number) or a workdir (``which``: ``best`` -- its
    ``best/``, else its latest -- ``latest``, or a step number in ``checkpoints/`` or
    ``best/``)."""
    path = os.path.abspath(path)
    which = str(which)
    if which not in ("best", "latest") and not which.isdigit():
        raise ValueError(f"init_from_which must be best, latest or a step number, got {which!r}")
    if not os.path.exists(path):
        raise FileNotFoundError(f"init_from={path}: no checkpoint found: no such file or directory")
    if os.path.isdir(os.path.join(path, "state")):
        return os.path.join(path, "state")
    if _steps(path):  # a checkpoint directory
        step = int(which) if which.isdigit() else _steps(path)[-1]
        if step in _steps(path):
            return os.path.join(path, str(step), "state")
        raise FileNotFoundError(f"init_from={path}: no step {step}; it holds {_steps(path)}")
    best, latest = os.path.join(path, "best"), os.path.join(path, "checkpoints")
    if which.isdigit():
        for directory in (latest, best):
            if int(which) in _steps(directory):
                return os.path.join(directory, which, "state")
    else:
        order = (best, latest) if which == "best" else (latest, best)
        for directory in order:
            if _steps(directory):
                return os.path.join(directory, str(_steps(directory)[-1]), "state")
    raise FileNotFoundError(
        f"init_from={path}: no checkpoint found"
        + (f" at step {which}" if which.isdigit() else "")
        + " (expected a workdir with best/ or checkpoints/, a checkpoint directory with "
        "numbered steps, or a step directory holding state/)"
    )


def _flat(tree: PyTree) -> dict[str, Any]:
    return {"/".join(k): v for k, v in traverse_util.flatten_dict(tree).items()}


def init_params_from(
    path: str,
    params: PyTree,
    allow_new: bool = False,
    ignore_unused: bool = False,
) -> tuple[PyTree, dict[str, list[str]]]:
    """Parameters of ``params`` taken from the checkpoint at ``path`` (params only).

    A parameter the model has but the checkpoint lacks (``new``), one the checkpoint has but
    the model lacks (``unused``), or one whose shape differs, is reported by its full path and
    both shapes. ``allow_new`` keeps fresh initialisation for new parameters; ``ignore_unused``
    skips unused ones; shape mismatches are always an error.
    """
    state_dir = resolve_state_dir(path)
    saved = ocp.StandardCheckpointer().restore(state_dir)
    saved_params = _flat(saved["params"] if "params" in saved else saved)
    model_params = _flat(params)
    new = sorted(set(model_params) - set(saved_params))
    unused = sorted(set(saved_params) - set(model_params))
    mismatched = [
        f"{k}: checkpoint {tuple(np.shape(saved_params[k]))} vs model {tuple(np.shape(v))}"
        for k, v in model_params.items()
        if k in saved_params and np.shape(saved_params[k]) != np.shape(v)
    ]
    problems = []
    if mismatched:
        problems.append("shape mismatch: " + "; ".join(mismatched))
    if new and not allow_new:
        shapes = [f"{k} {tuple(np.shape(model_params[k]))}" for k in new]
        problems.append(
            "missing from checkpoint (set init_from_allow_new=True to keep their fresh "
            "initialisation): " + "; ".join(shapes)
        )
    if unused and not ignore_unused:
        shapes = [f"{k} {tuple(np.shape(saved_params[k]))}" for k in unused]
        problems.append(
            "in checkpoint but not in model (set init_from_ignore_unused=True to skip): "
            + "; ".join(shapes)
        )
    if problems:
        raise ValueError(f"init_from={state_dir}: " + " | ".join(problems))
    merged = {
        tuple(k.split("/")): (
            np.asarray(saved_params[k], dtype=v.dtype) if k in saved_params else v
        )
        for k, v in model_params.items()
    }
    report = {"loaded": sorted(set(model_params) & set(saved_params)), "new": new, "unused": unused}
    return traverse_util.unflatten_dict(merged), report
