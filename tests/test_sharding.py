"""Sharded steps over a device mesh and multi-process training, on simulated CPU devices.

Runs on several devices (8 simulated CPU devices; two processes on 127.0.0.1) go through
``tests/sharding_worker.py`` in a subprocess, since this process's JAX already has one device.
Every run reads the same global batches (``config.data.batch_multiple = 8``), so its losses
must equal the one-device run's.
"""

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time

import flax.linen as nn
import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from conftest import ROOT, tiny_config, tiny_final_config
from jax.sharding import PartitionSpec as P
from sharding_worker import restore_params

from docnmt_jax import parallel
from docnmt_jax.data import readers
from docnmt_jax.data.pipeline import PipelineConfig
from docnmt_jax.data.schema import dummy_batch
from docnmt_jax.data.tokenizer import get_or_train_tokenizer
from docnmt_jax.models import build_model
from docnmt_jax.training import dev_eval, trainer

WORKER = os.path.join(ROOT, "tests", "sharding_worker.py")
CONFIGS = {"transformer": tiny_config, "final": tiny_final_config}


def _config(data_dir, model, num_steps, mesh=(-1, 1, 1), tokenizer="", bleu=False):
    config = CONFIGS[model](data_dir, num_steps=num_steps)
    config.data.max_src_len = config.data.max_tgt_len = 16  # few shapes: few compilations
    config.data.on_long = "truncate"  # most synthetic sentences are longer than 16 tokens
    config.data.batch_multiple = 8  # the same global batches on every mesh
    config.data.tokenizer = tokenizer
    config.train.dev_bleu = bleu  # greedy translation of the dev set at the end of the run
    config.mesh.data, config.mesh.fsdp, config.mesh.model = mesh
    return config


