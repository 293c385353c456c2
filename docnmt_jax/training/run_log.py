"""A training run's logs: the plain-text ``train.log`` and TensorBoard scalars, without
TensorFlow.

The TensorBoard events are written with the ``tensorboard`` package's own event writer and
scalar protos (``tensorboard.summary.writer``, ``tensorboard.plugins.scalar``), which import
no TensorFlow: the same files, tags and scalar plugin data as ``tf.summary.scalar``, so runs on
a machine without TensorFlow (an accelerator host, a slim venv) log exactly as elsewhere.
"""

from __future__ import annotations

import os
from typing import Any

import jax
from absl import logging
from tqdm import tqdm

from docnmt_jax.files import log_line


class ScalarWriter:
    """TensorBoard scalar events in ``logdir`` (``events.out.tfevents.*``), one file per run
    segment; ``tag`` values land under the scalars dashboard as ``tf.summary.scalar``'s do."""

    def __init__(self, logdir: str):
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        os.makedirs(logdir, exist_ok=True)
        self._writer = EventFileWriter(logdir)

    def scalars(self, step: int, values: dict[str, float]) -> None:
        import time

        from tensorboard.compat.proto import event_pb2
        from tensorboard.plugins.scalar.summary_v2 import scalar_pb

        for tag, value in values.items():
            event = event_pb2.Event(wall_time=time.time(), step=int(step))
            event.summary.CopyFrom(scalar_pb(tag, float(value)))
            self._writer.add_event(event)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class RunLog:
    """Plain-text log (``train.log``) and TensorBoard events (``tensorboard/``), written by
    process 0 only."""

    def __init__(self, workdir: str):
        self.enabled = jax.process_index() == 0
        self._writer: ScalarWriter | None = None
        self._file: Any = None
        if self.enabled:
            path = os.path.join(workdir, "train.log")
            self._file = open(path, "a", encoding="utf-8")
            if self._file.tell() and not _ends_with_newline(path):
                self._file.write("\n")  # a run killed mid-line: start on a line of our own
            self._writer = ScalarWriter(os.path.join(workdir, "tensorboard"))

    def write(self, step: int, values: dict[str, float], prefix: str = "") -> None:
        if not self.enabled:
            return
        text = " ".join(f"{prefix}{k}={v:.6g}" for k, v in sorted(values.items()))
        self._file.write(log_line(f"step={step} {text}"))
        self._file.flush()
        self._writer.scalars(step, {prefix + k: v for k, v in values.items()})

    def note(self, message: str) -> None:
        logging.info(message)
        if self.enabled:
            tqdm.write(message)
            self._file.write(log_line(message))
            self._file.flush()

    def warn(self, message: str) -> None:
        """A warning: to the log file and through absl (stderr under ``launch/train.py``)."""
        logging.warning(message)
        if self.enabled:
            self._file.write(log_line(f"WARNING: {message}"))
            self._file.flush()

    def close(self) -> None:
        if self.enabled:
            self._file.close()
            self._writer.close()


def _ends_with_newline(path: str) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"
