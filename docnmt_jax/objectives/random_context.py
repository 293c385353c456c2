"""Maximum likelihood with every sentence given another document's context: row (b) of Jean &
Cho (2019)'s Table 1.

``config.objective.name = "random_context"``: the model's own label-smoothed loss on the batch
after :func:`~docnmt_jax.objectives.context_margin.deranged_batch` (each sentence, with its
target, moved to a row of other documents; context windows rotated with their column), so a
document model is trained with as many parameters as with its true context but with a context
that carries no information ("Instead of omitting the context, we give a random context to
make the number of parameters match", Table 1 footnote). Readings:

* the reassignment is the regulariser's (Sec. 5: "shuffle the context in each minibatch"),
  drawn anew every step from the step's ``rng`` (fixed ``seed`` in evaluation, ``rng`` None),
  so dev loss is measured under random context too, as the model is trained;
* a sentence whose batch holds no other document (``B = 1``) keeps a context of its own
  document: it is still trained (the loss is over every real token), and counted in
  ``random_context_missed``; the grid is required (:attr:`needs_grid`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from docnmt_jax.models.base import Metric, Metrics
from docnmt_jax.objectives.base import Objective, register_objective
from docnmt_jax.objectives.context_margin import (
    check_random_context,
    deranged_batch,
    require_grid_batch,
)

Array = jax.Array
PyTree = Any


@dataclasses.dataclass(frozen=True)
class RandomContextOptions:
    """``seed``: the reassignment of evaluation batches (training draws from the step rng)."""

    seed: int = 0


@register_objective("random_context")
class RandomContext(Objective):
    """``model.loss`` on the batch with every sentence's context from other documents."""

    options_class = RandomContextOptions
    needs_grid = True

    def check(self, model: Any) -> None:
        check_random_context(model, "random_context")

    def loss(
        self, params: PyTree, batch: dict[str, Array], rng: Array | None, train: bool
    ) -> tuple[Array, Metrics]:
        require_grid_batch(batch, "random_context")
        key = rng if rng is not None else jax.random.PRNGKey(self.options.seed)
        shuffle_key, dropout_key = jax.random.split(jax.random.fold_in(key, 1))
        shuffled, valid = deranged_batch(batch, shuffle_key)
        loss, metrics = self.model.loss(params, shuffled, dropout_key if train else None, train)
        real = jnp.any(batch["tgt_mask"] > 0, -1)
        missed = jnp.sum(real & ~valid).astype(jnp.float32)
        return loss, dict(metrics, random_context_missed=Metric(missed, jnp.ones(()), "sum"))
