"""Crash safety of training (docs/reliability.md).

Default suite (seconds): the checkpoint layer alone -- a save that never finished (Orbax's
``<step>.orbax-checkpoint-tmp``) is never restored and is cleaned up; a finished step with a
file truncated, deleted or garbled is skipped with a warning naming it and moved aside, the
previous step restoring bit-exactly; when no step restores nothing is moved; a state with an
Inf is not saved.

``slow`` (``make test-slow``): a SIGINT inside a run saves the step it stops at and the resumed
run has the uninterrupted run's losses; a tiny training in a subprocess killed with SIGKILL at four
points (between steps; in an asynchronous save, everything written but not renamed; right after
a save's rename; as soon as a save's temporary directory appears) and then given a truncated
latest checkpoint: every run resumes from the newest complete checkpoint and every step's
logged loss equals the uninterrupted run's to 1e-5. Then SIGTERM and SIGINT through
``launch/train.py`` (save, exit 0, the step named), and a second signal during the save, which
exits at once and leaves the previous checkpoint the latest.

Kill points are chosen by the test: a driver script (written here, run as a subprocess) wraps
Orbax's rename or the trainer's data iterator to block at the chosen point and create a marker
file; the test kills the process when the marker (or a file of the run) appears.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from conftest import ROOT, tiny_config, tiny_final_config

from docnmt_jax.data import pipeline
from docnmt_jax.training import checkpoints, trainer

TMP_SUFFIX = ".orbax-checkpoint-tmp"


# ---------------------------------------------------------------------------------------------
# The checkpoint layer (default suite).


def _state(step):
    """A small train-state-like tree whose values depend on ``step``."""
    rng = np.random.default_rng(step)
    return {
        "step": jnp.array(step, jnp.int32),
        "params": {
            "w": jnp.asarray(rng.normal(size=(24, 40)), jnp.float32),
            "b": jnp.asarray(rng.normal(size=40), jnp.float32),
        },
        "opt_state": {"count": jnp.array(step, jnp.int32), "mu": jnp.zeros((24, 40))},
    }


def _save(directory, steps, keep=5):
    ckpt = checkpoints.Checkpointer(str(directory), keep=keep)
    for step in steps:
        ckpt.save(step, _state(step), {"step": step, "data_step": step})
    ckpt.wait()
    ckpt.close()


def _assert_tree_equal(got, want):
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _listing(directory):
    return sorted(os.listdir(directory))


def test_an_unfinished_save_is_never_restored_and_is_removed(tmp_path):
    _save(tmp_path, [2, 4])
    latest = tmp_path / "checkpoints"
    # What a process killed during the save of step 6 leaves: every file written, the step
    # directory not renamed (Orbax renames <step>.orbax-checkpoint-tmp to <step> last).
    shutil.copytree(latest / "4", latest / f"6{TMP_SUFFIX}")
    ckpt = checkpoints.Checkpointer(str(tmp_path))
    state, meta = ckpt.restore("latest", _state(0))
    assert meta["step"] == 4
    _assert_tree_equal(state, _state(4))
    ckpt.save(6, _state(6), {"step": 6, "data_step": 6})
    ckpt.close()
    assert _listing(latest) == ["2", "4", "6"]
    ckpt = checkpoints.Checkpointer(str(tmp_path))
    state, meta = ckpt.restore("latest", _state(0))
    ckpt.close()
    assert meta["step"] == 6
    _assert_tree_equal(state, _state(6))


def _largest_file(directory):
    files = [os.path.join(r, f) for r, _, fs in os.walk(directory) for f in fs]
    return max(files, key=os.path.getsize)


def _truncate(path):
    os.truncate(path, os.path.getsize(path) // 2)


def _garble(path):
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.seek(size // 2)
        f.write(b"\0" * (size - size // 2))


FAULTS = {
    "state data truncated": lambda step_dir: _truncate(_largest_file(step_dir / "state")),
    "state data deleted": lambda step_dir: os.remove(_largest_file(step_dir / "state")),
    "state data zeroed": lambda step_dir: _garble(_largest_file(step_dir / "state")),
    "state metadata truncated": lambda step_dir: _truncate(step_dir / "state" / "_METADATA"),
    "meta truncated": lambda step_dir: _truncate(step_dir / "meta" / "metadata"),
    "meta names another step": lambda step_dir: (step_dir / "meta" / "metadata").write_text(
        json.dumps({"step": 2, "data_step": 2})
    ),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_corrupt_latest_checkpoint_is_skipped_with_a_warning(tmp_path, fault):
    _save(tmp_path, [2, 4, 6])
    latest = tmp_path / "checkpoints"
    FAULTS[fault](latest / "6")
    warnings = []
    ckpt = checkpoints.Checkpointer(str(tmp_path))
    state, meta = ckpt.restore("latest", _state(0), warn=warnings.append)
    assert meta["step"] == 4
    _assert_tree_equal(state, _state(4))
    assert len(warnings) == 1
    assert f"checkpoint {latest / '6'} does not restore" in warnings[0]
    assert "resuming from step 4" in warnings[0]
    assert _listing(latest) == ["2", "4", "6.corrupt"]
    # The run goes on and saves step 6 again.
    ckpt.save(6, _state(6), {"step": 6, "data_step": 6})
    ckpt.wait()
    state, meta = ckpt.restore("latest", _state(0))
    ckpt.close()
    assert meta["step"] == 6
    _assert_tree_equal(state, _state(6))


@pytest.mark.slow
def test_every_single_file_fault_falls_back_or_restores_exactly(tmp_path):
    """Each file of the newest checkpoint truncated to half, deleted, or its second half zeroed,
    one at a time: the restore either warns and returns step 4's state or returns step 6's
    exact state -- never other values. Most faults fall back; some files are not needed to
    read the arrays (e.g. the commit markers)."""
    _save(tmp_path / "saved", [4, 6])
    step_dir = tmp_path / "saved" / "checkpoints" / "6"
    files = sorted(
        os.path.relpath(os.path.join(r, f), step_dir) for r, _, fs in os.walk(step_dir) for f in fs
    )
    fell_back = {}
    for name in files:
        for fault in (_truncate, os.remove, _garble):
            work = tmp_path / "work"
            shutil.rmtree(work, ignore_errors=True)
            shutil.copytree(tmp_path / "saved", work)
            fault(work / "checkpoints" / "6" / name)
            warnings = []
            ckpt = checkpoints.Checkpointer(str(work))
            state, meta = ckpt.restore("latest", _state(0), warn=warnings.append)
            ckpt.close()
            assert meta["step"] in (4, 6), (name, fault.__name__)
            assert len(warnings) == (meta["step"] == 4), (name, fault.__name__)
            _assert_tree_equal(state, _state(meta["step"]))
            fell_back[name, fault.__name__] = meta["step"] == 4
    # The array data and the meta JSON are needed: every fault to them falls back.
    data = os.path.relpath(_largest_file(step_dir), step_dir)
    for name in (data, os.path.join("meta", "metadata")):
        for fault in ("_truncate", "remove", "_garble"):
            assert fell_back[name, fault], (name, fault)
    outcomes = {"fell back": sum(fell_back.values()), "cases": len(fell_back)}
    print(f"{len(files)} files x 3 faults: {outcomes}")


def test_damage_that_leaves_the_data_readable_restores_the_exact_state(tmp_path):
    """Without the tree metadata Orbax reads each array's own: the saved values, no warning."""
    _save(tmp_path, [2, 4, 6])
    os.remove(tmp_path / "checkpoints" / "6" / "state" / "_METADATA")
    ckpt = checkpoints.Checkpointer(str(tmp_path))
    state, meta = ckpt.restore("latest", _state(0), warn=pytest.fail)
    ckpt.close()
    assert meta["step"] == 6
    _assert_tree_equal(state, _state(6))


