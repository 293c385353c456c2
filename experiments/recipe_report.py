"""The recipe study's report: ``OUT/recipe_study.md`` and ``.json`` (and the ``--doc`` copy).

One line per row and parameter set (the last checkpoint; its EMA and checkpoint average where
measured): dev perplexity and dev s-BLEU (what recipes are chosen on), then the test books'
s-BLEU, d-BLEU, chrF, length ratio and empty outputs, the source-use probe, steps, epochs,
train speed and wall time. The row chosen on dev is marked.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
from collections.abc import Sequence
from typing import Any

COMMAND = "python experiments/recipe_study.py --out runs/recipe_study"


def _read(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _f(value: Any, spec: str = ".2f") -> str:
    return "–" if value is None else format(value, spec)


def collect(study: Any, recipes: Sequence[Any]) -> list[dict[str, Any]]:
    """One entry per row and measured parameter set, in row order (rows not trained yet are
    listed with what they have)."""
    lines = []
    for recipe in recipes:
        row_dir = study.row_dir(recipe.name)
        train = _read(os.path.join(row_dir, "train.json")) or {}
        measure = _read(os.path.join(row_dir, "measure.json")) or {}
        sets = [
            k for k in ("last", "ema", *(k for k in measure if k.startswith("avg"))) if k in measure
        ]
        for which in sets or ["last"]:
            m = measure.get(which, {})
            lines.append(
                {
                    "row": recipe.name,
                    "params": which,
                    "description": recipe.description,
                    "budget": recipe.budget,
                    "steps": train.get("steps"),
                    "epochs": train.get("epochs"),
                    "dev_ppl": m.get("dev_ppl", (train.get("dev") or {}).get("dev_ppl")),
                    "dev": m.get("dev", {}),
                    "test": m.get("test", {}),
                    "source_probe": m.get("source_probe", {}),
                    "train_tokens_per_s": train.get("train_tokens_per_s"),
                    "wall_minutes": (train.get("wall_seconds") or 0) / 60 or None,
                    "host_peak_gflops": train.get("host_peak_gflops"),
                    "measured": bool(m),
                }
            )
    return lines


def chosen(lines: Sequence[dict[str, Any]], budget: float = 1.0) -> dict[str, Any] | None:
    """The measured Transformer row and parameter set at ``budget`` with the best dev s-BLEU
    (FINAL rows are not candidates)."""
    pool = [
        x
        for x in lines
        if x["measured"] and x["budget"] == budget and not x["row"].startswith("final")
    ]
    return max(pool, key=lambda x: x["dev"]["s_bleu"], default=None)


def markdown(lines: Sequence[dict[str, Any]], study: Any) -> str:
    best = chosen(lines)
    peaks = [x["host_peak_gflops"] for x in lines if x["host_peak_gflops"]]
    head = [
        "# Training recipes on the Bible at one budget",
        "",
        f"Command: `{COMMAND}` (resumable; rows in `experiments/recipe_rows.py`). "
        f"Written {datetime.date.today().isoformat()} on {platform.machine()} "
        f"({os.cpu_count()} cores); float32 matmul rate measured before each row (2,048 "
        "square): "
        + (f"{min(peaks):.0f}–{max(peaks):.0f} GFLOP/s" if peaks else "not measured yet")
        + ". Rows ran one after another with other work beside them on the same 2 cores, so "
        "tok/s and wall minutes are not a speed comparison (the benchmark is).",
        "",
        f"Budget: {study.budget_tokens:,} real target tokens x the row's budget (1.0 = the "
        "results runner's 600 steps of 2,048-token batches, ~1.3 epochs). Search: beam "
        f"{study.beam}, alpha {study.alpha}. Recipes are chosen on **dev** (s-BLEU; dev "
        "perplexity beside it), reported on **test** (the Bible's test books). Source probe: "
        "log-likelihood per target token lost with another chapter's / blank sources "
        "(first 6 test chapters).",
        "",
        "| row | params | steps | epochs | dev ppl | dev s-BLEU | test s-BLEU | d-BLEU | chrF "
        "| len ratio | empty | src drop other / blank | tok/s | wall min |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    rows = []
    for x in lines:
        dev, test, probe = x["dev"], x["test"], x["source_probe"]
        mark = " **(chosen)**" if best is x else ""
        rows.append(
            f"| {x['row']}{mark} | {x['params']} | {_f(x['steps'], 'd')} | {_f(x['epochs'])} "
            f"| {_f(x['dev_ppl'], '.1f')} | {_f(dev.get('s_bleu'))} | {_f(test.get('s_bleu'))} "
            f"| {_f(test.get('d_bleu'))} | {_f(test.get('chrf'), '.1f')} "
            f"| {_f(test.get('length_ratio'))} | {_f(test.get('empty'), 'd')} "
            f"| {_f(probe.get('drop_other'))} / {_f(probe.get('drop_blank'))} "
            f"| {_f(x['train_tokens_per_s'], '.0f')} | {_f(x['wall_minutes'], '.1f')} |"
        )
    described = sorted({(x["row"], x["description"]) for x in lines}, key=lambda r: r[0])
    legend = ["", "Rows:", ""] + [f"- `{name}`: {text}" for name, text in described]
    sig = next((x["test"].get("signatures") for x in lines if x["test"]), None)
    tail = ["", f"sacreBLEU signatures: {sig}"] if sig else []
    findings = os.path.join(os.path.dirname(os.path.abspath(__file__)), "recipe_findings.md")
    if os.path.exists(findings):
        with open(findings, encoding="utf-8") as f:
            tail += ["", f.read().rstrip()]
    return "\n".join(head + rows + legend + tail) + "\n"


def write(study: Any, recipes: Sequence[Any], doc: str | None) -> None:
    """Writes the report into ``study.out`` and, when given, ``doc``."""
    lines = collect(study, recipes)
    text = markdown(lines, study)
    os.makedirs(study.out, exist_ok=True)
    paths = [os.path.join(study.out, "recipe_study.md")] + ([doc] if doc else [])
    for path in paths:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    data = {"budget_tokens": study.budget_tokens, "rows": lines}
    json_paths = [os.path.join(study.out, "recipe_study.json")]
    if doc:
        json_paths.append(os.path.splitext(doc)[0] + ".json")
    for path in json_paths:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2, default=float)
            f.write("\n")
