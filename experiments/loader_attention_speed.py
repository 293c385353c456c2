"""CPU training speed of the loaders (tf.data, the prefetching NumPy loader) and the attention
kernels (XLA's fused ``dot_product_attention``, the unfused einsum path), interleaved in one run
on the Bible's own batch plan, so host-to-host drift does not decide the ratios.

    python experiments/loader_attention_speed.py [--steps 60] [--rounds 2] [--out DIR]
        [--data_dir data/bible] [--doc docs/log/loader_attention_speed.md]

Each variant trains the sentence Transformer (the configs' defaults: TED size, 1,024-token
packed batches) for ``--steps`` steps from scratch, ``--rounds`` times in turn (A B C A B C);
the trainer's own real target tokens/s (train.log windows, compilation excluded) is reported
per variant with its ratio to the first, with the host's float32 matmul peak.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: (name, data.loader, DOCNMT_ATTENTION)
VARIANTS = (
    ("tf.data + fused attention (XLA)", "tf", "xla"),
    ("NumPy loader + fused attention (XLA)", "numpy", "xla"),
    ("tf.data + unfused attention (einsum)", "tf", "einsum"),
)


def run_variant(loader: str, attention: str, args: argparse.Namespace, workdir: str) -> float:
    """Real target tokens/s of one training run of ``args.steps`` steps."""
    from docnmt_jax.config_files import load_config
    from docnmt_jax.training import trainer
    from docnmt_jax.training.budget import train_speed

    os.environ["DOCNMT_ATTENTION"] = attention
    shutil.rmtree(workdir, ignore_errors=True)
    config = load_config("configs/transformer.py")
    config.data.data_dir = args.data_dir
    config.data.tokenizer = args.spm
    config.data.loader = loader
    config.train.num_steps = args.steps
    config.train.log_every = max(args.steps // 3, 1)
    config.train.eval_every = config.train.checkpoint_every = 10**9
    config.train.dev_bleu = False
    config.train.best_metric, config.train.best_mode = "dev_loss", "min"
    trainer.train_and_evaluate(config, workdir)
    return train_speed(os.path.join(workdir, "train.log"))["train_tokens_per_s"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--data_dir", default="data/bible")
    p.add_argument("--spm", default="", help="sentencepiece model (default: trained once in --out)")
    p.add_argument("--out", default="runs/loader_attention_speed")
    p.add_argument("--doc", default="", help="also write the report here")
    args = p.parse_args(argv)
    import jax.numpy as jnp

    from docnmt_jax.benchmarking.peak import matmul_gflops
    from docnmt_jax.data import loader
    from docnmt_jax.files import write_atomic

    os.makedirs(args.out, exist_ok=True)
    if not args.spm:
        from docnmt_jax.data import readers
        from docnmt_jax.data.tokenizer import get_or_train_tokenizer

        args.spm = os.path.join(args.out, "spm.model")
        docs = readers.read_tsv(os.path.join(args.data_dir, "train.tsv"))
        get_or_train_tokenizer(args.spm, docs, vocab_size=8000)
    variants = [v for v in VARIANTS if v[1] != "tf" or loader.tensorflow_importable()]
    peak = matmul_gflops(2048, jnp.float32)[0]
    speeds: dict[str, list[float]] = {name: [] for name, _, _ in variants}
    for _ in range(args.rounds):
        for name, data_loader, attention in variants:
            workdir = os.path.join(args.out, "run")
            speeds[name].append(run_variant(data_loader, attention, args, workdir))
    first = statistics.median(speeds[variants[0][0]])
    lines = [
        "# Training speed on CPU: loaders and attention kernels, interleaved",
        "",
        f"`python experiments/loader_attention_speed.py --steps {args.steps} --rounds "
        f"{args.rounds}` ({datetime.date.today().isoformat()}, {platform.machine()}, "
        f"{os.cpu_count()} cores, float32 matmul peak {peak:.0f} GFLOP/s measured first). "
        "Sentence Transformer, the configs' defaults (TED size, 1,024-token packed batches), "
        "real target tokens/s from the trainer's log windows (compilation excluded); "
        "variants in turn each round.",
        "",
        "| variant | tokens/s per round | median | ratio to the first |",
        "|---|---|---|---|",
    ]
    for name, _, _ in variants:
        runs = speeds[name]
        median = statistics.median(runs)
        lines.append(
            f"| {name} | {', '.join(f'{x:.0f}' for x in runs)} | {median:.0f} "
            f"| {median / first:.2f} |"
        )
    text = "\n".join(lines) + "\n"
    for path in [os.path.join(args.out, "report.md")] + ([args.doc] if args.doc else []):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        write_atomic(path, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