def test_two_corrupt_checkpoints_fall_back_to_the_third(tmp_path):
    _save(tmp_path, [2, 4, 6])
    latest = tmp_path / "checkpoints"
    FAULTS["state data truncated"](latest / "6")
    FAULTS["meta truncated"](latest / "4")
    warnings = []
    ckpt = checkpoints.Checkpointer(str(tmp_path))
    state, meta = ckpt.restore("latest", _state(0), warn=warnings.append)
    ckpt.close()
    assert meta["step"] == 2
    _assert_tree_equal(state, _state(2))
    assert [w.split(" does not")[0] for w in warnings] == [
        f"checkpoint {latest / '6'}",
        f"checkpoint {latest / '4'}",
    ]
    assert _listing(latest) == ["2", "4.corrupt", "6.corrupt"]


def test_when_no_checkpoint_restores_nothing_is_moved(tmp_path):
    """A config that does not fit (here: other shapes) fails every step alike: an error naming
    each step, and the checkpoints stay where they are."""
    _save(tmp_path, [2, 4])
    other = _state(0)
    other["params"]["w"] = jnp.zeros((24, 41))
    ckpt = checkpoints.Checkpointer(str(tmp_path))
    with pytest.raises(checkpoints.CheckpointError, match=r"step 4: .*; step 2: "):
        ckpt.restore("latest", other, warn=pytest.fail)
    ckpt.close()
    assert _listing(tmp_path / "checkpoints") == ["2", "4"]


