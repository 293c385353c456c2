"""The training batch stream: tf.data where TensorFlow is installed, a prefetching NumPy
iterator where it is not (``data.loader``).

Both serve the same :class:`~docnmt_jax.data.batch_plan.BatchPlan` /
:class:`~docnmt_jax.data.packed_plan.PackedPlan` from the same global step, so they give the
same batches element for element (``tests/test_loader.py``); they differ only in who does the
work ahead of the train step: tf.data's threads, or one Python thread filling a bounded queue
(materialising a batch is NumPy gathers, which release the GIL for most of their time).

``data.loader``: ``"auto"`` (tf.data when ``import tensorflow`` succeeds, else NumPy),
``"tf"`` or ``"numpy"``.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any

from docnmt_jax.data import pipeline as pipeline_lib
from docnmt_jax.data.pipeline import Batch
from docnmt_jax.errors import ConfigError

LOADERS = ("auto", "tf", "numpy")
#: Batches the NumPy loader materialises ahead of the consumer.
PREFETCH = 4


def tensorflow_importable() -> bool:
    """Whether ``import tensorflow`` succeeds here (the import is what tf.data needs)."""
    try:
        import tensorflow  # noqa: F401
    except ImportError:
        return False
    return True


def resolve(loader: str) -> str:
    """``"tf"`` or ``"numpy"``: the loader ``data.loader`` names on this machine; an unknown
    name, or ``"tf"`` without TensorFlow, is a one-line :class:`ConfigError`."""
    if loader not in LOADERS:
        raise ConfigError(f"config.data.loader={loader!r}: expected one of {', '.join(LOADERS)}")
    if loader == "auto":
        return "tf" if tensorflow_importable() else "numpy"
    if loader == "tf" and not tensorflow_importable():
        raise ConfigError(
            "config.data.loader='tf' but TensorFlow cannot be imported here: use 'numpy' or 'auto'"
        )
    return loader


def prefetched(batches: Iterator[Batch], size: int = PREFETCH) -> Iterator[Batch]:
    """``batches`` produced by a background thread up to ``size`` ahead, in order; an error
    in the producer is raised here, at the batch where it happened. Closing the returned
    generator (or dropping it) stops the thread."""
    slots: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=max(size, 1))
    stop = threading.Event()

    def put(item: tuple[str, Any]) -> bool:
        while not stop.is_set():
            try:
                slots.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for batch in batches:
                if not put(("batch", batch)):
                    return
            put(("end", None))
        except BaseException as e:  # handed to the consumer, raised there
            put(("error", e))

    thread = threading.Thread(target=produce, name="numpy-loader", daemon=True)
    thread.start()
    try:
        while True:
            kind, value = slots.get()
            if kind == "end":
                return
            if kind == "error":
                raise value
            yield value
    finally:
        stop.set()


def train_batches(
    plan: Any, start_step: int = 0, loader: str = "auto", prefetch: int = PREFETCH
) -> Iterator[Batch]:
    """This process's batches of ``plan`` (a batch or packed plan) from global step
    ``start_step`` on, as NumPy dicts, through the loader ``data.loader`` names."""
    if resolve(loader) == "tf":
        return pipeline_lib.make_dataset(plan, start_step=start_step).as_numpy_iterator()
    return prefetched(pipeline_lib.numpy_batches(plan, start_step=start_step), prefetch)
