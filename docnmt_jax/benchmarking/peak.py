"""The machine's matrix-multiply peak (GFLOP/s) in float32 and bfloat16: the denominator of
the train section's MFU."""

from __future__ import annotations

import argparse
from typing import Any

from docnmt_jax.benchmarking.timing import median, time_calls

Results = dict[str, Any]


def matmul_gflops(n: int, dtype: Any, calls: int = 5) -> tuple[float, float]:
    """(GFLOP/s, seconds per call) of an ``n x n`` matmul, median over ``calls`` batches of
    ``calls`` back-to-back calls (so dispatch overhead is amortised)."""
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32).astype(dtype)
    matmul = jax.jit(lambda x, y: jnp.matmul(x, y, preferred_element_type=jnp.float32))
    jax.block_until_ready(matmul(a, a))

    def burst() -> list[Any]:
        return [matmul(a, a) for _ in range(calls)]

    per_call = median(time_calls(burst, calls)) / calls
    return 2 * n**3 / per_call / 1e9, per_call


def peak_section(args: argparse.Namespace, results: Results) -> Results:
    """Matmul peak per dtype; with ``--peak-size 0`` the size doubles from 512 until one call
    takes 20 ms (or 8192), so the measurement is compute-bound on any machine."""
    import jax
    import jax.numpy as jnp

    result: Results = {"device": str(jax.devices()[0])}
    sizes = [args.peak_size] if args.peak_size else [512, 1024, 2048, 4096, 8192]
    for name, dtype in (("float32", jnp.float32), ("bfloat16", jnp.bfloat16)):
        for n in sizes:
            gflops, per_call = matmul_gflops(n, dtype)
            if per_call >= 0.02:
                break
        result[f"{name}_gflops"] = gflops
        result[f"{name}_size"] = n
    return result
