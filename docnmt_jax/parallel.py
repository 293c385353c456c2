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
(:func:`check_process_rows`).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import math
import os
import re
import secrets
import selectors
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NoReturn

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


# ``jax.distributed`` timeouts, in seconds, sized for a loaded machine (JAX's defaults: 300 to
# connect, 100 without a heartbeat, 300 at the shutdown barrier). At exit every process waits
# at the coordination service's shutdown barrier, and the barrier fails when the last process
# arrives more than the shutdown timeout after the first: the service then reports an error to
# every process and each aborts (SIGABRT, "Shutdown barrier has failed ... # of tasks that
# reached the barrier: 1/2"), even a straggler that is still working correctly. After the last
# collective each process finishes its own work unsynchronised (logs and TensorBoard, result
# files, freeing the input pipeline, then the interpreter's teardown before JAX's atexit
# handler), and on a busy 2-core machine one process can stall for tens of seconds at a time.
# :func:`shutdown_distributed` makes the arrivals simultaneous; these timeouts give the rest
# of the run the same slack. A process that dies is found at once by the lifelines
# (:class:`_Lifelines`), one that goes silent (a lost machine) by its missing heartbeats.
INIT_TIMEOUT_S = 600
HEARTBEAT_TIMEOUT_S = 300
SHUTDOWN_TIMEOUT_S = 900

# Multi-process failure (BUILD_NOTES "Multi-process failure"). What JAX 0.10
# does when a process of the job dies: the others' next collective fails at once (gloo: a
# Python exception, "Connection reset by peer"); the coordination service declares the process
# dead after the heartbeat timeout and every other process then aborts in C++ (LOG(FATAL),
# SIGABRT: "Terminating process because the JAX distributed service detected fatal errors");
# when process 0, which hosts the service, dies, the others abort at once the same way. The
# abort cannot be caught, and the client's ``missed_heartbeat_callback`` cannot be a Python
# function (jaxlib has no conversion of its status argument: std::bad_cast, terminate). So:
# * every pair of processes holds a TCP connection (a lifeline) watched by a daemon thread; a
#   process that ends by any means but :func:`shutdown_distributed` or an orderly exit closes
#   its lifelines, and each other process prints one line naming it and exits 1 at once;
# * an uncaught exception ends a multi-process program at once (status 1, after its traceback,
#   or after the one line when a collective failed because a process left), instead of at
#   JAX's exit-time shutdown barrier, which waits for the lost process up to the heartbeat
#   timeout and then aborts; the other processes see its lifelines close.
_LIFELINE_KEY = "docnmt_jax/lifeline/"
_fail_lock = threading.Lock()
_lifelines: _Lifelines | None = None
_resume_hint: Callable[[], str] | None = None


def _prog() -> str:
    return os.path.basename(sys.argv[0]) or "python"


def fail_job(reason: str) -> NoReturn:
    """Ends this process at once (status 1) with one line on stderr: ``PROG: error: REASON;
    the job cannot continue; HINT`` (the hint from :func:`init_distributed`'s ``resume_hint``).

    Safe from any thread and from several at once (one line is written). ``os._exit`` skips
    JAX's exit-time shutdown barrier, which would wait for a lost process and then abort.
    """
    with _fail_lock:
        message = f"{_prog()}: error: {reason}; the job cannot continue"
        if _resume_hint is not None:
            try:
                message += f"; {_resume_hint()}"
            except Exception as e:  # noqa: BLE001 - the line must still be written
                message += f" (no resume hint: {type(e).__name__}: {e})"
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        # One write system call on a fresh line (tqdm's bar may be mid-line on stderr).
        os.write(2, f"\n{message}\n".encode(errors="replace"))
        os._exit(1)


def _route_address(coordinator_address: str) -> tuple[socket.AddressFamily, str]:
    """This host's address on the route to the coordinator (peers on other hosts reach it)."""
    host, _, port = coordinator_address.rpartition(":")
    info = socket.getaddrinfo(host.strip("[]"), int(port), type=socket.SOCK_DGRAM)[0]
    with socket.socket(info[0], socket.SOCK_DGRAM) as probe:
        probe.connect(info[4])  # UDP: chooses the route, sends nothing
        return info[0], probe.getsockname()[0]


