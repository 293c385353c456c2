"""Maximum likelihood: the model's own label-smoothed cross-entropy (the default objective)."""

from __future__ import annotations

from docnmt_jax.objectives.base import Objective, register_objective


@register_objective("maximum_likelihood")
class MaximumLikelihood(Objective):
    """``loss = model.loss`` (label-smoothed NLL per target token)."""

    carries_state = True
