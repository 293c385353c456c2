"""Jean & Cho (2019)'s multi-level context-aware margin regulariser as an objective.

``config.objective.name = "context_margin"``: ``loss = (sum of the model's label-smoothed
token losses + R(theta; D)) / real target tokens`` (Eq. 1 + Eq. 3), ``D`` the batch of one
``objective.loss`` call (one micro-batch / one device shard under accumulation or sharding).

Scores (Sec. 4.1), from teacher-forced log-probabilities of the gold tokens:
``s_tok = log p(y*_t | y_<t, X, C)``, ``s_sent = sum_t s_tok``, ``s_data = sum_Y s_sent``;
``s_tok`` on the batch grid is the model's ``token_scores`` (the scoring capability of
:mod:`docnmt_jax.models.contract`), whatever rows the model computes it in.

Context-less scores (Sec. 4.3, Eq. 2): ``M = samples`` random contexts per sentence, each an
in-batch reassignment (Sec. 5, ``M = 1``) by :func:`derangement`. Readings:

* every level's estimate is the log-mean-exp over the ``M`` samples of that level's
  probability (stably, :func:`log_mean_exp`): token level over ``p(y_t | ...)``, sentence
  level over ``p(Y | X, C_m)`` (the sequence marginal, not the sum of token estimates); the
  data level is the sum of the sentence estimates (Sec. 4.1's ``s_data = sum_Y s_sent``,
  examples independent). With ``M = 1`` the three readings coincide with plain differences.
* Eq. 3: ``alpha_d [sum_n T_n delta_d - s_data(C) + s_data(rand)]_+ + alpha_s sum_n
  [T_n delta_s - s_sent(C) + s_sent(rand)]_+ + alpha_tau sum_{n,t} [delta_tau - s_tok(C) +
  s_tok(rand)]_+`` with ``T_n`` the real target tokens of sentence ``n`` (EOS included;
  doc2doc: its separator). Sums run over the sentences that got a valid random context
  (below); the data-level sum of ``T_n`` over the same sentences.
* Normalisation: ``R`` is a sum (as Eq. 3) added to the summed label-smoothed loss, and both are
  divided by the batch's real target tokens -- the model's own per-token normaliser -- so the
  ratio NLL : R is the paper's whatever the batch size.
* Defaults (Sec. 5): ``alpha_tau = alpha_d = 1``, ``alpha_s = 0``, ``delta_tau = delta_s =
  0``, ``delta_d = log 1.1``, ``M = 1``.
* ``random_context_gradient`` (default True): gradients flow through the random-context
  scores, because Eq. 3 is a function of theta through both scores and the paper stops no
  gradient; False treats them as constants (only the true-context scores are pushed up).
  Measured on the synthetic task (docs/papers/jean_cho.md): with True a tiny FINAL
  never found its context within the budget, with False it did.
* Random contexts: the objective's own :func:`deranged_batch`, not the model's
  ``with_random_context`` (which may hand a sentence its own context back); the model must
  support random contexts (:meth:`ContextMargin.check`). The batch must be the ``[B, S, T]``
  grid (:attr:`ContextMargin.needs_grid`: the trainer builds it for this objective).
* A random context is valid when the sentence's new row holds no other sentence of its own
  document (``doc_index``; the row when absent) and is not a row of that document (row
  features, e.g. a context window, stay with the row). A sentence without one (a batch with
  a single real document, ``B = 1``, or too few documents for a column) is skipped: out of
  ``R`` and ``Delta``, counted in ``margin_skipped`` -- no error, since that is data inside a
  jitted step.
* Evaluation (``rng`` None): the random contexts of ``seed``, no dropout. Training: the true
  forward pass uses the step's ``rng`` (so ``ml_loss`` equals ``model.loss`` with that rng);
  sample ``m`` folds ``m + 1`` into it for its reassignment and its dropout.
* One true-context forward (``token_scores``) gives both the label-smoothed loss (as
  ``BaseModel.loss``) and the true scores; metrics a model adds in an overridden ``loss``
  (HM-GDC's ``split_documents``) are not reported.

Metrics (beyond ``loss``/``nll``/``ppl``/``tokens``): ``ml_loss`` (label-smoothed part),
``margin_reg`` (``R`` per token), ``hinge_{tok,sent,data}`` (hinge values before ``alpha``,
mean per token / sentence / batch), ``active_{tok,sent,data}`` (fraction of hinges > 0),
``delta`` (``s_data(C) - s_data(rand)`` per token, Sec. 4.4), ``margin_skipped``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp

from docnmt_jax.data.schema import dummy_batch
from docnmt_jax.errors import ModelError
from docnmt_jax.models.context_rotation import context_grid, rotate_context
from docnmt_jax.models.contract import Metric, Metrics, RandomContext, Scoring, require
from docnmt_jax.objectives.base import Objective, ObjectiveError, register_objective

Array = jax.Array
PyTree = Any

#: Candidate reassignments drawn per batch; the one with the most valid sentences is used.
ATTEMPTS = 8


@dataclasses.dataclass(frozen=True)
class ContextMarginOptions:
    """Eq. 3's strengths and margins (Sec. 5 defaults), ``M`` and the gradient switch."""

    alpha_data: float = 1.0
    alpha_sentence: float = 0.0
    alpha_token: float = 1.0
    margin_data: float = math.log(1.1)
    margin_sentence: float = 0.0
    margin_token: float = 0.0
    samples: int = 1
    random_context_gradient: bool = True
    seed: int = 0


