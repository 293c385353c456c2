"""Train a model: ``docnmt-train --config final --workdir runs/NAME`` (in a checkout also
``python launch/train.py --config configs/final.py --workdir runs/NAME``).

``--config`` takes a config file (``FILE`` or ``FILE:ARG``) or a shipped config by name
(``transformer``, ``final.py:paper``, ``final_table3:doc2sent``; a file of that name in the
current directory wins). Every key of the config can be overridden, e.g.
``--config.train.num_steps=2000``; ``--config CONFIG --helpfull`` lists CONFIG's keys with
their values. Starting again on a workdir that holds checkpoints resumes. Without
``--workdir`` the run goes to ``runs/<config file name>`` in the current directory.

Devices: ``--config.mesh.data/fsdp/model`` shape the device mesh (default: data parallel over
every device). Several processes (hosts): run the same command in each, with
``--coordinator_address/--num_processes/--process_id`` (or the environment variables
``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES``, ``JAX_PROCESS_ID``), or ``--distributed``
to take them from the cluster (TPU pod, SLURM, Open MPI); see ``launch/cluster/tpu_pod.sh``
and ``launch/cluster/slurm_gpu.sbatch``. ``--dry_run`` parses the flags and config and exits. When a
process dies, the others exit at once (status 1) with one line naming it and the checkpoint a
rerun of every process resumes from; a silent host ends the job after ``--heartbeat_timeout``.

Preemption: SIGTERM or SIGINT (Ctrl-C) saves a checkpoint after the current step and exits 0
with a line naming the step and the checkpoint; a second signal exits at once (status 128 +
signal) without saving, leaving the previous complete checkpoint as the latest. A run killed
outright (SIGKILL, a lost machine) resumes from its newest complete checkpoint. Steps with a
NaN/Inf loss or gradient are skipped; ``train.max_bad_steps`` of them in a row end the run with
a one-line error (status 1) naming the step, its documents and the last good checkpoint.
"""

from __future__ import annotations

import json
import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from docnmt_jax import cli, multiprocess
from docnmt_jax.config_files import DEFAULT_CONFIG, config_key_help, resolve_config_path
from docnmt_jax.training.checkpoints import CheckpointError, NonFiniteError
from docnmt_jax.training.dev_eval import dev_bleu_hook
from docnmt_jax.training.trainer import train_and_evaluate


def _env_int(name: str) -> int | None:
    return int(os.environ[name]) if os.environ.get(name) else None


def config_flag_help(config: str | None = None) -> str:
    """The ``--config`` flag's help: what it takes, then one line per key of ``config``
    (``FILE`` or ``FILE:ARG``; ``None``: the default, ``configs/transformer.py``) with its
    value and comment, which ``--helpfull`` prints."""
    path = config or resolve_config_path(DEFAULT_CONFIG)
    if config:
        whose = os.path.basename(config)
    else:
        whose = f"configs/{DEFAULT_CONFIG} (with --config CONFIG, those of CONFIG)"
    keys = config_key_help(path) if os.path.isfile(path.partition(":")[0] or path) else ""
    return (
        "Training configuration: a config file, or a shipped config by name (transformer, "
        "final, final.py:paper, final_table3:doc2sent; see configs/), a file of that name in "
        "the current directory winning. Override any key with --config.KEY=VALUE; the keys "
        f"of {whose}:\n{keys}"
    )


