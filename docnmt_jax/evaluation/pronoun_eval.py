"""Scoring the Spanish→English pronoun sets (:mod:`docnmt_jax.data.pronoun_set`;
docs/evaluation.md):
the forced-choice path of :mod:`docnmt_jax.evaluation.contrastive` (strictly-higher rule)
under three contexts, and McNemar's exact test between two models.

* **Contexts** (:func:`~docnmt_jax.evaluation.contrastive.with_context`): ``true`` (the
  document's previous sentences), ``none`` (the current sentence alone), ``random`` (as many
  previous sentences of another document of the set, seeded). A model that uses the context
  for the pronoun should lose accuracy from true to none and to random on the instances only
  the context decides (``context_only``).
* **Breakdowns**: overall, ``by_gender``, ``by_distance`` (``1``, ``2``, ``3-5``, ``>5``,
  ``outside`` the chunk, ``none``), ``by_context_only``; and the context-only subset on its
  own, with its own breakdowns (:func:`score_conditions`).
* **Paired test** (:func:`compare`): per context, McNemar's exact test of the system's
  right/wrong outcomes against the baseline's, over all instances and the context-only ones
  (:func:`~docnmt_jax.evaluation.significance.mcnemar_exact`).

A sentence model sees no context: its three contexts give one score, computed once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from docnmt_jax.data.contrastive_sets import ContrastiveInstance
from docnmt_jax.data.tokenizer import Tokenizer
from docnmt_jax.evaluation import contrastive, cxmi
from docnmt_jax.evaluation.significance import mcnemar_exact
from docnmt_jax.models.base import Model


def context_only_mask(instances: Sequence[ContrastiveInstance]) -> np.ndarray:
    """Instances whose attribute ``context_only`` is ``yes`` (bool ``[N]``)."""
    return np.array([i.attributes.get("context_only") == "yes" for i in instances], bool)


def summarise(
    instances: Sequence[ContrastiveInstance], scores: Sequence[np.ndarray]
) -> dict[str, Any]:
    """Accuracy with breakdowns, the context-only subset's, and the per-instance outcomes."""
    only = context_only_mask(instances)
    subset = [i for i, keep in zip(instances, only, strict=True) if keep]
    subset_scores = [s for s, keep in zip(scores, only, strict=True) if keep]
    result = contrastive.forced_choice_accuracy(instances, scores)
    if subset:
        result["context_only_subset"] = contrastive.forced_choice_accuracy(subset, subset_scores)
    result["outcomes"] = contrastive.choice_outcomes(instances, scores).tolist()
    return result


def score_conditions(
    model: Model,
    params: Any,
    tokenizer: Tokenizer,
    instances: Sequence[ContrastiveInstance],
    groups: Sequence[str],
    contexts: Sequence[str] = contrastive.CONTEXTS,
    seed: int = 0,
    max_sentences: int = 20,
    rows: int = 32,
    scorer: Callable[[Any, dict[str, np.ndarray]], Any] | None = None,
) -> dict[str, dict[str, Any]]:
    """``{context: summarise(...) + scores}`` for every context of ``contexts``; ``groups``:
    each instance's document (random contexts come from other documents)."""
    blind = cxmi.context_view(model, max_sentences) == 0
    results: dict[str, dict[str, Any]] = {}
    first: list[np.ndarray] | None = None
    for mode in contexts:
        if blind and first is not None:
            scores = first
        else:
            variant = contrastive.with_context(instances, mode, groups, seed)
            scores = contrastive.instance_scores(
                model, params, tokenizer, variant, max_sentences, rows, scorer=scorer
            )
            first = scores
        results[mode] = summarise(instances, scores)
        results[mode]["log_probs"] = [[float(x) for x in s] for s in scores]
    return results


def compare(
    system: Mapping[str, Mapping[str, Any]],
    baseline: Mapping[str, Mapping[str, Any]],
    instances: Sequence[ContrastiveInstance],
) -> dict[str, dict[str, Any]]:
    """Per context both hold: McNemar's exact test over all instances and the context-only."""
    only = context_only_mask(instances)
    out = {}
    for mode in system:
        if mode not in baseline:
            continue
        a = np.asarray(system[mode]["outcomes"], bool)
        b = np.asarray(baseline[mode]["outcomes"], bool)
        out[mode] = {"all": mcnemar_exact(a, b), "context_only": mcnemar_exact(a[only], b[only])}
    return out


def _cell(bucket: Mapping[str, Any] | None) -> str:
    if not bucket or not bucket["total"]:
        return f"{'-':>14}"
    return f"{100 * bucket['accuracy']:6.1f} ({bucket['correct']:>3}/{bucket['total']:<3})"


def format_conditions(results: Mapping[str, Mapping[str, Any]], title: str) -> str:
    """A table: rows overall, each breakdown value, context-only subset; a column a context."""
    modes = list(results)
    rows: list[tuple[str, Callable[[Mapping[str, Any]], Any]]] = [("overall", lambda r: r)]
    first = results[modes[0]]
    for key in sorted(k for k in first if k.startswith("by_")):
        for value in first[key]:
            rows.append((f"{key[3:]} {value}", lambda r, k=key, v=value: r.get(k, {}).get(v)))
    rows.append(("context-only subset", lambda r: r.get("context_only_subset")))
    lines = [title, f"  {'':<22}" + "".join(f"{m + ' context':>16}" for m in modes)]
    for name, get in rows:
        lines.append(f"  {name:<22}" + "".join(f"  {_cell(get(results[m]))}" for m in modes))
    return "\n".join(lines)


def format_compare(result: Mapping[str, Mapping[str, Any]], system: str, baseline: str) -> str:
    """McNemar's exact test per context, as lines."""
    lines = [f"McNemar's exact test, {system} vs {baseline} (only one right: system / baseline):"]
    for mode, tests in result.items():
        for subset, t in tests.items():
            lines.append(
                f"  {mode:>6} context, {subset:<12} {t['system_only']:>3} / "
                f"{t['baseline_only']:<3} of {t['pairs']:>4}  p = {t['p_value']:.4g}"
            )
    return "\n".join(lines)