# ----------------------------------------------------------------------------- derangement


def derangement(real: Array, ident: Array, rng: Array) -> tuple[Array, Array]:
    """``origin [B, C]``: the input row whose column-``c`` sentence goes to row ``b``; ``valid``.

    ``real [B, C]`` marks real sentences, ``ident [B]`` each row's document. Every column is
    rotated among its own real rows by a shift in ``1 .. n_c - 1`` (one shared random order
    of shifts, so columns get distinct shifts when ``n_c > C``); padding slots stay where they
    are, so no real sentence lands in padding and none is replaced by it. ``valid`` marks the
    real sentences whose new row holds no other sentence of their document and is not one of
    their document's rows; the best of :data:`ATTEMPTS` draws is kept.
    """
    B, C = real.shape
    rows = jnp.arange(B)
    order = jnp.argsort(~real, axis=0, stable=True)  # [B, C]: real rows first
    rank = jnp.argsort(order, axis=0)  # position of row b in its column's order
    n = jnp.sum(real, axis=0)  # [C]

    def draw(key: Array) -> tuple[Array, Array]:
        keys = jax.random.uniform(key, (B,))
        values = jnp.arange(B)
        ok = (values[None, :] >= 1) & (values[None, :] < n[:, None])  # [C, B]
        ranked = jnp.argsort(jnp.where(ok, keys[None, :], 2.0), axis=1)  # valid shifts first
        m = jnp.maximum(n - 1, 1)
        shift = jnp.where(n >= 2, ranked[jnp.arange(C), jnp.arange(C) % m], 0)
        dest = (rank + shift[None, :]) % jnp.maximum(n, 1)[None, :]
        moved = order[dest, jnp.arange(C)[None, :]]
        origin = jnp.where(real, moved, rows[:, None])
        doc = ident[origin]  # [B, C]
        same = (doc[:, :, None] == doc[:, None, :]) & real[:, None, :]
        same = same & ~jnp.eye(C, dtype=bool)[None]
        valid = real & (doc != ident[:, None]) & ~jnp.any(same, axis=2)
        return origin, valid

    origins, valids = jax.vmap(draw)(jax.random.split(rng, ATTEMPTS))
    best = jnp.argmax(jnp.sum(valids, axis=(1, 2)))
    return origins[best].astype(jnp.int32), valids[best]


