"""``jax.export`` of the sentence Transformer's encoder and decoder step, for greedy search
outside this library (``launch/export.py --stablehlo``; docs/export.md).

Two functions are exported with ``jax.export.export(jax.jit(fn))`` and serialized
(``Exported.serialize()``), each also as a portable StableHLO bytecode module:

* ``encode(params, src [b, t] int32, src_mask [b, t] int32) -> extra``: the encoder and the
  decoder's per-example inputs (:meth:`~docnmt_jax.models.transformer.Transformer.
  decode_inputs`: the source mask and every decoder layer's cross-attention keys/values);
* ``decode_step(params, cache, tokens [b] int32, extra) -> (logits [b, V] float32, cache)``:
  one position of :meth:`~docnmt_jax.models.transformer.Transformer.decode_step` at
  ``cache``'s index.

``params``, ``cache`` and ``extra`` are flat lists of arrays in the order ``model.json``
names them. The parameters are inputs, not constants baked into the modules: both functions
read the release's one ``params.npz`` (no copy of the weights per function, and the modules
stay a few tens of KB whatever the model's size). Shapes are symbolic
(``jax.export.symbolic_shape``): ``b`` rows, ``t`` source positions, ``l`` cache positions
(the output limit), so one artifact serves every batch and length. ``model.json`` holds what
a driver needs: the files, every input's and output's shape (symbolic dims by name), the
cache's initial value (zeros, index 0), the special ids, the tokens never generated and the
output limit. :mod:`docnmt_jax.export.greedy` is such a driver.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import export

from docnmt_jax.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from docnmt_jax.decoding.search import SearchConfig
from docnmt_jax.errors import ModelError
from docnmt_jax.export import greedy, release

FORMAT = greedy.FORMAT
FORMAT_VERSION = greedy.FORMAT_VERSION
SPEC_FILE = greedy.SPEC_FILE
#: Platforms the modules are lowered for (one artifact runs on any of them).
DEFAULT_PLATFORMS = ("cpu", "cuda")
#: Two sets of sizes the shapes are traced at, to tell which axes are which symbolic dim.
_PROBES = ({"b": 2, "t": 3, "l": 5}, {"b": 7, "t": 11, "l": 13})
_DIMS = {
    "b": "rows of the batch",
    "t": "source positions (padded; src_mask marks the tokens)",
    "l": "cache positions: the longest output limit of the batch",
}
EXPORTABLE_MODELS = ("transformer",)

Tree = Any


def check_exportable(model: Any) -> None:
    """Only the sentence Transformer's search is exported; another model is a one-line error."""
    if getattr(model, "name", "") not in EXPORTABLE_MODELS:
        raise ModelError(
            f"--stablehlo exports the sentence Transformer only ({', '.join(EXPORTABLE_MODELS)}); "
            f"this run's model is {getattr(model, 'name', type(model).__name__)!r}"
        )


def _named_leaves(tree: Tree) -> tuple[list[str], list[Any], Any]:
    """The ``/``-joined key paths of ``tree``'s leaves, the leaves, and its treedef."""
    pairs, treedef = jax.tree_util.tree_flatten_with_path(tree)
    names = ["/".join(str(getattr(k, "key", k)) for k in path) for path, _ in pairs]
    return names, [leaf for _, leaf in pairs], treedef


def _symbolic(shapes: Sequence[tuple[int, ...]]) -> tuple[str | int, ...]:
    """A shape whose axes are named by the probe dim (``b``, ``t``, ``l``) they followed in
    ``shapes`` (one per :data:`_PROBES`), else the fixed size."""
    dims: list[str | int] = []
    for sizes in zip(*shapes, strict=True):
        names = [d for d in _DIMS if all(p[d] == s for p, s in zip(_PROBES, sizes, strict=True))]
        if names:
            dims.append(names[0])
        elif len(set(sizes)) == 1:
            dims.append(int(sizes[0]))
        else:
            raise ValueError(f"an axis of sizes {sizes} follows no symbolic dim")
    return tuple(dims)


