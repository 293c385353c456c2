"""Orbax checkpoints: the last N, the best by a dev metric, and params-only initialisation.

Layout of a workdir::

    checkpoints/<step>/{state,meta}   the last ``keep`` checkpoints (asynchronous saves)
    best/<step>/{state,meta}          the single best checkpoint by the dev metric

``state`` is the train state as a state dict (params, optimiser state, step); ``meta`` is JSON:
the step, the data-iterator position (global batches consumed), the dev metrics and the config.
Restore order for a run: resume the latest checkpoint of this workdir; else, with
``init_from``, take parameters only from another run (pretrain-then-finetune, mapped by
:mod:`docnmt_jax.training.param_mapping`); else start fresh.

Crash safety (docs/reliability.md): Orbax writes a step into
``<step>.orbax-checkpoint-tmp`` and renames it to ``<step>`` once every file is written, so a
process killed at any point leaves either a complete ``<step>`` or a temporary directory that
is never restored (and is removed when the next run opens the manager). A finished step that
does not restore -- a file truncated, deleted or garbled, non-finite values, a step that does
not match its ``meta`` -- is skipped with a warning naming it and moved aside to
``<step>.corrupt``; the run resumes from the newest step before it. When no step restores
(e.g. a config that does not fit the checkpoints) nothing is moved and :class:`CheckpointError`
lists every step's error. A state holding NaN or Inf is never saved (:class:`NonFiniteError`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from flax import traverse_util
from jax.experimental import multihost_utils

PyTree = Any


class CheckpointError(RuntimeError):
    """No finished checkpoint of a directory restores (each step's error in the message)."""


class ParamShapeError(ValueError):
    """A checkpoint's parameter shapes differ from the model's (``mismatched``: one entry each)."""

    def __init__(self, message: str, mismatched: str = ""):
        super().__init__(message)
        self.mismatched = mismatched


class NonFiniteError(RuntimeError):
    """Training produced NaN or Inf: a state that holds them is never saved."""


def _path_name(path: tuple[Any, ...]) -> str:
    return "/".join(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path)


@jax.jit
def _finite_leaves(tree: PyTree) -> list[jax.Array]:
    return [jnp.all(jnp.isfinite(x)) for x in jax.tree_util.tree_leaves(tree)]


def nonfinite_leaves(tree: PyTree) -> list[str]:
    """Paths (``params/encoder/.../kernel``) of the floating-point leaves of ``tree`` that hold
    NaN or Inf; one jitted reduction per leaf, on the devices that hold them (global arrays of
    several processes included: each result is a replicated scalar)."""
    paths, leaves = [], []
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if jnp.issubdtype(jnp.result_type(leaf), jnp.inexact):
            paths.append(_path_name(path))
            leaves.append(leaf)
    if not leaves:
        return []
    flags = jax.device_get([_local(ok) for ok in _finite_leaves(leaves)])
    return [p for p, ok in zip(paths, flags, strict=True) if not bool(ok)]


def _local(x: Any) -> Any:
    """``x``, or for a replicated array spanning processes its copy on this process."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        return x.addressable_data(0)
    return x


def _manager(directory: str, keep: int, use_async: bool, name: str) -> ocp.CheckpointManager:
    """A manager whose multi-process barriers carry ``name``: Orbax keys the barrier of its
    save-progress flag by a fixed string, so two managers of one process without their own
    prefix meet at the same barrier from two threads and abort ("barrier ... already ongoing")."""
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep,
        enable_async_checkpointing=use_async,
        create=True,
        # Temporary directories of saves that never finished (a killed process) go.
        cleanup_tmp_directories=True,
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
        to ``best`` when ``best``; ``meta`` must be JSON-able. A state with a NaN or Inf
        anywhere is not saved: :class:`NonFiniteError` names its arrays.

        The two saves never run at once: the ``best`` save waits for the ``latest`` one to
        finish, since JAX collectives (Orbax's barriers among them) must not run concurrently
        from two threads of one process.
        """
        bad = nonfinite_leaves(state)
        if bad:
            raise NonFiniteError(
                f"step {step}: the train state holds NaN or Inf in {len(bad)} arrays "
                f"({', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''}); not saved"
            )
        args = ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta))
        if latest:
            self.latest.save(step, args=args, force=True)
        if best:
            self.latest.wait_until_finished()
            self.best.save(step, args=args, force=True)

    def restore(
        self,
        which: str | int,
        target: PyTree,
        warn: Callable[[str], None] = logging.warning,
    ) -> tuple[PyTree, dict[str, Any]] | None:
        """Restores ``'latest'``, ``'best'`` or a step number onto the structure of ``target``.

        Returns ``None`` when there is no such checkpoint. For ``'latest'`` and ``'best'`` a
        newest step that does not restore (:func:`check_restored`) is reported through ``warn``
        by its directory, moved aside to ``<step>.corrupt`` and the next older one is tried;
        :class:`CheckpointError` when none restores (then nothing is moved).
        """
        manager = self.best if which == "best" else self.latest
        if which in ("best", "latest"):
            steps = sorted(manager.all_steps(), reverse=True)
        else:
            steps = [int(which)] if int(which) in manager.all_steps() else []
        errors: list[tuple[int, str]] = []
        for step in steps:
            error = ""
            try:
                restored = manager.restore(
                    step,
                    args=ocp.args.Composite(
                        state=ocp.args.StandardRestore(_abstract(target)),
                        meta=ocp.args.JsonRestore(),
                    ),
                )
                error = check_restored(step, restored.state, restored.meta)
            except Exception as e:  # any failure to read it: the step is not usable
                error = _brief(e)
            if jax.process_count() > 1:  # all processes skip the step if any cannot read it
                failed = multihost_utils.process_allgather(np.int32(bool(error)))
                if np.any(failed) and not error:
                    error = "another process could not restore it"
            if not error:
                for bad_step, reason in errors:
                    path = self._quarantine(manager, bad_step)
                    warn(
                        f"checkpoint {os.path.join(manager.directory, str(bad_step))} does not "
                        f"restore ({reason}); skipped, moved to {path}; resuming from step {step}"
                    )
                if errors:
                    manager.reload()
                return restored.state, restored.meta
            errors.append((step, error))
        if errors:
            raise CheckpointError(
                f"no checkpoint in {manager.directory} restores: "
                + "; ".join(f"step {s}: {e}" for s, e in errors)
                + " (a config that differs from the run's, e.g. model sizes, fails every step; "
                "move the directory away to start afresh)"
            )
        return None

    @staticmethod
    def _quarantine(manager: ocp.CheckpointManager, step: int) -> str:
        """Renames step directory ``step`` to ``<step>.corrupt`` (``.corrupt.N`` if taken), which
        Orbax and the step listings ignore; process 0 renames, every process waits for it."""
        source = os.path.join(manager.directory, str(step))
        target, n = f"{source}.corrupt", 0
        while os.path.exists(target):
            n += 1
            target = f"{source}.corrupt.{n}"
        if jax.process_count() > 1:  # every process has chosen the same name before the rename
            multihost_utils.sync_global_devices(f"docnmt_quarantine_named_{step}")
        if jax.process_index() == 0:
            os.rename(source, target)
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices(f"docnmt_quarantine_moved_{step}")
        return target

    def latest_complete(self) -> tuple[int, str] | None:
        """The newest finished ``latest`` step and its directory, once pending saves are done."""
        self.latest.wait_until_finished()
        step = self.latest.latest_step()
        return None if step is None else (step, os.path.join(self.latest.directory, str(step)))

    def wait(self) -> None:
        self.latest.wait_until_finished()
        self.best.wait_until_finished()

    def close(self) -> None:
        self.latest.close()
        self.best.close()


