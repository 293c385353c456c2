"""Markdown tables of the benchmark results: one ``print_*`` per section, each taking what the
section returned (the JSON of ``launch/benchmark.py --json``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

Results = dict[str, Any]


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """A markdown table; every column but the first is right-aligned."""
    print("| " + " | ".join(headers) + " |")
    print("|---|" + "---:|" * (len(headers) - 1))
    for row in rows:
        print("| " + " | ".join(str(c) for c in row) + " |")


def fmt(value: float | None, spec: str = ",.0f", scale: float = 1.0) -> str:
    """``value * scale`` formatted by ``spec``; "n/a" when there is no value."""
    return "n/a" if value is None else format(value * scale, spec)


def print_peak(result: Results) -> None:
    print(
        f"\n### peak: matmul on {result['device']}: float32 {result['float32_gflops']:,.0f} "
        f"GFLOP/s ({result['float32_size']}²), bfloat16 {result['bfloat16_gflops']:,.0f} "
        f"GFLOP/s ({result['bfloat16_size']}²)\n"
    )


def print_train(result: Results) -> None:
    print(
        f"\n### train: size {result['size']}, {result['dtype']}, MFU against the measured "
        f"{result['dtype']} peak; ratio to {result['baseline']}\n"
    )
    rows = []
    for r in result["runs"]:
        rows.append(
            [
                r["model"],
                "x".join(map(str, r["batch"])),
                f"{r['compile_seconds']:.1f}",
                f"{1000 * r['step_seconds']:.1f}",
                f"{r['tokens_per_s']:,.0f}",
                f"{r['tokens_per_s_ratio']:.2f}",
                fmt(r["flops_per_step"], ".3f", 1e-9),
                fmt(r["jaxpr_over_analytic"], ".3f"),
                fmt(r["xla_over_analytic"], ".3f"),
                fmt(r["achieved_flops_per_s"], ",.1f", 1e-9),
                fmt(r["mfu"], ".1%"),
                f"{r['memory_bytes']['total'] / 2**20:,.2f}",
                f"{r['memory_bytes']['temp'] / 2**20:,.2f}",
            ]
        )
    print_table(
        [
            "model",
            "batch BxSxT",
            "compile s",
            "step ms",
            "target tok/s",
            "tok/s ratio",
            "GFLOP/step",
            "jaxpr dots/analytic",
            "XLA/analytic",
            "GFLOP/s",
            "MFU",
            "compiled MiB",
            "temp MiB",
        ],
        rows,
    )


def print_decode(result: Results) -> None:
    print(
        f"\n### decode: every sentence {result['decode_len']} tokens (EOS forced last); "
        f"ratio to {result['baseline']}\n"
    )
    rows = [
        [
            r["model"],
            r["search"],
            r["sentences"],
            r["calls"],
            f"{r['mean_output_len']:.1f}",
            f"{r['compile_seconds']:.1f}",
            f"{r['compilations']}" + (f" +{r['recompilations']}" if r["recompilations"] else ""),
            f"{1000 * r['seconds']:.1f}",
            f"{r['sentences_per_s']:,.1f}",
            f"{r['tokens_per_s']:,.0f}",
            f"{r['sentences_per_s_ratio']:.2f}",
        ]
        for r in result["runs"]
    ]
    print_table(
        [
            "model",
            "search",
            "sentences",
            "calls",
            "tokens/sent",
            "compile s",
            "compilations",
            "ms (all calls)",
            "sentences/s",
            "tokens/s",
            "sent/s ratio",
        ],
        rows,
    )


def print_growth(result: Results) -> None:
    print(f"\n### growth: train step against batch shape ({result['chunks']} chunks)\n")
    rows = []
    for axis, by_layout in result["sweeps"].items():
        for layout, by_model in by_layout.items():
            for name, points in by_model.items():
                for p in points:
                    rows.append(
                        [
                            name,
                            layout,
                            axis,
                            p["sentences"],
                            p["length"],
                            "x".join(map(str, p["batch"])),
                            p["real_target_tokens"],
                            f"{1000 * p['step_seconds']:.1f}",
                            f"{1000 * p['work_seconds']:.1f}",
                            f"{p['memory_bytes'] / 2**20:,.2f}",
                            f"{p['temp_bytes'] / 2**20:,.2f}",
                            fmt(p["flops_per_step"], ".3f", 1e-9),
                        ]
                    )
    headers = ["model", "layout", "sweep", "S", "T", "batch", "real tgt tokens", "step ms"]
    headers += ["ms per grid batch", "compiled MiB", "temp MiB", "grid GFLOP"]
    print_table(headers, rows)
    print("\nfitted log-log slopes (growth exponents; time per grid batch of real tokens):\n")
    rows = [
        [
            name,
            layout,
            axis,
            f"{s['time']:.2f}",
            f"{s['memory']:.2f}",
            f"{s['temp_memory']:.2f}",
            fmt(s["flops"], ".2f"),
        ]
        for axis, by_layout in result["slopes"].items()
        for layout, by_model in by_layout.items()
        for name, s in by_model.items()
    ]
    headers = ["model", "layout", "against", "time", "memory", "temp memory", "analytic FLOPs"]
    print_table(headers, rows)


def print_pipeline(result: Results) -> None:
    c = result["corpus"]
    print(
        f"\n### pipeline: {result['tsv']} ({c['documents']} documents, {c['sentences']} "
        f"sentences, {c['src_tokens']}+{c['tgt_tokens']} tokens with EOS; encoder: "
        f"{result['encoder']}; tokenised in {result['tokenize_seconds']:.2f} s)\n"
    )
    print(
        "| mode | iterator | batches/s | chunks/s | sentences/s | real tokens/s (src+tgt) "
        "| padded tokens/s | padding % | shapes | resume 1st batch s |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in result["runs"]:
        real = r["src_tokens_per_s"] + r["tgt_tokens_per_s"]
        print(
            f"| {r['mode']} | {r['iterator']} | {r['batches_per_s']:,.0f} "
            f"| {r['chunks_per_s']:,.0f} | {r['sentences_per_s']:,.0f} | {real:,.0f} "
            f"| {r['padded_tokens_per_s']:,.0f} | {100 * r['padding_fraction']:.1f} "
            f"| {r['distinct_shapes']}/{r['declared_shapes']} "
            f"| {r['resume_first_batch_seconds']:.2f} |"
        )


def print_profile(result: Results) -> None:
    print("\n### profile traces (tensorboard --logdir DIR, Profile tab)\n")
    print_table(["model", "trace directory"], list(result["traces"].items()))


def print_corpus(result: Results) -> None:
    c = result["corpus"]
    print(
        f"\n### corpus: {result['tsv']} ({c['documents']} documents, {c['sentences']} "
        f"sentences), size {result['size']}, {result['dtype']}, vocab {result['vocab']}, "
        f"{result['timed_steps']} timed steps per run (the plan's first batches, interleaved)\n"
    )
    print(
        "| model | layout | batches/epoch | padding % | shapes (plan) | compilations (s) "
        "| real tgt tokens/step | real tgt tokens/s | × Transformer | × grid "
        "| at the epoch's fill: tokens/step | tokens/s | × Transformer |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in result["runs"]:
        grid = "" if r["ratio_to_grid"] is None else f"{r['ratio_to_grid']:.2f}"
        print(
            f"| {r['model']} | {r['layout']} | {r['batches_per_epoch']:,} "
            f"| {100 * r['padding_fraction']:.1f} | {r['plan_shapes']} "
            f"| {r['compilations']} ({r['compile_seconds']:.1f}) "
            f"| {r['real_tokens_per_step']:,.0f} | {r['tokens_per_s']:,.0f} "
            f"| {r['ratio_to_transformer']:.2f} | {grid} | {r['epoch_tokens_per_step']:,.0f} "
            f"| {r['epoch_tokens_per_s']:,.0f} | {r['epoch_ratio_to_transformer']:.2f} |"
        )
    if result.get("translate"):
        print_corpus_translate(result["translate"])


def print_corpus_translate(result: Results) -> None:
    """The corpus section's translation of the test books (``result["translate"]``)."""
    print(
        f"\n### corpus translation: {result['test_tsv']} ({result['documents']} documents, "
        f"{result['sentences']} sentences), the Translator's batches of "
        f"{result['batch_tokens']} source tokens; median of {result['repeats']} whole passes "
        f"(interleaved), compilation excluded; ratio to {result['baseline']}; random-init "
        f"params: EOS never generated, every output forced to {result['decode_len']} tokens "
        "(tokens/s counts those decoder steps; tokens/sent is measured)\n"
    )
    rows = [
        [
            r["model"],
            r["search"],
            r["params"],
            r["sentences"],
            r["batches"],
            f"{100 * r['src_padding_fraction']:.1f}",
            r["shapes"],
            f"{r['compilations']}" + (f" +{r['recompilations']}" if r["recompilations"] else ""),
            f"{r['compile_seconds']:.1f}",
            f"{r['mean_output_len']:.1f}",
            f"{r['seconds']:.2f}",
            f"{r['sentences_per_s']:,.1f}",
            f"{r['tokens_per_s']:,.0f}",
            f"{r['sentences_per_s_ratio']:.2f}",
        ]
        for r in result["runs"]
    ]
    print_table(
        [
            "model",
            "search",
            "params",
            "sentences",
            "batches",
            "src padding %",
            "shapes",
            "compilations",
            "compile s",
            "tokens/sent",
            "s (pass)",
            "sentences/s",
            "tokens/s",
            "sent/s ratio",
        ],
        rows,
    )