def deranged_batch(batch: dict[str, Array], rng: Array) -> tuple[dict[str, Array], Array]:
    """The grid batch with every sentence given foreign context (``M = 1``, Sec. 5), and
    ``valid [B, S]`` (:func:`derangement`): the cells of the ``[B, K + S]`` grid of window and
    chunk sentences moved by :func:`~docnmt_jax.models.context_rotation.rotate_context` (every
    ``[B, S, ...]`` feature with its sentence, its target too, keeping its slot; ``context_*``
    windows as columns of the grid; row features stay; ``origin_row [B, S]``)."""
    B = batch["src"].shape[0]
    joined, K = context_grid(batch)
    real = jnp.any(joined["src_mask"] > 0, -1) | jnp.any(joined["tgt_mask"] > 0, -1)
    ident = jnp.arange(B)
    if "doc_index" in batch:  # chunks of one document count as one (-1: padding rows)
        ident = jnp.where(batch["doc_index"] >= 0, batch["doc_index"], -1 - jnp.arange(B))
    origin, valid = derangement(real, ident, rng)
    return rotate_context(batch, origin), valid[:, K:]


def check_random_context(model: Any, objective: str) -> None:
    """Raises :class:`ObjectiveError` when ``model`` has no context to replace (a sentence
    model, or one without the random-context capability): what an objective that reassigns
    contexts checks."""
    try:
        require(model, RandomContext, f"be trained with objective {objective!r}")
        jax.eval_shape(
            model.with_random_context, dummy_batch(sentences=2, rows=2), jax.random.PRNGKey(0)
        )
    except ModelError as e:
        raise ObjectiveError(f"objective {objective!r} needs random contexts: {e}") from None


def require_grid_batch(batch: dict[str, Array], objective: str) -> None:
    """Raises :class:`ObjectiveError` on packed rows: contexts are reassigned on the grid."""
    if "src_chunk_ids" in batch:
        raise ObjectiveError(
            f"objective {objective!r} needs [B, S, T] grid batches, got packed rows "
            "(the trainer builds the grid for it: PipelineConfig(packing=None))"
        )


# ----------------------------------------------------------------------------- regulariser


def log_mean_exp(x: Array) -> Array:
    """``log mean_m exp(x_m)`` over axis 0 (Sec. 4.3), stable: ``max + log mean exp(x - max)``
    (exactly ``x_0`` when the samples are equal: a context-ignoring model gets Delta = 0)."""
    top = jax.lax.stop_gradient(jnp.max(x, axis=0))
    return top + jnp.log(jnp.mean(jnp.exp(x - top), axis=0))


def margin_regulariser(
    true_tok: Array, random_tok: Array, mask: Array, use: Array, options: ContextMarginOptions
) -> tuple[Array, Metrics]:
    """Eq. 3 over ``true_tok [B, S, T]`` and ``random_tok [M, B, S, T]`` (gold log-probs, the
    samples aligned to the true positions), ``mask [B, S, T]``, ``use [B, S]`` (sentences
    that enter R). Returns ``(R, metrics)``; see the module docstring for the readings."""
    o = options
    mask = mask.astype(jnp.float32)
    w_sent = use.astype(jnp.float32) * (jnp.sum(mask, -1) > 0)
    w_tok = mask * w_sent[..., None]
    lengths = jnp.sum(mask, -1)  # T_n
    rand_tok = log_mean_exp(random_tok)
    true_sent = jnp.sum(true_tok * mask, -1)
    rand_sent = log_mean_exp(jnp.sum(random_tok * mask, -1))
    arg_tok = o.margin_token - true_tok + rand_tok
    arg_sent = lengths * o.margin_sentence - true_sent + rand_sent
    arg_data = jnp.sum(w_sent * (lengths * o.margin_data - true_sent + rand_sent))
    hinge_tok = jnp.sum(jax.nn.relu(arg_tok) * w_tok)
    hinge_sent = jnp.sum(jax.nn.relu(arg_sent) * w_sent)
    any_data = (jnp.sum(w_sent) > 0).astype(jnp.float32)
    hinge_data = jax.nn.relu(arg_data) * any_data
    reg = o.alpha_data * hinge_data + o.alpha_sentence * hinge_sent + o.alpha_token * hinge_tok
    n_tok, n_sent, one = jnp.sum(w_tok), jnp.sum(w_sent), jnp.ones(())
    metrics = {
        "hinge_tok": Metric(hinge_tok, n_tok),
        "active_tok": Metric(jnp.sum((arg_tok > 0) * w_tok), n_tok),
        "hinge_sent": Metric(hinge_sent, n_sent),
        "active_sent": Metric(jnp.sum((arg_sent > 0) * w_sent), n_sent),
        "hinge_data": Metric(hinge_data, any_data),
        "active_data": Metric((arg_data > 0) * any_data, any_data),
        "delta": Metric(jnp.sum(w_sent * (true_sent - rand_sent)), n_tok),
        "margin_tokens": Metric(n_tok, one, "sum"),
    }
    return reg, metrics


