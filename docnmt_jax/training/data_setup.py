"""A training run's data: its documents, tokenizer and pipeline settings.

Training documents come from ``data.train``/``data.dev``, the prepared corpus in
``data.data_dir``, or a mix of corpora (:mod:`docnmt_jax.data.corpus_mix`); the tokenizer is
``data.tokenizer``, the ``init_from`` run's, or one trained on the training documents; the
pipeline settings (:class:`~docnmt_jax.data.pipeline.PipelineConfig`) follow the model's layout,
packing and context window and the mesh's data-parallel size.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil

import jax
import ml_collections
from absl import logging
from jax.experimental import multihost_utils

from docnmt_jax.data import corpus_mix, readers
from docnmt_jax.data import pipeline as pipeline_lib
from docnmt_jax.data.documents import Document
from docnmt_jax.data.spec import PackingConfig, check_on_long
from docnmt_jax.data.tokenizer import Tokenizer, get_or_train_tokenizer, load_tokenizer
from docnmt_jax.errors import ConfigError, RunNotFoundError
from docnmt_jax.models import Model
from docnmt_jax.training import param_mapping


def load_documents(
    data_cfg: ml_collections.ConfigDict, split: str, seed: int = 0
) -> list[Document]:
    """Documents of ``split`` ('train' | 'dev' | 'test') named by the data config. Training
    documents come from ``data.mix`` when set and are split into one-sentence documents with
    ``data.train_as = "sentences"`` (:mod:`docnmt_jax.data.corpus_mix`; ``seed`` orders them)."""
    train_as = corpus_mix.check_train_as(data_cfg.get("train_as", "documents"))
    if split == "train" and data_cfg.get("mix", ""):
        if data_cfg.get("train", ""):
            raise corpus_mix.DataConfigError(
                "config.data.mix and config.data.train are both set: the mix is the training "
                "corpus (add data.train to it as an entry)"
            )
        fmt = data_cfg.get("format", "auto")
        entries = corpus_mix.parse_mix(data_cfg.mix)
        docs = corpus_mix.mix_documents(entries, lambda p: readers.read_corpus(p, fmt), seed)
    else:
        docs = read_split(data_cfg, split)
    if split == "train" and train_as == "sentences":
        docs = corpus_mix.as_sentences(docs, seed)
    return docs


def read_split(data_cfg: ml_collections.ConfigDict, split: str) -> list[Document]:
    """The documents of ``split`` as the files hold them: ``data.train``/``data.dev``, or the
    prepared corpus in ``data.data_dir``."""
    own = {"train": data_cfg.get("train", ""), "dev": data_cfg.get("dev", "")}
    if own["train"] or own["dev"]:
        if split not in own or not own[split]:
            raise ConfigError(
                f"config.data.{split} is empty: with your own corpus set both "
                "config.data.train and config.data.dev"
            )
        return readers.read_corpus(own[split], data_cfg.get("format", "auto"))
    path = os.path.join(data_cfg.data_dir, f"{split}.tsv")
    if not os.path.exists(path):
        raise RunNotFoundError(
            f"{path} not found: prepare the corpus first with `python launch/prepare_data.py "
            f"--corpus {data_cfg.corpus} --out {data_cfg.data_dir}`, or set config.data.train "
            "and config.data.dev to your own files"
        )
    return readers.read_tsv(path)


#: How the run log names each packed layout.
PACKING_WORDS = {
    "sentence": "packed sentences",
    "chunk": "packed chunks",
    "grouped": "packed sentences, chunks whole within a batch",
}


def pipeline_config(
    data_cfg: ml_collections.ConfigDict,
    seed: int,
    train: bool,
    sentence_level: bool,
    batch_multiple: int = 1,
    packing: PackingConfig | None = None,
    context_sentences: int = 0,
    whole_documents: bool = False,
) -> pipeline_lib.PipelineConfig:
    """The pipeline settings for training (shuffled, endless) or evaluation (one padded pass);
    ``sentence_level`` from the model's layout; batch rows are a multiple of
    ``batch_multiple`` (the mesh's data-parallel size); ``packing`` the model's packed rows
    (:meth:`~docnmt_jax.models.base.BaseModel.packing`), with ``data.packed_row_tokens`` (when
    > 0) as the shortest row length, or None for the ``[B, S, T]`` grid;
    ``context_sentences`` the model's context window
    (:attr:`~docnmt_jax.models.base.BaseModel.context_sentences`); ``whole_documents``
    whether chunks are whole documents (the model's
    :attr:`~docnmt_jax.models.base.BaseModel.whole_documents`)."""
    budget = data_cfg.eval_batch_tokens
    row_tokens = data_cfg.get("packed_row_tokens", 0)
    if packing is not None and row_tokens > 0:
        packing = dataclasses.replace(packing, row_tokens=row_tokens)
    return pipeline_lib.PipelineConfig(
        max_sentences=data_cfg.max_sentences,
        max_src_len=data_cfg.max_src_len,
        max_tgt_len=data_cfg.max_tgt_len,
        batch_src_tokens=data_cfg.batch_src_tokens if train else budget,
        batch_tgt_tokens=data_cfg.batch_tgt_tokens if train else budget,
        sentence_level=sentence_level,
        shuffle=train,
        seed=seed,
        num_epochs=None if train else 1,
        process_index=jax.process_index(),
        process_count=jax.process_count(),
        pad_batch=not train,
        batch_multiple=math.lcm(batch_multiple, data_cfg.get("batch_multiple", 1)),
        packing=packing,
        context_sentences=context_sentences,
        whole_documents=whole_documents,
        on_long=check_on_long(data_cfg.get("on_long", "error")),
    )


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
    """``config.data.tokenizer`` if set, else ``WORKDIR/spm.model``: on first use a copy of the
    tokenizer of the ``init_from`` run (``init_dir``, its state directory: finetuning must keep
    the pretraining's pieces), else trained on ``train_docs`` (by process 0 first so that
    processes sharing the workdir load its model)."""
    if config.data.tokenizer:
        return load_tokenizer(config.data.tokenizer)
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
    packing: PackingConfig | None,
    encode: pipeline_lib.Encode,
    docs: list[Document],
    train: bool,
) -> pipeline_lib.BatchPlan:
    """The batch plan of ``docs`` for training (``train``: shuffled, endless) or evaluation
    (one padded pass) in ``model``'s layout, its settings checked by the model
    (:meth:`~docnmt_jax.models.base.BaseModel.check_data`); the arguments as for
    :func:`pipeline_config`, ``encode`` the tokenizer's batch encoder."""
    cfg = pipeline_config(
        config.data,
        config.train.seed,
        train,
        model.layout.sentence_level,
        batch_multiple=batch_multiple,
        packing=packing,
        context_sentences=model.context_sentences,
        whole_documents=model.whole_documents,
    )
    model.check_data(cfg)
    return pipeline_lib.plan_batches(docs, encode, cfg)


def data_notes(
    data_cfg: ml_collections.ConfigDict,
    model: Model,
    packing: PackingConfig | None,
    loader: str,
    docs: tuple[list[Document], list[Document]],
    plans: tuple[pipeline_lib.BatchPlan, pipeline_lib.BatchPlan],
) -> list[str]:
    """What the run log says about the data: the train and dev ``docs`` and batch ``plans``
    (batches, shapes, layout, padding, ``loader``), then the sentences over the length
    limits."""
    (train_docs, dev_docs), (train_plan, dev_plan) = docs, plans
    on_long = check_on_long(data_cfg.get("on_long", "error"))
    shapes = sorted(train_plan.local_shapes)
    return [
        f"data: {len(train_docs)} train / {len(dev_docs)} dev documents, "
        f"{train_plan.batches_per_epoch} train batches per epoch, {len(shapes)} train batch "
        f"shapes {shapes} ({model.layout.value}, "
        + (PACKING_WORDS[packing.unit] if packing else "[B, S, T] grid")
        + f"), {100 * train_plan.stats.padding_fraction:.1f}% padding; loader {loader}",
        f"data: sentences over data.max_src_len={data_cfg.max_src_len} / "
        f"max_tgt_len={data_cfg.max_tgt_len} (data.on_long={on_long}): "
        + long_sentence_note("train", train_plan.stats, on_long)
        + "; "
        + long_sentence_note("dev", dev_plan.stats, on_long),
    ]
