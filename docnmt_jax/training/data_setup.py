"""A training run's data: its documents, tokenizer and pipeline settings.

Training documents come from ``data.train``/``data.dev``, the prepared corpus in
``data.data_dir``, or a mix of corpora (:mod:`docnmt_jax.data.corpus_mix`); the tokenizer is
``data.tokenizer``, the ``init_from`` run's, or one trained on the training documents; the
pipeline settings (:func:`data_settings`: lengths, budgets, order, the mesh's data-parallel
size) and the model's data needs (:meth:`~docnmt_jax.models.base.BaseModel.data_spec`) become
the batch plans through the data builder (:func:`plan_batches`,
:func:`docnmt_jax.data.builder.build_plan`).
"""

from __future__ import annotations

import math
import os
import shutil

import jax
import ml_collections
from absl import logging
from jax.experimental import multihost_utils

from docnmt_jax.data import builder, corpus_mix, document_units, readers
from docnmt_jax.data import pipeline as pipeline_lib
from docnmt_jax.data.documents import Document
from docnmt_jax.data.spec import PipelineConfig, check_on_long
from docnmt_jax.data.tokenizer import Tokenizer, get_or_train_tokenizer, load_tokenizer
from docnmt_jax.errors import ConfigError, RunNotFoundError
from docnmt_jax.models import Model
from docnmt_jax.training import param_mapping, run_tokenizer


def load_documents(
    data_cfg: ml_collections.ConfigDict, split: str, seed: int = 0
) -> list[Document]:
    """Documents of ``split`` ('train' | 'dev' | 'test') named by the data config. Training
    documents come from ``data.mix`` when set and are split into one-sentence documents with
    ``data.train_as = "sentences"`` (``seed`` orders them) or into all the resolutions of
    ``"multi_resolution"`` (:mod:`docnmt_jax.data.corpus_mix`); every corpus is read in
    ``data.document_unit`` (:func:`read_corpus_as_unit`)."""
    train_as = corpus_mix.check_train_as(data_cfg.get("train_as", "documents"))
    unit = data_cfg.get("document_unit", "chapter")  # a bad value fails before any reading
    document_units.check_unit(unit, "config.data.document_unit")
    if split == "train" and data_cfg.get("mix", ""):
        if data_cfg.get("train", ""):
            raise corpus_mix.DataConfigError(
                "config.data.mix and config.data.train are both set: the mix is the training "
                "corpus (add data.train to it as an entry)"
            )
        entries = corpus_mix.parse_mix(data_cfg.mix)
        docs = corpus_mix.mix_documents(entries, lambda p: read_corpus_as_unit(data_cfg, p), seed)
    else:
        docs = read_split(data_cfg, split)
    if split == "train" and train_as == "sentences":
        docs = corpus_mix.as_sentences(docs, seed)
    elif split == "train" and train_as == "multi_resolution":
        docs = corpus_mix.as_multi_resolution(docs)
    return docs


def read_split(data_cfg: ml_collections.ConfigDict, split: str) -> list[Document]:
    """The documents of ``split`` in ``data.document_unit``: ``data.train``/``data.dev``, or
    the prepared corpus in ``data.data_dir``."""
    own = {"train": data_cfg.get("train", ""), "dev": data_cfg.get("dev", "")}
    if own["train"] or own["dev"]:
        if split not in own or not own[split]:
            raise ConfigError(
                f"config.data.{split} is empty: with your own corpus set both "
                "config.data.train and config.data.dev"
            )
        return read_corpus_as_unit(data_cfg, own[split])
    path = os.path.join(data_cfg.data_dir, f"{split}.tsv")
    if not os.path.exists(path):
        raise RunNotFoundError(
            f"{path} not found: prepare the corpus first with `python launch/prepare_data.py "
            f"--corpus {data_cfg.corpus} --out {data_cfg.data_dir}`, or set config.data.train "
            "and config.data.dev to your own files"
        )
    return read_corpus_as_unit(data_cfg, path, "tsv")