def _brief(error: Exception) -> str:
    """``error`` on one line, without TensorStore's spec dump, at most ~300 characters."""
    text = " ".join(str(error).split()).split(" See full TensorStore details")[0]
    return f"{type(error).__name__}: {text[:300]}"


def check_restored(step: int, state: PyTree, meta: Any) -> str:
    """Why a restored checkpoint numbered ``step`` is unusable, or ``''``: its ``meta`` must be
    a dict whose data position is ``step`` and agrees with its update step (equal to it without
    accumulation), the state's own step counter that update step, and every value finite (no
    NaN/Inf state is ever saved)."""
    if not isinstance(meta, dict):
        return f"meta is {type(meta).__name__}, not a dict"
    # A checkpoint is numbered by its data position: its update step, or with gradient
    # accumulation updates x accumulate_steps + the micro-batch inside the update.
    updates = meta.get("step", step)
    k, micro = meta.get("accumulate_steps", 1), meta.get("micro", 0)
    if meta.get("data_step", step) != step or updates * k + micro != step:
        return f"meta names step {updates!r}, data position {meta.get('data_step')!r}" + (
            f" (accumulate_steps {k!r}, micro-batch {micro!r})" if k != 1 else ""
        )
    counter = state.get("step") if isinstance(state, dict) else None
    if counter is not None and int(jax.device_get(_local(counter))) != updates:
        return f"the state's step counter is {int(jax.device_get(_local(counter)))}"
    bad = nonfinite_leaves(state)
    if bad:
        return f"NaN or Inf in {', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''}"
    return ""