def test_a_nonfinite_state_is_refused(tmp_path):
    state = _state(2)
    state["params"]["b"] = state["params"]["b"].at[3].set(jnp.inf)
    ckpt = checkpoints.Checkpointer(str(tmp_path))
    with pytest.raises(checkpoints.NonFiniteError, match=r"step 2: .* in 1 arrays \(params/b\)"):
        ckpt.save(2, state, {"step": 2, "data_step": 2})
    ckpt.close()
    assert _listing(tmp_path / "checkpoints") == []


# ---------------------------------------------------------------------------------------------
# Runs (slow): a SIGINT in-process; subprocesses killed or signalled at chosen points.

DRIVER = r'''
"""Runs a training (``spec["config"]`` through ``train_and_evaluate``, or ``launch/train.py``
with ``spec["argv"]``) after installing the kill-point hook ``spec["hook"]``."""
import json
import os
import sys
import time

spec = json.load(open(sys.argv[1]))
hook = spec.get("hook") or {}
kind = hook.get("kind")


def reached():
    """Marks the kill point and waits there for the test's SIGKILL (or second signal)."""
    open(spec["marker"], "w").close()
    while True:
        time.sleep(60)


if kind in ("before_rename", "after_rename"):
    # Orbax finalises a save by renaming <step>.orbax-checkpoint-tmp to <step>.
    from orbax.checkpoint._src.path import async_path

    original_rename = async_path.rename

    async def rename(src, dst):
        hit = os.path.basename(os.path.dirname(os.fspath(dst))) == "checkpoints" and (
            hook.get("step") is None or os.path.basename(os.fspath(dst)) == str(hook["step"])
        )
        if hit and kind == "before_rename":
            reached()
        result = await original_rename(src, dst)
        if hit and kind == "after_rename":
            reached()
        return result

    async_path.rename = rename

if kind == "between_steps":
    # Before the batch of step hook["step"] + 1 is fetched, once pending saves are finished.
    from docnmt_jax.data import pipeline
    from docnmt_jax.training import checkpoints

    managers = []
    original_init = checkpoints.Checkpointer.__init__

    def init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        managers.append(self)

    checkpoints.Checkpointer.__init__ = init
    make_dataset = pipeline.make_dataset

    def hooked(plan, start_step=0, **kwargs):
        dataset = make_dataset(plan, start_step=start_step, **kwargs)

        class Dataset:
            def as_numpy_iterator(self):
                for step, batch in enumerate(dataset.as_numpy_iterator(), start_step):
                    if step == hook["step"]:
                        for manager in managers:
                            manager.wait()
                        reached()
                    yield batch

        return Dataset()

    pipeline.make_dataset = hooked

if "argv" in spec:
    import runpy

    sys.argv = ["train.py", *spec["argv"]]
    runpy.run_path(os.path.join(spec["root"], "launch", "train.py"), run_name="__main__")
else:
    import ml_collections

    from docnmt_jax.training import trainer

    trainer.train_and_evaluate(ml_collections.ConfigDict(spec["config"]), spec["workdir"])
'''


def _start(tmp_path, name, spec):
    """Starts the driver with ``spec`` (output to ``<name>.out``); returns the process, the
    marker path and the output path."""
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    spec = dict(spec, root=ROOT, marker=str(tmp_path / f"{name}.marker"))
    (tmp_path / f"{name}.json").write_text(json.dumps(spec))
    out = open(tmp_path / f"{name}.out", "w")
    proc = subprocess.Popen(
        [sys.executable, str(driver), str(tmp_path / f"{name}.json")],
        stdout=out,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
    )
    return proc, spec["marker"], tmp_path / f"{name}.out"


