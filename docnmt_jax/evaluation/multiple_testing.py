"""Corrections of p-values for a family of comparisons.

Holm (1979), "A simple sequentially rejective multiple test procedure": sort the ``m``
p-values ascending, ``p_(1) <= ... <= p_(m)``; the adjusted value of the ``i``-th is
``max_{j <= i} min(1, (m - j + 1) * p_(j))``. Rejecting where the adjusted value is below
``alpha`` controls the family-wise error rate at ``alpha`` under any dependence between the
tests, and rejects at least what Bonferroni (``m * p``) rejects.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values, in the order of ``p_values`` (module docstring)."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (m - rank) * float(p_values[index])))
        adjusted[index] = running
    return adjusted


def holm_by_key(p_values: Mapping[str, float]) -> dict[str, float]:
    """:func:`holm` over a mapping ``name -> p``, keyed the same."""
    names = list(p_values)
    return dict(zip(names, holm([p_values[n] for n in names]), strict=True))