def _steps(directory: str) -> list[int]:
    """The numbered (finished) steps of a checkpoint directory, ascending."""
    if not os.path.isdir(directory):
        return []
    return sorted(int(d) for d in os.listdir(directory) if d.isdigit())


@contextlib.contextmanager
def _orbax_warnings_off() -> Iterator[None]:
    """absl logging at ERROR while reading a state: Orbax warns on every read of a state saved
    without its item metadata (``Metadata file does not exist``), which is how ours are saved
    and harmless; a command's output should not carry it."""
    level = logging.get_verbosity()
    logging.set_verbosity(logging.ERROR)
    try:
        yield
    finally:
        logging.set_verbosity(level)


def saved_trees(state_dir: str) -> list[str]:
    """The top-level entries of a saved state (``params``, ``opt_state``, ``ema``, ...)."""
    with _orbax_warnings_off():
        metadata = ocp.StandardCheckpointer().metadata(state_dir)
    tree = getattr(metadata, "item_metadata", metadata)
    tree = getattr(tree, "tree", tree)
    return sorted(tree.keys()) if hasattr(tree, "keys") else []


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
    tree: str = "params",
) -> tuple[PyTree, dict[str, list[str]]]:
    """Parameters of ``params`` taken from the checkpoint at ``path`` (params only; ``tree =
    "ema"``: its exponential moving average instead, which the state must hold).

    A parameter the model has but the checkpoint lacks (``new``), one the checkpoint has but
    the model lacks (``unused``), or one whose shape differs, is reported by its full path and
    both shapes. ``allow_new`` keeps fresh initialisation for new parameters; ``ignore_unused``
    skips unused ones; shape mismatches are always an error.
    """
    state_dir = resolve_state_dir(path)
    with _orbax_warnings_off():
        saved = ocp.StandardCheckpointer().restore(state_dir)
    if tree != "params" and tree not in saved:
        raise ValueError(f"{state_dir}: the checkpoint holds no {tree!r} parameters")
    saved_params = _flat(saved[tree] if tree in saved else saved)
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
        message = f"init_from={state_dir}: " + " | ".join(problems)
        if mismatched:
            raise ParamShapeError(message, "; ".join(mismatched))
        raise ValueError(message)
    merged = {
        tuple(k.split("/")): (
            np.asarray(saved_params[k], dtype=v.dtype) if k in saved_params else v
        )
        for k, v in model_params.items()
    }
    report = {"loaded": sorted(set(model_params) & set(saved_params)), "new": new, "unused": unused}
    return traverse_util.unflatten_dict(merged), report
