"""Training budgets and speeds in real target tokens.

:func:`tokens_per_step` plans a config's batches over an epoch of its training split and
counts the real target tokens a step carries (its packing or grid, its padding excluded): a
budget stated in tokens becomes each model's own number of steps. :func:`train_speed` reads
the tokens a run trained, and how fast, back from its ``train.log``. :data:`TINY_MODEL`,
:func:`set_key` and :func:`resize_model` set a config for a smoke run of any model.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import ml_collections

from docnmt_jax.files import log_timestamp

#: Tiny model sizes for a run of a few steps (any model; keys a model lacks are dropped).
TINY_MODEL = (
    ("d_model", 32),
    ("embed_dim", 32),
    ("hidden_dim", 32),
    ("num_heads", 2),
    ("ffn_dim", 64),
    ("num_encoder_layers", 2),  # FINAL: a local layer under the global one
    ("num_decoder_layers", 1),
    ("num_layers", 1),
    ("num_context_layers", 1),
)


def set_key(config: ml_collections.ConfigDict, key: str, value: Any) -> None:
    """Sets the flattened ``section.key`` (any depth) of ``config`` to ``value``."""
    *path, leaf = key.split(".")
    node = config
    for part in path:
        node = node[part]
    node[leaf] = value


def resize_model(config: ml_collections.ConfigDict, sizes: Sequence[tuple[str, Any]]) -> None:
    """Sets the model sizes of ``sizes`` that ``config.model`` has (the others are dropped),
    the heads capped at the width."""
    for key, value in sizes:
        if key in config.model:
            config.model[key] = value
    if "num_heads" in config.model and "d_model" in config.model:
        config.model.num_heads = min(config.model.num_heads, config.model.d_model)


def tokens_per_step(config: ml_collections.ConfigDict, tokenizer: Any) -> tuple[float, int]:
    """Mean real target tokens of one training step of ``config`` over an epoch of its own
    batch plan (the trainer's, :func:`~docnmt_jax.training.data_setup.plan_batches`: its
    packing or grid, its limits checked, its padding excluded), and the epoch's target
    tokens."""
    from docnmt_jax.models import build_model
    from docnmt_jax.objectives import build_objective
    from docnmt_jax.training import data_setup

    model = build_model(config.model, tokenizer.vocab_size)
    objective = build_objective(config.get("objective", {}), model)
    packed = data_setup.trains_packed(config, objective.needs_grid)
    docs = data_setup.load_documents(config.data, "train", config.train.seed)
    plan = data_setup.plan_batches(config, model, 1, packed, tokenizer.encode_batch, docs, True)
    return plan.stats.tgt_tokens / max(plan.stats.batches_per_epoch, 1), plan.stats.tgt_tokens


def train_speed(log_path: str) -> dict[str, float]:
    """Real target tokens, seconds and tokens/s over every logged training window of
    ``train.log`` (a window's seconds = its tokens / its tokens/s). A run that starts again at
    step N (``starting at step N``: resumed, or from scratch where no checkpoint was left)
    drops the earlier runs' windows past N: their steps were trained again.

    ``wall_seconds`` sums each run's first-to-last log line (a run starts at the trainer's
    ``data: N train / M dev documents`` line), so a row trained over several sessions states
    its whole wall time; a run that starts again at step 0 drops the earlier runs' time."""
    windows: list[tuple[int, float, float]] = []  # (last step, tokens, seconds)
    runs: list[list[float]] = []  # [first, last] timestamp of each run of the trainer
    window = re.compile(r"step=(\d+) .*train/tokens=([\d.e+-]+) train/tokens_per_s=([\d.e+-]+)")
    start = re.compile(r"starting at step (\d+)")
    run_start = re.compile(r"data: \d+ train / \d+ dev documents")
    try:
        with open(log_path, encoding="utf-8") as f:
            for line in f:
                stamp = log_timestamp(line)
                if stamp is not None:
                    if run_start.search(line) or not runs:
                        runs.append([stamp, stamp])
                    runs[-1][1] = stamp
                if match := start.search(line):
                    windows = [w for w in windows if w[0] <= int(match.group(1))]
                    if int(match.group(1)) == 0:
                        runs = runs[-1:]
                elif (match := window.search(line)) and float(match.group(3)) > 0:
                    tokens = float(match.group(2))
                    windows.append((int(match.group(1)), tokens, tokens / float(match.group(3))))
    except OSError:
        pass
    tokens = sum(w[1] for w in windows)
    seconds = sum(w[2] for w in windows)
    return {
        "train_tokens": tokens,
        "train_seconds": seconds,
        "train_tokens_per_s": tokens / seconds if seconds else 0.0,
        "wall_seconds": sum(last - first for first, last in runs),
    }
