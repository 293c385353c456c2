"""Memory per device of the compiled train step under several device meshes, as a markdown table.

``python launch/memory_report.py --config configs/final_base.py --devices 8`` compiles (never
runs) the sharded train step of the config's model for each ``--meshes`` entry and prints XLA's
``memory_analysis()`` per device: arguments (train state + batch), outputs, temporaries
(activations, gradients, collectives' buffers) and their peak sum (outputs alias the donated
state). ``--devices N`` simulates N CPU devices when no accelerator is present.
"""

from __future__ import annotations

import argparse
import os

from docnmt_jax import cli

MiB = 2**20


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = cli.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="configs/final_base.py", help="config file")
    parser.add_argument(
        "--meshes",
        default="8,1,1 1,8,1 2,4,1 4,1,2 2,1,4 2,2,2 1,1,8",
        help="space-separated data,fsdp,model sizes",
    )
    parser.add_argument("--rows", type=int, default=16, help="global batch rows (chunks)")
    parser.add_argument("--sentences", type=int, default=4, help="sentences per chunk")
    parser.add_argument("--length", type=int, default=32, help="tokens per sentence")
    parser.add_argument("--devices", type=int, default=0, help="simulated CPU devices (0: real)")
    return parser.parse_args(argv)


def step_memory(config, mesh: tuple[int, int, int], rows: int, sentences: int, length: int):
    """``memory_analysis()`` of the train step of ``config`` compiled for ``mesh``."""
    import jax

    from docnmt_jax import parallel
    from docnmt_jax.data.schema import dummy_batch
    from docnmt_jax.models import build_model
    from docnmt_jax.objectives import build_objective
    from docnmt_jax.training import state as train_state
    from docnmt_jax.training import trainer

    layout = parallel.Layout(parallel.make_mesh(dict(zip(parallel.MESH_AXES, mesh, strict=True))))
    model = build_model(config.model, config.data.vocab_size, config.train.label_smoothing)
    objective = build_objective(config.get("objective", {}), model)
    shardings, state, tx, schedule = train_state.build_optimizer_state(
        model, config, layout, note=lambda _: None
    )
    batch = {
        k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=layout.batch)
        for k, v in dummy_batch(sentences, length, rows).items()
    }
    train_step, _ = trainer.make_steps(
        objective, tx, schedule, config.train.seed, layout, shardings
    )
    return train_step.lower(state, batch).compile().memory_analysis()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.devices:
        os.environ["XLA_FLAGS"] = (
            os.environ.get("XLA_FLAGS", "")
            + f" --xla_force_host_platform_device_count={args.devices}"
        )
    from docnmt_jax.config_files import load_config

    config = load_config(args.config)
    m = config.model
    print(
        f"{args.config}: d_model {m.d_model}, ffn {m.ffn_dim}, {m.num_heads} heads, "
        f"{m.num_encoder_layers}+{m.num_decoder_layers} layers, vocab {config.data.vocab_size}; "
        f"batch [{args.rows}, {args.sentences}, {args.length}]; MiB per device\n"
    )
    print("| mesh (data, fsdp, model) | arguments | outputs | temporaries | peak |")
    print("|---|---:|---:|---:|---:|")
    for text in args.meshes.split():
        mesh = tuple(int(x) for x in text.split(","))
        mem = step_memory(config, mesh, args.rows, args.sentences, args.length)
        sizes = [mem.argument_size_in_bytes, mem.output_size_in_bytes, mem.temp_size_in_bytes]
        sizes.append(sum(sizes) - mem.alias_size_in_bytes)
        print(f"| {mesh} | " + " | ".join(f"{x / MiB:.1f}" for x in sizes) + " |", flush=True)


def run() -> None:
    """The command line: ``python launch/memory_report.py``."""
    cli.run_argparse(main)


if __name__ == "__main__":
    run()