def _leaf_specs(fn: Callable[[dict[str, int]], Tree]) -> tuple[list[dict[str, Any]], Any]:
    """``[{name, shape (symbolic), dtype}]`` of the leaves of ``fn(probe)``'s abstract value
    and its treedef, from :data:`_PROBES`."""
    traced = [jax.eval_shape(lambda p=p: fn(p)) for p in _PROBES]
    names, leaves, treedef = _named_leaves(traced[0])
    others = [jax.tree.leaves(t) for t in traced]
    specs = [
        {"name": name, "shape": list(_symbolic([o[i].shape for o in others])), "dtype": x.dtype}
        for i, (name, x) in enumerate(zip(names, leaves, strict=True))
    ]
    specs = [dict(s, dtype=str(s["dtype"])) for s in specs]
    return specs, treedef


class _FlatTransformer:
    """The Transformer's flax methods over flat lists of arrays (the exported interface)."""

    def __init__(self, model: Any, names: list[str]):
        self.module = model.eval_module
        self.names = names

    def variables(self, leaves: Sequence[jax.Array]) -> dict[str, Any]:
        return {"params": release.unflatten_params(dict(zip(self.names, leaves, strict=True)))}

    def extra_tree(self, leaves: Sequence[jax.Array], src: jax.Array, mask: jax.Array) -> Tree:
        variables, module = self.variables(leaves), self.module
        encoded = module.apply(variables, src, mask, method=module.encode)
        return module.apply(variables, encoded, mask, method=module.decode_inputs)

    def cache_tree(self, leaves: Sequence[jax.Array], rows: int, length: int) -> Tree:
        module = self.module
        return module.apply(self.variables(leaves), rows, length, method=module.init_cache)


def _struct(spec: dict[str, Any], dims: dict[str, Any]) -> jax.ShapeDtypeStruct:
    shape = tuple(dims[d] if isinstance(d, str) else d for d in spec["shape"])
    return jax.ShapeDtypeStruct(shape, jnp.dtype(spec["dtype"]))


def _check_zero_cache(flat: _FlatTransformer, leaves: Sequence[jax.Array]) -> None:
    """``model.json`` says the empty cache is zeros (index 0): check that it is."""
    probe = _PROBES[0]
    cache = flat.cache_tree(leaves, probe["b"], probe["l"])
    if any(np.any(np.asarray(x) != 0) for x in jax.tree.leaves(cache)):
        raise ValueError("the model's init_cache is not all zeros; model.json cannot say so")


_IDS_SPEC = {"shape": ["b", "t"], "dtype": "int32"}
_TOKENS_SPEC = {"shape": ["b"], "dtype": "int32"}


def export_functions(
    model: Any, params: Tree, platforms: Sequence[str]
) -> tuple[dict[str, export.Exported], dict[str, Any]]:
    """The exported ``encode`` and ``decode_step`` of ``model`` (module docstring) and their
    interface: the parameter names (the order of the ``params`` list) and the ``extra`` and
    ``cache`` leaves' specs."""
    flat_params = release.flatten_params(params)
    names = sorted(flat_params)
    leaves = [jnp.asarray(flat_params[n]) for n in names]
    flat = _FlatTransformer(model, names)
    _check_zero_cache(flat, leaves)

    def probe_ids(p: dict[str, int]) -> jax.Array:
        return jnp.ones((p["b"], p["t"]), jnp.int32)

    extra_specs, extra_def = _leaf_specs(lambda p: flat.extra_tree(leaves, *[probe_ids(p)] * 2))
    cache_specs, cache_def = _leaf_specs(lambda p: flat.cache_tree(leaves, p["b"], p["l"]))

    def encode(param_leaves: list, src: jax.Array, src_mask: jax.Array) -> list:
        return extra_def.flatten_up_to(flat.extra_tree(param_leaves, src, src_mask))

    def decode_step(param_leaves: list, cache: list, tokens: jax.Array, extra: list) -> tuple:
        module = flat.module
        logits, new_cache = module.apply(
            flat.variables(param_leaves),
            cache_def.unflatten(cache),
            tokens,
            extra_def.unflatten(extra),
            method=module.decode_step,
        )
        return logits, cache_def.flatten_up_to(new_cache)

    dims = dict(zip(_DIMS, export.symbolic_shape(", ".join(_DIMS)), strict=True))
    param_structs = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in leaves]
    src, tokens = _struct(_IDS_SPEC, dims), _struct(_TOKENS_SPEC, dims)
    extra = [_struct(s, dims) for s in extra_specs]
    cache = [_struct(s, dims) for s in cache_specs]
    exported = {
        "encode": export.export(jax.jit(encode), platforms=platforms)(param_structs, src, src),
        "decode_step": export.export(jax.jit(decode_step), platforms=platforms)(
            param_structs, cache, tokens, extra
        ),
    }
    return exported, {"names": names, "extra": extra_specs, "cache": cache_specs}


