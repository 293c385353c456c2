"""Holm's step-down correction against hand-computed values and a brute-force check of its
definition (the smallest alpha at which the sequential procedure rejects each hypothesis)."""

import itertools

import pytest

from docnmt_jax.evaluation.multiple_testing import holm, holm_by_key


def test_holm_matches_a_hand_computation():
    # sorted: 0.01 (x4 = 0.04), 0.02 (x3 = 0.06), 0.03 (x2 = 0.06), 0.5 (x1 = 0.5)
    assert holm([0.03, 0.5, 0.01, 0.02]) == pytest.approx([0.06, 0.5, 0.04, 0.06])
    # monotone: a later smaller product is raised to the running maximum; capped at 1
    assert holm([0.04, 0.045, 0.9]) == pytest.approx([0.12, 0.12, 0.9])
    assert holm([0.6, 0.7]) == pytest.approx([1.0, 1.0])
    assert holm([]) == []
    assert holm_by_key({"a": 0.01, "b": 0.04}) == pytest.approx({"a": 0.02, "b": 0.04})


def _rejects(p, alpha):
    """Holm's sequential procedure, written from its definition: step through the sorted
    p-values, reject while p_(k) <= alpha / (m - k + 1), stop at the first that is not."""
    m, rejected = len(p), set()
    for k, i in enumerate(sorted(range(m), key=lambda i: p[i])):
        if p[i] > alpha / (m - k):
            break
        rejected.add(i)
    return rejected


def test_adjusted_values_reject_exactly_what_the_procedure_rejects():
    values = [0.001, 0.004, 0.012, 0.013, 0.03, 0.2]
    for p in itertools.permutations(values, 4):
        adjusted = holm(list(p))
        for alpha in (0.01, 0.02, 0.05, 0.1):
            assert {i for i, a in enumerate(adjusted) if a <= alpha} == _rejects(p, alpha)
