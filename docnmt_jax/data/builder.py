"""The one data builder: a model's data needs (:class:`~docnmt_jax.data.spec.DataSpec`) and a
run's settings become the pipeline config (:func:`pipeline_config`) and its batch plan
(:func:`build_plan`, :func:`plan_batches`).

Every consumer goes through here: the trainer and its token budget
(:mod:`docnmt_jax.training.data_setup`), the translator, the analyses and the benchmarks. The
settings are a :class:`~docnmt_jax.data.spec.PipelineConfig` whose model fields (rows, window,
whole documents, packing, sequential search) are replaced by the spec's:

* ``sentence_level``: the spec's rows are single sentences;
* ``context_sentences`` and ``whole_documents``: the spec's window and document context;
* ``packing``: the spec's packed rows when ``packed`` (training; None: the ``[B, S, T]`` grid),
  the shortest row ``row_tokens`` slots when that is > 0;
* ``sequential_sentences``: when ``decoding`` a model that searches a chunk's sentences one
  after another, so its token budget counts one sentence per chunk;
* ``streams``: the spec's document streams (training and dev loss;
  :class:`~docnmt_jax.data.stream_plan.StreamPlan` on the grid,
  :class:`~docnmt_jax.data.packed_stream_plan.PackedStreamPlan` in packed rows).

Training data (``decoding`` False) is checked against the spec's limits
(:meth:`~docnmt_jax.data.spec.DataLimits.violation`, :class:`DataLimitError`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from docnmt_jax.data.batch_plan import BatchPlan
from docnmt_jax.data.documents import Document
from docnmt_jax.data.grouped_plan import GroupedPackedPlan
from docnmt_jax.data.packed_plan import PackedPlan
from docnmt_jax.data.packed_stream_plan import PackedStreamPlan
from docnmt_jax.data.spec import DataLimitError, DataSpec, PipelineConfig
from docnmt_jax.data.stream_plan import StreamPlan
from docnmt_jax.data.tokenized import Encode, TokenizedCorpus, tokenize_corpus
from docnmt_jax.data.two_layout_plan import TwoLayoutPlan
from docnmt_jax.data.window_plan import WindowPackedPlan

PipelineInput = Sequence[Document] | TokenizedCorpus | BatchPlan | PackedPlan | PackedStreamPlan


def pipeline_config(
    spec: DataSpec,
    settings: PipelineConfig,
    *,
    packed: bool = False,
    row_tokens: int = 0,
    decoding: bool = False,
) -> PipelineConfig:
    """``settings`` with the model fields that ``spec`` sets (module docstring): the pipeline
    config of a model with those data needs. Raises :class:`DataLimitError` when training data
    (not ``decoding``) breaks the spec's limits."""
    packing = spec.packing if packed and not decoding else None
    if packing is not None and row_tokens > 0:
        packing = dataclasses.replace(packing, row_tokens=row_tokens)
    config = dataclasses.replace(
        settings,
        sentence_level=spec.sentence_level,
        context_sentences=spec.context_sentences,
        whole_documents=spec.whole_documents,
        packing=packing,
        sequential_sentences=decoding and spec.sequential,
        streams=spec.streams and not decoding,
        stream_window=spec.stream_window if spec.streams and not decoding else 1,
    )
    problem = None if decoding else spec.limits.violation(config)
    if problem is not None:
        raise DataLimitError(problem)
    return config


def build_plan(
    spec: DataSpec,
    settings: PipelineConfig,
    data: PipelineInput,
    encode: Encode | None = None,
    *,
    packed: bool = False,
    row_tokens: int = 0,
    decoding: bool = False,
) -> BatchPlan | PackedPlan | PackedStreamPlan:
    """The batch plan of ``data`` (documents tokenised with ``encode``, or a corpus) under
    :func:`pipeline_config` of ``spec`` and ``settings`` (the options as there)."""
    config = pipeline_config(
        spec, settings, packed=packed, row_tokens=row_tokens, decoding=decoding
    )
    return plan_batches(data, encode, config)


def plan_batches(
    data: PipelineInput,
    encode: Encode | None = None,
    config: PipelineConfig | None = None,
) -> BatchPlan | PackedPlan | PackedStreamPlan:
    """The deterministic batch plan of documents (tokenised with ``encode``) or a corpus: a
    :class:`~docnmt_jax.data.packed_plan.PackedPlan` when ``config.packing`` is set
    (:class:`~docnmt_jax.data.grouped_plan.GroupedPackedPlan` for ``unit="grouped"``,
    :class:`~docnmt_jax.data.window_plan.WindowPackedPlan` with a context window,
    :class:`~docnmt_jax.data.two_layout_plan.TwoLayoutPlan` with ``block_tokens``; with
    ``streams`` a :class:`~docnmt_jax.data.packed_stream_plan.PackedStreamPlan`), else a
    :class:`~docnmt_jax.data.batch_plan.BatchPlan` (with ``streams`` a
    :class:`~docnmt_jax.data.stream_plan.StreamPlan`). A plan is returned as is (its config must
    match ``config`` when one is given)."""
    if isinstance(data, BatchPlan | PackedPlan | PackedStreamPlan):
        if config is not None and config != data.config:
            raise ValueError(f"a {type(data).__name__} was given with a different config")
        return data
    if isinstance(data, TokenizedCorpus):
        config = config or data.config
        corpus = data
    else:
        if encode is None:
            raise ValueError("encode is required when raw documents are given")
        config = config or PipelineConfig()
        corpus = tokenize_corpus(data, encode, config)
    if config.streams and config.packing is not None:
        return PackedStreamPlan(corpus, config)
    if config.streams:
        return StreamPlan(corpus, config)
    if config.packing is None:
        return BatchPlan(corpus, config)
    if config.packing.unit == "grouped":
        return GroupedPackedPlan(corpus, config)
    if config.packing.block_tokens is not None:
        return TwoLayoutPlan(corpus, config)
    if config.context_sentences:
        return WindowPackedPlan(corpus, config)
    return PackedPlan(corpus, config)
