"""Loading ml_collections config files by path, so one config can derive from another.

``configs/final.py`` builds on ``configs/transformer.py`` and ``configs/final_table3.py`` on
``configs/final.py``; config files are loaded by path (absl's ``config_flags``), not imported
as a package, hence this helper. ``PATH:ARG`` calls ``get_config(ARG)``, as ``--config`` does
(``configs/final_table3.py:doc2sent``).
"""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Callable
from types import ModuleType

import ml_collections


def load_config_module(path: str) -> ModuleType:
    """The config file at ``path`` as a module (for its tables, e.g. ``TABLE3_SWITCHES``)."""
    name = "config_" + os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise FileNotFoundError(f"{path}: not a config file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_config(path: str) -> ml_collections.ConfigDict:
    """``get_config()`` of the config file at ``path``, or ``get_config(ARG)`` for
    ``PATH:ARG``."""
    path, sep, arg = path.partition(":") if path.endswith(".py") is False else (path, "", "")
    module = load_config_module(path)
    return module.get_config(arg) if sep else module.get_config()


def sibling_config(config_file: str, name: str) -> ml_collections.ConfigDict:
    """``get_config()`` of ``name`` (e.g. ``"final.py"``) in the directory of ``config_file``."""
    return load_config(os.path.join(os.path.dirname(os.path.abspath(config_file)), name))


#: The papers' training settings (``configs/X.py:paper``): post-LayerNorm, Vaswani et al.
#: (2017)'s inverse-sqrt schedule with 8,000 warm-up steps and the d_model-scaled peak, no
#: gradient clipping, no parameter average.
PAPER_TRAINING = {
    "model.pre_ln": False,
    "train.warmup_steps": 8000,
    "train.lr_scale": 1.0,
    "train.learning_rate": 0.0,
    "train.clip_norm": 0.0,
    "train.ema_decay": 0.0,
    "data.batch_src_tokens": 2048,
    "data.batch_tgt_tokens": 2048,
    "data.train_as": "documents",  # the papers train on the documents, never their cuts
}
PAPER = "paper"


def paper_training(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """``config`` with :data:`PAPER_TRAINING` (keys the config lacks, e.g. ``model.pre_ln``
    of a recurrent model, are left out)."""
    for key, value in PAPER_TRAINING.items():
        section, name = key.split(".")
        if name in config[section]:
            config[section][name] = value
    return config


def paper_variant(
    get_config: Callable[..., ml_collections.ConfigDict],
) -> Callable[..., ml_collections.ConfigDict]:
    """Lets a config file's ``get_config`` take ``paper`` among its comma-separated
    arguments (``final.py:paper``, ``doct.py:two_step,paper``): the config of the other
    arguments (or of none: the file's default) with the papers' training settings."""

    @functools.wraps(get_config)
    def with_paper(arg: str = "") -> ml_collections.ConfigDict:
        parts = [p for p in arg.split(",") if p] if arg else []
        rest = ",".join(p for p in parts if p != PAPER)
        config = get_config(rest) if rest else get_config()
        return paper_training(config) if PAPER in parts else config

    return with_paper
