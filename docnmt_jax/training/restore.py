"""Loading a finished or running training run for translation and evaluation.

A workdir holds ``config.json``, ``spm.model`` (older runs: unless ``config.data.tokenizer``
names one elsewhere, :mod:`~docnmt_jax.training.run_tokenizer`),
``checkpoints/<step>`` and ``best/<step>``; :func:`load_translator` rebuilds the model from the
config and restores only its parameters from the chosen checkpoint (onto a device mesh if
asked: the Translator then searches there).

Every function here that takes a workdir also takes a release directory
(``launch/export.py``, :mod:`docnmt_jax.export.release`): its ``config.json``, always its own
``spm.model``, and its one parameter set, so a ``--checkpoint`` other than the default
(:data:`DEFAULT_CHECKPOINT`) or a ``--params`` other than ``auto`` or the release's own set is
a one-line error.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import ml_collections
import numpy as np
from flax import traverse_util

from docnmt_jax import parallel
from docnmt_jax.data.schema import dummy_batch
from docnmt_jax.data.tokenizer import Tokenizer, load_tokenizer
from docnmt_jax.decoding.search import SearchConfig
from docnmt_jax.decoding.translator import MAX_SOURCE_TOKENS, Translator
from docnmt_jax.errors import RunNotFoundError, UserError, VocabularyMismatchError
from docnmt_jax.export import release
from docnmt_jax.models import Model, build_model
from docnmt_jax.training import checkpoints, run_tokenizer

#: The ``--checkpoint`` of translate.py, evaluate.py and analyze.py when none is given: the
#: only one a release directory accepts.
DEFAULT_CHECKPOINT = "best"


def load_config(workdir: str) -> ml_collections.ConfigDict:
    """The ``config.json`` of a workdir or a release directory (checked against the
    release's manifest)."""
    path = os.path.join(workdir, "config.json")
    if release.is_release(workdir):
        path = release.check_file(workdir, release.read_manifest(workdir), release.CONFIG_FILE)
    if not os.path.exists(path):
        raise RunNotFoundError(
            f"{path} not found: is {workdir} a training workdir or a release directory?"
        )
    with open(path, encoding="utf-8") as f:
        return ml_collections.ConfigDict(json.load(f))


def load_run_tokenizer(config: ml_collections.ConfigDict, workdir: str) -> Tokenizer:
    """The run's tokenizer: ``config.data.tokenizer`` or the workdir's ``spm.model``, a
    relative path found from the workdir, whatever the current directory
    (:func:`~docnmt_jax.training.run_tokenizer.resolve`); a release directory's own
    ``spm.model`` (its hash checked) whatever the config says."""
    if release.is_release(workdir):
        manifest = release.read_manifest(workdir)
        return load_tokenizer(release.check_file(workdir, manifest, release.TOKENIZER_FILE))
    return load_tokenizer(run_tokenizer.resolve(config.data.tokenizer, workdir))


def checkpoint_step_dir(workdir: str, which: str) -> tuple[str, int]:
    """The step directory of ``best``, ``latest``, ``averaged`` (``launch/average_checkpoints.py``)
    or a step number, and that step."""

    def steps(sub: str) -> list[int]:
        path = os.path.join(workdir, sub)
        return (
            sorted(int(d) for d in os.listdir(path) if d.isdigit()) if os.path.isdir(path) else []
        )

    if which == "averaged":
        if not steps("averaged"):
            raise RunNotFoundError(
                f"{workdir}: no averaged checkpoint; make one with `python "
                f"launch/average_checkpoints.py --workdir {workdir} --last N`"
            )
        return os.path.join(workdir, "averaged", str(steps("averaged")[-1])), steps("averaged")[-1]
    if which == "best" and steps("best"):
        return os.path.join(workdir, "best", str(steps("best")[-1])), steps("best")[-1]
    if which in ("best", "latest"):
        if not steps("checkpoints"):
            raise RunNotFoundError(f"{workdir}: no checkpoint in checkpoints/ or best/")
        return os.path.join(workdir, "checkpoints", str(steps("checkpoints")[-1])), steps(
            "checkpoints"
        )[-1]
    if not which.isdigit():
        raise UserError(
            f"--checkpoint must be best, latest, averaged or a step number, got {which!r}"
        )
    for sub in ("checkpoints", "best"):
        if int(which) in steps(sub):
            return os.path.join(workdir, sub, which), int(which)
    raise RunNotFoundError(
        f"{workdir}: no checkpoint at step {which}; available: {steps('checkpoints')} "
        f"(latest), {steps('best')} (best)"
    )


def load_model(workdir: str, dtype: str = "") -> tuple[Model, Tokenizer, ml_collections.ConfigDict]:
    """The model of the run in ``workdir`` (from its ``config.json``), its tokenizer and
    config; ``dtype`` (e.g. ``bfloat16``) replaces the run's ``model.dtype`` ('' keeps it)."""
    config = load_config(workdir)
    if dtype:
        config.model.dtype = dtype
    tokenizer = load_run_tokenizer(config, workdir)
    return build_model(config.model, tokenizer.vocab_size), tokenizer, config


#: Which parameter set of a checkpoint to use: ``auto`` (the EMA when the run keeps one),
#: ``ema`` or ``raw`` (the optimiser's own parameters).
PARAM_SETS = ("auto", "ema", "raw")


def parameter_tree(step_dir: str, params: str) -> str:
    """The saved tree (``params`` or ``ema``) that ``params`` (:data:`PARAM_SETS`) picks in
    ``step_dir``; ``ema`` where the checkpoint has none is a one-line error."""
    if params not in PARAM_SETS:
        raise UserError(f"--params must be one of {', '.join(PARAM_SETS)}, got {params!r}")
    if params == "raw":
        return "params"
    has_ema = "ema" in checkpoints.saved_trees(os.path.join(step_dir, "state"))
    if params == "ema" and not has_ema:
        raise UserError(f"{step_dir}: --params ema, but the run kept no EMA (train.ema_decay=0)")
    return "ema" if has_ema else "params"


def release_manifest(directory: str, which: str, params: str) -> dict[str, Any]:
    """The manifest of the release in ``directory``, once ``which`` (``--checkpoint``) and
    ``params`` (``--params``) are known to fit its one parameter set: ``which`` must be
    :data:`DEFAULT_CHECKPOINT`, ``params`` ``auto`` or the release's set."""
    if params not in PARAM_SETS:
        raise UserError(f"--params must be one of {', '.join(PARAM_SETS)}, got {params!r}")
    manifest = release.read_manifest(directory)
    held = f"{manifest['parameter_set']} parameters of step {manifest['source_step']}"
    if str(which) != DEFAULT_CHECKPOINT:
        raise UserError(
            f"{directory} is a release holding one parameter set ({held}): --checkpoint "
            f"{which} does not apply (leave it at {DEFAULT_CHECKPOINT})"
        )
    if params not in ("auto", manifest["parameter_set"]):
        raise UserError(
            f"{directory} is a release holding one parameter set ({held}): --params {params} "
            "does not apply"
        )
    return manifest


def selected_parameters(workdir: str, which: str, params: str) -> tuple[int, str]:
    """The step and the parameter set (``ema`` or ``raw``) that ``which`` and ``params``
    (:data:`PARAM_SETS`) pick in a workdir or a release directory."""
    if release.is_release(workdir):
        manifest = release_manifest(workdir, which, params)
        return manifest["source_step"], manifest["parameter_set"]
    step_dir, step = checkpoint_step_dir(workdir, which)
    return step, "raw" if parameter_tree(step_dir, params) == "params" else "ema"


def fit_release_params(
    model: Model, saved: Mapping[str, np.ndarray], directory: str, tokenizer_path: str | None
) -> Any:
    """The parameter tree of ``model`` from a release's flat parameters ``saved``
    (:func:`~docnmt_jax.export.release.read_params`): every parameter present, no other, each
    of the model's shape (else a one-line error) and dtype."""
    boxed = jax.eval_shape(model.init, jax.random.PRNGKey(0), dummy_batch())["params"]
    template = traverse_util.flatten_dict(nn.meta.unbox(boxed), sep="/")
    where = os.path.join(directory, release.PARAMS_FILE)
    missing, unexpected = sorted(set(template) - set(saved)), sorted(set(saved) - set(template))
    if missing or unexpected:
        raise UserError(
            f"{where} does not fit the model of its config.json: missing {missing[:3]}, "
            f"unexpected {unexpected[:3]}"
        )
    mismatched = [
        f"{k}: release {saved[k].shape} vs model {tuple(v.shape)}"
        for k, v in template.items()
        if saved[k].shape != tuple(v.shape)
    ]
    if mismatched:
        raise VocabularyMismatchError(
            f"{tokenizer_path or 'the tokenizer'} does not fit {where}: {'; '.join(mismatched)}"
        )
    return release.unflatten_params(
        {k: np.asarray(saved[k], dtype=v.dtype) for k, v in template.items()}
    )


def load_params(
    model: Model,
    workdir: str,
    which: str,
    tokenizer_path: str | None = None,
    params: str = "auto",
) -> tuple[Any, int]:
    """Parameters of ``model`` restored from ``which`` checkpoint of ``workdir``, and its step;
    ``params`` picks the EMA or the raw parameters (:data:`PARAM_SETS`). A release directory
    gives its one parameter set and the step it came from (:func:`release_manifest`).

    ``model`` is built from the run's own config, so a parameter whose shape differs from the
    checkpoint's can only come from the vocabulary: a :class:`VocabularyMismatchError` names
    ``tokenizer_path`` and the shapes."""
    if release.is_release(workdir):
        manifest = release_manifest(workdir, which, params)
        release.verify_release(workdir, manifest, skip=(release.PARAMS_FILE,))
        saved = release.read_params(workdir, manifest)
        return fit_release_params(model, saved, workdir, tokenizer_path), manifest["source_step"]
    template = nn.meta.unbox(model.init(jax.random.PRNGKey(0), dummy_batch())["params"])
    step_dir, step = checkpoint_step_dir(workdir, which)
    tree = parameter_tree(step_dir, params)
    try:
        params, _ = checkpoints.init_params_from(step_dir, template, tree=tree)
    except checkpoints.ParamShapeError as e:
        raise VocabularyMismatchError(
            f"{tokenizer_path or 'the tokenizer'} does not fit checkpoint {step_dir} (was the "
            f"tokenizer replaced after training?): {e.mismatched}"
        ) from None
    return jax.tree_util.tree_map(np.asarray, params), step


def load_translator(
    workdir: str,
    which: str,
    search: SearchConfig,
    batch_tokens: int = 4096,
    mesh: Mapping[str, int] | None = None,
    max_source_tokens: int | None = MAX_SOURCE_TOKENS,
    params: str = "auto",
    dtype: str = "",
) -> tuple[Translator, int]:
    """A :class:`Translator` for the run in ``workdir`` and the checkpoint step it uses; with
    ``mesh`` (``config.mesh``-style sizes) it searches on that device mesh; ``params`` picks
    the EMA or the raw parameters (:data:`PARAM_SETS`); ``dtype`` the computation's dtype
    ('': the run's ``model.dtype``; parameters stay float32)."""
    model, tokenizer, config = load_model(workdir, dtype)
    params, step = load_params(model, workdir, which, tokenizer.model_path, params)
    layout = None
    if mesh is not None:
        layout = parallel.Layout(parallel.make_mesh(mesh))
        boxed = jax.eval_shape(model.init, jax.random.PRNGKey(0), dummy_batch())["params"]
        params = jax.device_put(params, layout.param_shardings(boxed))
    translator = Translator(
        model,
        params,
        tokenizer,
        search,
        batch_tokens=batch_tokens,
        max_sentences=config.data.max_sentences,
        mesh=layout,
        max_source_tokens=max_source_tokens,
    )
    return translator, step
