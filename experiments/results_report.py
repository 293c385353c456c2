"""The results table's report (``experiments/results.py``): the records of every row turned
into ``results.md`` / ``results.json``: one table, the spread over the seeds of the
Transformer and FINAL (which differences exceed it), the paired significance of each document
row against its same-token control, and the quality goals checked on the numbers.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import os
import platform
import statistics
import sys
from collections.abc import Sequence
from typing import Any

from docnmt_jax.errors import ConfigError
from docnmt_jax.files import write_atomic
from experiments.results_rows import CONTROL, CONVERGED_SEEDED, SEEDED, Row
from experiments.results_significance import significance_lines
from experiments.results_stages import Plan, Settings, row_complete

GOAL_S_BLEU, GOAL_D_BLEU = 2.0, 2.5


def _fmt(value: float | None, spec: str = ".2f") -> str:
    return (
        "–"
        if value is None or (isinstance(value, float) and math.isnan(value))
        else (format(value, spec))
    )


#: The numbers of ``experiments/context_use.py`` (its ``read_context_use``).
CONTEXT_USE_KEYS = (
    "pronoun_only_true",
    "pronoun_only_random",
    "pronoun_mcnemar_p",
    "cxmi",
    "delta_d",
)


def row_numbers(record: dict[str, Any]) -> dict[str, Any]:
    """The table's numbers of one row record (``None`` where a stage is missing)."""
    m, t, s, p = (record.get(k) or {} for k in ("measure", "train", "synthetic", "params"))
    used = record.get("context_use") or {}
    scores = m.get("scores") or {}
    context = m.get("context")
    return {
        "s_bleu": (scores.get("s_bleu") or {}).get("score"),
        "d_bleu": (scores.get("d_bleu") or {}).get("score"),
        "chrf": (scores.get("chrf") or {}).get("score"),
        "subset_bleu": (m.get("context_subset") or {}).get("s_bleu"),
        "random_bleu": context["context_marginalised_bleu"] if context else None,
        "delta_bleu": context["delta_bleu"] if context else None,
        "single_bleu": (m.get("single_sentence") or {}).get("score"),
        "pronoun_f1": (m.get("pronouns") or {}).get("f1"),
        **{k: used.get(k) for k in CONTEXT_USE_KEYS},
        "params": p.get("params"),
        "train_tokens_per_s": t.get("train_tokens_per_s"),
        "decode_sentences_per_s": (m.get("decode") or {}).get("sentences_per_s"),
        "synthetic": s.get("accuracy"),
        "steps": t.get("steps"),
        "epochs": t.get("epochs"),
        "wall_minutes": (t.get("wall_seconds") or 0) / 60 if t else None,
        "train_tokens_m": t["steps"] * t["tokens_per_step"] / 1e6
        if t.get("steps") and t.get("tokens_per_step")
        else None,
        "cpu_hours": t["cpu_seconds"] / 3600 if t.get("cpu_seconds") else None,
    }