def read_corpus_as_unit(
    data_cfg: ml_collections.ConfigDict, path: str, fmt: str = ""
) -> list[Document]:
    """The corpus at ``path`` (format ``fmt``, else ``data.format``) in
    ``data.document_unit`` (:mod:`docnmt_jax.data.document_units`; books need a TSV's
    ``BOOK.CHAPTER`` doc ids, not a plain-text file's generated ones)."""
    key = "config.data.document_unit"
    unit = document_units.check_unit(data_cfg.get("document_unit", "chapter"), key)
    fmt = fmt or data_cfg.get("format", "auto")
    if unit == "book" and (readers.detect_format(path) if fmt == "auto" else fmt) != "tsv":
        raise ConfigError(
            f"{key}=book needs a TSV corpus (doc ids BOOK.CHAPTER); {path} is plain text, "
            "whose doc ids are FILE:N"
        )
    return document_units.documents_by_unit(readers.read_corpus(path, fmt), unit)


#: How the run log names each packed layout.
PACKING_WORDS = {
    "sentence": "packed sentences",
    "chunk": "packed chunks",
    "grouped": "packed sentences, chunks whole within a batch",
}


def data_settings(
    data_cfg: ml_collections.ConfigDict, seed: int, train: bool, batch_multiple: int = 1
) -> PipelineConfig:
    """The run's pipeline settings for training (shuffled, endless) or evaluation (one padded
    pass, ``data.eval_batch_tokens`` a side), batch rows a multiple of ``batch_multiple`` (the
    mesh's data-parallel size) and of ``data.batch_multiple``; the model's fields are left to
    :func:`docnmt_jax.data.builder.pipeline_config`."""
    budget = data_cfg.eval_batch_tokens
    return PipelineConfig(
        max_sentences=data_cfg.max_sentences,
        max_src_len=data_cfg.max_src_len,
        max_tgt_len=data_cfg.max_tgt_len,
        batch_src_tokens=data_cfg.batch_src_tokens if train else budget,
        batch_tgt_tokens=data_cfg.batch_tgt_tokens if train else budget,
        shuffle=train,
        seed=seed,
        num_epochs=None if train else 1,
        process_index=jax.process_index(),
        process_count=jax.process_count(),
        pad_batch=not train,
        batch_multiple=math.lcm(batch_multiple, data_cfg.get("batch_multiple", 1)),
        on_long=check_on_long(data_cfg.get("on_long", "error")),
        stream_rows=int(data_cfg.get("stream_rows", 0)),
    )


def trains_packed(config: ml_collections.ConfigDict, needs_grid: bool) -> bool:
    """Whether the run trains on the model's packed rows: ``data.packed`` (default True) unless
    the objective needs the ``[B, S, T]`` grid (``needs_grid``)."""
    return bool(config.data.get("packed", True)) and not needs_grid


def long_sentence_note(name: str, stats: pipeline_lib.PipelineStats, on_long: str) -> str:
    """What the run log says about the ``name`` corpus's sentences over
    ``data.max_src_len``/``max_tgt_len``: pairs skipped or sentences truncated, per side."""
    if on_long == "skip":
        return (
            f"{name}: {stats.skipped_pairs} sentence pairs skipped (source {stats.src_skipped}, "
            f"target {stats.tgt_skipped} over the limit)"
        )
    if on_long == "truncate":
        return (
            f"{name}: truncated {stats.src_truncated} source, {stats.tgt_truncated} target "
            "sentences"
        )
    return f"{name}: none"


