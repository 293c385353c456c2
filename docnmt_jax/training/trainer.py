"""The training loop every model shares: ``train_and_evaluate(config, workdir)``.

One ``jax.jit``-compiled train step (old state donated), an eval step summing dev loss, a tqdm
bar, TensorBoard events and a plain-text log in the workdir, Orbax checkpoints (latest N and
best by a dev metric), resume from the latest checkpoint including the data position,
``init_from`` for params-only initialisation, a time budget, and SIGTERM -> save and exit.
Dropout keys are ``fold_in(seed_key, step)`` and the data plan is a pure function of the
step, so a resumed run reproduces the uninterrupted one exactly.

Devices: the steps run on the ``config.mesh`` device mesh (:mod:`docnmt_jax.parallel`; one
device by default), the state initialised straight into its shardings
(:mod:`docnmt_jax.training.state`). With several processes each reads its own rows of every
global batch, process 0 alone writes logs, TensorBoard and ``config.json``, and all processes
write and restore checkpoints (onto the current mesh, whatever mesh wrote them).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging
from jax.experimental import multihost_utils
from tqdm.auto import tqdm

from docnmt_jax import parallel
from docnmt_jax.data import pipeline as pipeline_lib
from docnmt_jax.data import readers
from docnmt_jax.data.documents import Document
from docnmt_jax.data.tokenizer import Tokenizer, get_or_train_tokenizer, load_tokenizer
from docnmt_jax.decoding.translator import SearchConfig, Translator
from docnmt_jax.evaluation.metrics import score_documents
from docnmt_jax.models import build_task
from docnmt_jax.training import checkpoints, losses, optim, restore
from docnmt_jax.training import state as train_state

PyTree = Any
EvalHook = Callable[[PyTree, int], dict[str, float]]


# ---------------------------------------------------------------------------------------------
# Data.


def load_documents(data_cfg: ml_collections.ConfigDict, split: str) -> list[Document]:
    """Documents of ``split`` ('train' | 'dev' | 'test') named by the data config."""
    own = {"train": data_cfg.get("train", ""), "dev": data_cfg.get("dev", "")}
    if own["train"] or own["dev"]:
        if split not in own or not own[split]:
            raise ValueError(
                f"config.data.{split} is empty: with your own corpus set both "
                "config.data.train and config.data.dev"
            )
        return readers.read_corpus(own[split], data_cfg.get("format", "auto"))
    path = os.path.join(data_cfg.data_dir, f"{split}.tsv")
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"{path} not found: prepare the corpus first with `python launch/prepare_data.py "
            f"--corpus {data_cfg.corpus} --out {data_cfg.data_dir}`, or set config.data.train "
            "and config.data.dev to your own files"
        )
    return readers.read_tsv(path)


def pipeline_config(
    data_cfg: ml_collections.ConfigDict, seed: int, train: bool, batch_multiple: int = 1
) -> pipeline_lib.PipelineConfig:
    """The pipeline settings for training (shuffled, endless) or evaluation (one padded pass);
    batch rows are a multiple of ``batch_multiple`` (the mesh's data-parallel size)."""
    budget = data_cfg.eval_batch_tokens
    return pipeline_lib.PipelineConfig(
        max_sentences=data_cfg.max_sentences,
        max_src_len=data_cfg.max_src_len,
        max_tgt_len=data_cfg.max_tgt_len,
        batch_src_tokens=data_cfg.batch_src_tokens if train else budget,
        batch_tgt_tokens=data_cfg.batch_tgt_tokens if train else budget,
        sentence_level=data_cfg.sentence_level,
        shuffle=train,
        seed=seed,
        num_epochs=None if train else 1,
        process_index=jax.process_index(),
        process_count=jax.process_count(),
        pad_batch=not train,
        batch_multiple=math.lcm(batch_multiple, data_cfg.get("batch_multiple", 1)),
    )


def get_tokenizer(
    config: ml_collections.ConfigDict, workdir: str, train_docs: list[Document]
) -> Tokenizer:
    """``config.data.tokenizer`` if set, else ``WORKDIR/spm.model`` (trained on first use, by
    process 0 first so that processes sharing the workdir load its model)."""
    if config.data.tokenizer:
        return load_tokenizer(config.data.tokenizer)
    path = os.path.join(workdir, "spm.model")
    if jax.process_index() == 0:
        tokenizer = get_or_train_tokenizer(path, train_docs, vocab_size=config.data.vocab_size)
    multihost_utils.sync_global_devices("tokenizer")
    if jax.process_index() != 0:
        tokenizer = get_or_train_tokenizer(path, train_docs, vocab_size=config.data.vocab_size)
    return tokenizer


# ---------------------------------------------------------------------------------------------
# Steps.


def make_steps(
    task: Any,
    tx: Any,
    schedule: Any,
    smoothing: float,
    seed: int,
    layout: parallel.Layout | None = None,
    shardings: PyTree | None = None,
):
    """The jitted ``train_step(state, batch) -> (state, metrics)`` and ``eval_step``.

    With a ``layout`` and the state's ``shardings`` both are compiled for the mesh: batch rows
    split over ``data x fsdp``, state as ``shardings``, metrics replicated, the models'
    activation constraints active.
    """
    base_key = jax.random.PRNGKey(seed)
    active = layout.activate if layout is not None else contextlib.nullcontext

    def train_step(state: PyTree, batch: PyTree) -> tuple[PyTree, dict[str, jax.Array]]:
        with active():
            return _train_step(state, batch)

    def eval_step(params: PyTree, batch: PyTree) -> dict[str, jax.Array]:
        with active():
            logits, targets, mask = task.logits(params, batch, None, False)
            return losses.masked_loss_sums(logits, targets, mask, smoothing)

    def _train_step(state: PyTree, batch: PyTree) -> tuple[PyTree, dict[str, jax.Array]]:
        dropout_rng = jax.random.fold_in(base_key, state["step"])

        def loss_fn(params: PyTree) -> tuple[jax.Array, dict[str, jax.Array]]:
            logits, targets, mask = task.logits(params, batch, dropout_rng, True)
            sums = losses.masked_loss_sums(logits, targets, mask, smoothing)
            return sums["loss"] / jnp.maximum(sums["tokens"], 1.0), sums

        grads, sums = jax.grad(loss_fn, has_aux=True)(state["params"])
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        params = jax.tree_util.tree_map(jnp.add, state["params"], updates)
        metrics = dict(sums, lr=schedule(state["step"]), grad_norm=optax_global_norm(grads))
        return {"step": state["step"] + 1, "params": params, "opt_state": opt_state}, metrics

    if layout is None:
        return jax.jit(train_step, donate_argnums=(0,)), jax.jit(eval_step)
    rep = layout.replicated
    return (
        jax.jit(
            train_step,
            in_shardings=(shardings, layout.batch),
            out_shardings=(shardings, rep),
            donate_argnums=(0,),
        ),
        jax.jit(eval_step, in_shardings=(shardings["params"], layout.batch), out_shardings=rep),
    )


def optax_global_norm(tree: PyTree) -> jax.Array:
    leaves = jax.tree_util.tree_leaves(tree)
    return jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in leaves))


