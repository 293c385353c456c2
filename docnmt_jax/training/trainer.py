"""The training loop every model shares: ``train_and_evaluate(config, workdir)``.

One ``jax.jit``-compiled train step (old state donated), an eval step summing dev loss, a tqdm
bar, TensorBoard events and a plain-text log in the workdir, Orbax checkpoints (latest N and
best by a dev metric), resume from the latest checkpoint including the data position,
``init_from`` for params-only initialisation mapped by ``init_from_rules``
(:mod:`docnmt_jax.training.param_mapping`; never applied when resuming), a time budget, and
SIGTERM or SIGINT -> save and exit (a second signal exits at once, saving nothing).
Dropout keys are ``fold_in(seed_key, step)`` and the data plan is a pure function of the
step, so a resumed run reproduces the uninterrupted one exactly.

Non-finite guard: a step whose loss or gradient norm is NaN or Inf leaves parameters and
optimiser state as they were (inside the jitted step; its batch is consumed, the step counter
advances) and counts in the ``bad_steps`` metric; ``train.max_bad_steps`` consecutive such
steps stop the run with :class:`NonFiniteError` naming the step, the documents of its batch and
the last complete checkpoint. No state holding NaN or Inf is ever saved. BUILD_NOTES.md,
"Reliability", lists what is promised and the tests that kill, signal and poison runs.

Devices: the steps run on the ``config.mesh`` device mesh (:mod:`docnmt_jax.parallel`; one
device by default), the state initialised straight into its shardings
(:mod:`docnmt_jax.training.state`). With several processes each reads its own rows of every
global batch, process 0 alone writes logs, TensorBoard and ``config.json``, and all processes
write and restore checkpoints (onto the current mesh, whatever mesh wrote them).
"""

from __future__ import annotations

import collections
import contextlib
import copy
import dataclasses
import json
import math
import os
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import flax.linen as nn
import jax
import ml_collections
import numpy as np
from absl import logging
from jax.experimental import multihost_utils
from tqdm.auto import tqdm

from docnmt_jax import parallel
from docnmt_jax.data import corpus_mix, readers, schema
from docnmt_jax.data import loader as loader_lib
from docnmt_jax.data import pipeline as pipeline_lib
from docnmt_jax.data.documents import Document
from docnmt_jax.data.schema import dummy_batch
from docnmt_jax.data.tokenized import PackingConfig, check_on_long
from docnmt_jax.data.tokenizer import Tokenizer, get_or_train_tokenizer, load_tokenizer
from docnmt_jax.decoding.search import SearchConfig
from docnmt_jax.decoding.translator import Translator
from docnmt_jax.errors import ConfigError, RunNotFoundError
from docnmt_jax.evaluation.metrics import score_documents
from docnmt_jax.files import write_atomic, write_hypotheses
from docnmt_jax.models import Metric, Model, build_model
from docnmt_jax.models.base import reduce_metrics
from docnmt_jax.objectives import Objective, build_objective
from docnmt_jax.training import checkpoints, param_mapping
from docnmt_jax.training import ema as ema_lib
from docnmt_jax.training import state as train_state
from docnmt_jax.training.checkpoints import CheckpointError as CheckpointError  # re-exported
from docnmt_jax.training.checkpoints import NonFiniteError as NonFiniteError  # re-exported
from docnmt_jax.training.run_log import RunLog
from docnmt_jax.training.steps import global_norm as optax_global_norm  # noqa: F401
from docnmt_jax.training.steps import make_steps

PyTree = Any
EvalHook = Callable[[PyTree, int], dict[str, float]]


# ---------------------------------------------------------------------------------------------
# Data.


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


# ---------------------------------------------------------------------------------------------
# Steps.