def _warn(what: str) -> None:
    print(
        f"{_prog()}: warning: {what}; a process's death is then found by a failed collective "
        "or JAX's heartbeats (--heartbeat_timeout) only",
        file=sys.stderr,
    )


class _Lifelines:
    """A TCP connection between this process and every other one, and a daemon thread that
    ends this process (:func:`fail_job`) when one closes, unless :meth:`stop` came first.

    The kernel closes a process's sockets however it ends (SIGKILL included), so a death is
    seen at once; a lost machine or network is left to JAX's heartbeats. Process ``i`` listens
    on an ephemeral port published in the coordination service's key-value store with a random
    token; every process connects to each lower-numbered one and sends ``"i token"``.
    """

    def __init__(self, client: Any, index: int, count: int, coordinator: str, timeout_s: int):
        self.index, self.count = index, count
        self.stopped = threading.Event()
        self.selector = selectors.DefaultSelector()
        self.peers: dict[socket.socket, int] = {}
        self.token = secrets.token_hex(16)
        self.listener: socket.socket | None = None
        address = None  # published either way, so that no process waits for a missing one
        try:
            family, host = _route_address(coordinator)
            self.listener = socket.create_server((host, 0), family=family, backlog=count)
            self.selector.register(self.listener, selectors.EVENT_READ)
            address = [host, self.listener.getsockname()[1], self.token]
        except (OSError, ValueError) as e:
            _warn(f"no lifelines to process {index} ({type(e).__name__}: {e})")
        client.key_value_set(_LIFELINE_KEY + str(index), json.dumps(address))
        for peer in range(index):
            value = client.blocking_key_value_get(_LIFELINE_KEY + str(peer), timeout_s * 1000)
            if (address := json.loads(value)) is None:
                continue  # that process could not listen (it said so)
            host, port, token = address
            try:
                sock = socket.create_connection((host, port), timeout=min(timeout_s, 60))
                sock.sendall(f"{index} {token}\n".encode())
            except OSError as e:
                _warn(f"no lifeline to process {peer} at {host}:{port} ({e})")
                continue
            self._watch(sock, peer)
        threading.Thread(target=self._run, name="docnmt-lifelines", daemon=True).start()

    def _watch(self, sock: socket.socket, peer: int) -> None:
        sock.settimeout(None)
        self.peers[sock] = peer
        self.selector.register(sock, selectors.EVENT_READ)

    def _accept(self) -> None:
        try:
            sock, _ = self.listener.accept()
        except OSError:
            return  # e.g. out of file descriptors: that peer's death is left to JAX
        try:
            sock.settimeout(10)
            peer, token = sock.recv(256).decode().split()
            if token != self.token or not self.index < int(peer) < self.count:
                raise ValueError("not a process of this job")
        except (OSError, ValueError):
            sock.close()  # a stray connection: ignored
            return
        self._watch(sock, int(peer))

    def _run(self) -> None:
        while not self.stopped.is_set():
            for key, _ in self.selector.select():
                if key.fileobj is self.listener:
                    self._accept()
                    continue
                sock = key.fileobj
                try:
                    if sock.recv(64):
                        continue  # nothing is sent after the hello; ignore
                except OSError:
                    pass  # reset by the kernel of a killed process: closed
                if self.stopped.is_set():
                    return
                fail_job(
                    f"process {self.peers[sock]} of {self.count} ended unexpectedly (killed, "
                    "crashed or exited with an error: its connection to this process closed)"
                )

    def stop(self) -> None:
        """From now on a closing lifeline is an orderly exit (call before JAX's shutdown)."""
        self.stopped.set()


def _stop_watching() -> None:
    if _lifelines is not None:
        _lifelines.stop()


