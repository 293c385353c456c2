"""The release directory: one parameter set, the run's config and tokenizer, and a manifest.

Layout::

    DIR/params.npz     the parameters: one array per parameter, keyed by its path
                       (``decoder_layers_0/ffn/Dense_0/kernel``), written by ``numpy.savez``
    DIR/config.json    the run's config, ``data.tokenizer`` cleared (a release reads its own
                       ``spm.model``; the manifest keeps the original path)
    DIR/spm.model      the tokenizer
    DIR/release.json   the manifest (:func:`write_manifest`): format version, model, source
                       run and step, parameter set, parameter count, dtype, and the size and
                       sha256 of every other file
    DIR/stablehlo/     with ``--stablehlo``: :mod:`docnmt_jax.export.stablehlo`

Why one ``.npz``: it restores with ``numpy.load`` alone into a flat ``{path: array}`` mapping,
without the training state's structure (optimiser state, step, EMA) that an Orbax checkpoint
must be restored onto, without Orbax/TensorStore, and without flax (which a msgpack file of
``flax.serialization`` needs); it is a zip of ``.npy`` files that other languages read too.
It is stored uncompressed (float weights barely compress). Parameters are float32
(``model.param_dtype``), a dtype numpy stores natively; a dtype it does not (bfloat16) is
refused rather than stored as raw bytes.

Verification (:func:`verify_release`, :func:`check_file`): every file the manifest lists is
checked against its sha256 when a release is loaded, and a manifest may only name plain
relative paths inside the release (``params.npz``, ``stablehlo/model.json``): never an
absolute path, a ``..`` or a backslash, and never a link out of the directory. A mismatch is a
one-line error naming the file.

Only numpy and the standard library are imported here.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from typing import Any

import numpy as np

from docnmt_jax.errors import RunNotFoundError, UserError

FORMAT = "docnmt_jax-release"
FORMAT_VERSION = 1
MANIFEST = "release.json"
PARAMS_FILE = "params.npz"
CONFIG_FILE = "config.json"
TOKENIZER_FILE = "spm.model"
STABLEHLO_DIR = "stablehlo"
#: What a staging directory of :func:`staging_dir` may hold (a killed export's leftovers).
_STAGED_NAMES = {MANIFEST, PARAMS_FILE, CONFIG_FILE, TOKENIZER_FILE, STABLEHLO_DIR}
#: The manifest entries a reader relies on.
_REQUIRED = ("format_version", "model", "source_step", "parameter_set", "files")


def is_release(path: str) -> bool:
    """Whether ``path`` is a release directory (it holds ``release.json``)."""
    return os.path.isfile(os.path.join(path, MANIFEST))


def flatten_params(tree: Mapping[str, Any], prefix: str = "") -> dict[str, np.ndarray]:
    """``{"a": {"b": x}}`` -> ``{"a/b": numpy x}`` (nested mappings of arrays)."""
    flat: dict[str, np.ndarray] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_params(value, name + "/"))
        else:
            flat[name] = np.asarray(value)
    return flat


def unflatten_params(flat: Mapping[str, Any]) -> dict[str, Any]:
    """The nested dict of :func:`flatten_params`' output."""
    tree: dict[str, Any] = {}
    for name, value in flat.items():
        *parents, leaf = name.split("/")
        node = tree
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return tree


def write_params(path: str, flat: Mapping[str, np.ndarray]) -> tuple[int, str]:
    """Writes ``flat`` (:func:`flatten_params`) to ``path`` (``.npz``, uncompressed); returns
    the parameter count and the dtype(s), e.g. ``"float32"``."""
    odd = sorted({str(a.dtype) for a in flat.values() if a.dtype.kind not in "fiub"})
    if odd:
        raise UserError(f"parameters of dtype {', '.join(odd)}: a release stores float32 params")
    with open(path, "wb") as f:
        np.savez(f, **flat)
    dtypes = ",".join(sorted({str(a.dtype) for a in flat.values()}))
    return int(sum(a.size for a in flat.values())), dtypes