def abstract_batch(
    shape: tuple[int, ...], sharding: Any, context_sentences: int = 0
) -> dict[str, jax.ShapeDtypeStruct]:
    """Every feature of a global batch of plan shape ``shape`` (``(B, L)`` packed rows or
    ``(B, S, T)`` grid, with ``context_sentences`` ``K > 0`` its context window) as a
    ``ShapeDtypeStruct`` with the batch ``sharding``."""
    axes = schema.PACKED_FEATURE_AXES if len(shape) == 2 else dict(schema.FEATURE_AXES)
    if context_sentences:
        axes.update(schema.CONTEXT_FEATURE_AXES)
    sizes = dict(zip("BL" if len(shape) == 2 else "BST", shape, strict=True))
    sizes["K"] = context_sentences
    return {
        name: jax.ShapeDtypeStruct(tuple(sizes[a] for a in ax), schema.DTYPE, sharding=sharding)
        for name, ax in axes.items()
    }


def compile_for_shapes(
    train_step: Any,
    state: PyTree,
    local_shapes: list[tuple[int, ...]],
    layout: parallel.Layout,
    note: Callable[[str], None],
    context_sentences: int = 0,
) -> Callable[[PyTree, PyTree], tuple[PyTree, dict[str, Metric]]]:
    """``train_step`` compiled ahead of time for every batch shape of the plan (this process's
    ``local_shapes``; rows times ``process_count`` globally), the compile time of each logged,
    so that no compilation interrupts training; a batch of another shape is compiled then."""
    abstract_state = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state
    )
    compiled: dict[tuple[int, ...], Any] = {}
    times = []
    for shape in local_shapes:
        start = time.perf_counter()
        global_shape = (shape[0] * jax.process_count(), *shape[1:])
        batch = abstract_batch(global_shape, layout.batch, context_sentences)
        compiled[global_shape] = train_step.lower(abstract_state, batch).compile()
        times.append(f"{'x'.join(map(str, global_shape))} {time.perf_counter() - start:.1f} s")
    note(f"compiled the train step for {len(compiled)} batch shapes: {', '.join(times)}")

    def step(state: PyTree, batch: PyTree) -> tuple[PyTree, dict[str, Metric]]:
        executable = compiled.get(batch["src"].shape)
        return (executable or train_step)(state, batch)

    return step


def add_metrics(total: dict[str, Metric], new: dict[str, Metric]) -> dict[str, Metric]:
    """Element-wise sum of two metric dicts (the first may be empty)."""
    return dict(new) if not total else {k: total[k] + new[k] for k in total}


def evaluate_metrics(
    eval_step: Callable, params: PyTree, batches: Iterator[dict]
) -> dict[str, float]:
    """The objective's metrics summed over every dev batch, as ``dev_<name>``."""
    totals: dict[str, Metric] = {}
    for batch in batches:
        totals = add_metrics(totals, eval_step(params, batch))
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


#: The signals that stop a run cleanly, and the stop reason each gives.
STOP_SIGNALS = {signal.SIGTERM: "sigterm", signal.SIGINT: "sigint"}


def _say(message: str) -> None:
    """``message`` to stderr by one ``write`` system call: safe inside a signal handler, where
    Python's buffered ``sys.stderr`` may be in the middle of another write (tqdm's bar)."""
    os.write(2, (message + "\n").encode())


