"""Wall-clock timing: calls waited for (``jax.block_until_ready``), medians, and rounds that
time every model once in turn."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


def median(values: Sequence[float]) -> float:
    return float(np.median(values))


def time_calls(fn: Callable[[], Any], repeats: int) -> list[float]:
    """Wall seconds of ``repeats`` calls of ``fn``, each waited for."""
    import jax

    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return times


def interleaved_times(runners: list[Callable[[], float]], rounds: int) -> list[float]:
    """Median seconds of each runner over ``rounds`` rounds, each round calling every runner
    once in turn: a drift of this shared machine's speed over minutes then hits every model
    alike, instead of the ratio between models measured minutes apart."""
    times: list[list[float]] = [[] for _ in runners]
    for _ in range(rounds):
        for i, runner in enumerate(runners):
            times[i].append(runner())
    return [median(t) for t in times]
