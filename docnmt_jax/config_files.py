"""Loading ml_collections config files by path, so one config can derive from another.

``configs/final.py`` builds on ``configs/transformer.py`` and ``configs/final_table3.py`` on
``configs/final.py``; config files are loaded by path (absl's ``config_flags``), not imported
as a package, hence this helper. ``PATH:ARG`` calls ``get_config(ARG)``, as ``--config`` does
(``configs/final_table3.py:doc2sent``).

The repository's ``configs/`` ship with the package (``docnmt_jax/configs/`` once installed,
mapped in ``setup.py`` without copies): :func:`resolve_config_path` turns ``final``,
``final.py:paper`` or ``configs/final_table3.py:doc2sent`` into the shipped file when no such
file exists relative to the current directory, so the installed commands run anywhere.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import os
import re
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import ml_collections

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
#: Where the shipped configs live: the installed package data, else (a repository checkout or
#: an editable install) the repository's configs/ next to the package.
_CONFIG_DIRS = (
    os.path.join(_PACKAGE_DIR, "configs"),
    os.path.join(os.path.dirname(_PACKAGE_DIR), "configs"),
)
DEFAULT_CONFIG = "transformer.py"  # a shipped config every other one derives from
_loaded_files: list[list[str]] = []  # one list per active _recording_loads()


def shipped_configs_dir() -> str | None:
    """The directory of the shipped config files (``configs/``), ``None`` if not found."""
    for directory in _CONFIG_DIRS:
        if os.path.isfile(os.path.join(directory, DEFAULT_CONFIG)):
            return directory
    return None


def shipped_config_names() -> list[str]:
    """The shipped configs' names (``final``, ``transformer``, ...), sorted."""
    directory = shipped_configs_dir()
    if directory is None:
        return []
    return sorted(
        name[:-3]
        for name in os.listdir(directory)
        if name.endswith(".py") and not name.startswith("_")
    )


def resolve_config_path(value: str) -> str:
    """``--config``'s value with a shipped config's name made its path.

    ``FILE`` or ``FILE:ARG`` (the ``ARG`` goes to ``get_config``, as in absl's
    ``config_flags``). A file ``FILE`` (or ``FILE.py``) relative to the current directory, or
    absolute, wins; else ``NAME``, ``NAME.py``, ``configs/NAME`` or ``configs/NAME.py`` names
    the shipped ``configs/NAME.py`` (``final``, ``final.py:paper``,
    ``final_table3:doc2sent``). Anything else is returned unchanged (its error names the
    user's value).
    """
    if not value or os.path.isfile(value):
        return value
    file, sep, arg = value.partition(":")
    if not file or os.path.isfile(file):
        return value
    if not file.endswith(".py") and os.path.isfile(file + ".py"):
        return file + ".py" + sep + arg
    name = file.replace(os.sep, "/")
    name = name[len("configs/") :] if name.startswith("configs/") else name
    name = name if name.endswith(".py") else name + ".py"
    directory = shipped_configs_dir()
    if "/" in name or directory is None or not os.path.isfile(os.path.join(directory, name)):
        return value
    return os.path.join(directory, name) + sep + arg


def load_config_module(path: str) -> ModuleType:
    """The config file at ``path`` as a module (for its tables, e.g. ``TABLE3_SWITCHES``)."""
    name = "config_" + os.path.splitext(os.path.basename(path))[0]
    for files in _loaded_files:
        files.append(os.path.abspath(path))
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise FileNotFoundError(f"{path}: not a config file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_config(path: str) -> ml_collections.ConfigDict:
    """``get_config()`` of the config file at ``path``, or ``get_config(ARG)`` for
    ``PATH:ARG``; a shipped config's name resolves (:func:`resolve_config_path`)."""
    path = resolve_config_path(path)
    path, sep, arg = path.partition(":") if path.endswith(".py") is False else (path, "", "")
    module = load_config_module(path)
    return module.get_config(arg) if sep else module.get_config()


def sibling_config(config_file: str, name: str) -> ml_collections.ConfigDict:
    """``get_config()`` of ``name`` (e.g. ``"final.py"``, ``"doct.py:two_step"``) in the
    directory of ``config_file``, else the shipped one (a copy of a shipped config elsewhere
    still finds its bases)."""
    directory = os.path.dirname(os.path.abspath(config_file))
    shipped = shipped_configs_dir()
    if not os.path.isfile(os.path.join(directory, name.partition(":")[0])) and shipped:
        directory = shipped
    return load_config(os.path.join(directory, name))


@contextlib.contextmanager
def _recording_loads() -> Iterator[list[str]]:
    """The paths of the config files loaded inside the block (a config, then its bases)."""
    files: list[str] = []
    _loaded_files.append(files)
    try:
        yield files
    finally:
        _loaded_files.remove(files)


_KEY_LINE = re.compile(r"^\s*config\.([\w.]+)\s*=\s*(.+?)\s*(?:#\s*(.*))?$")
_COMMENT_LINE = re.compile(r"^\s*#\s?(.*)$")


def _key_lines(path: str) -> Iterator[tuple[str, str]]:
    """``(KEY, comment)`` for each ``config.KEY = VALUE  # comment`` line of the config file
    ``path``, in file order (sections too); a line without its own comment takes the comment
    block right above it, else ``""``."""
    block: list[str] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if comment := _COMMENT_LINE.match(line):
                block.append(comment.group(1).strip())
                continue
            if match := _KEY_LINE.match(line):
                key, value, comment = match.groups()
                yield key, "" if "ConfigDict()" in value else comment or " ".join(block)
            block = []


def _leaf_items(config: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in config.items():
        if isinstance(value, ml_collections.ConfigDict):
            yield from _leaf_items(value, f"{prefix}{key}.")
        else:
            yield prefix + key, value


def _shown_value(value: Any) -> str:
    return json.dumps(value) if isinstance(value, str) else repr(value)


def config_key_help(path: str) -> str:
    """One line per key of the config ``path`` (``FILE`` or ``FILE:ARG``, as ``--config``):
    ``--config.KEY (default VALUE): comment``, every key of the loaded config with its value,
    in the order of the files (bases first). The comment is the key's in the config file or,
    first found, in the files it derives from (:func:`sibling_config`)."""
    with _recording_loads() as files:
        config = load_config(path)
    comments: dict[str, str] = {}
    for file in files:  # the config first, then its bases
        for key, comment in _key_lines(file):
            if comment:
                comments.setdefault(key, comment)
    position: dict[str, int] = {}
    for file in reversed(files):
        for key, _ in _key_lines(file):
            position.setdefault(key, len(position))

    def file_order(key: str) -> tuple:
        parts = key.split(".")
        prefixes = (".".join(parts[: i + 1]) for i in range(len(parts)))
        return (*(position.get(p, len(position)) for p in prefixes), key)

    lines = []
    for key, value in sorted(_leaf_items(config), key=lambda item: file_order(item[0])):
        comment = comments.get(key)
        lines.append(
            f"  --config.{key} (default {_shown_value(value)}){': ' + comment if comment else ''}"
        )
    return "\n".join(lines)


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
    "model.packed_chunk_spans": 2,  # FINAL's two-layout rows: one row of 2,048 slots a batch
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
