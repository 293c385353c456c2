"""The training loop every model shares: ``train_and_evaluate(config, workdir)``.

One ``jax.jit``-compiled train step (old state donated), an eval step summing dev loss, a tqdm
bar, TensorBoard events and a plain-text log in the workdir, Orbax checkpoints (latest N and
best by a dev metric), resume from the latest checkpoint including the data position,
``init_from`` for params-only initialisation mapped by ``init_from_rules``
(:mod:`docnmt_jax.training.param_mapping`; never applied when resuming), a time budget, and
SIGTERM or SIGINT -> save and exit (a second signal exits at once, saving nothing), and early
stopping: ``train.patience = n > 0`` ends the run after ``n`` dev evaluations in a row that do
not improve ``train.best_metric`` (the count is in every checkpoint, so it survives a resume; a
run resumed with its patience spent stops at once, before any step).
Dropout keys are ``fold_in(seed_key, step)`` and the data plan is a pure function of the
step, so a resumed run reproduces the uninterrupted one exactly.

Non-finite guard: a step whose loss or gradient norm is NaN or Inf leaves parameters and
optimiser state as they were (inside the jitted step; its batch is consumed, the step counter
advances) and counts in the ``bad_steps`` metric; ``train.max_bad_steps`` consecutive such
steps stop the run with :class:`~docnmt_jax.training.checkpoints.NonFiniteError` naming the
step, the documents of its batch and the last complete checkpoint. No state holding NaN or Inf
is ever saved. docs/reliability.md lists what is promised and the tests that kill, signal and
poison runs.

Devices: the steps run on the ``config.mesh`` device mesh (:mod:`docnmt_jax.parallel`; one
device by default), the state initialised straight into its shardings
(:mod:`docnmt_jax.training.state`). With several processes each reads its own rows of every
global batch, process 0 alone writes logs, TensorBoard and ``config.json``, and all processes
write and restore checkpoints (onto the current mesh, whatever mesh wrote them).

The parts: data and tokenizer (:mod:`~docnmt_jax.training.data_setup`), steps and their
ahead-of-time compilation (:mod:`~docnmt_jax.training.steps`), where a run starts and what a
save records (:mod:`~docnmt_jax.training.run_checkpoints`), dev evaluation and its hooks
(:mod:`~docnmt_jax.training.dev_eval`), stop signals and the non-finite guard
(:mod:`~docnmt_jax.training.supervision`), logs (:mod:`~docnmt_jax.training.run_log`).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterator
from typing import Any

import jax
import ml_collections
import numpy as np
from tqdm.auto import tqdm

from docnmt_jax import parallel
from docnmt_jax.data import loader as loader_lib
from docnmt_jax.data import pipeline as pipeline_lib
from docnmt_jax.data.spec import check_on_long
from docnmt_jax.errors import ConfigError
from docnmt_jax.files import write_atomic
from docnmt_jax.models import Metric, build_model
from docnmt_jax.models.contract import reduce_metrics
from docnmt_jax.objectives import Objective, build_objective
from docnmt_jax.training import data_setup, supervision
from docnmt_jax.training import state as train_state
from docnmt_jax.training.checkpoints import NonFiniteError
from docnmt_jax.training.dev_eval import (
    BLEU_METRICS,
    DevContext,
    DevEvaluator,
    DevHookFactory,
    EvalHook,
    add_metrics,
    metric_names,
)
from docnmt_jax.training.run_checkpoints import (
    Progress,
    RunCheckpoints,
    check_resumable,
    init_from_dir,
    restore_or_init,
)
from docnmt_jax.training.run_log import RunLog
from docnmt_jax.training.steps import Step, compile_for_shapes, make_steps

PyTree = Any


@dataclasses.dataclass
class TrainResult:
    """What a run ends with: its last step, the latest dev metrics, per-step train losses
    (``record_losses``), why it stopped (``num_steps``, ``time_budget``, ``patience``,
    ``sigterm``, ``sigint``) and its newest complete checkpoint."""

    step: int
    dev_metrics: dict[str, float]
    losses: list[float]
    stopped_by: str
    #: the newest complete ``checkpoints/<step>`` directory at the end ('' when none)
    checkpoint: str = ""


def check_train_config(config: ml_collections.ConfigDict, dev_hook: DevHookFactory | None) -> None:
    """Refuses a ``train.best_mode`` other than min/max, a negative ``train.patience`` or
    ``train.weight_decay``, float16 parameters or computation (no loss scaling here), and
    ``train.dev_bleu`` without the dev-BLEU hook (the train command builds it:
    :func:`~docnmt_jax.training.dev_eval.dev_bleu_hook`)."""
    tcfg = config.train
    if tcfg.best_mode not in ("min", "max"):
        raise ConfigError(f"config.train.best_mode must be min or max, got {tcfg.best_mode!r}")
    patience = tcfg.get("patience", 0)
    if isinstance(patience, bool) or not isinstance(patience, int) or patience < 0:
        raise ConfigError(f"config.train.patience must be an integer >= 0, got {patience!r}")
    if float(tcfg.get("weight_decay", 0.0)) < 0:
        raise ConfigError(f"config.train.weight_decay must be >= 0, got {tcfg.weight_decay}")
    for key in ("dtype", "param_dtype"):
        if config.model.get(key) == "float16":
            raise ConfigError(
                f"config.model.{key}=float16 needs loss scaling, which docnmt_jax does not "
                "implement; use bfloat16 (same speed on accelerators, float32's range)"
            )
    if tcfg.get("dev_bleu", False) and dev_hook is None:
        raise ConfigError(
            "config.train.dev_bleu=True but no dev-BLEU hook was given: pass "
            "dev_hook=dev_eval.dev_bleu_hook(config) to train_and_evaluate (launch/train.py "
            "does), or set config.train.dev_bleu=False"
        )


def check_best_metric(
    tcfg: ml_collections.ConfigDict, objective: Objective, custom_hooks: bool
) -> None:
    """Refuses a ``train.best_metric`` that no evaluation computes: the objective's dev metrics,
    and BLEU with ``train.dev_bleu``; any name passes when ``custom_hooks`` add metrics."""
    known = {f"dev_{name}" for name in metric_names(objective)} | (
        set(BLEU_METRICS) if tcfg.get("dev_bleu", False) else set()
    )
    if tcfg.best_metric not in known and not custom_hooks:
        raise ConfigError(
            f"config.train.best_metric={tcfg.best_metric!r} is never computed; choose one of "
            f"{sorted(known)} (BLEU metrics need config.train.dev_bleu=True)"
        )


def open_workdir(config: ml_collections.ConfigDict, workdir: str) -> RunLog:
    """Creates ``workdir``, refuses checkpoints of another model config there
    (:func:`~docnmt_jax.training.run_checkpoints.check_resumable`), writes its ``config.json``
    (process 0) and opens its run log."""
    os.makedirs(workdir, exist_ok=True)
    check_resumable(config, workdir)
    runlog = RunLog(workdir)
    if jax.process_index() == 0:  # written whole and renamed: a kill never leaves half of it
        config_text = config.to_json_best_effort(indent=2, sort_keys=True) + "\n"
        write_atomic(os.path.join(workdir, "config.json"), config_text)
    return runlog


def train_and_evaluate(
    config: ml_collections.ConfigDict,
    workdir: str,
    eval_hooks: tuple[EvalHook, ...] = (),
    record_losses: bool = False,
    dev_hook: DevHookFactory | None = None,
) -> TrainResult:
    """Trains ``config`` in ``workdir``; resumes from the latest checkpoint there if any.

    ``eval_hooks`` add dev metrics at every evaluation; ``dev_hook`` builds one more from the
    run's model, tokenizer and mesh (the dev-BLEU hook,
    :func:`~docnmt_jax.training.dev_eval.dev_bleu_hook`: required with ``train.dev_bleu``);
    ``record_losses`` keeps every step's training loss (synchronising each step; for tests).
    """
    tcfg = config.train
    check_train_config(config, dev_hook)
    check_on_long(config.data.get("on_long", "error"))  # a bad value fails before any work
    loader = loader_lib.resolve(config.data.get("loader", "auto"))
    runlog = open_workdir(config, workdir)
    init_dir = init_from_dir(config, workdir)

    # The data, the tokenizer and the model.
    layout = parallel.Layout(parallel.make_mesh(config.get("mesh", {})))
    parallel.check_process_rows(layout)
    train_docs = data_setup.load_documents(config.data, "train", tcfg.seed)
    dev_docs = data_setup.load_documents(config.data, "dev")
    tokenizer = data_setup.get_tokenizer(config, workdir, train_docs, init_dir)
    model = build_model(config.model, tokenizer.vocab_size, tcfg.label_smoothing)
    objective = build_objective(config.get("objective", {}), model)
    custom_hooks = bool(eval_hooks) or (dev_hook is not None and not tcfg.get("dev_bleu", False))
    check_best_metric(tcfg, objective, custom_hooks)
    packed = data_setup.trains_packed(config, objective.needs_grid)
    encode = tokenizer.encode_batch
    shards = layout.batch_shards
    train_plan = data_setup.plan_batches(config, model, shards, packed, encode, train_docs, True)
    dev_plan = data_setup.plan_batches(config, model, shards, packed, encode, dev_docs, False)
    for note in data_setup.data_notes(
        config.data, model, loader, (train_docs, dev_docs), (train_plan, dev_plan)
    ):
        runlog.note(note)

    # The state: restored from the newest checkpoint, or initialised (init_from).
    shardings, abstract, tx, schedule = train_state.build_optimizer_state(
        model, config, layout, runlog.note, carry_rows=getattr(train_plan, "stream_rows", 0)
    )
    num_params = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(abstract["params"]))
    saved = RunCheckpoints(workdir, config)
    state = restore_or_init(
        config, workdir, model, tx, shardings, abstract, saved, init_dir, runlog.note, runlog.warn
    )
    progress = Progress.of(state, int(tcfg.get("accumulate_steps", 1)))
    runlog.note(
        f"model {model.name} (objective {objective.name}): {num_params:,} parameters; mesh "
        f"{dict(layout.mesh.shape)} over {jax.device_count()} devices, "
        f"{jax.process_count()} processes; starting at step {progress.step}"
    )

    # The steps, the dev evaluation and the input pipeline from the run's data position.
    train_step, eval_step = _compiled_steps(
        config, objective, (tx, schedule, shardings), layout, progress, state, train_plan, runlog
    )
    if dev_hook is not None:
        eval_hooks = (
            *eval_hooks,
            dev_hook(DevContext(model, tokenizer, dev_docs, layout, workdir)),
        )
    initial_carry = model.initial_carry if "carry" in shardings else None
    evaluate = DevEvaluator(eval_step, dev_plan, layout, eval_hooks, initial_carry)
    dataset = loader_lib.train_batches(train_plan, start_step=progress.position, loader=loader)

    # The loop: step, log, evaluate, checkpoint, stop.
    loop = TrainLoop(config, state, progress, train_step, dataset, layout, evaluate, saved, runlog)
    del state  # the loop holds the only reference (the train step donates it)
    return loop.run(train_plan, record_losses)


def _compiled_steps(
    config: ml_collections.ConfigDict,
    objective: Objective,
    optimizer: tuple[Any, Any, Any],
    layout: parallel.Layout,
    progress: Progress,
    state: PyTree,
    train_plan: pipeline_lib.BatchPlan,
    runlog: RunLog,
) -> tuple[Step, Step]:
    """The jitted train and eval steps; the train step compiled up front for every batch
    shape of ``train_plan`` with ``train.aot_compile``. ``optimizer``: (tx, schedule,
    shardings)."""
    tcfg = config.train
    tx, schedule, shardings = optimizer
    train_step, eval_step = make_steps(
        objective,
        tx,
        schedule,
        tcfg.seed,
        layout,
        shardings,
        ema_decay=float(tcfg.get("ema_decay", 0.0)),
        accumulate_steps=progress.accumulate_steps,
    )
    if tcfg.get("aot_compile", True):
        shapes = sorted(train_plan.local_shapes)
        train_step = compile_for_shapes(
            train_step,
            state,
            shapes,
            layout,
            runlog.note,
            objective.model.context_sentences,
            train_plan.config.streams,
        )
    return train_step, eval_step


class TrainLoop:
    """The training loop of a set-up run: steps (micro-batches with accumulation) until
    ``train.num_steps``, the time budget, ``train.patience`` dev evaluations without
    improvement or a stop signal; logs every ``train.log_every``,
    evaluates every ``eval_every`` and saves every ``checkpoint_every`` steps, and at the end
    evaluates and saves (a signal saves at once, without evaluating)."""

    def __init__(
        self,
        config: ml_collections.ConfigDict,
        state: PyTree,
        progress: Progress,
        train_step: Step,
        dataset: Iterator[dict[str, np.ndarray]],
        layout: parallel.Layout,
        evaluate: DevEvaluator,
        saved: RunCheckpoints,
        runlog: RunLog,
    ):
        self.tcfg = tcfg = config.train
        self.state, self.progress = state, progress
        self.start, self.start_position = progress.step, progress.position
        self.train_step, self.dataset, self.layout = train_step, dataset, layout
        self.evaluate, self.saved, self.runlog = evaluate, saved, runlog
        self.deadline = (
            time.monotonic() + 60 * tcfg.time_budget_minutes if tcfg.time_budget_minutes else None
        )
        self.max_bad = int(tcfg.get("max_bad_steps", 5))
        self.patience = int(tcfg.get("patience", 0))
        self.record_losses = False  # run()'s
        self.guard = supervision.BadStepGuard(self.max_bad)
        self.losses: list[float] = []
        self.window: dict[str, Metric] = {}  # the train metrics since the last log line
        self.window_start = time.monotonic()
        self.dev: dict[str, float] = {}
        self.stopped_by = "num_steps"
        # A time budget is the usual bound when set: no step total (its ETA would be the
        # steps'), the minutes left in the postfix instead.
        self.bar = tqdm(
            total=None if self.deadline else tcfg.num_steps,
            initial=progress.step,
            desc=f"train ({tcfg.time_budget_minutes:g} min budget)" if self.deadline else "train",
            disable=jax.process_index() != 0,
        )

    def run(self, train_plan: pipeline_lib.BatchPlan, record_losses: bool) -> TrainResult:
        """Trains to the end; ``train_plan`` names the documents of a bad step's batch,
        ``record_losses`` keeps every step's loss. Raises ``NonFiniteError`` when the
        non-finite guard stops the run (pending saves finish, the log says why)."""
        self.record_losses = record_losses
        # SIGTERM/SIGINT: stop after the current step and save; a second one exits at once.
        with supervision.stop_signals() as flag:
            try:
                self._train(flag)
                self._finish()
                self.saved.wait()
            except supervision.TooManyBadStepsError as bad:
                raise self._fail(
                    supervision.too_many_bad_steps_message(bad, self.max_bad, train_plan)
                ) from None
            except NonFiniteError as e:
                raise self._fail(f"training stopped: {e}") from None
        checkpoint = self.saved.newest()
        self.saved.close()
        self.runlog.note(
            f"stopped at step {self.progress.step} ({self.stopped_by}); dev "
            + " ".join(f"{k}={v:.4g}" for k, v in sorted(self.dev.items()))
        )
        self.runlog.close()
        return TrainResult(
            step=self.progress.step,
            dev_metrics=self.dev,
            losses=self.losses,
            stopped_by=self.stopped_by,
            checkpoint=checkpoint,
        )

    def _train(self, flag: dict[str, str]) -> None:
        """Steps until ``num_steps``, or a stop (``stopped_by``: the time budget, patience or a
        signal)."""
        tcfg, progress = self.tcfg, self.progress
        if progress.step < tcfg.num_steps and self.saved.patience_spent(self.patience):
            self.stopped_by = "patience"  # resumed after an early stop: nothing left to do
            self.runlog.note(
                f"not training past step {progress.step}: {self.saved.no_improvement()}, "
                f"train.patience={self.patience} is spent (raise it to train on)"
            )
            return
        while progress.step < tcfg.num_steps:
            if jax.process_count() == 1 or progress.step % tcfg.log_every == 0:
                reason = supervision.stop_reason(
                    flag, self.deadline, every_process=jax.process_count() > 1
                )
                if reason:
                    self.stopped_by = reason
                    return
            metrics, reason = self._update(flag)
            if progress.micro:  # stopped mid-accumulation: saved as it is, resumed exactly
                self.stopped_by = reason
                return
            progress.step += 1
            self.window = add_metrics(self.window, metrics)
            if self.record_losses:
                self.losses.append(reduce_metrics({"loss": metrics["loss"]})["loss"])
            if progress.step % tcfg.log_every == 0 or progress.step == tcfg.num_steps:
                self._log_window()
            self.bar.update(1)
            self._evaluate_and_save()
            if self.saved.patience_spent(self.patience) and progress.step < tcfg.num_steps:
                self.stopped_by = "patience"  # this step was evaluated and saved
                self.runlog.note(f"stopping at step {progress.step}: {self.saved.no_improvement()}")
                return

    def _update(self, flag: dict[str, str]) -> tuple[dict[str, Metric], str]:
        """One optimiser update: its micro-batches (one without accumulation), their summed
        metrics and, when a signal stops it between micro-batches, the stop reason."""
        progress, k = self.progress, self.progress.accumulate_steps
        metrics: dict[str, Metric] = {}
        while True:
            batch = parallel.global_batch(next(self.dataset), self.layout.batch)
            self.state, batch_metrics = self.train_step(self.state, batch)
            progress.position, progress.micro = progress.position + 1, (progress.micro + 1) % k
            self.guard.push(progress.step + 1 if k == 1 else progress.position, batch_metrics)
            self.guard.check(keep=1)  # the previous step's flag: this one still runs
            metrics = add_metrics(metrics, batch_metrics)
            if progress.micro == 0:
                return metrics, ""
            if jax.process_count() == 1:  # a signal between micro-batches
                reason = supervision.stop_reason(flag, None, every_process=False)
                if reason:
                    return metrics, reason

    def _log_window(self) -> None:
        """The train metrics since the last log line, to the log and the bar."""
        values = reduce_metrics(self.window)
        elapsed = time.monotonic() - self.window_start
        if "tokens" in values:
            values["tokens_per_s"] = values["tokens"] / max(elapsed, 1e-9)
        self.runlog.write(self.progress.step, values, prefix="train/")
        left = {}
        if self.deadline:
            left = {"left": f"{max(self.deadline - time.monotonic(), 0) / 60:.1f}m"}
        self.bar.set_postfix(
            loss=f"{values.get('loss', float('nan')):.3f}",
            lr=f"{values['lr']:.2e}",
            tok_s=f"{values.get('tokens_per_s', 0.0):.0f}",
            **left,
        )
        self.window = {}
        self.window_start = time.monotonic()

    def _evaluate_and_save(self) -> None:
        """Evaluates at ``eval_every`` steps, saves at those and ``checkpoint_every`` steps."""
        step = self.progress.step
        evaluated = step % self.tcfg.eval_every == 0
        due = evaluated or step % self.tcfg.checkpoint_every == 0
        if due:
            self.guard.check()  # a run of bad steps that ends here stops before saving
        if evaluated:
            self.dev = self.evaluate(self.state, step)
            self.runlog.write(step, self.dev)
        if due:
            self.saved.save(self.state, self.progress, self.dev if evaluated else None)

    def _finish(self) -> None:
        """After the last step: a signal saves at once; otherwise the last step is evaluated
        and saved unless it was already."""
        self.guard.check()
        self.bar.close()
        tcfg, progress = self.tcfg, self.progress
        if self.stopped_by in supervision.STOP_SIGNALS.values():
            self._save_on_signal()
        elif progress.step != self.start and (progress.step % tcfg.eval_every != 0):
            self.dev = self.evaluate(self.state, progress.step)
            self.runlog.write(progress.step, self.dev)
            # A checkpoint of this step may exist already (checkpoint_every divides it).
            latest = progress.step % tcfg.checkpoint_every != 0
            self.saved.save(self.state, progress, self.dev, latest=latest)

    def _save_on_signal(self) -> None:
        """Preemption: saves at once (no dev evaluation, which may take minutes), unless no
        step ran or this step is saved already."""
        tcfg, progress = self.tcfg, self.progress
        name = self.stopped_by.upper()
        at = f"step {progress.step}" + (
            f" (micro-batch {progress.micro} of {progress.accumulate_steps})"
            if progress.micro
            else ""
        )
        if progress.position == self.start_position:
            self.runlog.note(f"{name} at {at}, before any step of this run: no save")
        elif not progress.micro and (
            progress.step % tcfg.eval_every == 0 or progress.step % tcfg.checkpoint_every == 0
        ):
            self.runlog.note(f"{name} at {at}: checkpoint {progress.position} is saved already")
        else:
            self.runlog.note(f"{name} at {at}: saving checkpoint {progress.position}")
            self.saved.save(self.state, progress, None)

    def _fail(self, message: str) -> NonFiniteError:
        """Ends the run on a non-finite state: pending saves finish (all finite), the message
        goes to the log; returns the error to raise."""
        self.bar.close()
        message = f"{message}; last good checkpoint: {self.saved.last_good()}"
        self.runlog.note(f"stopped: {message}")
        self.saved.close()
        self.runlog.close()
        return NonFiniteError(message)
