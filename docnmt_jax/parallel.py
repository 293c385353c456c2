"""Device mesh, logical-axis rules and shardings: how train/eval/decode steps use many devices.

The mesh has three axes (``config.mesh``): ``data`` (pure data parallelism), ``fsdp`` (data
parallelism that also shards parameters and optimiser state, ZeRO-3 style) and ``model``
(Megatron-style tensor parallelism over heads, feed-forward units and the vocabulary). The
models name every parameter and activation dimension with a logical axis
(:mod:`docnmt_jax.models.layers`); :data:`LOGICAL_RULES` maps those names onto mesh axes.
Flax applies the rules in order and never uses a mesh axis twice in one array, so activations
``(batch, length, embed)`` are sharded on ``batch`` only (``fsdp`` is taken by ``batch``),
while parameters ``(vocab, embed)`` are sharded on ``model`` x ``fsdp``. A dimension that its
mesh axes do not divide (e.g. 2 heads on ``model=4``) is replicated instead. Activation
constraints take effect inside :meth:`Layout.activate` (abstract mesh + rules).

Multi-host: every process builds the same global mesh over all devices and feeds the rows of
the global batch that its own devices hold (:func:`global_batch`), which is the pipeline's
contiguous per-process slice as long as ``data x fsdp`` is a multiple of the process count
(:func:`check_process_rows`). Joining the job and ending it together is
:mod:`docnmt_jax.multiprocess`'s.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator, Mapping
from typing import Any

import flax.linen as nn
import jax
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

PyTree = Any
Rules = tuple[tuple[str, Any], ...]

MESH_AXES = ("data", "fsdp", "model")
BATCH_AXES = ("data", "fsdp")

# Logical axis -> mesh axes, by priority. Every logical name the models use appears here.
LOGICAL_RULES: Rules = (
    ("batch", BATCH_AXES),  # examples (rows of a batch): split over all data-parallel devices
    ("vocab", "model"),  # embedding rows / output logits: tensor parallel
    ("heads", "model"),  # attention heads: tensor parallel (Megatron)
    ("mlp", "model"),  # feed-forward hidden units: tensor parallel (Megatron)
    ("embed", "fsdp"),  # model dimension of parameters: FSDP (activations: taken by batch)
    ("kv", None),  # per-head dimension: never split
    ("length", None),  # sequence positions: never split
    ("relpos", None),  # relative-distance tables: small, replicated
    ("segments", None),  # segment-embedding table rows: small, replicated
)


def mesh_shape(mesh_cfg: Mapping[str, int], num_devices: int) -> tuple[int, int, int]:
    """``(data, fsdp, model)`` sizes with at most one ``-1`` ("the rest") resolved."""
    sizes = [int(mesh_cfg.get(axis, 1)) for axis in MESH_AXES]
    if sizes.count(-1) > 1 or any(s == 0 or s < -1 for s in sizes):
        raise ValueError(f"config.mesh: sizes must be >= 1 with at most one -1, got {sizes}")
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if num_devices % known:
            raise ValueError(f"config.mesh {sizes}: {num_devices} devices not divisible by {known}")
        sizes[sizes.index(-1)] = num_devices // known
    if math.prod(sizes) != num_devices:
        raise ValueError(
            f"config.mesh {sizes} needs {math.prod(sizes)} devices, have {num_devices}"
        )
    return tuple(sizes)  # type: ignore[return-value]


def make_mesh(mesh_cfg: Mapping[str, int], devices: list[Any] | None = None) -> Mesh:
    """The ``(data, fsdp, model)`` mesh over ``devices`` (default: every device of the job)."""
    devices = list(devices if devices is not None else jax.devices())
    shape = mesh_shape(mesh_cfg, len(devices))
    auto = (jax.sharding.AxisType.Auto,) * len(MESH_AXES)
    return jax.make_mesh(shape, MESH_AXES, axis_types=auto, devices=devices)


def _fit(spec: P, shape: tuple[int, ...], mesh: Mesh) -> P:
    """``spec`` without the mesh axes of any dimension they do not divide (it is replicated)."""
    out = []
    for dim, axes in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec)), strict=True):
        names = (axes,) if isinstance(axes, str) else tuple(axes or ())
        out.append(axes if dim % math.prod(mesh.shape[a] for a in names) == 0 else None)
    return P(*out)


@dataclasses.dataclass(frozen=True)
class Layout:
    """A mesh with its logical rules: the shardings of batches, parameters and state."""

    mesh: Mesh
    rules: Rules = LOGICAL_RULES

    @property
    def batch_shards(self) -> int:
        """How many ways batch rows are split: ``data x fsdp``."""
        return math.prod(self.mesh.shape[a] for a in BATCH_AXES)

    @property
    def batch(self) -> NamedSharding:
        """Leading (row) dimension split over ``data x fsdp``, the rest replicated."""
        return NamedSharding(self.mesh, P(BATCH_AXES))

    @property
    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, P())

    @contextlib.contextmanager
    def activate(self) -> Iterator[None]:
        """Makes ``layers.constrain`` effective; usable inside a jitted function."""
        with jax.sharding.use_abstract_mesh(self.mesh.abstract_mesh):
            with nn.logical_axis_rules(self.rules):
                yield

    def param_shardings(self, boxed: PyTree) -> PyTree:
        """Shardings of (abstract) parameters boxed with logical names (``task.init`` output);
        parameters without names are replicated."""

        def sharding(x: Any) -> NamedSharding:
            boxed = isinstance(x, nn.Partitioned)
            spec = nn.logical_to_mesh_axes(x.names if boxed else (), self.rules)
            shape = x.value.shape if boxed else x.shape
            return NamedSharding(self.mesh, _fit(spec, shape, self.mesh))

        return jax.tree_util.tree_map(
            sharding, boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned)
        )

    def opt_state_shardings(
        self, tx: optax.GradientTransformation, opt_state: PyTree, params: PyTree
    ) -> PyTree:
        """Optimiser-state shardings: a leaf whose key path ends with a parameter's path (Adam's
        ``mu``/``nu`` mirror the parameter tree) follows that parameter's sharding; the rest
        (step counts) is replicated. Matching by path, not by ``optax.tree_map_params``, also
        covers states of partly frozen parameters (``optax.multi_transform``), whose masked
        entries are empty ``MaskedNode``s."""
        del tx  # the state's own structure says where the parameters are
        by_path = {
            key_names(path): sharding
            for path, sharding in jax.tree_util.tree_flatten_with_path(params)[0]
        }

        def sharding(path: tuple[Any, ...], leaf: Any) -> NamedSharding:
            keys = key_names(path)
            for start in range(len(keys)):  # the longest suffix that is a parameter path
                if keys[start:] in by_path:
                    return by_path[keys[start:]]
            return self.replicated

        return jax.tree_util.tree_map_with_path(
            sharding, opt_state, is_leaf=lambda x: isinstance(x, jax.ShapeDtypeStruct)
        )


def key_names(path: tuple[Any, ...]) -> tuple[str, ...]:
    """The names along a pytree key path (dict keys, attribute names, sequence indices)."""
    names = []
    for key in path:
        for attr in ("key", "name", "idx"):
            if hasattr(key, attr):
                names.append(str(getattr(key, attr)))
                break
    return tuple(names)


def abstract(tree: PyTree, shardings: PyTree) -> PyTree:
    """``jax.ShapeDtypeStruct`` leaves of ``tree`` carrying ``shardings`` (restore targets)."""
    return jax.tree_util.tree_map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings
    )


def global_batch(batch: Mapping[str, np.ndarray], sharding: NamedSharding) -> dict[str, jax.Array]:
    """The global batch from this process's rows (the pipeline's per-process slice)."""
    return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in batch.items()}


def replicated_batch(batch: Mapping[str, np.ndarray], sharding: NamedSharding) -> dict:
    """A global batch from a batch every process holds whole (e.g. translation)."""
    return {
        k: jax.make_array_from_callback(v.shape, sharding, lambda index, v=v: v[index])
        for k, v in batch.items()
    }


def check_process_rows(layout: Layout) -> None:
    """Raises unless process ``i`` of ``P`` holds rows ``[i*B/P, (i+1)*B/P)`` of a batch,
    the slice the data pipeline gives it."""
    count, index = jax.process_count(), jax.process_index()
    if count == 1:
        return
    if layout.batch_shards % count:
        raise ValueError(
            f"mesh {dict(layout.mesh.shape)}: data x fsdp = {layout.batch_shards} must be a "
            f"multiple of the {count} processes (each process feeds its own batch rows)"
        )
    rows = layout.batch_shards
    held = layout.batch.addressable_devices_indices_map((rows,)).values()
    starts = sorted({idx[0].start or 0 for idx in held})
    expected = list(range(index * rows // count, (index + 1) * rows // count))
    if starts != expected:
        raise ValueError(
            f"process {index} holds batch rows {starts} of {rows}, not the contiguous slice "
            f"{expected} its pipeline reads; order the mesh devices by process"
        )
