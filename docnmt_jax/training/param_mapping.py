"""Parameters of a new model from another run's checkpoint through path rules (``init_from``).

T5X's assignment map, with the model as the source of the presets. ``config.init_from_rules``
is one string of entries separated by ``;`` or newlines (a Python sequence of entries or of
``(regex, template)`` pairs also works), each of them

* ``REGEX -> TEMPLATE``: a parameter of the new model whose whole path (``a/b/c``, the names
  ``train.freeze`` sees) matches ``REGEX`` comes from checkpoint path ``TEMPLATE`` with the
  match's groups filled in (``\\1``, ``\\g<name>``: :meth:`re.Match.expand`);
* ``REGEX -> skip``: matching parameters keep their fresh initialisation;
* a preset: ``all`` (the whole model) or ``source`` (the source side,
  :attr:`~docnmt_jax.models.base.BaseModel.source_parameters`; every other parameter fresh).
  From a checkpoint with exactly the new model's parameter paths a preset copies identical
  paths; from any other checkpoint it applies the model's own mapping from a sentence
  Transformer (:meth:`~docnmt_jax.models.base.BaseModel.transformer_rules`: identical paths
  by default; FINAL declares its own).

The first entry whose regex matches a parameter decides for it. A parameter that no entry
matches comes from the same path; when the checkpoint lacks that path it is an error unless
``init_from_allow_new`` (then fresh). A rule that matches no parameter of the new model, a
template naming a path the checkpoint lacks, and a shape that differs (vocabulary sizes
included) are errors naming both paths and shapes; a ``skip`` rule before it keeps a
parameter fresh instead. Checkpoint parameters nothing uses are ``unused``: with rules that
is reported, without rules (the default, ``""``: every parameter by identical path) it is an
error unless ``init_from_ignore_unused``.

Every restore yields one table (:class:`Row`: parameter, source path, status ``loaded`` /
``renamed`` / ``fresh`` / ``unused``, both shapes), which the trainer prints and writes to
``WORKDIR/init_from.tsv``. Only parameters are read: the checkpoint's metadata gives its paths
and shapes, then an Orbax partial restore reads exactly the needed arrays of its ``params``
subtree (never the optimiser state), each straight onto the sharding of the parameter it
fills, so a checkpoint written on one mesh initialises a run on any other.
``init_from_params = "ema"`` reads the run's exponential moving average of its parameters
instead (what its translations use), ``"auto"`` the EMA where the run keeps one.

``init_from`` may also name a release directory (``docnmt-export``,
:mod:`docnmt_jax.export.release`): its one parameter set (``init_from_params`` must be
``auto`` or that set: ``ema``, or ``params`` for a release of raw parameters) is read from
``params.npz`` after its sha256 is checked against the manifest, and its ``spm.model`` is the
tokenizer, so a finetune starts from a committed release on a machine without the run.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from docnmt_jax.errors import ConfigError
from docnmt_jax.export import release as release_lib
from docnmt_jax.files import atomic_open
from docnmt_jax.models.base import ModelError
from docnmt_jax.models.contract import PretrainMapping, require
from docnmt_jax.training import checkpoints, run_tokenizer
from docnmt_jax.training.optim import parameter_path

PyTree = Any
Shape = tuple[int, ...]

SKIP = "skip"
PRESETS = ("all", "source")
LOADED, RENAMED, FRESH, UNUSED = "loaded", "renamed", "fresh", "unused"
TABLE_COLUMNS = ("parameter", "source", "status", "shape", "checkpoint_shape")
_LISTED = 8  # problems listed by name in one error line


class InitFromError(ModelError):
    """A mistake in ``init_from`` / ``init_from_rules`` or a checkpoint that does not fit (a
    one-line message naming the offending path or rule)."""


@dataclasses.dataclass(frozen=True)
class Rule:
    """``pattern`` (full match over new parameter paths) -> ``template`` (checkpoint path) or
    :data:`SKIP`; ``origin`` names it in errors; ``required``: matching no parameter is an
    error."""

    pattern: str
    template: str
    origin: str
    required: bool = True

    @property
    def regex(self) -> re.Pattern[str]:
        return re.compile(self.pattern)


@dataclasses.dataclass(frozen=True)
class Row:
    """One line of the restore table; ``parameter`` is empty for an unused checkpoint path,
    ``source`` for a fresh parameter."""

    parameter: str
    source: str
    status: str
    shape: Shape | None
    checkpoint_shape: Shape | None


def parse_rules(value: str | Sequence[Any]) -> list[Rule | str]:
    """The entries of ``config.init_from_rules``: :class:`Rule` s and preset names."""
    parts = re.split(r"[;\n]", value) if isinstance(value, str) else list(value)
    entries: list[Rule | str] = []
    for index, part in enumerate(parts):
        if isinstance(part, (tuple, list)) and len(part) == 2:
            pattern, template = (str(x).strip() for x in part)
        elif isinstance(part, str):
            part = part.strip()
            if not part:
                continue
            if "->" not in part:
                if part not in PRESETS:
                    raise InitFromError(
                        f"config.init_from_rules: {part!r} is neither a preset {PRESETS} nor "
                        "a rule 'REGEX -> TEMPLATE' or 'REGEX -> skip'"
                    )
                entries.append(part)
                continue
            pattern, _, template = (x.strip() for x in part.partition("->"))
        else:
            raise InitFromError(f"config.init_from_rules: cannot read entry {part!r}")
        origin = f"init_from_rules rule {index} {pattern!r} -> {template!r}"
        if not pattern or not template:
            raise InitFromError(f"config.init_from_rules: {origin} needs a regex and a template")
        try:
            re.compile(pattern)
        except re.error as e:
            raise InitFromError(f"{origin}: not a regular expression: {e}") from None
        entries.append(Rule(pattern, template, origin))
    return entries


def resolve_rules(
    entries: Sequence[Rule | str], model: Any, model_paths: Sequence[str], ckpt_paths: Sequence[str]
) -> list[Rule]:
    """``entries`` with every preset expanded for ``model`` and this checkpoint: identical
    paths when the checkpoint has exactly the model's parameter paths, else the model's
    :meth:`transformer_rules`; ``source`` first keeps everything off the source side fresh."""
    rules: list[Rule] = []
    same = set(model_paths) == set(ckpt_paths)
    for entry in entries:
        if isinstance(entry, Rule):
            rules.append(entry)
            continue
        if entry == "source" or not same:
            require(model, PretrainMapping, f"fill the init_from_rules preset {entry!r}")
        if entry == "source":
            scope = model.source_parameters
            rules.append(
                Rule(f"(?!(?:{scope})$).*", SKIP, f"preset 'source' (outside {scope!r})", False)
            )
        if same:
            rules.append(Rule("(.*)", r"\1", f"preset {entry!r} (identical paths)"))
            continue
        owner = f"{type(model).__name__}.transformer_rules"
        for pattern, template in model.transformer_rules():
            rules.append(Rule(pattern, template, f"preset {entry!r} rule {pattern!r} ({owner})"))
    return rules


def _listed(items: Sequence[str]) -> str:
    more = f" (+{len(items) - _LISTED} more)" if len(items) > _LISTED else ""
    return "; ".join(items[:_LISTED]) + more


def _fmt(shape: Shape | None) -> str:
    return "-" if shape is None else "(" + ", ".join(map(str, shape)) + ")"


def plan(
    model_shapes: Mapping[str, Shape],
    ckpt_shapes: Mapping[str, Shape],
    rules: Sequence[Rule],
    allow_new: bool = False,
    ignore_unused: bool = False,
    where: str = "init_from",
) -> list[Row]:
    """The restore table of a model (``path -> shape``) from a checkpoint (``path -> shape``)
    under ``rules`` (module docstring); raises :class:`InitFromError` listing every problem."""
    for rule in rules:
        if rule.required and not any(rule.regex.fullmatch(p) for p in model_shapes):
            example = min(model_shapes) if model_shapes else "-"
            raise InitFromError(
                f"{where}: {rule.origin} matches no parameter of the model (e.g. {example!r})"
            )
    compiled = [(rule, rule.regex) for rule in rules]
    rows: list[Row] = []
    missing_ruled, missing_same, mismatched, vocab = [], [], [], []
    for path in sorted(model_shapes):
        shape = tuple(model_shapes[path])
        hit = next(((r, m) for r, rx in compiled if (m := rx.fullmatch(path))), None)
        if hit is not None and hit[0].template == SKIP:
            rows.append(Row(path, "", FRESH, shape, None))
            continue
        source = path
        if hit is not None:
            try:
                source = hit[1].expand(hit[0].template)
            except (re.error, IndexError) as e:
                raise InitFromError(f"{where}: {hit[0].origin}: bad template: {e}") from None
        if source not in ckpt_shapes:
            if hit is None and allow_new:
                rows.append(Row(path, "", FRESH, shape, None))
            elif hit is None:
                missing_same.append(f"{path} {_fmt(shape)}")
            else:
                missing_ruled.append(f"{path} <- {source} ({hit[0].origin})")
            continue
        ckpt_shape = tuple(ckpt_shapes[source])
        if ckpt_shape != shape:
            mismatched.append(f"{path} {_fmt(shape)} <- {source} {_fmt(ckpt_shape)}")
            if "embed" in path and shape[1:] == ckpt_shape[1:] and len(shape) == 2:
                vocab.append((shape[0], ckpt_shape[0]))
            continue
        rows.append(Row(path, source, LOADED if source == path else RENAMED, shape, ckpt_shape))
    used = {row.source for row in rows if row.source}
    unused = sorted(set(ckpt_shapes) - used)
    problems = []
    if vocab:
        problems.append(
            f"vocabulary sizes differ (model {vocab[0][0]}, checkpoint {vocab[0][1]}): train "
            "with the pretraining run's tokenizer (config.data.tokenizer=PRETRAIN_WORKDIR/"
            "spm.model)"
        )
    if mismatched:
        problems.append(
            "shape mismatch (a rule 'REGEX -> skip' before keeps them fresh): "
            + _listed(mismatched)
        )
    if missing_ruled:
        problems.append("the checkpoint has no such path: " + _listed(missing_ruled))
    if missing_same:
        problems.append(
            "missing from checkpoint (set init_from_allow_new=True to keep their fresh "
            "initialisation, or map them with init_from_rules): " + _listed(missing_same)
        )
    if unused and not rules and not ignore_unused:
        problems.append(
            "in checkpoint but not in model (set init_from_ignore_unused=True to skip): "
            + _listed([f"{p} {_fmt(tuple(ckpt_shapes[p]))}" for p in unused])
        )
    if problems:
        raise InitFromError(f"{where}: " + " | ".join(problems))
    rows += [Row("", p, UNUSED, None, tuple(ckpt_shapes[p])) for p in unused]
    return rows


# ------------------------------------------------------------------------- checkpoint I/O


def checkpoint_dir(config: Any) -> str:
    """The ``state`` directory ``config.init_from`` names (``init_from_which`` in a
    workdir), the release directory it names, or :class:`InitFromError`."""
    if release_lib.is_release(config.init_from):
        which = str(config.get("init_from_which", "best"))
        if which != "best":
            raise InitFromError(
                f"init_from={config.init_from} is a release (one parameter set): "
                f"init_from_which={which!r} applies to a workdir only"
            )
        return os.path.abspath(config.init_from)
    try:
        return checkpoints.resolve_state_dir(
            config.init_from, str(config.get("init_from_which", "best"))
        )
    except (FileNotFoundError, ValueError) as e:
        raise InitFromError(str(e)) from None


def source_tokenizer(state_dir: str) -> str | None:
    """The sentencepiece model of the run that wrote ``state_dir`` (its ``config.json``'s
    ``data.tokenizer``, else its ``spm.model``; a release's own ``spm.model``, checked against
    its manifest), or None when no run directory is found."""
    if release_lib.is_release(state_dir):
        manifest = release_lib.read_manifest(state_dir)
        return release_lib.check_file(state_dir, manifest, release_lib.TOKENIZER_FILE)
    directory = os.path.abspath(state_dir)
    for _ in range(4):  # state -> step -> best|checkpoints -> workdir
        directory = os.path.dirname(directory)
        config_path = os.path.join(directory, "config.json")
        if os.path.exists(config_path):
            with open(config_path, encoding="utf-8") as f:
                named = json.load(f).get("data", {}).get("tokenizer", "")
            path = run_tokenizer.resolve(named, directory)  # relative: from the run's directory
            return path if os.path.exists(path) else None
    return None


def _flatten_metadata(tree: Any, prefix: tuple[str, ...] = ()) -> dict[str, Any]:
    if isinstance(tree, Mapping):
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(_flatten_metadata(value, (*prefix, str(key))))
        return out
    return {"/".join(prefix): tree}


def checkpoint_parameters(
    state_dir: str, which: str = "params"
) -> tuple[tuple[str, ...], dict[str, Any]]:
    """From the metadata only (no array read): the key of the parameters in the saved state
    (``("params",)``, ``("ema",)`` or ``()`` for a bare parameter tree) and ``path -> array
    metadata`` (``.shape``, ``.dtype``). ``which``: ``params`` (the trained parameters),
    ``ema`` (their exponential moving average; an error where the state keeps none) or
    ``auto`` (the EMA where kept, as translation reads a run)."""
    if which not in ("params", "ema", "auto"):
        raise ConfigError(f"init_from_params must be params, ema or auto, got {which!r}")
    if release_lib.is_release(state_dir):
        return (), {
            path: jax.ShapeDtypeStruct(array.shape, array.dtype)
            for path, array in release_parameters(state_dir, which).items()
        }
    metadata = ocp.PyTreeCheckpointHandler().metadata(epath.Path(state_dir))
    tree = getattr(metadata, "tree", metadata)
    has_ema = isinstance(tree.get("ema"), Mapping)
    if which == "ema" and not has_ema:
        raise ConfigError(f"init_from_params=ema: {state_dir} keeps no EMA of its parameters")
    key = "ema" if which == "ema" or (which == "auto" and has_ema) else "params"
    prefix: tuple[str, ...] = (key,) if isinstance(tree.get(key), Mapping) else ()
    if prefix:
        tree = tree[key]
    return prefix, _flatten_metadata(tree)


def release_parameters(directory: str, which: str) -> dict[str, np.ndarray]:
    """The flat parameters of the release in ``directory`` (sha256 checked), when
    ``init_from_params`` (``which``) is ``auto`` or the release's own set."""
    manifest = release_lib.read_manifest(directory)
    own = {"raw": "params"}.get(manifest["parameter_set"], manifest["parameter_set"])
    if which not in ("auto", own):
        raise ConfigError(
            f"init_from_params={which}: the release {directory} holds only its {own} "
            "parameters (init_from_params=auto or " + own + ")"
        )
    return release_lib.read_params(directory, manifest)