def spread(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (NaN for fewer than two values: a spread that is
    not measured is not zero)."""
    values = [v for v in values if v is not None]
    if not values:
        return float("nan"), float("nan")
    sd = statistics.stdev(values) if len(values) > 1 else float("nan")
    return statistics.fmean(values), sd


def seed_spread(numbers: dict[str, dict[str, Any]], base: str, key: str) -> tuple[float, float]:
    names = [n for n in numbers if n == base or n.startswith(base + "_seed")]
    return spread([numbers[n][key] for n in names])


def seed_count(numbers: dict[str, dict[str, Any]], base: str) -> int:
    """How many seeds of ``base`` have an s-BLEU."""
    names = [n for n in numbers if n == base or n.startswith(base + "_seed")]
    return sum(numbers[n].get("s_bleu") is not None for n in names)


def goals(numbers: dict[str, dict[str, Any]], row_list: Sequence[Row]) -> list[str]:
    """The results table's quality goals checked on the numbers, one line each."""
    lines = []
    t_s, t_sd = seed_spread(numbers, "transformer", "s_bleu")
    f_s, f_sd = seed_spread(numbers, "final", "s_bleu")
    t_d, _ = seed_spread(numbers, "transformer", "d_bleu")
    f_d, _ = seed_spread(numbers, "final", "d_bleu")
    if not any(math.isnan(x) for x in (t_s, f_s, t_d, f_d)):
        ds, dd = f_s - t_s, f_d - t_d
        lines.append(
            f"- FINAL ≥ +{GOAL_S_BLEU} s-BLEU over the sentence Transformer (seed means): "
            f"{ds:+.2f} — {'holds' if ds >= GOAL_S_BLEU else f'missed by {GOAL_S_BLEU - ds:.2f}'}"
        )
        lines.append(
            f"- FINAL ≥ +{GOAL_D_BLEU} d-BLEU: {dd:+.2f} — "
            f"{'holds' if dd >= GOAL_D_BLEU else f'missed by {GOAL_D_BLEU - dd:.2f}'}"
        )
    positive, other = [], []
    for row in row_list:
        delta = numbers.get(row.name, {}).get("delta_bleu")
        if delta is not None:
            (positive if delta > 0 else other).append(f"{row.name} {delta:+.2f}")
    if positive or other:
        lines.append(
            f"- every document model's Δ_BLEU > 0: {len(positive)} of "
            f"{len(positive) + len(other)} rows" + (f"; not: {', '.join(other)}" if other else "")
        )
    for plain, margin in (
        ("jean_cho", "jean_cho_margin"),
        ("jean_cho", "jean_cho_margin_stopgrad"),
        ("final", "final_margin"),
    ):
        a = numbers.get(plain, {}).get("delta_bleu")
        b = numbers.get(margin, {}).get("delta_bleu")
        if a is not None and b is not None:
            lines.append(
                f"- the margin regulariser raises Δ_BLEU ({margin} against {plain}): "
                f"{b:+.2f} against {a:+.2f} — {'holds' if b > a else 'does not hold'}"
            )
    control = numbers.get(CONTROL, {})
    for row in row_list:
        n = numbers.get(row.name, {})
        if row.init_from != "transformer" or row.name == CONTROL or n.get("s_bleu") is None:
            continue
        if control.get("s_bleu") is None:
            lines.append(
                f"- {row.name} has twice the tokens of the rows above; its like-for-like "
                f"control, `{CONTROL}`, is not run yet (`--rows {CONTROL}`)"
            )
            continue
        lines.append(
            f"- {row.name} against `{CONTROL}` (the same tokens in all): s-BLEU "
            f"{n['s_bleu'] - control['s_bleu']:+.2f}, d-BLEU {n['d_bleu'] - control['d_bleu']:+.2f}"
        )
    return lines


#: The converged comparison's goal: a document model over its same-token control.
GOAL_CONVERGED_S, GOAL_CONVERGED_D, GOAL_P = 1.0, 1.5, 0.05


def converged_goals(numbers: dict[str, dict[str, Any]], paired: dict[str, Any]) -> list[str]:
    """The converged goal per document model (its seeds together): every seed pair ≥
    +1.0 s-BLEU and ≥ +1.5 d-BLEU over its control with Holm-corrected p < 0.05 (paired
    bootstrap, the larger of the two metrics' p)."""
    by_model: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for name, r in paired.items():
        if "holm" in r:
            by_model.setdefault(name.split("_seed")[0], []).append((name, r))
    lines = []
    for model, pairs in by_model.items():
        cells, met = [], True
        for name, r in pairs:
            ds = r["bs"]["s_bleu"]["system"] - r["bs"]["s_bleu"]["baseline"]
            dd = r["bs"]["d_bleu"]["system"] - r["bs"]["d_bleu"]["baseline"]
            p = max(r["holm"]["bs"]["s_bleu"], r["holm"]["bs"]["d_bleu"])
            met = met and ds >= GOAL_CONVERGED_S and dd >= GOAL_CONVERGED_D and p < GOAL_P
            cells.append(f"{name} vs {r['control']}: {ds:+.2f} / {dd:+.2f}, Holm p {p:.4f}")
        lines.append(
            f"- {model} ≥ +{GOAL_CONVERGED_S} s-BLEU and ≥ +{GOAL_CONVERGED_D} d-BLEU over its "
            f"control, Holm p < {GOAL_P}, in each of {len(pairs)} seed pair(s): "
            + ("holds" if met else "does not hold")
            + " ("
            + "; ".join(cells)
            + ")"
        )
    return lines


COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("s_bleu", "s-BLEU", ".2f"),
    ("d_bleu", "d-BLEU", ".2f"),
    ("chrf", "chrF", ".1f"),
    ("subset_bleu", "s-BLEU, context books", ".2f"),
    ("random_bleu", "BLEU, random context", ".2f"),
    ("delta_bleu", "Δ_BLEU", "+.2f"),
    ("single_bleu", "single-sentence BLEU", ".2f"),
    ("pronoun_f1", "pronoun F1", ".3f"),
    ("pronoun_only_true", "pronoun acc., context-only", ".3f"),
    ("pronoun_only_random", "the same, random context", ".3f"),
    ("pronoun_mcnemar_p", "McNemar p vs control", ".4f"),
    ("cxmi", "CXMI", "+.4f"),
    ("delta_params", "Δ\\|θ\\|", "+,d"),  # escaped: a bar would split the cell
    ("train_ratio", "train tok/s ratio", ".2f"),
    ("decode_ratio", "decode sent/s ratio", ".2f"),
    ("synthetic", "synthetic acc.", ".3f"),
    ("steps", "steps", ",d"),
    ("epochs", "epochs", ".2f"),
    ("train_tokens_m", "train tokens (M)", ".2f"),
    ("wall_minutes", "train min", ".1f"),
    ("cpu_hours", "train CPU h", ".2f"),
)


