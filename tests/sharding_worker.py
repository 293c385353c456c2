"""Runs training on simulated devices for ``tests/test_sharding.py``, in a fresh process.

The CPU device count (``XLA_FLAGS``) and ``jax.distributed`` must be set before JAX starts, so
the tests run this script: ``python tests/sharding_worker.py SPEC.json OUT.json``. ``SPEC``:
``devices`` (simulated CPU devices of this process), optional ``distributed`` (keyword
arguments of ``multiprocess.init_distributed``), ``runs`` (``{"config": dict, "workdir": str}``,
trained in order with ``record_losses``) and ``restores`` (``{"workdir", "config", "npz"}``:
the latest checkpoint of ``workdir`` restored onto ``config``'s mesh, parameters saved to
``npz``) and ``saves`` (``{"workdir", "steps"}``: a small global array saved to ``latest`` and
``best`` together at each of ``steps`` steps, as a run that improves at every evaluation does).
``OUT``: per run its losses and dev metrics (written by process 0). A distributed
worker ends with ``multiprocess.shutdown_distributed`` (all processes leave together).
"""

import json
import os
import sys

if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as f:
        SPEC = json.load(f)
    devices = f"--xla_force_host_platform_device_count={SPEC['devices']}"
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {devices}".strip()

import jax  # noqa: E402
import ml_collections  # noqa: E402
import numpy as np  # noqa: E402
from flax import traverse_util  # noqa: E402

from docnmt_jax import multiprocess, parallel  # noqa: E402
from docnmt_jax.data.tokenizer import load_tokenizer  # noqa: E402
from docnmt_jax.models import build_model  # noqa: E402
from docnmt_jax.training import checkpoints, dev_eval, trainer  # noqa: E402
from docnmt_jax.training import state as train_state  # noqa: E402


def restore_params(workdir: str, config: ml_collections.ConfigDict) -> dict[str, np.ndarray]:
    """Parameters of the latest checkpoint of ``workdir`` restored onto ``config``'s mesh."""
    layout = parallel.Layout(parallel.make_mesh(config.mesh))
    vocab = load_tokenizer(config.data.tokenizer or os.path.join(workdir, "spm.model")).vocab_size
    model = build_model(config.model, vocab)
    shardings, abstract, _, _ = train_state.build_optimizer_state(
        model, config, layout, note=lambda _: None
    )
    ckpt = checkpoints.Checkpointer(workdir)
    state, _ = ckpt.restore("latest", abstract)
    ckpt.close()
    for leaf, sharding in zip(
        jax.tree_util.tree_leaves(state["params"]),
        jax.tree_util.tree_leaves(shardings["params"]),
        strict=True,
    ):
        assert leaf.sharding == sharding, (leaf.sharding, sharding)
    flat = traverse_util.flatten_dict(state["params"], sep=".")
    return {k: np.asarray(v) for k, v in flat.items()}


def save_latest_and_best(workdir: str, steps: int) -> None:
    """Saves one global array to ``latest`` and ``best`` at every step (see ``saves``)."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    rows = np.arange(len(jax.devices()) * 4, dtype=np.float32).reshape(-1, 4)
    state = {"w": jax.make_array_from_callback(rows.shape, sharding, lambda index: rows[index])}
    ckpt = checkpoints.Checkpointer(workdir, keep=2)
    for step in range(1, steps + 1):
        ckpt.save(step, state, {"step": step}, best=True)
    ckpt.wait()
    ckpt.close()


def main() -> None:
    if "distributed" in SPEC:
        multiprocess.init_distributed(**SPEC["distributed"])
    results = []
    for run in SPEC.get("runs", []):
        config = ml_collections.ConfigDict(run["config"])
        result = trainer.train_and_evaluate(
            config, run["workdir"], record_losses=True, dev_hook=dev_eval.dev_bleu_hook(config)
        )
        results.append({"losses": result.losses, "dev": result.dev_metrics})
    for item in SPEC.get("restores", []):
        params = restore_params(item["workdir"], ml_collections.ConfigDict(item["config"]))
        np.savez(item["npz"], **params)
    for item in SPEC.get("saves", []):
        save_latest_and_best(item["workdir"], item["steps"])
    if jax.process_index() == 0:
        with open(sys.argv[2], "w", encoding="utf-8") as f:
            json.dump(results, f)
    # Every process waits here until all are done, then all leave jax.distributed at once:
    # left to JAX's exit handler, a process still busy (or descheduled on a loaded machine)
    # more than the shutdown timeout after the other finished made both abort.
    multiprocess.shutdown_distributed()


if __name__ == "__main__":
    main()
