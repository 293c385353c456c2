"""A process of a multi-process job dies (docs/reliability.md, "Multi-process
jobs"): the others end at once with one line, status 1, and a rerun resumes.

Two processes on 127.0.0.1, one CPU device each, ``--heartbeat_timeout`` 20 s. Without the
lifelines of ``multiprocess.init_distributed`` a survivor waiting at a barrier would wait for the
heartbeat timeout and then abort (SIGABRT); every bound asserted here is below it.

Default suite: ``multiprocess.init_distributed`` alone in a small driver: a process SIGKILLed while
the other waits at the end barrier, an uncaught exception on one process, and an orderly end.
``slow``: ``launch/train.py`` SIGKILLed mid-training, process 1 and then (after a rerun that
resumes) process 0, the coordinator; a last rerun beside a CPU-heavy process resumes and ends
cleanly (both exit 0).
"""

import os
import re
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT
from test_crash_safety import (
    _config,
    _config_file,
    _finished_steps,
    _logged_steps,
    _segments,
    shared_tokenizer,  # noqa: F401 - a fixture used by the slow test
)
from test_sharding import _free_port

HEARTBEAT_S = 20
# JAX's own answer to a SIGKILLed coordinator when it beats the lifeline (a race; see
# docs/log/2026-11-25-reliability.md): an abort with this line.
JAX_ABORT = "Terminating process because the JAX distributed service detected fatal errors"

DRIVER = """
import sys
import time

from docnmt_jax import multiprocess

port, index, action, marker = sys.argv[1:]
multiprocess.init_distributed(
    f"127.0.0.1:{port}", 2, int(index), heartbeat_timeout_seconds=HEARTBEAT_S,
    resume_hint=lambda: "rerun every process",
)
open(marker, "w").close()
if action == "sleep":
    time.sleep(600)
if action == "raise":
    raise RuntimeError("a bug on this process only")
multiprocess.shutdown_distributed()
""".replace("HEARTBEAT_S", str(HEARTBEAT_S))


def _env():
    """One CPU device per process."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    return env


def _popen(command, log):
    with open(log, "wb") as f:
        return subprocess.Popen(command, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=_env())


def _wait_until(procs, condition, what, timeout=600):
    """Polls ``condition()``; fails with every process's output if one ends first."""
    deadline = time.monotonic() + timeout
    while not condition():
        ended = [(proc, log) for proc, log in procs if proc.poll() is not None]
        if ended or time.monotonic() > deadline:
            _stop(procs)
            pytest.fail(f"no {what} after {timeout} s or a process ended first:\n{_tails(procs)}")
        time.sleep(0.05)


def _tails(procs):
    return "\n".join(
        f"--- process {i}: status {proc.poll()}\n{log.read_text(errors='replace')[-3000:]}"
        for i, (proc, log) in enumerate(procs)
    )


def _stop(procs):
    for proc, _ in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def _kill_and_time(procs, victim):
    """SIGKILLs process ``victim``; the other's exit status and seconds until it exited."""
    (survivor, _), (killed, _) = procs[1 - victim], procs[victim]
    killed.send_signal(signal.SIGKILL)
    start = time.monotonic()
    try:
        status = survivor.wait(timeout=HEARTBEAT_S + 120)
    except subprocess.TimeoutExpired:
        _stop(procs)
        pytest.fail(f"the survivor still runs {HEARTBEAT_S + 120} s after the kill")
    elapsed = time.monotonic() - start
    killed.wait()
    return status, elapsed


def _error_lines(text, prog):
    return [line for line in text.splitlines() if line.startswith(f"{prog}: error:")]


# ---------------------------------------------------------------------------------------------
# multiprocess.init_distributed alone (default suite).


def _start_driver(tmp_path, name, actions):
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    port = _free_port()
    procs = []
    for index, action in enumerate(actions):
        marker, log = tmp_path / f"{name}_{index}.up", tmp_path / f"{name}_{index}.log"
        command = [sys.executable, str(driver), str(port), str(index), action, str(marker)]
        procs.append((_popen(command, log), log))
    markers = [tmp_path / f"{name}_{i}.up" for i in range(len(actions))]
    _wait_until(procs, lambda: all(m.exists() for m in markers), "start", timeout=300)
    return procs


def test_a_killed_process_ends_the_one_waiting_at_a_barrier_at_once(tmp_path):
    """Process 0 waits at the end barrier (no collective would fail): JAX alone would wait for
    the heartbeat timeout and abort; the lifeline ends it at once with one line."""
    procs = _start_driver(tmp_path, "kill", ["end", "sleep"])
    time.sleep(1)  # process 0 reaches the barrier
    status, elapsed = _kill_and_time(procs, victim=1)
    text = procs[0][1].read_text(errors="replace")
    assert status == 1, text
    assert elapsed < HEARTBEAT_S, elapsed
    assert _error_lines(text, "driver.py") == [
        "driver.py: error: process 1 of 2 ended unexpectedly (killed, crashed or exited with an "
        "error: its connection to this process closed); the job cannot continue; rerun every "
        "process"
    ], text
    assert JAX_ABORT not in text
    print(f"survivor exited {elapsed:.2f} s after the kill")


def test_an_uncaught_exception_on_one_process_ends_both_at_once(tmp_path):
    procs = _start_driver(tmp_path, "raise", ["end", "raise"])
    start = time.monotonic()
    for proc, _ in procs:
        proc.wait(timeout=HEARTBEAT_S + 120)
    elapsed = time.monotonic() - start
    statuses = [proc.returncode for proc, _ in procs]
    texts = [log.read_text(errors="replace") for _, log in procs]
    assert statuses == [1, 1], _tails(procs)
    assert elapsed < HEARTBEAT_S, elapsed
    assert "RuntimeError: a bug on this process only" in texts[1]  # the traceback is kept
    assert _error_lines(texts[1], "driver.py") == [
        "driver.py: error: process 1 of 2 failed (the error above); the job cannot continue; "
        "rerun every process"
    ]
    assert _error_lines(texts[0], "driver.py")[0].startswith(
        "driver.py: error: process 1 of 2 ended unexpectedly"
    )