def add_ratios(numbers: dict[str, dict[str, Any]]) -> None:
    base = numbers.get("transformer", {})
    for n in numbers.values():
        for key, ratio in (
            ("train_tokens_per_s", "train_ratio"),
            ("decode_sentences_per_s", "decode_ratio"),
        ):
            n[ratio] = n[key] / base[key] if n.get(key) and base.get(key) else None
        n["delta_params"] = (
            n["params"] - base["params"] if n.get("params") and base.get("params") else None
        )


def markdown_table(row_list: Sequence[Row], numbers: dict[str, dict[str, Any]]) -> str:
    head = "| row | " + " | ".join(title for _, title, _ in COLUMNS) + " |"
    lines = [head, "|---|" + "---:|" * len(COLUMNS)]
    for row in row_list:
        n = numbers.get(row.name, {})
        cells = [_fmt(n.get(key), spec) for key, _, spec in COLUMNS]
        lines.append(f"| {row.label} (`{row.name}`) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def report(
    row_list: Sequence[Row],
    records: dict[str, dict[str, Any]],
    settings: Settings,
    header: str,
    paired: dict[str, dict[str, Any]] | None = None,
) -> tuple[str, dict[str, Any]]:
    """The markdown report and its JSON: the table, the seed spreads, the paired
    significance of each document row against its same-token control (``paired``:
    :func:`~experiments.results_significance.paired_rows`), the quality goals, the
    signatures."""
    numbers = {row.name: row_numbers(records.get(row.name, {})) for row in row_list}
    for row in row_list:  # rows sharing an architecture share its synthetic accuracy
        if numbers[row.name]["synthetic"] is None and row.base in numbers:
            numbers[row.name]["synthetic"] = numbers[row.base]["synthetic"]
    add_ratios(numbers)
    lines = [header, "", markdown_table(row_list, numbers), ""]
    lines.append("**Seed spread** (mean ± sample standard deviation over seeds):")
    for base in CONVERGED_SEEDED if settings.converged else SEEDED:
        cells = []
        for key, title in (("s_bleu", "s-BLEU"), ("d_bleu", "d-BLEU"), ("chrf", "chrF")):
            mean, sd = seed_spread(numbers, base, key)
            cells.append(f"{title} {_fmt(mean)} ± {_fmt(sd)}")
        seeds = seed_count(numbers, base)
        lines.append(f"- {base} ({seeds} seed{'s' if seeds != 1 else ''}): " + ", ".join(cells))
    lines += ["", "**Paired significance against the same-token control:**", ""]
    lines += significance_lines(paired or {})
    quality = goals(numbers, row_list) + (
        converged_goals(numbers, paired or {}) if settings.converged else []
    )
    lines += ["", "**Quality goals**:"] + (quality or ["- not measured yet"])
    signatures = next(
        (
            records[r.name]["measure"]["scores"]
            for r in row_list
            if (records.get(r.name) or {}).get("measure")
        ),
        None,
    )
    if signatures:
        lines += [
            "",
            f"sacreBLEU signatures: s-BLEU and d-BLEU `{signatures['s_bleu']['signature']}`, "
            f"chrF `{signatures['chrf']['signature']}`.",
        ]
    missing = [r.name for r in row_list if not row_complete(r, records.get(r.name) or {})]
    if missing:
        lines += ["", f"Rows not yet complete: {', '.join(missing)}."]
    payload = {
        "settings": dataclasses.asdict(settings),
        "rows": [
            {
                "name": r.name,
                "label": r.label,
                "group": r.group,
                "config": r.config,
                "overrides": dict(r.overrides),
                "seed": r.seed,
                "init_from": r.init_from,
                "numbers": numbers[r.name],
                "paired": (paired or {}).get(r.name),
                "records": records.get(r.name, {}),
            }
            for r in row_list
        ],
    }
    return "\n".join(lines) + "\n", payload