def export_greedy(
    model: Any,
    params: Tree,
    out_dir: str,
    platforms: Sequence[str] = DEFAULT_PLATFORMS,
    search: SearchConfig | None = None,
    params_file: str = f"../{release.PARAMS_FILE}",
    tokenizer_file: str = f"../{release.TOKENIZER_FILE}",
) -> dict[str, Any]:
    """Exports ``model``'s encoder and decoder step with ``params``' structure into
    ``out_dir`` (module docstring), with a copy of the greedy driver; returns the
    ``model.json`` it writes. ``params_file`` and ``tokenizer_file`` are the release's files,
    relative to ``out_dir``; ``search`` gives the output limit (``max_len``, ``len_a``,
    ``len_b``; default :class:`SearchConfig`'s) the driver applies."""
    check_exportable(model)
    search = search or SearchConfig(beam_size=1, alpha=0.0)
    exported, interface = export_functions(model, params, platforms)
    os.makedirs(out_dir, exist_ok=True)
    files = {}
    for name, exp in exported.items():
        files[name] = {"file": f"{name}.jax_export", "stablehlo": f"{name}.mlirbc"}
        with open(os.path.join(out_dir, files[name]["file"]), "wb") as f:
            f.write(exp.serialize())
        with open(os.path.join(out_dir, files[name]["stablehlo"]), "wb") as f:
            f.write(exp.mlir_module_serialized)
    shutil.copyfile(greedy.__file__, os.path.join(out_dir, "greedy.py"))
    vocab_size = int(exported["decode_step"].out_avals[0].shape[1])
    logits_spec = {"shape": ["b", vocab_size], "dtype": "float32"}
    spec = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "model": model.name,
        "jax_version": jax.__version__,
        "calling_convention_version": exported["encode"].calling_convention_version,
        "platforms": list(platforms),
        "params": {"file": params_file, "names": interface["names"]},
        "tokenizer": tokenizer_file,
        "ids": {"pad": PAD_ID, "eos": EOS_ID, "bos": BOS_ID},
        "never_generated": [PAD_ID, BOS_ID],
        "output_limit": {"max_len": search.max_len, "len_a": search.len_a, "len_b": search.len_b},
        "dims": _DIMS,
        "encode": {
            **files["encode"],
            "inputs": ["params", {"name": "src", **_IDS_SPEC}, {"name": "src_mask", **_IDS_SPEC}],
            "outputs": interface["extra"],
        },
        "decode_step": {
            **files["decode_step"],
            "inputs": ["params", "cache", {"name": "tokens", **_TOKENS_SPEC}, "extra"],
            "outputs": [{"name": "logits", **logits_spec}, "cache"],
            "cache": [dict(s, init=0) for s in interface["cache"]],
        },
    }
    with open(os.path.join(out_dir, SPEC_FILE), "w", encoding="utf-8") as f:
        f.write(json.dumps(spec, indent=2) + "\n")
    return spec
