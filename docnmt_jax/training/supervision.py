"""Supervision of a training run: stop signals, the time budget and the non-finite guard.

SIGTERM or SIGINT sets a flag the loop checks after each step, so the run saves a checkpoint
and exits cleanly (preemption); a second signal exits at once, saving nothing. With several
processes the stop decision is agreed by all of them, so none waits in a collective alone.

The non-finite guard's host side: the jitted step (:mod:`docnmt_jax.training.steps`) leaves
parameters and optimiser state unchanged on a NaN/Inf loss or gradient norm and flags the step
in ``bad_steps``; :class:`BadStepGuard` counts consecutive flagged steps and stops the run at
``train.max_bad_steps``, naming the documents of the last bad batch (:func:`batch_documents`).
"""

from __future__ import annotations

import collections
import contextlib
import copy
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from docnmt_jax.data import pipeline as pipeline_lib
from docnmt_jax.models import Metric

#: The signals that stop a run cleanly, and the stop reason each gives.
STOP_SIGNALS = {signal.SIGTERM: "sigterm", signal.SIGINT: "sigint"}


def _say(message: str) -> None:
    """``message`` to stderr by one ``write`` system call: safe inside a signal handler, where
    Python's buffered ``sys.stderr`` may be in the middle of another write (tqdm's bar)."""
    os.write(2, (message + "\n").encode())


@contextlib.contextmanager
def stop_signals() -> Iterator[dict[str, str]]:
    """Turns SIGTERM and SIGINT into a flag (``flag["stop"]``: ``'sigterm'``/``'sigint'``) that
    the loop checks, so it can save a checkpoint and exit cleanly. A second signal while that
    happens exits the process at once (``os._exit(128 + signum)``) without saving: a save in
    flight is then never finalised and the previous complete checkpoint stays the latest."""
    flag = {"stop": ""}

    def handler(signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if flag["stop"]:
            _say(
                f"train: {name} again: exiting at once without saving; the latest complete "
                "checkpoint is kept (a save in flight is discarded)"
            )
            os._exit(128 + signum)
        flag["stop"] = STOP_SIGNALS[signum]
        _say(
            f"train: {name}: saving a checkpoint after the current step, then stopping "
            "(send it again to exit at once without saving)"
        )

    previous = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        yield flag
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


_STOP_REASONS = ("", "time_budget", "sigterm", "sigint")


def stop_reason(flag: dict[str, str], deadline: float | None, every_process: bool) -> str:
    """``'sigterm'``, ``'sigint'``, ``'time_budget'`` or ``''``; with ``every_process`` the
    processes agree (any process stopping stops all, so none waits in a collective for the
    others)."""
    if flag["stop"]:
        code = _STOP_REASONS.index(flag["stop"])
    else:
        code = int(deadline is not None and time.monotonic() > deadline)
    if every_process:
        code = int(np.max(multihost_utils.process_allgather(np.int32(code))))
    return _STOP_REASONS[code]


# ---------------------------------------------------------------------------------------------
# The non-finite guard.


def batch_documents(plan: pipeline_lib.BatchPlan, index: int) -> list[str]:
    """Ids of the documents in global batch ``index`` (0-based: the batch of step
    ``index + 1``) of a training ``plan``, in order of first appearance. Computed from the plan
    (a pure function of the step), since packed batches carry no document indices."""
    plan = copy.copy(plan)  # its own epoch cache: the input pipeline's thread uses the plan's
    e, b = plan.locate(index)
    ids = plan.epoch(e).batch(b)
    ids = ids[ids >= 0]
    if hasattr(plan, "item_rows"):  # packed plans: batches are rows of items (chunks)
        ids = np.concatenate([plan.item_rows[r] for r in ids]) if ids.size else ids
    docs = plan.chunk_table["doc"][ids]
    names = plan.corpus.doc_ids
    return [names[d] for d in dict.fromkeys(docs.tolist())]


def name_documents(ids: list[str], limit: int = 12) -> str:
    """The first ``limit`` of ``ids``, comma-separated, then how many more there are."""
    more = f" and {len(ids) - limit} more" if len(ids) > limit else ""
    return ", ".join(ids[:limit]) + more


class BadStepGuard:
    """Host side of the non-finite guard: follows the jitted step's ``bad_steps`` flags one step
    behind (fetching step n's flag after step n+1 is queued keeps the device busy) and raises
    :class:`TooManyBadStepsError` at the ``max_bad`` -th consecutive bad step (0: never)."""

    def __init__(self, max_bad: int):
        self.max_bad = max_bad
        self.pending: collections.deque = collections.deque()
        self.run: list[int] = []  # the current run of consecutive bad steps

    def push(self, step: int, metrics: dict[str, Metric]) -> None:
        if self.max_bad > 0:
            loss = metrics.get("loss", metrics["grad_norm"])  # every objective reports a loss
            values = (metrics["bad_steps"].total, loss, metrics["grad_norm"].total)
            self.pending.append((step, values))

    def check(self, keep: int = 0) -> None:
        """Looks at the flags of every pending step but the newest ``keep``."""
        while len(self.pending) > keep:
            step, values = self.pending.popleft()
            bad, loss, grad_norm = jax.device_get(values)
            if not bad:
                self.run = []
                continue
            self.run.append(step)
            if len(self.run) >= self.max_bad:
                raise TooManyBadStepsError(self.run, loss.value(), float(grad_norm))


class TooManyBadStepsError(Exception):
    """``max_bad_steps`` consecutive bad steps: their numbers, the last one's loss and
    gradient norm."""

    def __init__(self, steps: list[int], loss: float, grad_norm: float):
        super().__init__(steps)
        self.steps, self.loss, self.grad_norm = list(steps), loss, grad_norm


def too_many_bad_steps_message(
    bad: TooManyBadStepsError, max_bad: int, plan: pipeline_lib.BatchPlan
) -> str:
    """The one-line account of a run of ``max_bad`` bad steps: the steps, the last loss and
    gradient norm, and the documents of the last bad step's batch in the training ``plan``."""
    first, last = bad.steps[0], bad.steps[-1]
    return (
        f"{len(bad.steps)} consecutive steps with a non-finite loss or gradient norm "
        f"(train.max_bad_steps={max_bad}), steps {first}-{last}: training stopped at "
        f"step {last} (loss {bad.loss:.4g}, gradient norm {bad.grad_norm:.4g}; "
        f"parameters unchanged since step {first - 1}); the batch of step {last} holds "
        f"documents {name_documents(batch_documents(plan, last - 1))}"
    )