def read_parameters(
    state_dir: str, prefix: tuple[str, ...], targets: Mapping[str, jax.ShapeDtypeStruct]
) -> dict[str, jax.Array]:
    """The checkpoint arrays at ``targets``' paths (under ``prefix``), each restored with its
    target's dtype and sharding by an Orbax partial restore (nothing else is read); from a
    release directory, its arrays placed on the targets' shardings."""
    if not targets:
        return {}
    if release_lib.is_release(state_dir):
        saved = release_parameters(state_dir, "auto")
        return {
            path: (
                jax.device_put(saved[path].astype(t.dtype), t.sharding)
                if t.sharding is not None
                else saved[path].astype(t.dtype)
            )
            for path, t in targets.items()
        }
    item: dict[str, Any] = {}
    for path, target in targets.items():
        node = item
        keys = (*prefix, *path.split("/"))
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = target
    restored = ocp.PyTreeCheckpointer().restore(
        state_dir,
        args=ocp.args.PyTreeRestore(
            item=item,
            restore_args=ocp.checkpoint_utils.construct_restore_args(item),
            partial_restore=True,
        ),
    )
    for key in prefix:
        restored = restored[key]
    flat = _flatten_metadata(restored)
    return {path: flat[path] for path in targets}


def _sharding(x: Any) -> Any:
    return getattr(x, "sharding", None) if isinstance(x, jax.Array) else None