def recipe_words(settings: Settings) -> str:
    """How the rows' training recipe is set, for the report's header."""
    if settings.warmup_steps is None and settings.lr_scale is None:
        return (
            "Every row trains with its config's defaults (the recipe chosen on dev by the "
            "recipe study, [`recipe_study.md`](recipe_study.md)); a row at a lower rate says so."
        )
    return (
        f"Every row's warm-up {settings.warmup_steps} and learning-rate scale "
        f"{settings.lr_scale} replace its config's (a run of a few steps)."
    )


def shown_path(path: str) -> str:
    """``path`` relative to the repository when inside it (a report names no machine's
    directories)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rel = os.path.relpath(path, root)
    return path if rel.startswith("..") else rel


def budget_words(settings: Settings, plan: Plan) -> str:
    """The header's paragraph on how long every row trains and which checkpoint is measured."""
    shared = (
        recipe_words(settings)
        + f" One sentencepiece model ({settings.vocab_size} pieces) for every row, seed 0 "
        "unless stated."
    )
    if settings.converged:
        return (
            "**Budget per row: converged.** Every row trains until "
            f"{settings.patience} dev evaluations in a row (one every "
            f"{settings.eval_every_epochs:g} epoch of its own batches) bring no better dev "
            f"BLEU (greedy, the parameters' EMA), at most {settings.max_epochs:g} epochs; the "
            "checkpoint with the best dev BLEU is measured (nothing is chosen on test). "
            "Pretrain→finetune rows start from the best checkpoint (its EMA) of the seed-0 "
            "sentence Transformer"
            + (
                " as committed in its release ("
                + ", ".join(shown_path(d) for _, d in settings.released)
                + "; that row is reported from its saved records)"
                if settings.released
                else ""
            )
            + "; their control (`transformer_continued`) starts from the same parameters "
            "and trains, without early stopping, for as many real target tokens as the "
            "longest-trained FINAL row, its checkpoint chosen on dev within them. FINAL "
            "finetuned and the control are trained with each seed (the seed sets data order, "
            "dropout and FINAL's new parameters), seed k tested against the control of seed "
            "k. FINAL from scratch, Table 3 and the RNN rows stay at the token budget "
            "([`results.md`](results.md)). " + shared
        )
    budget = settings.base_steps * plan.reference_tokens_per_step
    return (
        f"**Budget per row:** the real target tokens of {settings.base_steps:,} packed "
        f"sentence-Transformer steps ({plan.reference_tokens_per_step:,.0f} a step, "
        f"{budget / 1e6:.2f}M tokens, {budget / max(plan.epoch_tokens, 1):.2f} epochs of "
        f"{plan.epoch_tokens:,} training target tokens); each row's steps from its own batch "
        "plan (padding excluded). "
        + shared
        + " Latest checkpoint. Pretrain→finetune rows start from the sentence Transformer row "
        "and then get the same budget again (twice the tokens in all). Training recipes at "
        "this budget, chosen on dev: [`recipe_study.md`](recipe_study.md)."
        + (
            " Not converged: a CPU budget; differences within the seed spread below mean nothing."
            if not settings.quick
            else ""
        )
    )