def evaluate_loss(eval_step: Callable, params: PyTree, batches: Iterator[dict]) -> dict[str, float]:
    """Dev loss (label-smoothed, per token), NLL per token and perplexity over all batches."""
    totals: dict[str, Any] = {}
    for batch in batches:
        sums = eval_step(params, batch)
        totals = sums if not totals else jax.tree_util.tree_map(jnp.add, totals, sums)
    if not totals:
        raise ValueError("the dev set produced no batch")
    totals = jax.device_get(totals)
    tokens = max(float(totals["tokens"]), 1.0)
    nll = float(totals["nll"]) / tokens
    return {
        "dev_loss": float(totals["loss"]) / tokens,
        "dev_nll": nll,
        "dev_ppl": math.exp(min(nll, 50.0)),
        "dev_tokens": tokens,
    }


def make_bleu_hook(
    task: Any,
    tokenizer: Tokenizer,
    documents: list[Document],
    search: SearchConfig,
    batch_tokens: int,
    max_sentences: int,
    layout: parallel.Layout | None = None,
    params_sharding: PyTree | None = None,
) -> EvalHook:
    """Dev s-BLEU / d-BLEU / chrF of the current parameters (sacreBLEU on detokenised text).

    One :class:`Translator` lives across evaluations, so its jitted search compiles once; with
    a ``layout`` it searches on the mesh (:func:`restore.shard_translator`).
    """
    translator = Translator(
        task, None, tokenizer, search, batch_tokens=batch_tokens, max_sentences=max_sentences
    )
    if layout is not None:
        restore.shard_translator(translator, layout, params_sharding)
    references = [list(doc.tgt) for doc in documents]

    def hook(params: PyTree, step: int) -> dict[str, float]:
        translator.params = params
        hyps = translator.translate(documents)
        scores = score_documents(hyps, references)
        return {
            "dev_bleu": scores["s_bleu"]["score"],
            "dev_dbleu": scores["d_bleu"]["score"],
            "dev_chrf": scores["chrf"]["score"],
        }

    return hook


