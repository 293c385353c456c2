"""How much context passes Jean & Cho's gate (Appendix A): one run's gate values
``g = Linear([x; x_hat_c])`` (sigmoid or linear) on every real source token of a corpus.

  python experiments/gate_stats.py --workdir runs/table1_synthetic/jean_cho \
      --tsv runs/table1_synthetic/data/test.tsv [--checkpoint latest] [--json]

Tokens are split by whether their sentence has a context (a document's first sentence has
none: ``x_hat_c = 0``). For the tokens with context it prints quantiles of ``g`` over every
feature and the *context share*: per token, ``|g * x_hat_c| / (|g * x_hat_c| + |(1 - g) * x|)``
(L2 norms over the features), the fraction of the fused vector that comes from the context
(0: the context is ignored; the trained model runs without dropout, as in evaluation).
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from docnmt_jax import cli
from docnmt_jax.data import pipeline as pipeline_lib
from docnmt_jax.data import readers
from docnmt_jax.errors import UserError
from docnmt_jax.models import window
from docnmt_jax.training import data_setup, restore

QUANTILES = (0.01, 0.1, 0.5, 0.9, 0.99)


def batch_gates(model, params, batch: dict) -> tuple[np.ndarray, np.ndarray]:
    """``(g [tokens, D], context share [tokens])`` over the real source tokens with context
    of one grid batch, and the same for tokens without context (first sentences)."""
    rows = model.rows(batch)
    _, state = window.encode_windows(model, params, batch, mutable=["intermediates"])
    found = state["intermediates"]
    g, x, x_hat = (found[k][0] for k in ("gate_values", "source_states", "context_states"))
    from_context = jnp.linalg.norm(g * x_hat, axis=-1)
    from_source = jnp.linalg.norm((1.0 - g) * x, axis=-1)
    share = from_context / jnp.maximum(from_context + from_source, 1e-30)
    present = jnp.any(rows["context_mask"] > 0, axis=-1)[:, None]
    real = rows["src_mask"] > 0
    return jax.device_get((g, share, real & present, real & ~present))


def gate_statistics(model, params, tokenizer, docs: list, config) -> dict:
    """Quantiles of ``g`` and of the context share over the tokens of ``docs`` with context,
    the mean ``g`` of the tokens without one, and the token counts."""
    # The run's evaluation batches, on the grid.
    plan = data_setup.plan_batches(config, model, 1, False, tokenizer.encode_batch, docs, False)
    step = jax.jit(lambda p, b: batch_gates(model, p, b))
    gates, shares, alone = [], [], []
    for batch in tqdm(pipeline_lib.numpy_batches(plan), desc="gates", unit="batch"):
        g, share, with_context, without = step(params, batch)
        gates.append(g[with_context].ravel())
        shares.append(share[with_context])
        alone.append(g[without].ravel())
    g, share, first = (np.concatenate(v) for v in (gates, shares, alone))
    return {
        "tokens_with_context": int(share.size),
        "tokens_without_context": int(first.size // max(model.config.d_model, 1)),
        "gate_quantiles": {str(q): float(np.quantile(g, q)) for q in QUANTILES},
        "gate_mean": float(g.mean()),
        "gate_mean_without_context": float(first.mean()) if first.size else float("nan"),
        "context_share_quantiles": {str(q): float(np.quantile(share, q)) for q in QUANTILES},
        "context_share_mean": float(share.mean()),
    }


def main(argv: list[str] | None = None) -> None:
    p = cli.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", required=True, help="a jean_cho run")
    p.add_argument("--tsv", required=True, help="corpus TSV doc_id<TAB>src<TAB>tgt")
    p.add_argument("--checkpoint", default="latest")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    model, tokenizer, config = restore.load_model(args.workdir)
    if model.name != "jean_cho":
        raise UserError(f"{args.workdir}: model {model.name!r} is not jean_cho (no gate)")
    params, step = restore.load_params(model, args.workdir, args.checkpoint)
    docs = readers.read_tsv(args.tsv)
    result = {"workdir": args.workdir, "step": step, "gate": model.config.gate}
    result |= gate_statistics(model, params, tokenizer, docs, config)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    q = " ".join(f"{k}:{v:.3g}" for k, v in result["gate_quantiles"].items())
    s = " ".join(f"{k}:{v:.3g}" for k, v in result["context_share_quantiles"].items())
    print(
        f"{args.workdir} step {step}, {model.config.gate} gate, "
        f"{result['tokens_with_context']} tokens with context"
    )
    print(f"  g quantiles {q}; mean {result['gate_mean']:.3g}")
    print(f"  context share quantiles {s}; mean {result['context_share_mean']:.3g}")


if __name__ == "__main__":
    cli.run_argparse(main)