def test_an_orderly_end_is_not_mistaken_for_a_failure(tmp_path):
    procs = _start_driver(tmp_path, "end", ["end", "end"])
    for proc, _ in procs:
        proc.wait(timeout=300)
    assert [proc.returncode for proc, _ in procs] == [0, 0], _tails(procs)
    assert not any("error" in log.read_text() for _, log in procs), _tails(procs)


# ---------------------------------------------------------------------------------------------
# launch/train.py (slow).


def _start_train(tmp_path, name, argv):
    port = _free_port()
    procs = []
    for index in range(2):
        log = tmp_path / f"{name}_{index}.log"
        command = [
            sys.executable,
            os.path.join(ROOT, "launch", "train.py"),
            *argv,
            f"--heartbeat_timeout={HEARTBEAT_S}",
            f"--coordinator_address=127.0.0.1:{port}",
            "--num_processes=2",
            f"--process_id={index}",
        ]
        procs.append((_popen(command, log), log))
    return procs


_RESUME_LINE = (
    r"train\.py: error: process {victim} of 2 ended unexpectedly \(killed, crashed or exited "
    r"with an error: its connection to this process closed\); the job cannot continue; run the "
    r"same command in every process again to resume from checkpoint (\d+) \((\S+)\)"
)


def _kill_mid_training(tmp_path, name, argv, ckpts, log, victim, after):
    """Starts both processes, SIGKILLs ``victim`` once a checkpoint newer than ``after`` is
    on disk and two more steps are logged; returns the survivor's status, seconds to exit,
    output, and the newest complete checkpoint."""
    procs = _start_train(tmp_path, name, argv)

    def ready():
        done = [s for s in _finished_steps(ckpts) if s > after] if ckpts.exists() else []
        return bool(done) and _logged_steps(log) >= done[-1] + 2

    _wait_until(procs, ready, f"a checkpoint after step {after}")
    status, elapsed = _kill_and_time(procs, victim)
    return status, elapsed, procs[1 - victim][1].read_text(errors="replace"), procs


@pytest.mark.slow
def test_a_killed_train_process_ends_the_other_and_a_rerun_resumes(
    synthetic_dir,
    shared_tokenizer,  # noqa: F811 - the fixture imported from test_crash_safety
    tmp_path,
):
    config = _config(synthetic_dir, shared_tokenizer, num_steps=1_000_000, checkpoint_every=4)
    workdir = tmp_path / "run"
    ckpts, log = workdir / "checkpoints", workdir / "train.log"
    argv = [f"--config={_config_file(tmp_path, config)}", f"--workdir={workdir}"]
    times = {}

    # Process 1 killed mid-training: process 0 exits 1 at once with one line naming it and the
    # checkpoint a rerun resumes from (the newest complete one).
    status, times["kill 1"], text, _ = _kill_mid_training(
        tmp_path, "first", argv, ckpts, log, victim=1, after=0
    )
    assert status == 1, text[-3000:]
    lines = _error_lines(text, "train.py")
    assert len(lines) == 1, text[-3000:]
    match = re.fullmatch(_RESUME_LINE.format(victim=1), lines[0])
    assert match, lines[0]
    first = _finished_steps(ckpts)[-1]
    assert int(match.group(1)) == first and match.group(2) == str(ckpts / str(first))
    assert times["kill 1"] < HEARTBEAT_S, times
    assert JAX_ABORT not in text

    # The same command resumes from that checkpoint; now process 0, the coordinator (it hosts
    # JAX's coordination service), is killed: process 1 ends at once, status 1 with the line,
    # or when JAX's own reaction wins the race, SIGABRT with JAX's line.
    status, times["kill 0"], text, _ = _kill_mid_training(
        tmp_path, "second", argv, ckpts, log, victim=0, after=first
    )
    assert _segments(log)[-1][0] == first  # "resumed from step FIRST"
    second = _finished_steps(ckpts)[-1]
    assert second > first
    assert times["kill 0"] < HEARTBEAT_S, times
    if status == 1:
        lines = _error_lines(text, "train.py")
        assert len(lines) == 1, text[-3000:]
        match = re.fullmatch(_RESUME_LINE.format(victim=0), lines[0])
        assert match and int(match.group(1)) == second, lines[0]
    else:
        assert status == -signal.SIGABRT and JAX_ABORT in text, (status, text[-3000:])
    print(f"process 0 killed: survivor status {status}")

    # The last rerun, beside a CPU-heavy process: resumes from the newest checkpoint, trains
    # two steps and both processes end cleanly.
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        start = time.monotonic()
        final = [*argv, f"--config.train.num_steps={second + 2}"]
        procs = _start_train(tmp_path, "final", final)
        for proc, _ in procs:
            proc.wait(timeout=900)
        times["loaded rerun"] = time.monotonic() - start
    finally:
        hog.kill()
        hog.wait()
    assert [proc.returncode for proc, _ in procs] == [0, 0], _tails(procs)
    assert _segments(log)[-1][0] == second
    assert _logged_steps(log) == second + 2
    for _, out in procs:
        text = out.read_text(errors="replace")
        assert f"step {second + 2} (num_steps)" in text
        assert not _error_lines(text, "train.py") and JAX_ABORT not in text
    print("seconds:", {k: round(v, 2) for k, v in times.items()})
