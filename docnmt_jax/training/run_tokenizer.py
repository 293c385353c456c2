"""Where a run's tokenizer is, and keeping it inside the run's workdir.

A run trains with ``config.data.tokenizer`` (a path given by the user, relative to the
directory training started from) or its own ``WORKDIR/spm.model``. Training copies a named
tokenizer into ``WORKDIR/spm.model`` and records ``data.tokenizer = "spm.model"`` in the
workdir's ``config.json`` (:func:`keep_in_workdir`), so that the workdir is self-contained:
it translates from any current directory and after being moved or copied.

:func:`resolve` reads what a ``config.json`` names, new or old: '' is ``WORKDIR/spm.model``;
an absolute path is itself; a relative path is looked up against the workdir (what runs
record now), then the current directory (older runs recorded the path as given), then every
directory above the workdir (an older run trained from the repository root with
``runs/demo/x/spm.model`` finds it from anywhere).

Only the standard library is imported here.
"""

from __future__ import annotations

import filecmp
import json
import os
import shutil

from docnmt_jax.errors import ConfigError
from docnmt_jax.files import atomic_path, write_atomic

#: The tokenizer's name inside a workdir, as its config.json records it.
WORKDIR_TOKENIZER = "spm.model"


def resolve(named: str, workdir: str) -> str:
    """The file that a run's ``config.data.tokenizer`` ``named`` means for the run in
    ``workdir`` (module docstring); a relative path found nowhere is returned as given."""
    if not named:
        return os.path.join(workdir, WORKDIR_TOKENIZER)
    if os.path.isabs(named):
        return named
    candidates = [os.path.join(workdir, named), named]
    directory = os.path.abspath(workdir)
    while os.path.dirname(directory) != directory:
        directory = os.path.dirname(directory)
        candidates.append(os.path.join(directory, named))
    return next((path for path in candidates if os.path.isfile(path)), named)


def keep_in_workdir(named: str, workdir: str) -> str:
    """Copies the tokenizer ``named`` (``config.data.tokenizer``) to ``WORKDIR/spm.model``
    unless it is there already, records it in the workdir's ``config.json`` as
    ``spm.model``, and returns the copy's path. A different ``spm.model`` already in the
    workdir is a one-line error: a run keeps the tokenizer it started with."""
    source = resolve(named, workdir)
    path = os.path.join(workdir, WORKDIR_TOKENIZER)
    if not os.path.isfile(source):
        raise ConfigError(f"config.data.tokenizer={named}: no such file ({source})")
    if not os.path.exists(path):
        with atomic_path(path) as tmp:
            shutil.copyfile(source, tmp)
    elif not os.path.samefile(source, path) and not filecmp.cmp(source, path, shallow=False):
        raise ConfigError(
            f"config.data.tokenizer={named} differs from the run's own {path}: a run keeps the "
            "tokenizer it started with (use a new workdir for another tokenizer)"
        )
    config_path = os.path.join(workdir, "config.json")
    if os.path.exists(config_path):
        with open(config_path, encoding="utf-8") as f:
            config = json.load(f)
        if config.get("data", {}).get("tokenizer") != WORKDIR_TOKENIZER:
            config.setdefault("data", {})["tokenizer"] = WORKDIR_TOKENIZER
            write_atomic(config_path, json.dumps(config, indent=2, sort_keys=True) + "\n")
    return path
