"""Dev evaluation during training: the objective's dev metrics and the hooks that add more.

Every evaluation sums the objective's metrics over one pass of the dev batches
(``dev_<name>``, from the EMA parameters when the run keeps them), then calls each
:data:`EvalHook`. The dev-BLEU hook (``config.train.dev_bleu``) translates the dev set with the
same :class:`~docnmt_jax.decoding.translator.Translator` as ``translate.py`` and scores it with
sacreBLEU: s-BLEU, d-BLEU and chrF. It needs the run's model, tokenizer and mesh, so the train
command passes a :data:`DevHookFactory` (:func:`dev_bleu_hook`) that the trainer calls once
they exist.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator
from typing import Any

import flax.linen as nn
import jax
import ml_collections

from docnmt_jax import parallel
from docnmt_jax.data import pipeline as pipeline_lib
from docnmt_jax.data.documents import Document
from docnmt_jax.data.schema import dummy_batch
from docnmt_jax.data.tokenizer import Tokenizer
from docnmt_jax.decoding.search import SearchConfig
from docnmt_jax.decoding.translator import Translator
from docnmt_jax.errors import ConfigError
from docnmt_jax.evaluation.metrics import score_documents
from docnmt_jax.files import write_hypotheses
from docnmt_jax.models import Metric, Model
from docnmt_jax.models.base import reduce_metrics
from docnmt_jax.objectives import Objective

PyTree = Any
#: Extra dev metrics of the evaluated parameters at a step: ``hook(params, step)``.
EvalHook = Callable[[PyTree, int], dict[str, float]]
#: The metrics the dev-BLEU hook adds.
BLEU_METRICS = ("dev_bleu", "dev_dbleu", "dev_chrf")


def add_metrics(total: dict[str, Metric], new: dict[str, Metric]) -> dict[str, Metric]:
    """Element-wise sum of two metric dicts (the first may be empty)."""
    return dict(new) if not total else {k: total[k] + new[k] for k in total}


def evaluate_metrics(
    eval_step: Callable, params: PyTree, batches: Iterator[dict], carry: PyTree = None
) -> dict[str, float]:
    """The objective's metrics summed over every dev batch, as ``dev_<name>``; with a
    ``carry`` (document streams) each batch reads the state the previous one left."""
    totals: dict[str, Metric] = {}
    for batch in batches:
        if carry is None:
            metrics = eval_step(params, batch)
        else:
            metrics, carry = eval_step(params, batch, carry)
        totals = add_metrics(totals, metrics)
    if not totals:
        raise ConfigError("config.data: the dev set produced no batch (is it empty?)")
    return {f"dev_{name}": value for name, value in reduce_metrics(totals).items()}


def metric_names(objective: Objective) -> list[str]:
    """The names of the metrics ``objective.loss`` returns (traced, nothing computed)."""
    model = objective.model
    params = jax.eval_shape(model.init, jax.random.PRNGKey(0), dummy_batch())["params"]
    params = nn.meta.unbox(params)
    batch = dummy_batch(sentences=1 if model.layout.sentence_level else 2)
    _, metrics = jax.eval_shape(lambda p: objective.loss(p, batch, None, False), params)
    return sorted(metrics)


def make_bleu_hook(
    model: Model,
    tokenizer: Tokenizer,
    documents: list[Document],
    search: SearchConfig,
    batch_tokens: int,
    max_sentences: int,
    layout: parallel.Layout | None = None,
    output_dir: str | None = None,
) -> EvalHook:
    """Dev s-BLEU / d-BLEU / chrF of the current parameters (sacreBLEU on detokenised text).

    One :class:`Translator` lives across evaluations, so its search compiles once; it is the
    Translator ``translate.py`` uses (same compiled search, on the mesh of ``layout``). With
    ``output_dir`` (process 0) the translations are written to ``output_dir/step_N.tsv``.
    """
    translator = Translator(
        model,
        None,
        tokenizer,
        search,
        batch_tokens=batch_tokens,
        max_sentences=max_sentences,
        mesh=layout,
    )
    references = [list(doc.tgt) for doc in documents]

    def hook(params: PyTree, step: int) -> dict[str, float]:
        translator.params = params
        hyps = translator.translate(documents)
        if output_dir is not None and jax.process_index() == 0:
            os.makedirs(output_dir, exist_ok=True)
            write_hypotheses(os.path.join(output_dir, f"step_{step}.tsv"), documents, hyps)
        scores = score_documents(hyps, references)
        return {
            "dev_bleu": scores["s_bleu"]["score"],
            "dev_dbleu": scores["d_bleu"]["score"],
            "dev_chrf": scores["chrf"]["score"],
        }

    return hook


@dataclasses.dataclass(frozen=True)
class DevContext:
    """What a run's dev hook is built from, once the trainer has it: the model, tokenizer,
    dev documents and mesh layout of the run, and its workdir."""

    model: Model
    tokenizer: Tokenizer
    documents: list[Document]
    layout: parallel.Layout
    workdir: str


#: Builds a run's dev hook from its :class:`DevContext` (``train_and_evaluate(dev_hook=...)``).
DevHookFactory = Callable[[DevContext], EvalHook]


def dev_bleu_hook(config: ml_collections.ConfigDict) -> DevHookFactory | None:
    """The dev-BLEU hook of ``config`` when ``config.train.dev_bleu`` is set, else None:
    search ``train.dev_bleu_beam``/``dev_bleu_alpha``, batches of ``data.eval_batch_tokens``
    and ``data.max_sentences``, translations in ``WORKDIR/dev_translations``."""
    tcfg = config.train
    if not tcfg.get("dev_bleu", False):
        return None

    def build(dev: DevContext) -> EvalHook:
        return make_bleu_hook(
            dev.model,
            dev.tokenizer,
            dev.documents,
            SearchConfig(beam_size=tcfg.dev_bleu_beam, alpha=tcfg.dev_bleu_alpha),
            config.data.eval_batch_tokens,
            config.data.max_sentences,
            dev.layout,
            os.path.join(dev.workdir, "dev_translations"),
        )

    return build


class DevEvaluator:
    """A run's dev evaluation: ``eval_step``'s metrics summed over the dev ``plan`` (batches
    laid out on ``layout``; document streams from ``initial_carry(rows)`` on), then each of
    ``hooks``; of the EMA when the state keeps one."""

    def __init__(
        self,
        eval_step: Callable,
        plan: pipeline_lib.BatchPlan,
        layout: parallel.Layout,
        hooks: tuple[EvalHook, ...],
        initial_carry: Callable[[int], PyTree] | None = None,
    ):
        self.eval_step, self.plan, self.layout, self.hooks = eval_step, plan, layout, hooks
        self.initial_carry = initial_carry

    def __call__(self, state: PyTree, step: int) -> dict[str, float]:
        params = state.get("ema", state["params"])  # the EMA when the run keeps one
        batches = pipeline_lib.numpy_batches(self.plan)
        metrics = evaluate_metrics(
            self.eval_step,
            params,
            (parallel.global_batch(b, self.layout.batch) for b in batches),
            self._empty_carry(),
        )
        for hook in self.hooks:
            metrics.update(hook(params, step))
        return metrics

    def _empty_carry(self) -> PyTree:
        """The state before the dev streams (None unless the plan is document streams)."""
        if self.initial_carry is None or not self.plan.config.streams:
            return None
        return self.initial_carry(self.plan.stream_rows)