# ------------------------------------------------------------------------------- objective


@register_objective("context_margin")
class ContextMargin(Objective):
    """``(sum label-smoothed loss + R) / tokens``, R of Eq. 3 (Jean & Cho 2019, Sec. 4)."""

    options_class = ContextMarginOptions
    #: Random contexts are reassigned on the ``[B, S, T]`` grid: the trainer builds it.
    needs_grid = True

    def check(self, model: Any) -> None:
        require(model, Scoring, "be trained with objective 'context_margin'")
        o = self.options
        if o.samples < 1:
            raise ObjectiveError(f"config.objective.samples = {o.samples}: must be >= 1")
        for name in ("alpha_data", "alpha_sentence", "alpha_token"):
            if getattr(o, name) < 0:
                raise ObjectiveError(f"config.objective.{name} = {getattr(o, name)}: must be >= 0")
        check_random_context(model, "context_margin")

    def loss(
        self, params: PyTree, batch: dict[str, Array], rng: Array | None, train: bool
    ) -> tuple[Array, Metrics]:
        require_grid_batch(batch, "context_margin")
        o, model = self.options, self.model
        key = rng if rng is not None else jax.random.PRNGKey(o.seed)
        grid_mask = batch["tgt_mask"]
        true_tok, token_metrics = model.token_scores(params, batch, rng, train)
        tokens = token_metrics["tokens"].total
        loss_sum = token_metrics["loss"].total
        nll_sum = -jnp.sum(true_tok)

        B, S = grid_mask.shape[:2]
        columns = jnp.arange(S)[None, :]
        samples, use = [], jnp.ones((B, S), bool)
        for m in range(o.samples):
            shuffle_key, dropout_key = jax.random.split(jax.random.fold_in(key, m + 1))
            shuffled, valid = deranged_batch(batch, shuffle_key)
            rand_tok, _ = model.token_scores(
                params, shuffled, dropout_key if train else None, train
            )
            if not o.random_context_gradient:
                rand_tok = jax.lax.stop_gradient(rand_tok)
            origin = shuffled["origin_row"]  # back to the true positions (a permutation)
            samples.append(jnp.zeros_like(rand_tok).at[origin, columns].set(rand_tok))
            use = use & jnp.zeros_like(valid).at[origin, columns].set(valid)
        reg, metrics = margin_regulariser(true_tok, jnp.stack(samples), grid_mask, use, o)

        real = jnp.sum(grid_mask, -1) > 0
        one = jnp.ones(())
        metrics.update(
            {
                "loss": Metric(loss_sum + reg, tokens),
                "ml_loss": Metric(loss_sum, tokens),
                "margin_reg": Metric(reg, tokens),
                "nll": Metric(nll_sum, tokens),
                "ppl": Metric(nll_sum, tokens, "exp_mean"),
                "tokens": Metric(tokens, one, "sum"),
                "margin_skipped": Metric(jnp.sum(real & ~use).astype(jnp.float32), one, "sum"),
            }
        )
        return (loss_sum + reg) / jnp.maximum(tokens, 1.0), metrics