def _start(tmp_path, spec, name, processes=1):
    """Starts the worker (``processes`` of it, each told its id); :func:`_finish` collects.

    Each worker writes its output to ``NAME_PID.log``, not to a pipe: a pipe that nobody reads
    while the test waits for the other worker fills up and blocks its writer short of the
    barrier the other worker waits at.
    """
    procs = []
    for pid in range(processes):
        if processes > 1:
            spec["distributed"]["process_id"] = pid
        path = tmp_path / f"{name}_{pid}.spec.json"
        path.write_text(json.dumps(spec))
        out = tmp_path / f"{name}.json"
        command = [sys.executable, WORKER, str(path), str(out)]
        log = tmp_path / f"{name}_{pid}.log"
        with open(log, "wb") as f:
            proc = subprocess.Popen(command, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
        procs.append((proc, log))
    return procs, out


def _finish(started, timeout):
    """The results of workers from :func:`_start`; if one failed, every worker's output tail
    (a worker often fails because another one did)."""
    procs, out = started
    deadline = time.monotonic() + timeout
    try:
        for proc, _ in procs:
            proc.wait(timeout=max(deadline - time.monotonic(), 1))
    except subprocess.TimeoutExpired:
        pass
    finally:
        for proc, _ in procs:
            proc.kill()
            proc.wait()
    if any(proc.returncode != 0 for proc, _ in procs):
        tails = [
            f"--- worker {pid}: exit code {proc.returncode}\n"
            + log.read_text(errors="replace")[-3000:]
            for pid, (proc, log) in enumerate(procs)
        ]
        pytest.fail(f"worker failed or ran over {timeout} s\n" + "\n".join(tails))
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def tokenizer(synthetic_dir, tmp_path_factory):
    """One sentencepiece model shared by every run here."""
    path = str(tmp_path_factory.mktemp("spm") / "spm.model")
    docs = readers.read_tsv(os.path.join(synthetic_dir, "train.tsv"))
    get_or_train_tokenizer(path, docs, vocab_size=300)
    return path


@pytest.fixture(scope="module")
def one_device(synthetic_dir, tokenizer, tmp_path_factory):
    """``one_device(model)``: the 10-step result of a one-device run, cached."""
    cache = {}

    def run(model):
        if model not in cache:
            workdir = str(tmp_path_factory.mktemp(f"one_device_{model}"))
            config = _config(synthetic_dir, model, 10, tokenizer=tokenizer, bleu=True)
            hook = dev_eval.dev_bleu_hook(config)
            cache[model] = trainer.train_and_evaluate(
                config, workdir, record_losses=True, dev_hook=hook
            )
        return cache[model]

    return run


# ---------------------------------------------------------------------------------------------
# Mesh and rules.


def test_mesh_shape_resolves_the_rest_and_names_bad_sizes():
    assert parallel.mesh_shape({"data": -1, "fsdp": 1, "model": 1}, 8) == (8, 1, 1)
    assert parallel.mesh_shape({"data": 2, "model": 4}, 8) == (2, 1, 4)
    assert parallel.mesh_shape({"data": 1, "fsdp": -1, "model": 2}, 8) == (1, 4, 2)
    for bad in ({"data": -1, "fsdp": -1}, {"data": 3, "fsdp": -1}, {"data": 2}, {"model": 0}):
        with pytest.raises(ValueError, match="config.mesh"):
            parallel.mesh_shape(bad, 8)


def test_batch_rows_are_a_multiple_of_the_data_parallel_size():
    for multiple, processes in [(8, 1), (4, 2), (6, 4)]:
        config = PipelineConfig(batch_multiple=multiple, process_count=processes)
        for s, t in [(1, 8), (4, 32), (20, 128)]:
            rows = config.batch_size(s, t)
            assert rows % multiple == 0 and rows % processes == 0 and rows >= multiple


def test_rules_cover_every_logical_name_and_shard_as_designed():
    names = set()
    for model in ("transformer", "final"):
        config = CONFIGS[model]("unused")
        boxed = jax.eval_shape(
            build_model(config.model, 300).init, jax.random.PRNGKey(0), dummy_batch()
        )
        specs = jax.tree_util.tree_leaves(
            nn.get_partition_spec(boxed["params"]), is_leaf=lambda x: isinstance(x, P)
        )
        names |= {name for spec in specs for name in spec}
    activations = {"batch", "length"}
    assert names | activations <= {rule[0] for rule in parallel.LOGICAL_RULES}

    def mesh_axes(*logical):
        return nn.logical_to_mesh_axes(logical, parallel.LOGICAL_RULES)

    batch = ("data", "fsdp")
    assert mesh_axes("vocab", "embed") == P("model", "fsdp")  # embedding: tensor x FSDP
    assert mesh_axes("embed", "heads", "kv") == P("fsdp", "model", None)  # Megatron column
    assert mesh_axes("mlp", "embed") == P("model", "fsdp")  # Megatron row
    assert mesh_axes("relpos", "heads", "kv") == P(None, "model", None)
    assert mesh_axes("batch", "length", "embed") == P(batch, None, None)  # fsdp taken by batch
    assert mesh_axes("batch", "length", "mlp") == P(batch, None, "model")
    mesh = jax.sharding.AbstractMesh((2, 2, 2), parallel.MESH_AXES)
    assert parallel._fit(P("model", "fsdp"), (3, 8), mesh) == P(None, "fsdp")  # 3 rows: whole


# ---------------------------------------------------------------------------------------------
# Training on meshes.


# Both slow (the default suite passed 20 minutes); the two-process test and the
# mesh translation test stay in it.
@pytest.mark.slow
@pytest.mark.parametrize("model", ["transformer", "final"])
def test_sharded_training_matches_one_device(model, one_device, synthetic_dir, tokenizer, tmp_path):
    # 10 steps on (8,1,1); 5 steps on (2,2,2) resumed to 10 on (1,4,2); the (8,1,1) checkpoint
    # restored on (2,2,2) and (1,4,2) there, and on one device here.
    straight = _config(synthetic_dir, model, 10, (8, 1, 1), tokenizer, bleu=True).to_dict()
    half = _config(synthetic_dir, model, 5, (2, 2, 2), tokenizer).to_dict()
    resume = _config(synthetic_dir, model, 10, (1, 4, 2), tokenizer).to_dict()
    spec = {
        "devices": 8,
        "runs": [
            {"config": straight, "workdir": str(tmp_path / "a")},
            {"config": half, "workdir": str(tmp_path / "b")},
            {"config": resume, "workdir": str(tmp_path / "b")},
        ],
        "restores": [
            {"workdir": str(tmp_path / "a"), "config": cfg, "npz": str(tmp_path / f"{i}.npz")}
            for i, cfg in enumerate([half, resume])
        ],
    }
    started = _start(tmp_path, spec, "meshes")
    reference = one_device(model)  # while the worker runs
    straight, first, second = _finish(started, timeout=900)

    np.testing.assert_allclose(straight["losses"], reference.losses, rtol=1e-5, atol=1e-5)
    resumed = first["losses"] + second["losses"]
    np.testing.assert_allclose(resumed, reference.losses, rtol=1e-5, atol=1e-5)
    for key in ("dev_loss", "dev_nll", "dev_chrf"):
        assert straight["dev"][key] == pytest.approx(reference.dev_metrics[key], rel=1e-5)
    here = restore_params(
        str(tmp_path / "a"), _config(synthetic_dir, model, 10, tokenizer=tokenizer)
    )
    for i in range(2):
        there = np.load(tmp_path / f"{i}.npz")
        assert sorted(there.files) == sorted(here)
        for key, value in here.items():
            np.testing.assert_array_equal(there[key], value, err_msg=key)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Slow (suite time): the default suite's two-process runs are
# tests/test_multiprocess_failure.py's and test_two_processes_save_latest_and_best_at_the_same_step.
@pytest.mark.slow
def test_two_processes_match_one_process(one_device, synthetic_dir, tokenizer, tmp_path):
    config = _config(synthetic_dir, "transformer", 4, (2, 1, 2), tokenizer)
    spec = {
        "devices": 2,  # per process: the mesh (data 2, model 2) spans both processes
        "distributed": {
            "coordinator_address": f"127.0.0.1:{_free_port()}",
            "num_processes": 2,
            "process_id": 0,  # multiprocess.init_distributed's timeouts: sized for a loaded machine
        },
        "runs": [{"config": config.to_dict(), "workdir": str(tmp_path / "run")}],
    }
    started = _start(tmp_path, spec, "two_processes", processes=2)
    reference = one_device("transformer")
    (result,) = _finish(started, timeout=1200)
    np.testing.assert_allclose(result["losses"], reference.losses[:4], rtol=1e-5, atol=1e-5)
    log = (tmp_path / "run" / "train.log").read_text()
    assert "over 4 devices, 2 processes" in log
    config.mesh.data, config.mesh.model = -1, 1  # restored on this process's one device
    restored = restore_params(str(tmp_path / "run"), config)
    assert all(np.isfinite(v).all() for v in restored.values())


def test_two_processes_save_latest_and_best_at_the_same_step(tmp_path):
    """Regression: the ``latest`` and ``best`` managers once shared Orbax's barrier key, so a
    ``best`` save beside the ``latest`` one's background finalisation aborted both processes
    ("barrier ... already ongoing") or hung them until the barrier timeout."""
    spec = {
        "devices": 1,
        "distributed": {
            "coordinator_address": f"127.0.0.1:{_free_port()}",
            "num_processes": 2,
            "process_id": 0,
        },
        "saves": [{"workdir": str(tmp_path / "run"), "steps": 20}],
    }
    _finish(_start(tmp_path, spec, "saves", processes=2), timeout=900)
    assert sorted(os.listdir(tmp_path / "run" / "checkpoints")) == ["19", "20"]
    assert os.listdir(tmp_path / "run" / "best") == ["20"]
    # Both processes' halves of the array made it to disk (known answer: 0..7 in two rows).
    one_device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = {"w": jax.ShapeDtypeStruct((2, 4), np.float32, sharding=one_device)}
    for kind, step in (("checkpoints", "20"), ("best", "20")):
        path = tmp_path / "run" / kind / step / "state"
        saved = ocp.StandardCheckpointer().restore(path, target)
        np.testing.assert_array_equal(saved["w"], np.arange(8, dtype=np.float32).reshape(2, 4))


# ---------------------------------------------------------------------------------------------
# Launch recipes.

RECIPE_ENV = {
    "WORKDIR": "/shared/runs/final_base",
    "CONFIG": "configs/final_base.py",
    "EXTRA_FLAGS": "",
}


def train_command(path):
    """The ``launch/train.py`` arguments of a recipe, its shell variables filled in."""
    with open(path, encoding="utf-8") as f:
        lines = [line.rstrip() for line in f if not line.lstrip().startswith("#")]
    start = next(i for i, line in enumerate(lines) if "launch/train.py" in line)
    end = next(i for i in range(start, len(lines)) if not lines[i].endswith("\\"))
    command = " ".join(line.rstrip("\\") for line in lines[start : end + 1])
    command = command.split("launch/train.py", 1)[1]
    if command.count('"') % 2:  # the closing quote of a --command="..." string
        command = command[: command.rindex('"')]
    command = command.replace('"$@"', "")  # no extra arguments
    command = re.sub(r"\$\{?(\w+)\}?", lambda m: RECIPE_ENV.get(m[1], m[0]), command)
    return shlex.split(command)


@pytest.mark.parametrize("recipe", ["tpu_pod.sh", "slurm_gpu.sbatch"])
def test_launch_recipes_parse(recipe):
    args = train_command(os.path.join(ROOT, "launch", "cluster", recipe))
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "launch", "train.py"), *args, "--dry_run"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    parsed = json.loads(out.stdout.strip().splitlines()[-1])
    assert parsed["workdir"] == RECIPE_ENV["WORKDIR"]
    assert parsed["distributed"]["auto"] is True
    assert parsed["config"]["model"]["d_model"] == 512  # configs/final_base.py
    assert set(parsed["config"]["mesh"]) == {"data", "fsdp", "model"}
