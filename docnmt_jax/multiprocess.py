"""Multi-process jobs: ``jax.distributed`` set-up and shutdown, and ending the job as one.

:func:`init_distributed` joins the job (explicit coordinator, process count and id, JAX's
environment, or the cluster's) with timeouts sized for loaded machines; with several processes
every pair holds a TCP lifeline, so a process that dies ends the others at once with one line
(:func:`fail_job`) instead of leaving them to JAX's heartbeat timeout and an uncatchable abort.
:func:`shutdown_distributed` makes every process leave together. The device mesh every process
builds is :mod:`docnmt_jax.parallel`'s.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import secrets
import selectors
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, NoReturn

import jax

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

# Multi-process failure (docs/log/2026-11-25-reliability.md). What JAX 0.10
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