@contextlib.contextmanager
def stop_signals() -> Iterator[dict[str, str]]:
    """Turns SIGTERM and SIGINT into a flag (``flag["stop"]``: ``'sigterm'``/``'sigint'``) that
    the loop checks, so it can save a checkpoint and exit cleanly. A second signal while that
    happens exits the process at once (``os._exit(128 + signum)``) without saving: a save in
    flight is then never finalised and the previous complete checkpoint stays the latest."""
    flag = {"stop": ""}

    def handler(signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if flag["stop"]:
            _say(
                f"train: {name} again: exiting at once without saving; the latest complete "
                "checkpoint is kept (a save in flight is discarded)"
            )
            os._exit(128 + signum)
        flag["stop"] = STOP_SIGNALS[signum]
        _say(
            f"train: {name}: saving a checkpoint after the current step, then stopping "
            "(send it again to exit at once without saving)"
        )

    previous = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        yield flag
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


_STOP_REASONS = ("", "time_budget", "sigterm", "sigint")


def stop_reason(flag: dict[str, str], deadline: float | None, every_process: bool) -> str:
    """``'sigterm'``, ``'sigint'``, ``'time_budget'`` or ``''``; with ``every_process`` the
    processes agree (any process stopping stops all, so none waits in a collective for the
    others)."""
    if flag["stop"]:
        code = _STOP_REASONS.index(flag["stop"])
    else:
        code = int(deadline is not None and time.monotonic() > deadline)
    if every_process:
        code = int(np.max(multihost_utils.process_allgather(np.int32(code))))
    return _STOP_REASONS[code]


def batch_documents(plan: pipeline_lib.BatchPlan, index: int) -> list[str]:
    """Ids of the documents in global batch ``index`` (0-based: the batch of step
    ``index + 1``) of a training ``plan``, in order of first appearance. Computed from the plan
    (a pure function of the step), since packed batches carry no document indices."""
    plan = copy.copy(plan)  # its own epoch cache: the input pipeline's thread uses the plan's
    e, b = divmod(index, plan.batches_per_epoch)
    ids = plan.epoch(e).batch(b)
    ids = ids[ids >= 0]
    if hasattr(plan, "item_rows"):  # packed plans: batches are rows of items (chunks)
        ids = np.concatenate([plan.item_rows[r] for r in ids]) if ids.size else ids
    docs = plan.chunk_table["doc"][ids]
    names = plan.corpus.doc_ids
    return [names[d] for d in dict.fromkeys(docs.tolist())]


def _name_documents(ids: list[str], limit: int = 12) -> str:
    more = f" and {len(ids) - limit} more" if len(ids) > limit else ""
    return ", ".join(ids[:limit]) + more


class BadStepGuard:
    """Host side of the non-finite guard: follows the jitted step's ``bad_steps`` flags one step
    behind (fetching step n's flag after step n+1 is queued keeps the device busy) and raises
    :class:`_TooManyBadStepsError` at the ``max_bad`` -th consecutive bad step (0: never)."""

    def __init__(self, max_bad: int):
        self.max_bad = max_bad
        self.pending: collections.deque = collections.deque()
        self.run: list[int] = []  # the current run of consecutive bad steps

    def push(self, step: int, metrics: dict[str, Metric]) -> None:
        if self.max_bad > 0:
            loss = metrics.get("loss", metrics["grad_norm"])  # every objective reports a loss
            values = (metrics["bad_steps"].total, loss, metrics["grad_norm"].total)
            self.pending.append((step, values))

    def check(self, keep: int = 0) -> None:
        """Looks at the flags of every pending step but the newest ``keep``."""
        while len(self.pending) > keep:
            step, values = self.pending.popleft()
            bad, loss, grad_norm = jax.device_get(values)
            if not bad:
                self.run = []
                continue
            self.run.append(step)
            if len(self.run) >= self.max_bad:
                raise _TooManyBadStepsError(self.run, loss.value(), float(grad_norm))


class _TooManyBadStepsError(Exception):
    def __init__(self, steps: list[int], loss: float, grad_norm: float):
        super().__init__(steps)
        self.steps, self.loss, self.grad_norm = list(steps), loss, grad_norm


# ---------------------------------------------------------------------------------------------
# The loop.


@dataclasses.dataclass
class TrainResult:
    """What a run ends with: its last step, the latest dev metrics, per-step train losses
    (``record_losses``), why it stopped (``num_steps``, ``time_budget``, ``sigterm``,
    ``sigint``) and its newest complete checkpoint."""

    step: int
    dev_metrics: dict[str, float]
    losses: list[float]
    stopped_by: str
    #: the newest complete ``checkpoints/<step>`` directory at the end ('' when none)
    checkpoint: str = ""


def _is_better(value: float, best: float | None, mode: str) -> bool:
    if best is None:
        return True
    return value < best if mode == "min" else value > best


def _flat_items(tree: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a.b": leaf}`` for a nested dict (JSON lists compare as lists)."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    items: dict[str, Any] = {}
    for key, value in tree.items():
        items.update(_flat_items(value, f"{prefix}.{key}" if prefix else str(key)))
    return items


def check_resumable(config: ml_collections.ConfigDict, workdir: str) -> None:
    """Refuses to resume ``workdir``'s checkpoints under another ``config.model``.

    A checkpoint restores into any model whose parameter shapes agree, so a workdir trained
    under one reading (e.g. FINAL's ``doc2sent_cross_attention="chunk"``) would silently be
    resumed -- or scored -- as another. When ``workdir`` holds a finished checkpoint and a
    ``config.json``, every ``model`` field present in both must be equal; fields only one side
    has (added or retired options) are not compared. Raises a one-line :class:`ConfigError`
    naming the fields and both values.
    """
    path = os.path.join(workdir, "config.json")
    if not checkpoints.has_steps(workdir) or not os.path.exists(path):
        return
    try:
        with open(path, encoding="utf-8") as f:
            saved = json.load(f).get("model", {})
    except (OSError, ValueError, AttributeError) as e:
        raise ConfigError(f"{path}: cannot read the run's saved config ({e})") from None
    old = _flat_items(saved if isinstance(saved, dict) else {})
    new = _flat_items(json.loads(config.model.to_json_best_effort()))
    differ = [k for k in sorted(old.keys() & new.keys()) if old[k] != new[k]]
    if differ:
        shown = ", ".join(f"model.{k}: {old[k]!r} there, {new[k]!r} now" for k in differ[:4])
        more = f" and {len(differ) - 4} more" if len(differ) > 4 else ""
        raise ConfigError(
            f"{path}: {workdir} holds checkpoints of another model config ({shown}{more}); "
            "use a new workdir, or the saved config to resume"
        )


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
    if tcfg.best_mode not in ("min", "max"):
        raise ConfigError(f"config.train.best_mode must be min or max, got {tcfg.best_mode!r}")
    on_long = check_on_long(config.data.get("on_long", "error"))
    loader = loader_lib.resolve(config.data.get("loader", "auto"))
    os.makedirs(workdir, exist_ok=True)
    check_resumable(config, workdir)
    runlog = RunLog(workdir)
    if jax.process_index() == 0:  # written whole and renamed: a kill never leaves half of it
        config_text = config.to_json_best_effort(indent=2, sort_keys=True) + "\n"
        write_atomic(os.path.join(workdir, "config.json"), config_text)

    init_dir = None
    if config.get("init_from", "") and not checkpoints.has_steps(workdir):
        # Fail fast on a bad init_from or rule syntax, before data and compilation.
        param_mapping.parse_rules(config.get("init_from_rules", ""))
        init_dir = param_mapping.checkpoint_dir(config)
    layout = parallel.Layout(parallel.make_mesh(config.get("mesh", {})))
    parallel.check_process_rows(layout)
    train_docs = load_documents(config.data, "train", tcfg.seed)
    dev_docs = load_documents(config.data, "dev")
    tokenizer = get_tokenizer(config, workdir, train_docs, init_dir)
    model = build_model(config.model, tokenizer.vocab_size, tcfg.label_smoothing)
    objective = build_objective(config.get("objective", {}), model)
    known = {f"dev_{name}" for name in metric_names(objective)} | (
        {"dev_bleu", "dev_dbleu", "dev_chrf"} if tcfg.get("dev_bleu", False) else set()
    )
    if tcfg.best_metric not in known and not eval_hooks:
        raise ConfigError(
            f"config.train.best_metric={tcfg.best_metric!r} is never computed; choose one of "
            f"{sorted(known)} (BLEU metrics need config.train.dev_bleu=True)"
        )
    encode = tokenizer.encode_batch

    packed = config.data.get("packed", True) and not objective.needs_grid
    packing = model.packing() if packed else None

    def plan(docs: list[Document], train: bool) -> pipeline_lib.BatchPlan:
        cfg = pipeline_config(
            config.data,
            tcfg.seed,
            train,
            model.layout.sentence_level,
            batch_multiple=layout.batch_shards,
            packing=packing,
            context_sentences=model.context_sentences,
            whole_documents=model.whole_documents,
        )
        model.check_data(cfg)
        return pipeline_lib.plan_batches(docs, encode, cfg)

    train_plan, dev_plan = plan(train_docs, True), plan(dev_docs, False)
    shapes = sorted(train_plan.local_shapes)
    runlog.note(
        f"data: {len(train_docs)} train / {len(dev_docs)} dev documents, "
        f"{train_plan.batches_per_epoch} train batches per epoch, {len(shapes)} train batch "
        f"shapes {shapes} ({model.layout.value}, "
        + (PACKING_WORDS[packing.unit] if packing else "[B, S, T] grid")
        + f"), {100 * train_plan.stats.padding_fraction:.1f}% padding; loader {loader}"
    )
    runlog.note(
        f"data: sentences over data.max_src_len={config.data.max_src_len} / "
        f"max_tgt_len={config.data.max_tgt_len} (data.on_long={on_long}): "
        + long_sentence_note("train", train_plan.stats, on_long)
        + "; "
        + long_sentence_note("dev", dev_plan.stats, on_long)
    )

    shardings, abstract, tx, schedule = train_state.build_optimizer_state(
        model, config, layout, runlog.note
    )
    num_params = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(abstract["params"]))

    ckpt = checkpoints.Checkpointer(workdir, keep=tcfg.keep_checkpoints)
    best_value: float | None = None
    # The newest checkpoint that restores (a corrupt one is skipped, with a warning naming it).
    restored = ckpt.restore("latest", abstract, warn=runlog.warn)
    if restored is not None:
        state, meta = restored
        best_value = meta.get("best_value")
        runlog.note(
            f"resumed from step {meta['step']} (data position {meta['data_step']}"
            + (
                f", micro-batch {meta['micro']} of {meta['accumulate_steps']})"
                if meta.get("micro")
                else ")"
            )
        )
    else:
        state = train_state.init_state(model, tx, shardings, tcfg.seed)
    if restored is None and config.get("init_from", ""):
        # Parameters only, mapped by init_from_rules; the optimiser state stays fresh. A resumed
        # run never gets here: its own latest checkpoint wins over init_from.
        params, rows, state_dir = param_mapping.init_from_checkpoint(
            config, model, state["params"], init_dir
        )
        runlog.note(
            f"init_from {state_dir} (init_from_rules={config.get('init_from_rules', '')!r}): "
            f"{param_mapping.summary(rows)}; table in {os.path.join(workdir, 'init_from.tsv')}"
            "\n" + param_mapping.format_table(rows)
        )
        if jax.process_index() == 0:
            param_mapping.write_table(os.path.join(workdir, "init_from.tsv"), rows)
        state = dict(state, params=params)
        if "ema" in state:  # the average starts at the initial parameters
            state["ema"] = jax.jit(ema_lib.init, out_shardings=shardings["ema"])(params)
    start = int(state["step"])
    k = int(tcfg.get("accumulate_steps", 1))
    micro = int(jax.device_get(state["accum"]["micro"])) if "accum" in state else 0
    start_micro = micro
    # Global batches consumed: the data plan's step, and the checkpoints' numbers (= the
    # step without accumulation; updates x k + micro-batch with it).
    position = start * k + micro
    runlog.note(
        f"model {model.name} (objective {objective.name}): {num_params:,} parameters; mesh "
        f"{dict(layout.mesh.shape)} over {jax.device_count()} devices, "
        f"{jax.process_count()} processes; starting at step {start}"
    )

    train_step, eval_step = make_steps(
        objective,
        tx,
        schedule,
        tcfg.seed,
        layout,
        shardings,
        ema_decay=float(tcfg.get("ema_decay", 0.0)),
        accumulate_steps=k,
    )
    if tcfg.get("aot_compile", True):
        train_step = compile_for_shapes(
            train_step, state, shapes, layout, runlog.note, model.context_sentences
        )
    if tcfg.get("dev_bleu", False):
        eval_hooks = (
            *eval_hooks,
            make_bleu_hook(
                model,
                tokenizer,
                dev_docs,
                SearchConfig(beam_size=tcfg.dev_bleu_beam, alpha=tcfg.dev_bleu_alpha),
                config.data.eval_batch_tokens,
                config.data.max_sentences,
                layout,
                os.path.join(workdir, "dev_translations"),
            ),
        )
    dataset = loader_lib.train_batches(train_plan, start_step=position, loader=loader)

    def run_eval(step: int) -> dict[str, float]:
        params = state.get("ema", state["params"])  # the EMA when the run keeps one
        batches = pipeline_lib.numpy_batches(dev_plan)
        metrics = evaluate_metrics(
            eval_step, params, (parallel.global_batch(b, layout.batch) for b in batches)
        )
        for hook in eval_hooks:
            metrics.update(hook(params, step))
        return metrics

    def save(step: int, dev: dict[str, float] | None, latest: bool = True) -> None:
        nonlocal best_value
        is_best = False
        if dev is not None and tcfg.best_metric in dev:
            is_best = _is_better(dev[tcfg.best_metric], best_value, tcfg.best_mode)
        meta = {
            "step": step,
            "data_step": position,
            "accumulate_steps": k,
            "micro": micro,
            "dev": dev or {},
            "best_metric": tcfg.best_metric,
            "best_value": dev[tcfg.best_metric] if is_best else best_value,
            "config": json.loads(config.to_json_best_effort()),
        }
        ckpt.save(position, state, meta, best=is_best, latest=latest)  # never a NaN/Inf state
        if is_best:
            best_value = dev[tcfg.best_metric]

    def last_checkpoint() -> str:
        done = ckpt.latest_complete()
        return "none saved yet" if done is None else f"{done[1]} (step {done[0]})"

    def fail(message: str) -> NonFiniteError:
        """Ends the run on a non-finite state: pending saves finish (all finite), the message
        goes to the log; returns the error to raise."""
        bar.close()
        message = f"{message}; last good checkpoint: {last_checkpoint()}"
        runlog.note(f"stopped: {message}")
        ckpt.close()
        runlog.close()
        return NonFiniteError(message)

    deadline = (
        time.monotonic() + 60 * tcfg.time_budget_minutes if tcfg.time_budget_minutes else None
    )
    max_bad = int(tcfg.get("max_bad_steps", 5))
    guard = BadStepGuard(max_bad)
    step = start
    step_losses: list[float] = []
    window: dict[str, Metric] = {}
    window_steps, window_start = 0, time.monotonic()
    dev: dict[str, float] = {}
    stopped_by = "num_steps"
    # A time budget is the usual bound when set: no step total (its ETA would be the steps'),
    # the minutes left in the postfix instead.
    bar = tqdm(
        total=None if deadline else tcfg.num_steps,
        initial=start,
        desc=f"train ({tcfg.time_budget_minutes:g} min budget)" if deadline else "train",
        disable=jax.process_index() != 0,
    )
    # SIGTERM/SIGINT: stop after the current step and save; a second one exits at once.
    with stop_signals() as flag:
        try:
            while step < tcfg.num_steps:
                if jax.process_count() == 1 or step % tcfg.log_every == 0:
                    reason = stop_reason(flag, deadline, every_process=jax.process_count() > 1)
                    if reason:
                        stopped_by = reason
                        break
                metrics, reason = {}, ""
                while True:  # the update's micro-batches (one without accumulation)
                    batch = parallel.global_batch(next(dataset), layout.batch)
                    state, batch_metrics = train_step(state, batch)
                    position, micro = position + 1, (micro + 1) % k
                    guard.push(step + 1 if k == 1 else position, batch_metrics)
                    guard.check(keep=1)  # the previous step's flag: this one still runs
                    metrics = add_metrics(metrics, batch_metrics)
                    if micro == 0:
                        break
                    if jax.process_count() == 1:  # a signal between micro-batches
                        reason = stop_reason(flag, None, every_process=False)
                        if reason:
                            break
                if micro:  # stopped mid-accumulation: saved as it is, resumed exactly
                    stopped_by = reason
                    break
                step += 1
                window_steps += 1
                window = add_metrics(window, metrics)
                if record_losses:
                    step_losses.append(reduce_metrics({"loss": metrics["loss"]})["loss"])
                if step % tcfg.log_every == 0 or step == tcfg.num_steps:
                    values = reduce_metrics(window)
                    elapsed = time.monotonic() - window_start
                    if "tokens" in values:
                        values["tokens_per_s"] = values["tokens"] / max(elapsed, 1e-9)
                    runlog.write(step, values, prefix="train/")
                    bar.set_postfix(
                        loss=f"{values.get('loss', float('nan')):.3f}",
                        lr=f"{values['lr']:.2e}",
                        tok_s=f"{values.get('tokens_per_s', 0.0):.0f}",
                        **(
                            {"left": f"{max(deadline - time.monotonic(), 0) / 60:.1f}m"}
                            if deadline
                            else {}
                        ),
                    )
                    window, window_steps = {}, 0
                    window_start = time.monotonic()
                bar.update(1)
                evaluated = step % tcfg.eval_every == 0
                if evaluated or step % tcfg.checkpoint_every == 0:
                    guard.check()  # a run of bad steps that ends here stops before saving
                if evaluated:
                    dev = run_eval(step)
                    runlog.write(step, dev)
                if evaluated or step % tcfg.checkpoint_every == 0:
                    save(step, dev if evaluated else None)
            guard.check()
            bar.close()
            if stopped_by in STOP_SIGNALS.values():
                # Preemption: save at once (no dev evaluation, which may take minutes).
                name = stopped_by.upper()
                at = f"step {step}" + (f" (micro-batch {micro} of {k})" if micro else "")
                if position == start * k + start_micro:
                    runlog.note(f"{name} at {at}, before any step of this run: no save")
                elif not micro and (
                    step % tcfg.eval_every == 0 or step % tcfg.checkpoint_every == 0
                ):
                    runlog.note(f"{name} at {at}: checkpoint {position} is saved already")
                else:
                    runlog.note(f"{name} at {at}: saving checkpoint {position}")
                    save(step, None)
            elif step != start and (step % tcfg.eval_every != 0):
                dev = run_eval(step)
                runlog.write(step, dev)
                # A checkpoint of this step may exist already (checkpoint_every divides it).
                save(step, dev, latest=step % tcfg.checkpoint_every != 0)
            ckpt.wait()
        except _TooManyBadStepsError as bad:
            first, last = bad.steps[0], bad.steps[-1]
            raise fail(
                f"{len(bad.steps)} consecutive steps with a non-finite loss or gradient norm "
                f"(train.max_bad_steps={max_bad}), steps {first}-{last}: training stopped at "
                f"step {last} (loss {bad.loss:.4g}, gradient norm {bad.grad_norm:.4g}; "
                f"parameters unchanged since step {first - 1}); the batch of step {last} holds "
                f"documents {_name_documents(batch_documents(train_plan, last - 1))}"
            ) from None
        except NonFiniteError as e:
            raise fail(f"training stopped: {e}") from None
    done = ckpt.latest_complete()
    ckpt.close()
    runlog.note(
        f"stopped at step {step} ({stopped_by}); dev "
        + " ".join(f"{k}={v:.4g}" for k, v in sorted(dev.items()))
    )
    runlog.close()
    return TrainResult(
        step=step,
        dev_metrics=dev,
        losses=step_losses,
        stopped_by=stopped_by,
        checkpoint="" if done is None else os.fspath(done[1]),
    )