def sha256(path: str) -> str:
    """The hex sha256 of the file at ``path``."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def directory_bytes(path: str) -> int:
    """Bytes of the files under ``path`` (links not followed)."""
    total = 0
    for root, _, names in os.walk(path):
        for name in names:
            file = os.path.join(root, name)
            if not os.path.islink(file):
                total += os.path.getsize(file)
    return total


def write_manifest(directory: str, info: Mapping[str, Any]) -> dict[str, Any]:
    """Writes ``release.json``: ``info`` plus the format, its version and ``files``: the size
    and sha256 of every file under ``directory`` (relative paths, ``/``-separated); returns
    it. Written last, once every other file is there."""
    files = {}
    for root, _, names in sorted(os.walk(directory)):
        for name in sorted(names):
            path = os.path.join(root, name)
            rel = os.path.relpath(path, directory).replace(os.sep, "/")
            if rel != MANIFEST:
                files[rel] = {"bytes": os.path.getsize(path), "sha256": sha256(path)}
    manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, **info, "files": files}
    with open(os.path.join(directory, MANIFEST), "w", encoding="utf-8") as f:
        f.write(json.dumps(manifest, indent=2) + "\n")
    return manifest


def read_manifest(directory: str) -> dict[str, Any]:
    """The manifest of the release in ``directory``; one-line errors for a missing, unreadable,
    incomplete or newer one."""
    path = os.path.join(directory, MANIFEST)
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
    except FileNotFoundError:
        raise RunNotFoundError(f"{path} not found: is {directory} a release?") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: not a release manifest ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise UserError(f"{path}: not a release manifest (format is not {FORMAT!r})")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise UserError(
            f"{path}: release format version {manifest.get('format_version')!r}; this "
            f"docnmt_jax reads version {FORMAT_VERSION}"
        )
    missing = [k for k in _REQUIRED if k not in manifest]
    if missing:
        raise UserError(f"{path}: the manifest lacks {', '.join(missing)}")
    files = manifest["files"]
    if not isinstance(files, dict):
        raise UserError(f"{path}: 'files' is not a mapping of file names")
    for name, entry in files.items():
        check_name(name, path)
        if not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str):
            raise UserError(f"{path}: the entry of {name!r} has no sha256")
    return manifest


def check_name(name: Any, where: str) -> str:
    """``name`` if it is a plain relative path inside a release (``a/b``: no absolute path,
    ``..``, ``.``, empty part or backslash), else a one-line error naming ``where``."""
    parts = name.split("/") if isinstance(name, str) else [""]
    if (
        not isinstance(name, str)
        or "\\" in name
        or "\0" in name
        or os.path.isabs(name)
        or any(part in ("", ".", "..") for part in parts)
    ):
        raise UserError(f"{where}: {name!r} is not a file name inside the release")
    return name


def check_file(directory: str, manifest: Mapping[str, Any], name: str) -> str:
    """The path of release file ``name``, after checking that it is a plain name inside the
    release (:func:`check_name`; no link out of it) and its sha256 against the manifest."""
    check_name(name, os.path.join(directory, MANIFEST))
    path = os.path.join(directory, *name.split("/"))
    if not os.path.isfile(path):
        raise RunNotFoundError(f"{path} not found: the release is incomplete")
    root = os.path.realpath(directory)
    if not os.path.realpath(path).startswith(root + os.sep):
        raise UserError(f"{path}: a link out of the release directory")
    entry = manifest.get("files", {}).get(name)
    if not isinstance(entry, dict):
        raise UserError(f"{path}: not listed in {MANIFEST} (the release is incomplete)")
    if entry.get("sha256") != sha256(path):
        raise UserError(f"{path}: sha256 differs from {MANIFEST}'s (the file is corrupt)")
    return path


def verify_release(
    directory: str, manifest: Mapping[str, Any], skip: tuple[str, ...] = ()
) -> Mapping[str, Any]:
    """Checks every file the manifest lists but ``skip`` (:func:`check_file`); returns the
    manifest."""
    for name in manifest["files"]:
        if name not in skip:
            check_file(directory, manifest, name)
    return manifest


def read_params(directory: str, manifest: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The release's parameters, flat (:func:`flatten_params`), checked against the manifest."""
    path = check_file(directory, manifest, PARAMS_FILE)
    with np.load(path, allow_pickle=False) as npz:
        return {name: npz[name] for name in npz.files}


# ------------------------------------------------------------------- writing the directory


def check_target(
    out: str, workdir: str, overwrite: bool, marker: str = MANIFEST, kind: str = "a release"
) -> None:
    """Refuses an ``out`` that is (or holds) ``workdir``, a file, or a non-empty directory
    (with ``overwrite``: a non-empty directory that is not ``kind``, i.e. holds no ``marker``
    file)."""
    out_abs, run_abs = os.path.abspath(out), os.path.abspath(workdir)
    if out_abs == run_abs or run_abs.startswith(out_abs + os.sep):
        raise UserError(f"--out={out} would replace the run {workdir} itself")
    if os.path.exists(out) and not os.path.isdir(out):
        raise UserError(f"--out={out} exists and is not a directory")
    if os.path.isdir(out) and os.listdir(out):
        if not overwrite:
            raise UserError(f"--out={out} exists and is not empty (--overwrite replaces it)")
        if not os.path.isfile(os.path.join(out, marker)):
            raise UserError(
                f"--out={out} is not empty and not {kind} (no {marker}): not replaced "
                "even with --overwrite"
            )


def staging_dir(out: str) -> str:
    """A fresh, empty ``OUT.tmp``; an earlier killed export's leftover there (only release
    files) is removed, anything else there is a one-line error."""
    tmp = os.path.abspath(out) + ".tmp"
    if os.path.lexists(tmp):
        names = set(os.listdir(tmp)) if os.path.isdir(tmp) else {"?"}
        if not names <= _STAGED_NAMES:
            raise UserError(f"{tmp} exists and is not a partial export: move it away")
        shutil.rmtree(tmp)
    os.makedirs(tmp)
    return tmp


def commit(tmp: str, out: str) -> None:
    """Puts the finished ``tmp`` in place of ``out`` by renames: an empty ``out`` is replaced
    at once; a release there is first moved into a temporary directory beside it, which is
    removed after the rename (a process killed between the two renames leaves it there)."""
    out = os.path.abspath(out)
    if not os.path.isdir(out):
        os.makedirs(os.path.dirname(out), exist_ok=True)
        os.rename(tmp, out)
        return
    if not os.listdir(out):
        os.rmdir(out)
        os.rename(tmp, out)
        return
    old = tempfile.mkdtemp(prefix=os.path.basename(out) + ".replaced.", dir=os.path.dirname(out))
    os.rename(out, os.path.join(old, "release"))
    os.rename(tmp, out)
    shutil.rmtree(old)