def get_tokenizer(
    config: ml_collections.ConfigDict,
    workdir: str,
    train_docs: list[Document],
    init_dir: str | None = None,
) -> Tokenizer:
    """``config.data.tokenizer`` if set, copied into the workdir as ``WORKDIR/spm.model`` and
    recorded so in its config.json (:func:`~docnmt_jax.training.run_tokenizer.keep_in_workdir`:
    the workdir is self-contained), else ``WORKDIR/spm.model``: on first use a copy of the
    tokenizer of the ``init_from`` run (``init_dir``, its state directory: finetuning must keep
    the pretraining's pieces), else trained on ``train_docs`` (by process 0 first so that
    processes sharing the workdir load its model)."""
    if config.data.tokenizer:
        if jax.process_index() == 0:
            run_tokenizer.keep_in_workdir(config.data.tokenizer, workdir)
        multihost_utils.sync_global_devices("tokenizer")
        return load_tokenizer(os.path.join(workdir, run_tokenizer.WORKDIR_TOKENIZER))
    path = os.path.join(workdir, "spm.model")
    source = param_mapping.source_tokenizer(init_dir) if init_dir else None
    if source and not os.path.exists(path) and jax.process_index() == 0:
        shutil.copyfile(source, path)
        logging.warning("tokenizer: %s copied from the init_from run (%s)", path, source)
    if jax.process_index() == 0:
        tokenizer = get_or_train_tokenizer(path, train_docs, vocab_size=config.data.vocab_size)
    multihost_utils.sync_global_devices("tokenizer")
    if jax.process_index() != 0:
        tokenizer = get_or_train_tokenizer(path, train_docs, vocab_size=config.data.vocab_size)
    return tokenizer


def plan_batches(
    config: ml_collections.ConfigDict,
    model: Model,
    batch_multiple: int,
    packed: bool,
    encode: pipeline_lib.Encode,
    docs: list[Document],
    train: bool,
) -> pipeline_lib.BatchPlan | pipeline_lib.PackedPlan:
    """The batch plan of ``docs`` for training (``train``: shuffled, endless) or evaluation
    (one padded pass): :func:`data_settings` and ``model``'s data needs through the data
    builder (:func:`docnmt_jax.data.builder.build_plan`: its packed rows when ``packed``, the
    shortest ``data.packed_row_tokens`` slots when > 0; its limits checked). ``encode`` is the
    tokenizer's batch encoder."""
    settings = data_settings(config.data, config.train.seed, train, batch_multiple)
    row_tokens = config.data.get("packed_row_tokens", 0)
    return builder.build_plan(
        model.data_spec(), settings, docs, encode, packed=packed, row_tokens=row_tokens
    )


def data_notes(
    data_cfg: ml_collections.ConfigDict,
    model: Model,
    loader: str,
    docs: tuple[list[Document], list[Document]],
    plans: tuple[pipeline_lib.BatchPlan, pipeline_lib.BatchPlan],
) -> list[str]:
    """What the run log says about the data: the train and dev ``docs`` and batch ``plans``
    (batches, shapes, layout, padding, ``loader``), then the sentences over the length
    limits."""
    (train_docs, dev_docs), (train_plan, dev_plan) = docs, plans
    packing = train_plan.config.packing
    on_long = check_on_long(data_cfg.get("on_long", "error"))
    shapes = sorted(train_plan.local_shapes)
    return [
        f"data: {len(train_docs)} train / {len(dev_docs)} dev documents, "
        f"{train_plan.batches_per_epoch} train batches per epoch, {len(shapes)} train batch "
        f"shapes {shapes} ({model.layout.value}, "
        + (PACKING_WORDS[packing.unit] if packing else "[B, S, T] grid")
        + (f", {train_plan.stream_rows} document streams" if train_plan.config.streams else "")
        + f"), {100 * train_plan.stats.padding_fraction:.1f}% padding; loader {loader}",
        f"data: sentences over data.max_src_len={data_cfg.max_src_len} / "
        f"max_tgt_len={data_cfg.max_tgt_len} (data.on_long={on_long}): "
        + long_sentence_note("train", train_plan.stats, on_long)
        + "; "
        + long_sentence_note("dev", dev_plan.stats, on_long),
    ]