def _wait_for(proc, condition, out, what, timeout=600):
    """Polls ``condition()`` until true; fails with the run's output if the process ends first
    (the timeout only bounds a hung run, nothing is timed)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            pytest.fail(
                f"the run ended (status {proc.returncode}) before {what}:\n{out.read_text()}"
            )
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"no {what} after {timeout} s:\n{out.read_text()}")
        time.sleep(0.005)


def _kill(proc):
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=120) == -signal.SIGKILL


def _finished_steps(checkpoint_dir):
    return sorted(int(d) for d in os.listdir(checkpoint_dir) if d.isdigit())


_STEP_LOSS = re.compile(r" step=(\d+) (?:\S+ )*?train/loss=(\S+)")


def _segments(log_path):
    """Per run (segment) of ``train.log``: ``(resumed_from or None, {step: loss})``."""
    segments = []
    for line in open(log_path, encoding="utf-8"):
        if re.search(r" data: \d+ train / ", line):  # a run's first line about its data
            segments.append([None, {}])
        elif match := re.search(r"resumed from step (\d+) ", line):
            segments[-1][0] = int(match.group(1))
        elif match := _STEP_LOSS.search(line):
            segments[-1][1][int(match.group(1))] = float(match.group(2))
    return segments


def _check_losses(log_path, reference, resumed_from):
    """Every logged step loss of every segment of the log equals the reference run's (1e-5),
    and segment ``i`` resumed from ``resumed_from[i]``; returns the steps compared."""
    segments = _segments(log_path)
    assert [s[0] for s in segments] == resumed_from
    compared = 0
    for start, losses in segments:
        steps = sorted(losses)
        assert steps == list(range((start or 0) + 1, (start or 0) + 1 + len(steps))), steps
        got = [losses[s] for s in steps]
        want = [reference[s - 1] for s in steps]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        compared += len(steps)
    return compared


@pytest.fixture(scope="module")
def shared_tokenizer(synthetic_dir, tmp_path_factory):
    """One sentencepiece model for every run here (as the runs would each train it)."""
    from docnmt_jax.data import readers
    from docnmt_jax.data.tokenizer import get_or_train_tokenizer

    path = str(tmp_path_factory.mktemp("spm") / "spm.model")
    docs = readers.read_tsv(os.path.join(synthetic_dir, "train.tsv"))
    get_or_train_tokenizer(path, docs, vocab_size=300)
    return path


def _config(synthetic_dir, tokenizer, final=False, **train):
    if final:  # recurrent FINAL on document streams of 4 rows
        config = tiny_final_config(synthetic_dir, log_every=1, **train)
        config.model.recurrent = True
        config.model.packed_layout = "banded"  # streams are banded rows
        config.data.train_as = "documents"
        config.data.stream_rows = 4
    else:
        config = tiny_config(synthetic_dir, log_every=1, **train)
    config.data.tokenizer = tokenizer
    # The subprocess gets the config as JSON: the reference run uses that same round trip.
    return ml_collections.ConfigDict(json.loads(config.to_json()))


@pytest.mark.slow
def test_sigint_saves_the_current_step_and_stops(
    synthetic_dir, shared_tokenizer, tmp_path, monkeypatch
):
    """The signal arrives while the batch of step 4 is fetched (sent by the data iterator):
    step 4 still runs, then the run saves checkpoint 4 (checkpoint_every does not divide it)
    and stops; resuming it to step 6 gives the losses of an uninterrupted 6-step run."""
    make_dataset = pipeline.make_dataset

    def signalling(plan, start_step=0, **kwargs):
        dataset = make_dataset(plan, start_step=start_step, **kwargs)

        class Dataset:
            def as_numpy_iterator(self):
                for step, batch in enumerate(dataset.as_numpy_iterator(), start_step):
                    if step == 3:  # the batch of step 4
                        os.kill(os.getpid(), signal.SIGINT)
                    yield batch

        return Dataset()

    config = _config(synthetic_dir, shared_tokenizer, num_steps=6)
    reference = trainer.train_and_evaluate(config, str(tmp_path / "reference"), record_losses=True)
    workdir = str(tmp_path / "run")
    with monkeypatch.context() as patch:
        patch.setattr(pipeline, "make_dataset", signalling)
        first = trainer.train_and_evaluate(
            _config(synthetic_dir, shared_tokenizer, num_steps=6, checkpoint_every=5),
            workdir,
            record_losses=True,
        )
    assert (first.step, first.stopped_by) == (4, "sigint")
    assert first.checkpoint == os.path.join(workdir, "checkpoints", "4")
    assert _listing(os.path.join(workdir, "checkpoints")) == ["4"]
    assert (
        "SIGINT at step 4: saving checkpoint 4" in open(os.path.join(workdir, "train.log")).read()
    )
    second = trainer.train_and_evaluate(config, workdir, record_losses=True)
    assert second.step == 6
    np.testing.assert_allclose(first.losses + second.losses, reference.losses, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["transformer", "recurrent_final"])
def test_sigkill_anywhere_resumes_the_uninterrupted_run(
    synthetic_dir, shared_tokenizer, tmp_path, model
):
    """``recurrent_final``: FINAL trained on document streams, whose train state also holds the
    state each row's last chunk left; the resumed runs must continue the streams with it."""
    num_steps = 24
    config = _config(
        synthetic_dir,
        shared_tokenizer,
        final=model == "recurrent_final",
        num_steps=num_steps,
        checkpoint_every=4,
        keep_checkpoints=3,
    )
    reference = trainer.train_and_evaluate(
        config, str(tmp_path / "reference"), record_losses=True
    ).losses
    assert len(reference) == num_steps
    workdir = tmp_path / "run"
    ckpts = workdir / "checkpoints"
    spec = {"config": config.to_dict(), "workdir": str(workdir)}
    resumed_from = [None]
    kills = []

    def killed_run(name, hook, condition=None):
        proc, marker, out = _start(tmp_path, name, dict(spec, hook=hook))
        condition = condition or (lambda: os.path.exists(marker))
        _wait_for(proc, condition, out, f"kill point {name}")
        _kill(proc)
        kills.append(name)
        return out

    # 1. Between steps: after step 10, pending saves finished.
    killed_run("between_steps", {"kind": "between_steps", "step": 10})
    assert _finished_steps(ckpts) == [4, 8]
    resumed_from.append(8)
    # 2. In the asynchronous save of step 12: every file written, the directory not renamed.
    killed_run("in_save", {"kind": "before_rename", "step": 12})
    assert _finished_steps(ckpts) == [4, 8] and f"12{TMP_SUFFIX}" in os.listdir(ckpts)
    resumed_from.append(8)
    # 3. Right after the save of step 16 (renamed; Orbax has not yet deleted the oldest).
    killed_run("after_save", {"kind": "after_rename", "step": 16})
    assert _finished_steps(ckpts)[-1] == 16 and f"12{TMP_SUFFIX}" not in os.listdir(ckpts)
    resumed_from.append(16)
    # 4. As soon as the save of step 20 shows (no hook): its temporary directory, or, if the
    # save was quicker than the polling, the finished directory.
    killed_run(
        "save_appears",
        None,
        lambda: os.path.exists(ckpts / f"20{TMP_SUFFIX}") or os.path.exists(ckpts / "20"),
    )
    finished = _finished_steps(ckpts)
    assert finished[-1] in (16, 20)  # 20 if its save finished before the kill landed
    # 5. The newest complete checkpoint is then truncated: the run warns, naming it, resumes
    # from the one before and trains to the end.
    newest = finished[-1]
    _truncate(_largest_file(ckpts / str(newest) / "state"))
    proc, _, out = _start(tmp_path, "final", dict(spec, hook=None))
    assert proc.wait(timeout=600) == 0, out.read_text()
    previous = finished[-2]
    resumed_from.append(previous)
    log = (workdir / "train.log").read_text()
    assert f"WARNING: checkpoint {ckpts / str(newest)} does not restore" in log
    assert f"resuming from step {previous}" in log
    assert f"{newest}.corrupt" in os.listdir(ckpts)
    assert not [d for d in os.listdir(ckpts) if TMP_SUFFIX in d]
    compared = _check_losses(workdir / "train.log", reference, resumed_from)
    assert compared >= num_steps
    assert _segments(workdir / "train.log")[-1][1].keys() >= {num_steps}
    print(f"kill points {kills}, one corrupt checkpoint; {compared} step losses equal")