# A collective whose peer process has gone (gloo over TCP on CPU).
_LOST_PEER_ERROR = re.compile(r"Gloo|Connection reset|closed by peer|Broken pipe", re.IGNORECASE)
_previous_excepthook = sys.excepthook


def _excepthook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
    """Ends a multi-process program at once on an uncaught exception (see above)."""
    if _lifelines is None or _lifelines.stopped.is_set():
        _previous_excepthook(kind, value, tb)
        return
    text = " ".join(str(value).split())
    if _LOST_PEER_ERROR.search(text):
        # A collective failed because a process left: its lifeline names it within moments
        # (the watchdog then ends this process); otherwise say what failed.
        time.sleep(5)
        fail_job(f"a collective failed: another process is gone or not responding ({text})")
    _previous_excepthook(kind, value, tb)
    fail_job(f"process {_lifelines.index} of {_lifelines.count} failed (the error above)")


def init_distributed(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    auto: bool = False,
    initialization_timeout: int = INIT_TIMEOUT_S,
    heartbeat_timeout_seconds: int = HEARTBEAT_TIMEOUT_S,
    shutdown_timeout_seconds: int = SHUTDOWN_TIMEOUT_S,
    resume_hint: Callable[[], str] | None = None,
) -> None:
    """``jax.distributed.initialize`` from explicit values (or JAX's ``JAX_COORDINATOR_ADDRESS``
    environment), or with ``auto`` from the cluster (TPU pod, SLURM, Open MPI, Kubernetes).

    A no-op when none is given and ``auto`` is False (single-process training). The timeouts
    default to values sized for loaded machines (see :data:`SHUTDOWN_TIMEOUT_S`); a process
    silent for ``heartbeat_timeout_seconds`` is declared dead by JAX (every other process
    aborts). With several processes, a process that dies ends the others at once with one line
    (:class:`_Lifelines`, :func:`fail_job`; ``resume_hint()`` is appended, e.g. which
    checkpoint a rerun resumes from), and an uncaught exception ends the program at once
    (:func:`_excepthook`). End the program with :func:`shutdown_distributed`.
    """
    global _lifelines, _resume_hint, _previous_excepthook
    if not auto and coordinator_address is None and num_processes is None and process_id is None:
        return
    jax.distributed.initialize(
        coordinator_address=coordinator_address,
        num_processes=num_processes,
        process_id=process_id,
        initialization_timeout=initialization_timeout,
        heartbeat_timeout_seconds=heartbeat_timeout_seconds,
        shutdown_timeout_seconds=shutdown_timeout_seconds,
    )
    from jax._src import distributed  # the client and the resolved address, id and count

    state = distributed.global_state
    if state.num_processes < 2:
        return
    _resume_hint = resume_hint
    _lifelines = _Lifelines(
        state.client,
        state.process_id,
        state.num_processes,
        state.coordinator_address,
        initialization_timeout,
    )
    _previous_excepthook, sys.excepthook = sys.excepthook, _excepthook
    # atexit runs handlers last-registered first: this one before JAX's shutdown (registered
    # when jax was imported), so every process has stopped watching before any process leaves.
    atexit.register(_stop_watching)


def shutdown_distributed(timeout_s: int = SHUTDOWN_TIMEOUT_S) -> None:
    """Ends a multi-process program in step; call it on every process after its last work.

    Each process waits at a barrier of the coordination service until every process has
    finished its own work (up to ``timeout_s``; a straggler beyond it raises here, with the
    barrier's message, instead of aborting in the exit handler), then all leave
    ``jax.distributed`` together, so its shutdown barrier sees them arrive at once. Without
    this, JAX shuts down in its ``atexit`` handler, after each process's unsynchronised
    teardown. A no-op without ``jax.distributed``.
    """
    if not jax.distributed.is_initialized():
        return
    from jax._src import distributed  # the client's barrier (Orbax's barriers use it too)

    distributed.global_state.client.wait_at_barrier("docnmt_jax:end", timeout_s * 1000)
    _stop_watching()  # every process is past its work: lifelines may close from now on
    jax.distributed.shutdown()