# ---------------------------------------------------------------------------------------------
# Logging.


class RunLog:
    """Plain-text log (``train.log``) and TensorBoard events, written by process 0 only."""

    def __init__(self, workdir: str):
        self.enabled = jax.process_index() == 0
        self._writer = None
        if self.enabled:
            self._file = open(os.path.join(workdir, "train.log"), "a", encoding="utf-8")
            import tensorflow as tf

            self._tf = tf
            self._writer = tf.summary.create_file_writer(os.path.join(workdir, "tensorboard"))

    def write(self, step: int, values: dict[str, float], prefix: str = "") -> None:
        if not self.enabled:
            return
        text = " ".join(f"{prefix}{k}={v:.6g}" for k, v in sorted(values.items()))
        self._file.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} step={step} {text}\n")
        self._file.flush()
        with self._writer.as_default(step=step):
            for k, v in values.items():
                self._tf.summary.scalar(prefix + k, v)
        self._writer.flush()

    def note(self, message: str) -> None:
        logging.info(message)
        if self.enabled:
            tqdm.write(message)
            self._file.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {message}\n")
            self._file.flush()

    def close(self) -> None:
        if self.enabled:
            self._file.close()
            self._writer.close()


@contextlib.contextmanager
def sigterm_flag() -> Iterator[dict[str, bool]]:
    """Turns SIGTERM into a flag the loop checks, so it can save and exit cleanly."""
    flag = {"stop": False}

    def handler(signum: int, frame: Any) -> None:
        flag["stop"] = True

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield flag
    finally:
        signal.signal(signal.SIGTERM, previous)


_STOP_REASONS = ("", "time_budget", "sigterm")


def stop_reason(flag: dict[str, bool], deadline: float | None, every_process: bool) -> str:
    """``'sigterm'``, ``'time_budget'`` or ``''``; with ``every_process`` the processes agree
    (any process stopping stops all, so none waits in a collective for the others)."""
    code = 2 if flag["stop"] else int(deadline is not None and time.monotonic() > deadline)
    if every_process:
        code = int(np.max(multihost_utils.process_allgather(np.int32(code))))
    return _STOP_REASONS[code]


# ---------------------------------------------------------------------------------------------
# The loop.


@dataclasses.dataclass
class TrainResult:
    """What a run ends with: its last step, the latest dev metrics and per-step train losses."""

    step: int
    dev_metrics: dict[str, float]
    losses: list[float]
    stopped_by: str


def _is_better(value: float, best: float | None, mode: str) -> bool:
    if best is None:
        return True
    return value < best if mode == "min" else value > best