_CONFIG = config_flags.DEFINE_config_file("config", None, config_flag_help(), lock_config=True)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Directory for checkpoints, logs, tokenizer (default: runs/<config name>)."
)
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address",
    os.environ.get("JAX_COORDINATOR_ADDRESS"),
    "host:port of process 0, for multi-process training (env JAX_COORDINATOR_ADDRESS).",
)
_NUM_PROCESSES = flags.DEFINE_integer(
    "num_processes", _env_int("JAX_NUM_PROCESSES"), "Processes in the job (env JAX_NUM_PROCESSES)."
)
_PROCESS_ID = flags.DEFINE_integer(
    "process_id", _env_int("JAX_PROCESS_ID"), "This process's index (env JAX_PROCESS_ID)."
)
_DISTRIBUTED = flags.DEFINE_bool(
    "distributed",
    False,
    "Initialise multi-process JAX from the cluster (TPU pod, SLURM, Open MPI, Kubernetes).",
)
_HEARTBEAT_TIMEOUT = flags.DEFINE_integer(
    "heartbeat_timeout",
    multiprocess.HEARTBEAT_TIMEOUT_S,
    "Several processes: seconds without a heartbeat after which JAX declares a process lost "
    "and ends the job (a lost machine; a process that dies ends the others at once).",
)
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Parse the flags and config, print them, exit.")
flags.mark_flags_as_required(["config"])


def resume_hint(workdir: str) -> str:
    """What to do after a multi-process job failed: rerun, and from which checkpoint."""
    directory = os.path.join(workdir, "checkpoints")
    steps = (
        sorted(int(d) for d in os.listdir(directory) if d.isdigit())
        if os.path.isdir(directory)
        else []
    )
    start = f"checkpoint {steps[-1]} ({directory}/{steps[-1]})" if steps else "step 0"
    return f"run the same command in every process again to resume from {start}"


def workdir_or_default() -> str:
    """``--workdir``, else ``runs/<config file name without .py>``."""
    if _WORKDIR.value:
        return _WORKDIR.value
    name = os.path.splitext(os.path.basename(flags.FLAGS["config"].config_filename))[0]
    return os.path.join("runs", name)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    workdir = workdir_or_default()
    distributed = dict(
        coordinator_address=_COORDINATOR.value,
        num_processes=_NUM_PROCESSES.value,
        process_id=_PROCESS_ID.value,
        auto=_DISTRIBUTED.value,
        heartbeat_timeout_seconds=_HEARTBEAT_TIMEOUT.value,
    )
    if _DRY_RUN.value:
        config = json.loads(_CONFIG.value.to_json_best_effort())
        print(json.dumps({"workdir": workdir, "distributed": distributed, "config": config}))
        return
    multiprocess.init_distributed(**distributed, resume_hint=lambda: resume_hint(workdir))
    logging.set_verbosity(logging.WARNING)  # progress goes to the bar and WORKDIR/train.log
    data = _CONFIG.value.data
    cli.note_user_paths([data.get(k) for k in ("train", "dev", "tokenizer", "data_dir")])
    try:
        # A user's mistake (docnmt_jax.errors.UserError: model, data and packing config,
        # init_from, files) is cli.run's: one line, status 2.
        # config.train.dev_bleu: dev BLEU, d-BLEU and chrF at every evaluation.
        result = train_and_evaluate(_CONFIG.value, workdir, dev_hook=dev_bleu_hook(_CONFIG.value))
    except (NonFiniteError, CheckpointError) as e:
        # Training diverged (NaN/Inf), or no checkpoint of the workdir restores: one line.
        print(f"train.py: error: {e}", file=sys.stderr)
        sys.exit(1)
    dev = " ".join(f"{k}={v:.4f}" for k, v in sorted(result.dev_metrics.items()))
    print(f"step {result.step} ({result.stopped_by}): {dev}")
    if result.stopped_by in ("sigterm", "sigint"):
        print(
            f"train.py: stopped by {result.stopped_by.upper()} at step {result.step}; checkpoint "
            f"{result.checkpoint or '(none: no step was trained)'}; run the same command "
            "again to resume"
        )
    multiprocess.shutdown_distributed()  # all processes leave jax.distributed together


def run() -> None:
    """The ``docnmt-train`` command (``python launch/train.py``)."""
    cli.run(main, config_help=config_flag_help)


if __name__ == "__main__":
    run()
