"""XLA compilation: counting backend compilations (:class:`CompileWatch`) and the trainer's
step compiled ahead of time (:func:`compile_train`) with its compile time, exact matmul FLOPs
of the traced step, XLA's ``cost_analysis`` FLOPs and compiled memory."""

from __future__ import annotations

import time
from typing import Any

from docnmt_jax.models import contract

Results = dict[str, Any]


class CompileWatch:
    """Counts XLA backend compilations inside a ``with`` block (via ``jax.monitoring``)."""

    EVENT = "/jax/core/compile/backend_compile_duration"

    def __init__(self) -> None:
        self.count = 0  # over every ``with`` block of this watch

    def __enter__(self) -> CompileWatch:
        import jax

        jax.monitoring.register_event_duration_secs_listener(self._listen)
        return self

    def __exit__(self, *exc: Any) -> None:
        import jax

        jax.monitoring.unregister_event_duration_listener(self._listen)

    def _listen(self, event: str, duration: float, **kwargs: Any) -> None:
        if event == self.EVENT:
            self.count += 1


def memory_bytes(compiled: Any) -> dict[str, int]:
    """Compiled memory (bytes): arguments, outputs, temporaries (the activations), aliased
    (donated) outputs, and ``total = argument + output + temp - alias``."""
    m = compiled.memory_analysis()
    if m is None:
        return {"total": 0, "temp": 0}
    parts = {
        "argument": m.argument_size_in_bytes,
        "output": m.output_size_in_bytes,
        "temp": m.temp_size_in_bytes,
        "alias": m.alias_size_in_bytes,
    }
    parts["total"] = parts["argument"] + parts["output"] + parts["temp"] - parts["alias"]
    return parts


def init_params(task: Any, batch: Results) -> Any:
    """Seeded parameters (one jitted init: faster than op-by-op for every model)."""
    import flax.linen as nn
    import jax

    return nn.meta.unbox(jax.jit(task.init)(jax.random.PRNGKey(0), batch)["params"])


class TrainStep:
    """A compiled train step with its state and the compilation's measurements."""

    def __init__(self, compiled: Any, state: Any, compile_seconds: float, dot_flops: int):
        self.compiled = compiled
        self.state = state
        self.compile_seconds = compile_seconds
        self.dot_flops = dot_flops  # exact matmul FLOPs of the traced step (backward included)
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        self.xla_flops = float(cost.get("flops", 0.0))
        self.memory = memory_bytes(compiled)

    def run(self, batch: Results, steps: int) -> list[float]:
        """Runs ``steps`` steps; wall seconds of each (state carried over)."""
        import jax

        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            self.state, metrics = self.compiled(self.state, batch)
            jax.block_until_ready(metrics)
            times.append(time.perf_counter() - t0)
        return times


def compile_train(task: Any, batch: Results, carry_rows: int = 0) -> TrainStep:
    """The trainer's jitted step for ``task``, compiled ahead of time for ``batch``; a model
    that carries state across chunks carries ``carry_rows`` streams (0: one a batch row)."""
    import jax.numpy as jnp

    from docnmt_jax import flops
    from docnmt_jax.objectives import build_objective
    from docnmt_jax.training import optim, trainer

    params = init_params(task, batch)
    tx, schedule = optim.make_optimizer(task.config.d_model, warmup_steps=4000)
    train_step, _ = trainer.make_steps(build_objective(None, task), tx, schedule, seed=0)
    state = {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": tx.init(params)}
    if contract.carries_state(task):  # document streams: the state rows carry
        state["carry"] = task.initial_carry(carry_rows or batch["src"].shape[0])
    t0 = time.perf_counter()
    traced = train_step.trace(state, batch)
    compiled = traced.lower().compile()
    compile_s = time.perf_counter() - t0
    return TrainStep(compiled, state, compile_s, flops.jaxpr_dot_flops(traced.jaxpr))