def _config_file(tmp_path, config):
    """A config file for ``launch/train.py --config`` holding ``config``."""
    (tmp_path / "config.json").write_text(config.to_json())
    path = tmp_path / "config_from_json.py"
    source = str(tmp_path / "config.json")
    path.write_text(
        "import json\nimport ml_collections\n\n\ndef get_config():\n"
        f"    return ml_collections.ConfigDict(json.load(open({source!r})))\n"
    )
    return str(path)


def _logged_steps(log_path):
    if not os.path.exists(log_path):
        return 0
    segments = _segments(log_path)
    return max(segments[-1][1], default=0) if segments else 0


@pytest.mark.slow
def test_sigterm_and_sigint_save_and_a_second_signal_exits_at_once(
    synthetic_dir, shared_tokenizer, tmp_path
):
    config = _config(synthetic_dir, shared_tokenizer, num_steps=1_000_000, checkpoint_every=1000)
    workdir = tmp_path / "run"
    ckpts, log = workdir / "checkpoints", workdir / "train.log"
    argv = [f"--config={_config_file(tmp_path, config)}", f"--workdir={workdir}"]
    resumed_from, saved = [None], []

    def signalled_run(name, sig, after_steps, hook=None):
        proc, marker, out = _start(tmp_path, name, {"argv": argv, "hook": hook})
        at_least = (resumed_from[-1] or 0) + after_steps
        _wait_for(proc, lambda: _logged_steps(log) >= at_least, out, f"step {at_least}")
        proc.send_signal(sig)
        return proc, marker, out

    # SIGTERM, then (resumed) SIGINT: each saves the step it stopped at and exits 0 naming it.
    for name, sig in (("sigterm", signal.SIGTERM), ("sigint", signal.SIGINT)):
        proc, _, out = signalled_run(name, sig, 5)
        assert proc.wait(timeout=600) == 0, out.read_text()
        text = out.read_text()
        match = re.search(
            rf"train\.py: stopped by {name.upper()} at step (\d+); checkpoint (\S+); run the "
            "same command again to resume",
            text,
        )
        assert match, text[-3000:]
        step = int(match.group(1))
        assert match.group(2) == str(ckpts / str(step))
        assert _finished_steps(ckpts)[-1] == step
        assert f"{name.upper()} at step {step}: saving checkpoint {step}" in log.read_text()
        saved.append(step)
        resumed_from.append(step)
    # A second signal while the SIGTERM save is being written (held before its rename): the
    # process exits at once with 128 + signal, the save never finalised.
    proc, marker, out = signalled_run(
        "second_signal", signal.SIGTERM, 5, hook={"kind": "before_rename"}
    )
    _wait_for(proc, lambda: os.path.exists(marker), out, "the SIGTERM save")
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=120) == 128 + signal.SIGINT, out.read_text()
    assert "SIGINT again: exiting at once without saving" in out.read_text()
    assert _finished_steps(ckpts)[-1] == saved[-1]
    assert [d for d in os.listdir(ckpts) if d.endswith(TMP_SUFFIX)]
    resumed_from.append(saved[-1])
    # The previous complete checkpoint restores: a last run to a few steps beyond it, and every
    # logged loss of every run equals the uninterrupted run's.
    final_steps = saved[-1] + 3
    final = _config(synthetic_dir, shared_tokenizer, num_steps=final_steps, checkpoint_every=1000)
    argv[0] = f"--config={_config_file(tmp_path, final)}"
    proc, _, out = _start(tmp_path, "final", {"argv": argv})
    assert proc.wait(timeout=600) == 0, out.read_text()
    longest = max(max(s[1], default=0) for s in _segments(log))
    reference_config = _config(
        synthetic_dir, shared_tokenizer, num_steps=longest, checkpoint_every=1000
    )
    reference = trainer.train_and_evaluate(
        reference_config, str(tmp_path / "reference"), record_losses=True
    ).losses
    _check_losses(log, reference, resumed_from)
    assert not [d for d in os.listdir(ckpts) if TMP_SUFFIX in d]
