"""A training run's checkpoints: where a run starts and what each save records.

A run resumes from the newest checkpoint of its workdir that restores (including its data
position and micro-batch, so the resumed run reproduces the uninterrupted one), refused when the
workdir's saved ``config.model`` differs (:func:`check_resumable`); a fresh run starts from
initialised parameters, or from another run's mapped by ``init_from_rules`` (never applied when
resuming). Every save (:class:`RunCheckpoints`) records the step, data position, dev metrics,
the best value of ``train.best_metric`` so far, the step it was reached at and the count of
dev evaluations since then without improvement (``train.patience``; strictly better is an
improvement), and updates the best checkpoint; a resume restores all three.
``init_from_continue`` continues a release's own training (:func:`continue_release`): the
release's chosen step and best dev value from its manifest, Adam's moments fresh.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import optax

from docnmt_jax.errors import ConfigError
from docnmt_jax.models import Model
from docnmt_jax.training import checkpoints, param_mapping
from docnmt_jax.training import ema as ema_lib
from docnmt_jax.training import state as train_state

PyTree = Any


def _is_better(value: float, best: float | None, mode: str) -> bool:
    if best is None:
        return True
    return value < best if mode == "min" else value > best


def _flat_items(tree: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a.b": leaf}`` for a nested dict (JSON lists compare as lists)."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    items: dict[str, Any] = {}
    for key, value in tree.items():
        items.update(_flat_items(value, f"{prefix}.{key}" if prefix else str(key)))
    return items


def check_resumable(config: ml_collections.ConfigDict, workdir: str) -> None:
    """Refuses to resume ``workdir``'s checkpoints under another ``config.model``.

    A checkpoint restores into any model whose parameter shapes agree, so a workdir trained
    under one reading (e.g. FINAL's ``doc2sent_cross_attention="chunk"``) would silently be
    resumed -- or scored -- as another. When ``workdir`` holds a finished checkpoint and a
    ``config.json``, every ``model`` field present in both must be equal; fields only one side
    has (added or retired options) are not compared. Raises a one-line :class:`ConfigError`
    naming the fields and both values.
    """
    path = os.path.join(workdir, "config.json")
    if not checkpoints.has_steps(workdir) or not os.path.exists(path):
        return
    try:
        with open(path, encoding="utf-8") as f:
            saved = json.load(f).get("model", {})
    except (OSError, ValueError, AttributeError) as e:
        raise ConfigError(f"{path}: cannot read the run's saved config ({e})") from None
    old = _flat_items(saved if isinstance(saved, dict) else {})
    new = _flat_items(json.loads(config.model.to_json_best_effort()))
    differ = [k for k in sorted(old.keys() & new.keys()) if old[k] != new[k]]
    if differ:
        shown = ", ".join(f"model.{k}: {old[k]!r} there, {new[k]!r} now" for k in differ[:4])
        more = f" and {len(differ) - 4} more" if len(differ) > 4 else ""
        raise ConfigError(
            f"{path}: {workdir} holds checkpoints of another model config ({shown}{more}); "
            "use a new workdir, or the saved config to resume"
        )


@dataclasses.dataclass
class Progress:
    """Where a run is: optimiser updates done (``step``), global batches consumed
    (``position``: the data plan's step and the checkpoints' number, ``step * k + micro``; the
    step itself without accumulation) and micro-batches into the current update (``micro``)
    with ``accumulate_steps`` ``k``."""

    step: int
    position: int
    micro: int
    accumulate_steps: int

    @classmethod
    def of(cls, state: PyTree, accumulate_steps: int) -> Progress:
        """The progress a (restored or fresh) train ``state`` is at."""
        step = int(state["step"])
        micro = int(jax.device_get(state["accum"]["micro"])) if "accum" in state else 0
        return cls(step, step * accumulate_steps + micro, micro, accumulate_steps)


class RunCheckpoints:
    """The checkpoints of a run in ``workdir`` (the latest ``train.keep_checkpoints`` and the
    best by ``train.best_metric``/``best_mode``), with the metadata a resume needs: the best
    value so far, its step, and the dev evaluations since without improvement."""

    def __init__(self, workdir: str, config: ml_collections.ConfigDict):
        self.config = config
        self.best_metric, self.best_mode = config.train.best_metric, config.train.best_mode
        self.best_value: float | None = None
        self.best_step: int | None = None
        #: dev evaluations in a row, up to the last one, that did not improve the best value
        self.evals_without_improvement = 0
        self.checkpointer = checkpoints.Checkpointer(workdir, keep=config.train.keep_checkpoints)

    def restore_latest(
        self, abstract: PyTree, warn: Callable[[str], None]
    ) -> tuple[PyTree, dict] | None:
        """The state and meta of the newest checkpoint that restores (a corrupt one is skipped,
        ``warn`` naming it), or None; the best value so far, its step and the evaluations since
        without improvement come with it (a checkpoint that predates the last two: unknown, 0)."""
        restored = self.checkpointer.restore("latest", abstract, warn=warn)
        if restored is not None:
            meta = restored[1]
            self.best_value = meta.get("best_value")
            self.best_step = meta.get("best_step")
            self.evals_without_improvement = int(meta.get("evals_without_improvement", 0))
        return restored

    def save(
        self,
        state: PyTree,
        progress: Progress,
        dev: dict[str, float] | None,
        latest: bool = True,
    ) -> None:
        """Saves ``state`` as checkpoint ``progress.position`` with the ``dev`` metrics of its
        step (None: not evaluated), as the best checkpoint too when they are the best so far;
        ``latest=False`` writes the best alone. A state holding NaN or Inf is never saved
        (:class:`~docnmt_jax.training.checkpoints.NonFiniteError`)."""
        is_best = False
        if dev is not None and self.best_metric in dev:
            is_best = _is_better(dev[self.best_metric], self.best_value, self.best_mode)
            if is_best:
                self.best_value, self.best_step = dev[self.best_metric], progress.step
                self.evals_without_improvement = 0
            else:
                self.evals_without_improvement += 1
        meta = {
            "step": progress.step,
            "data_step": progress.position,
            "accumulate_steps": progress.accumulate_steps,
            "micro": progress.micro,
            "dev": dev or {},
            "best_metric": self.best_metric,
            "best_value": self.best_value,
            "best_step": self.best_step,
            "evals_without_improvement": self.evals_without_improvement,
            "config": json.loads(self.config.to_json_best_effort()),
        }
        self.checkpointer.save(progress.position, state, meta, best=is_best, latest=latest)

    def patience_spent(self, patience: int) -> bool:
        """Whether the last ``patience`` (> 0; 0: never) dev evaluations in a row did not
        improve ``best_metric``."""
        return patience > 0 and self.evals_without_improvement >= patience

    def no_improvement(self) -> str:
        """``no improvement of METRIC in N evaluations (best X at step B)``."""
        best = "none" if self.best_value is None else f"{self.best_value:.4g}"
        at = "" if self.best_step is None else f" at step {self.best_step}"
        return (
            f"no improvement of {self.best_metric} in {self.evals_without_improvement} "
            f"evaluations (best {best}{at})"
        )

    def last_good(self) -> str:
        """The newest complete checkpoint, as a log message names it."""
        done = self.checkpointer.latest_complete()
        return "none saved yet" if done is None else f"{done[1]} (step {done[0]})"

    def newest(self) -> str:
        """The newest complete ``checkpoints/<step>`` directory ('' when none)."""
        done = self.checkpointer.latest_complete()
        return "" if done is None else os.fspath(done[1])

    def wait(self) -> None:
        self.checkpointer.wait()

    def close(self) -> None:
        self.checkpointer.close()


def restore_or_init(
    config: ml_collections.ConfigDict,
    workdir: str,
    model: Model,
    tx: optax.GradientTransformation,
    shardings: PyTree,
    abstract: PyTree,
    saved: RunCheckpoints,
    init_dir: str | None,
    note: Callable[[str], None],
    warn: Callable[[str], None],
) -> PyTree:
    """The train state a run starts from: its newest checkpoint that restores, else a fresh
    state (``train.seed``) whose parameters, with ``init_from``, are the ``init_dir`` run's
    mapped by ``init_from_rules`` (the optimiser state stays fresh; the table goes to
    ``WORKDIR/init_from.tsv``). ``note`` and ``warn`` write the run log."""
    restored = saved.restore_latest(abstract, warn)
    if restored is not None:
        state, meta = restored
        note(
            f"resumed from step {meta['step']} (data position {meta['data_step']}"
            + (
                f", micro-batch {meta['micro']} of {meta['accumulate_steps']})"
                if meta.get("micro")
                else ")"
            )
        )
        return state
    state = train_state.init_state(
        model, tx, shardings, config.train.seed, carry=abstract.get("carry")
    )
    if not config.get("init_from", ""):
        return state
    # Parameters only, mapped by init_from_rules. A resumed run never gets here: its own latest
    # checkpoint wins over init_from.
    params, rows, state_dir = param_mapping.init_from_checkpoint(
        config, model, state["params"], init_dir
    )
    note(
        f"init_from {state_dir} (init_from_rules={config.get('init_from_rules', '')!r}): "
        f"{param_mapping.summary(rows)}; table in {os.path.join(workdir, 'init_from.tsv')}"
        "\n" + param_mapping.format_table(rows)
    )
    if jax.process_index() == 0:
        param_mapping.write_table(os.path.join(workdir, "init_from.tsv"), rows)
    state = dict(state, params=params)
    if "ema" in state:  # the average starts at the initial parameters
        state["ema"] = jax.jit(ema_lib.init, out_shardings=shardings["ema"])(params)
    if config.get("init_from_continue", False):
        state = continue_release(config, state, saved, note)
    return state


def release_progress(config: ml_collections.ConfigDict) -> tuple[int, dict[str, float]]:
    """The chosen step and its dev metrics from the training record of the release that
    ``init_from`` names (``init_from_continue``); one-line errors when it is no release, has no
    record, or lacks ``train.best_metric``."""
    from docnmt_jax.export import release as release_lib

    path = config.init_from
    if not release_lib.is_release(path):
        raise ConfigError(f"init_from_continue=True: init_from={path} is not a release")
    training = release_lib.read_manifest(path).get("training") or {}
    step, dev = training.get("chosen_step"), training.get("dev_at_chosen_step") or {}
    metric = config.train.best_metric
    if not isinstance(step, int) or metric not in dev:
        raise ConfigError(
            f"init_from_continue=True: {path}/release.json has no training record with "
            f"chosen_step and dev_at_chosen_step.{metric} (docnmt-export --training_record)"
        )
    return step, dev


def with_schedule_count(opt_state: PyTree, count: jax.Array) -> PyTree:
    """``opt_state`` with every learning-rate schedule's count set to ``count`` (each its own
    buffer: the state is donated to the train step); Adam's own count and moments are kept
    (fresh: its bias correction starts again)."""

    def is_schedule(x: Any) -> bool:
        return isinstance(x, optax.ScaleByScheduleState)

    def set_count(x: Any) -> Any:
        if not is_schedule(x):
            return x
        return optax.ScaleByScheduleState(count=jnp.array(count, copy=True))  # own buffer

    return jax.tree_util.tree_map(set_count, opt_state, is_leaf=is_schedule)


def continue_release(
    config: ml_collections.ConfigDict,
    state: PyTree,
    saved: RunCheckpoints,
    note: Callable[[str], None],
) -> PyTree:
    """A fresh ``state`` loaded from a release (``init_from_continue``) put where the release's
    training stopped: the step (so the data position and the learning-rate schedule continue;
    Adam's moments stay fresh) and the best dev value so far (for ``train.patience``). Saved at
    once as the run's first latest and best checkpoint, so a run whose patience is spent
    without improving on the release still has its best checkpoint."""
    step, dev = release_progress(config)
    as_step = jax.jit(lambda s: jnp.asarray(step, s.dtype), out_shardings=state["step"].sharding)
    count = as_step(state["step"])
    state = dict(state, step=count, opt_state=with_schedule_count(state["opt_state"], count))
    saved.save(state, Progress.of(state, int(config.train.get("accumulate_steps", 1))), dev)
    note(
        f"init_from_continue: step {step} and {saved.best_metric}={dev[saved.best_metric]:.4g} "
        f"of {config.init_from} (Adam's moments fresh; learning-rate schedule at step {step})"
    )
    return state


def init_from_dir(config: ml_collections.ConfigDict, workdir: str) -> str | None:
    """The state directory of the ``init_from`` run when this run starts fresh from it (None
    when it resumes its own checkpoints or has no ``init_from``). The rules are parsed first,
    so a bad ``init_from`` or rule fails fast, before data and compilation."""
    if not config.get("init_from", "") or checkpoints.has_steps(workdir):
        return None
    param_mapping.parse_rules(config.get("init_from_rules", ""))
    return param_mapping.checkpoint_dir(config)
