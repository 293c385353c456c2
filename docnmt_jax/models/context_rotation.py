"""Random contexts: every sentence of a grid batch moved to another row, keeping its slot, so
that the sentences it reads there (its context) come from other documents (Jean & Cho 2019,
Sec. 4.3).

A batch is seen as one ``[B, K + S]`` grid of sentence cells: the ``K`` window sentences
before each chunk (``context_*`` features, DocT and Jean & Cho) then its ``S`` sentences.
:func:`rotate_context` moves every cell by an ``origin [B, K + S]`` table (cell ``(b, c)``
receives cell ``(origin[b, c], c)``), the window columns with the sentence columns, so no
sentence keeps a window sentence of its own row. The origins are drawn by
:func:`shifted_rows` (every column rotated by its own random shift, :func:`random_context_batch`,
what ``Model.with_random_context`` does) or by the context-margin objective's derangement
(:func:`~docnmt_jax.objectives.context_margin.derangement`); the analyses' random-context
corpus moves its cells with :func:`take_columns` too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array
Grid = TypeVar("Grid", np.ndarray, jax.Array)


def take_columns(grid: Grid, origin: Any) -> Grid:
    """``out[b, c] = grid[origin[b, c], c]`` for a grid ``[B, C, ...]`` and ``origin [B, C]``
    (NumPy or JAX)."""
    return grid[origin, np.arange(origin.shape[1])[None, :]]


def context_grid(batch: Mapping[str, Array]) -> tuple[dict[str, Array], int]:
    """Every per-sentence feature ``[B, S, ...]`` of ``batch`` (those not named
    ``context_*``) as a ``[B, K + S, ...]`` grid: its window ``context_<name>`` first (zeros
    where the batch has none), then the chunk's sentences; and ``K`` (the width of
    ``context_src``, 0 without one)."""
    B, S = batch["src"].shape[:2]
    K = batch["context_src"].shape[1] if "context_src" in batch else 0
    joined = {}
    for key, value in batch.items():
        if key.startswith("context_") or not (value.ndim >= 2 and value.shape[:2] == (B, S)):
            continue
        empty = jnp.zeros((B, K) + value.shape[2:], value.dtype)
        before = batch.get(f"context_{key}", empty)
        joined[key] = jnp.concatenate([before, value], 1)
    return joined, K


def rotate_context(batch: Mapping[str, Array], origin: Array) -> dict[str, Array]:
    """``batch`` with every sentence cell moved by ``origin [B, K + S]`` (module docstring):
    every per-sentence feature (its target too) and its ``context_*`` window move together;
    row features (``doc_index`` ...) stay; ``origin_row [B, S]`` says which input row each
    sentence came from."""
    joined, K = context_grid(batch)
    out = dict(batch)
    for key, grid in joined.items():
        moved = take_columns(grid, origin)
        out[key] = moved[:, K:]
        if f"context_{key}" in batch:
            out[f"context_{key}"] = moved[:, :K]
    out["origin_row"] = jnp.asarray(origin)[:, K:].astype(jnp.int32)
    return out


def shifted_rows(rng: Array, rows: int, columns: int) -> Array:
    """``origin [rows, columns]``: column ``c`` rotated by its own random shift, ``origin[b, c]
    = (b + shift_c) mod rows``; the shifts are distinct (a random permutation's first
    ``columns``) when ``rows >= columns``, so the cells that share a row come from different
    input rows."""
    if rows >= columns:
        shifts = jax.random.permutation(rng, rows)[:columns]
    else:
        shifts = jax.random.randint(rng, (columns,), 0, rows)
    return (jnp.arange(rows)[:, None] + shifts[None, :]) % rows


def random_context_batch(batch: Mapping[str, Array], rng: Array) -> dict[str, Array]:
    """Every sentence with its context taken from other rows (Jean & Cho 2019, Sec. 4.3):
    :func:`rotate_context` by :func:`shifted_rows` over the batch's ``K + S`` columns. Every
    sentence keeps its slot and appears exactly once; with ``B >= K + S`` no sentence keeps a
    sentence of its own input row in its new row."""
    B, S = batch["src"].shape[:2]
    K = batch["context_src"].shape[1] if "context_src" in batch else 0
    return rotate_context(batch, shifted_rows(rng, B, K + S))