def train_and_evaluate(
    config: ml_collections.ConfigDict,
    workdir: str,
    eval_hooks: tuple[EvalHook, ...] = (),
    record_losses: bool = False,
) -> TrainResult:
    """Trains ``config`` in ``workdir``; resumes from the latest checkpoint there if any.

    ``eval_hooks`` add dev metrics (e.g. BLEU) at every evaluation; ``record_losses`` keeps
    every step's training loss (synchronising each step; for tests).
    """
    tcfg = config.train
    known = {"dev_loss", "dev_nll", "dev_ppl"} | (
        {"dev_bleu", "dev_dbleu", "dev_chrf"} if tcfg.get("dev_bleu", False) else set()
    )
    if tcfg.best_metric not in known and not eval_hooks:
        raise ValueError(
            f"config.train.best_metric={tcfg.best_metric!r} is never computed; choose one of "
            f"{sorted(known)} (BLEU metrics need config.train.dev_bleu=True)"
        )
    if tcfg.best_mode not in ("min", "max"):
        raise ValueError(f"config.train.best_mode must be min or max, got {tcfg.best_mode!r}")
    os.makedirs(workdir, exist_ok=True)
    runlog = RunLog(workdir)
    if jax.process_index() == 0:
        with open(os.path.join(workdir, "config.json"), "w", encoding="utf-8") as f:
            f.write(config.to_json_best_effort(indent=2, sort_keys=True) + "\n")

    layout = parallel.Layout(parallel.make_mesh(config.get("mesh", {})))
    parallel.check_process_rows(layout)
    train_docs = load_documents(config.data, "train")
    dev_docs = load_documents(config.data, "dev")
    tokenizer = get_tokenizer(config, workdir, train_docs)
    encode = tokenizer.encode_batch

    def plan(docs: list[Document], train: bool) -> pipeline_lib.BatchPlan:
        cfg = pipeline_config(config.data, tcfg.seed, train, batch_multiple=layout.batch_shards)
        return pipeline_lib.plan_batches(docs, encode, cfg)

    train_plan, dev_plan = plan(train_docs, True), plan(dev_docs, False)
    runlog.note(
        f"data: {len(train_docs)} train / {len(dev_docs)} dev documents, "
        f"{train_plan.batches_per_epoch} train batches per epoch, "
        f"{len(train_plan.local_shapes)} train batch shapes"
    )

    task = build_task(config.model, tokenizer.vocab_size)
    tx, schedule = optim.make_optimizer(
        config.model.d_model,
        tcfg.warmup_steps,
        tcfg.lr_scale,
        clip_norm=tcfg.clip_norm or None,
    )
    shardings = train_state.state_shardings(task, tx, layout)
    abstract = train_state.abstract_state(task, tx, shardings)
    num_params = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(abstract["params"]))

    ckpt = checkpoints.Checkpointer(workdir, keep=tcfg.keep_checkpoints)
    best_value: float | None = None
    restored = ckpt.restore("latest", abstract)
    if restored is not None:
        state, meta = restored
        best_value = meta.get("best_value")
        runlog.note(f"resumed from step {meta['step']} (data position {meta['data_step']})")
    else:
        state = train_state.init_state(task, tx, shardings, tcfg.seed)
    if restored is None and config.init_from:
        params, report = checkpoints.init_params_from(
            config.init_from,
            state["params"],
            allow_new=config.init_from_allow_new,
            ignore_unused=config.init_from_ignore_unused,
        )
        runlog.note(
            f"init_from {config.init_from}: {len(report['loaded'])} parameters loaded, "
            f"{len(report['new'])} new, {len(report['unused'])} unused"
        )
        state = train_state.init_state(task, tx, shardings, tcfg.seed, params)
    start = int(state["step"])
    runlog.note(
        f"model {config.model.name}: {num_params:,} parameters; mesh {dict(layout.mesh.shape)} "
        f"over {jax.device_count()} devices, {jax.process_count()} processes; "
        f"starting at step {start}"
    )

    train_step, eval_step = make_steps(
        task, tx, schedule, tcfg.label_smoothing, tcfg.seed, layout, shardings
    )
    if tcfg.get("dev_bleu", False):
        eval_hooks = (
            *eval_hooks,
            make_bleu_hook(
                task,
                tokenizer,
                dev_docs,
                SearchConfig(beam_size=tcfg.dev_bleu_beam, alpha=tcfg.dev_bleu_alpha),
                config.data.eval_batch_tokens,
                config.data.max_sentences,
                layout,
                shardings["params"],
            ),
        )
    dataset = pipeline_lib.make_dataset(train_plan, start_step=start).as_numpy_iterator()

    def run_eval(step: int) -> dict[str, float]:
        batches = pipeline_lib.numpy_batches(dev_plan)
        metrics = evaluate_loss(
            eval_step, state["params"], (parallel.global_batch(b, layout.batch) for b in batches)
        )
        for hook in eval_hooks:
            metrics.update(hook(state["params"], step))
        return metrics

    def save(step: int, dev: dict[str, float] | None) -> None:
        nonlocal best_value
        is_best = False
        if dev is not None and tcfg.best_metric in dev:
            is_best = _is_better(dev[tcfg.best_metric], best_value, tcfg.best_mode)
            if is_best:
                best_value = dev[tcfg.best_metric]
        meta = {
            "step": step,
            "data_step": step,
            "dev": dev or {},
            "best_metric": tcfg.best_metric,
            "best_value": best_value,
            "config": json.loads(config.to_json_best_effort()),
        }
        ckpt.save(step, state, meta, best=is_best)

    deadline = (
        time.monotonic() + 60 * tcfg.time_budget_minutes if tcfg.time_budget_minutes else None
    )
    step = start
    step_losses: list[float] = []
    window: dict[str, Any] = {}
    window_steps, window_start = 0, time.monotonic()
    dev: dict[str, float] = {}
    stopped_by = "num_steps"
    bar = tqdm(total=tcfg.num_steps, initial=start, desc="train", disable=jax.process_index() != 0)
    with sigterm_flag() as flag:
        while step < tcfg.num_steps:
            if jax.process_count() == 1 or step % tcfg.log_every == 0:
                reason = stop_reason(flag, deadline, every_process=jax.process_count() > 1)
                if reason:
                    stopped_by = reason
                    break
            state, metrics = train_step(state, parallel.global_batch(next(dataset), layout.batch))
            step += 1
            window_steps += 1
            window = metrics if not window else jax.tree_util.tree_map(jnp.add, window, metrics)
            if record_losses:
                m = jax.device_get(metrics)
                step_losses.append(float(m["loss"]) / max(float(m["tokens"]), 1.0))
            if step % tcfg.log_every == 0 or step == tcfg.num_steps:
                w = jax.device_get(window)
                n = window_steps
                elapsed = time.monotonic() - window_start
                values = {
                    "loss": float(w["loss"]) / max(float(w["tokens"]), 1.0),
                    "nll": float(w["nll"]) / max(float(w["tokens"]), 1.0),
                    "lr": float(w["lr"]) / n,
                    "grad_norm": float(w["grad_norm"]) / n,
                    "tokens_per_s": float(w["tokens"]) / max(elapsed, 1e-9),
                }
                runlog.write(step, values, prefix="train/")
                bar.set_postfix(
                    loss=f"{values['loss']:.3f}",
                    lr=f"{values['lr']:.2e}",
                    tok_s=f"{values['tokens_per_s']:.0f}",
                )
                window, window_steps = {}, 0
                window_start = time.monotonic()
            bar.update(1)
            evaluated = step % tcfg.eval_every == 0
            if evaluated:
                dev = run_eval(step)
                runlog.write(step, dev)
            if evaluated or step % tcfg.checkpoint_every == 0:
                save(step, dev if evaluated else None)
    bar.close()
    if step != start and (step % tcfg.eval_every != 0):
        dev = run_eval(step)
        runlog.write(step, dev)
        save(step, dev)
    ckpt.wait()
    ckpt.close()
    runlog.note(
        f"stopped at step {step} ({stopped_by}); dev "
        + " ".join(f"{k}={v:.4g}" for k, v in sorted(dev.items()))
    )
    runlog.close()
    return TrainResult(step=step, dev_metrics=dev, losses=step_losses, stopped_by=stopped_by)