def init_from_checkpoint(
    config: Any, model: Any, params: PyTree, state_dir: str | None = None
) -> tuple[PyTree, list[Row], str]:
    """``params`` (the model's fresh parameters: host arrays or global arrays with their
    shardings) with every parameter the rules take from ``config.init_from`` replaced, the
    restore table, and the checkpoint's state directory."""
    state_dir = state_dir or checkpoint_dir(config)
    entries = parse_rules(config.get("init_from_rules", ""))
    leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
    paths = [parameter_path(path) for path, _ in leaves]
    values = dict(zip(paths, (x for _, x in leaves), strict=True))
    prefix, saved = checkpoint_parameters(state_dir, config.get("init_from_params", "params"))
    rules = resolve_rules(entries, model, paths, list(saved))
    rows = plan(
        {p: tuple(np.shape(v)) for p, v in values.items()},
        {p: tuple(m.shape) for p, m in saved.items()},
        rules,
        allow_new=bool(config.get("init_from_allow_new", False)),
        ignore_unused=bool(config.get("init_from_ignore_unused", False)),
        where=f"init_from={state_dir}",
    )
    targets: dict[str, jax.ShapeDtypeStruct] = {}
    for row in rows:
        if row.status in (LOADED, RENAMED) and row.source not in targets:
            value = values[row.parameter]
            targets[row.source] = jax.ShapeDtypeStruct(
                row.shape, value.dtype, sharding=_sharding(value)
            )
    arrays = read_parameters(state_dir, prefix, targets)
    for row in rows:
        if row.status in (LOADED, RENAMED):
            value, array = values[row.parameter], arrays[row.source]
            if array.dtype != value.dtype:
                array = array.astype(value.dtype)
            sharding = _sharding(value)
            values[row.parameter] = (
                jax.device_put(array, sharding) if sharding is not None else np.asarray(array)
            )
    new = jax.tree_util.tree_unflatten(treedef, [values[p] for p in paths])
    return new, rows, state_dir


# ----------------------------------------------------------------------------------- table


def format_table(rows: Sequence[Row]) -> str:
    """The table as aligned text (one line per row, a header first)."""
    cells = [list(TABLE_COLUMNS)] + [_cells_of(row) for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(TABLE_COLUMNS))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in cells
    )


def _cells_of(row: Row) -> list[str]:
    def dims(shape: Shape | None) -> str:
        return "-" if shape is None else "x".join(map(str, shape)) or "scalar"

    return [
        row.parameter or "-",
        row.source or "-",
        row.status,
        dims(row.shape),
        dims(row.checkpoint_shape),
    ]


def write_table(path: str, rows: Sequence[Row]) -> None:
    """The table as TSV with a header (:data:`TABLE_COLUMNS`), via a temporary file."""
    with atomic_open(path) as f:
        f.write("\t".join(TABLE_COLUMNS) + "\n")
        for row in rows:
            f.write("\t".join(_cells_of(row)) + "\n")


def summary(rows: Sequence[Row]) -> str:
    """``N loaded, N renamed, N fresh, N unused``."""
    counts = {s: sum(row.status == s for row in rows) for s in (LOADED, RENAMED, FRESH, UNUSED)}
    return ", ".join(f"{n} {status}" for status, n in counts.items())
