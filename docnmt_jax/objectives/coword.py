"""Context-aware word dropout (CoWord; Fernandes et al. 2021, Sec. 5) as an objective any
model can use.

``config.objective.name = "coword"``: in training, every real token of the *current* source
sentences is replaced by the unknown token (``UNK_ID``) with probability ``probability``
before the model's own loss is taken, so that the model has to recover the lost information
from its context (Fernandes et al. report it raises CXMI and context-dependent accuracy).
Readings:

* **Current sentences** are the batch's ``src`` -- every sentence whose target is predicted;
  a window model's context (``context_src``: DocT, Jean & Cho) is never dropped. In a chunk
  model (FINAL, doc2doc, HM-GDC) every sentence of the chunk is a current sentence, so each is
  dropped independently and the others' remaining words are its context. A sentence model
  can be trained with it too (plain word dropout).
* **Tokens**, not whole words, are dropped (subword pieces, as the masking of the paper's
  released fairseq code); EOS and padding never are, and no position, mask or segment
  changes (a dropped token reads as unknown, there is no separate mask piece in the
  vocabulary).
* Evaluation (``train`` False, dev loss) drops nothing; the draw folds ``1`` into the step's
  rng, the model's dropout gets the other half of the split.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from docnmt_jax.data.tokenizer import EOS_ID, UNK_ID
from docnmt_jax.models.base import Metric, Metrics
from docnmt_jax.objectives.base import Objective, ObjectiveError, register_objective

Array = jax.Array
PyTree = Any


@dataclasses.dataclass(frozen=True)
class CoWordOptions:
    """``probability``: the chance a current-source token is dropped (Fernandes et al.
    explore 0.1 to 0.3; 0.1 is the default here)."""

    probability: float = 0.1


def coword_mask(src: Array, src_mask: Array, uniform: Array, probability: float) -> Array:
    """Which tokens to drop: real (``src_mask``), not EOS, and ``uniform < probability``
    (``uniform`` of the shape of ``src``, in [0, 1))."""
    return (src_mask > 0) & (src != EOS_ID) & (uniform < probability)


def coword_batch(batch: dict[str, Array], rng: Array, probability: float) -> tuple[dict, Array]:
    """The batch with the current sources' dropped tokens set to ``UNK_ID``, and the mask."""
    src = batch["src"]
    mask = coword_mask(src, batch["src_mask"], jax.random.uniform(rng, src.shape), probability)
    return {**batch, "src": jnp.where(mask, UNK_ID, src).astype(src.dtype)}, mask


@register_objective("coword")
class CoWord(Objective):
    """The model's own loss on the batch after CoWord dropout (training only)."""

    options_class = CoWordOptions

    def check(self, model: Any) -> None:
        p = self.options.probability
        if not 0.0 <= p < 1.0:
            raise ObjectiveError(f"config.objective.coword.probability = {p}: must be in [0, 1)")

    def loss(
        self, params: PyTree, batch: dict[str, Array], rng: Array | None, train: bool
    ) -> tuple[Array, Metrics]:
        if not train or rng is None:
            return self.model.loss(params, batch, rng, train)
        drop_key, model_key = jax.random.split(jax.random.fold_in(rng, 1))
        dropped, mask = coword_batch(batch, drop_key, self.options.probability)
        loss, metrics = self.model.loss(params, dropped, model_key, train)
        real = jnp.sum(batch["src_mask"] > 0).astype(jnp.float32)
        share = Metric(jnp.sum(mask).astype(jnp.float32), jnp.maximum(real, 1.0))
        return loss, dict(metrics, coword_dropped=share)