def header(settings: Settings, plan: Plan) -> str:
    """The report's title and paragraphs: the command, the machine, the budget, the test."""
    import jax

    device = jax.devices()[0]
    kind = (
        "quick run (tiny models: checks the pipeline, not the models)"
        if settings.quick
        else "converged comparison"
        if settings.converged
        else ("budgeted comparison" if device.platform == "cpu" else "comparison")
    )
    shown, skip = [], False  # what makes the table; --stages/--jobs say how this call works
    for a in sys.argv[1:] if argv_is_cli() else []:
        if skip or a == "":
            skip = False
            continue
        skip = a in ("--stages", "--jobs", "--worker")
        if not a.startswith(("--stages", "--jobs", "--worker")):
            shown.append(a)
    command = "python experiments/results.py " + " ".join(shown)
    return "\n".join(
        [
            f"# Results on the Bible (Es→En): {kind}",
            "",
            *(
                [
                    "**The Bible is not prepared on this machine: the synthetic corpus "
                    f"stands in for it ({settings.data_dir}).**",
                    "",
                ]
                if plan.corpus != "Bible"
                else []
            ),
            f"Command: `{command.strip()}` (resumable; `make results`). Written "
            f"{datetime.datetime.now().strftime('%Y-%m-%d %H:%M')} on {platform.node() or 'host'}: "
            f"{os.cpu_count()} CPUs, JAX device {device.device_kind}.",
            "",
            budget_words(settings, plan),
            "",
            f"**Test:** {len(plan.test)} chapters, {sum(len(d) for d in plan.test):,} verses; "
            f"beam {settings.beam}, α {settings.alpha}; s-BLEU, d-BLEU, chrF and pronoun F1 "
            "(clipped English pronoun matches per sentence) on every test chapter. "
            + context_scope(settings, plan)
            + f" BLEU with random context: {settings.draws} draw(s) of contexts from other "
            "chapters (Jean & Cho 2019), Δ_BLEU = BLEU with the true context (s-BLEU, context "
            "books) − that; single-sentence BLEU: every verse of the same chapters translated "
            "alone (Zheng et al. 2020, Table 2). Ratios are to the "
            "sentence Transformer: real train tokens/s from each row's train.log (rows trained one "
            "after another, not interleaved), decode sentences/s over every translation of the "
            "row (compilation included). Synthetic acc.: labelled-word accuracy on the synthetic "
            f"context task (tiny models, {settings.synthetic_steps} steps; chance 0.333).",
        ]
    )


def context_scope(settings: Settings, plan: Plan) -> str:
    """Which chapters the random-context and single-sentence translations cover."""
    if not settings.context_books:
        return "Random-context and single-sentence translations: every test chapter."
    picked = [d for d in plan.test if d.doc_id.startswith(settings.context_books)]
    books = ", ".join(b.rstrip(".") for b in settings.context_books)
    return (
        f"Random-context and single-sentence translations on {books} ({len(picked)} "
        f"chapters, {sum(len(d) for d in picked):,} verses; CPU time), as Jean & Cho's "
        "Table 1 analogue in BUILD_NOTES."
    )


README_BEGIN, README_END = "<!-- results:begin -->", "<!-- results:end -->"


def update_readme(path: str, report: str) -> None:
    """Replaces the text between the results markers of ``path`` with the report's table
    and notes (its title and header paragraphs stay in docs/results.md)."""
    with open(path, encoding="utf-8") as f:
        readme = f.read()
    if README_BEGIN not in readme or README_END not in readme:
        raise ConfigError(f"{path}: no {README_BEGIN} ... {README_END} block to fill")
    table = report[report.index("| row |") :]
    head, rest = readme.split(README_BEGIN, 1)
    _, tail = rest.split(README_END, 1)
    write_atomic(path, f"{head}{README_BEGIN}\n{table.rstrip()}\n{README_END}{tail}")


def argv_is_cli() -> bool:
    return os.path.basename(sys.argv[0]) == "results.py"
