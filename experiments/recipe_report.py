"""The recipe study's report: ``OUT/recipe_study.md`` and ``.json`` (and the ``--doc`` copy).

One line per row and parameter set (the last checkpoint; its EMA and checkpoint average where
measured): dev perplexity and dev s-BLEU (what recipes are chosen on), then the test books'
s-BLEU, d-BLEU, chrF, length ratio and empty outputs, the source-use probe, steps, epochs,
train speed and wall time. The row chosen on dev is marked.
"""

from __future__ import annotations

import collections
import datetime
import json
import math
import os
import platform
import re
from collections.abc import Sequence
from typing import Any

COMMAND = "python experiments/recipe_study.py --out runs/recipe_study"
#: A run has collapsed when more than this share of its test outputs is empty or one sentence.
COLLAPSED_SHARE = 0.1
#: A run has diverged when its last logged training loss is this far (nats) above its lowest.
DIVERGED_RISE = 1.0
_LOGGED = re.compile(r"step=(\d+) .*train/loss=(\S+)")
_BAD = re.compile(r"train/bad_steps=(\S+)")


def _read(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _f(value: Any, spec: str = ".2f") -> str:
    return "–" if value is None else format(value, spec)


def output_stats(path: str) -> dict[str, Any] | None:
    """Of a ``doc_id<TAB>hyp`` file: outputs, empty ones, the share of distinct outputs and of
    the most frequent one (None when the file is missing)."""
    try:
        with open(path, encoding="utf-8") as f:
            hyps = [line.rstrip("\n").split("\t", 1)[1] for line in list(f)[1:]]
    except OSError:
        return None
    counts = collections.Counter(h for h in hyps if h.strip())
    n = max(len(hyps), 1)
    return {
        "outputs": len(hyps),
        "empty": sum(not h.strip() for h in hyps),
        "distinct_share": len(counts) / n,
        "top_share": (counts.most_common(1)[0][1] / n) if counts else 0.0,
    }


def loss_curve(log_path: str) -> dict[str, Any]:
    """The logged training losses of a run (``train.log``): first, lowest, last, and the
    non-finite steps the guard skipped (summed over the logged windows)."""
    losses, bad = [], 0.0
    try:
        with open(log_path, encoding="utf-8") as f:
            for line in f:
                if (m := _LOGGED.search(line)) is not None:
                    losses.append(float(m.group(2)))
                    if (b := _BAD.search(line)) is not None:
                        bad += float(b.group(1))
    except OSError:
        pass
    if not losses:
        return {}
    finite = [x for x in losses if math.isfinite(x)]
    return {
        "first": losses[0],
        "lowest": min(finite, default=math.nan),
        "last": losses[-1],
        "bad_steps": int(bad),
    }


def verdict(curve: dict[str, Any], outputs: dict[str, Any] | None) -> str:
    """'trains', or why not: a non-finite or risen loss (diverged), empty or one repeated
    output for more than :data:`COLLAPSED_SHARE` of the test books (collapsed)."""
    if not curve or outputs is None:
        return "not measured yet"
    if not math.isfinite(curve["last"]) or curve["last"] > curve["lowest"] + DIVERGED_RISE:
        return f"diverged (loss {curve['lowest']:.2f} -> {curve['last']:.2f})"
    n = max(outputs["outputs"], 1)
    if outputs["empty"] / n > COLLAPSED_SHARE or outputs["top_share"] > COLLAPSED_SHARE:
        return "collapsed (empty or one repeated output)"
    return "trains"


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
                    "config": recipe.config,
                    "check": recipe.check,
                    "loss": loss_curve(os.path.join(row_dir, "train.log")),
                    "outputs": output_stats(os.path.join(row_dir, f"test.{which}.hyp.tsv")),
                }
            )
    return lines


def chosen(lines: Sequence[dict[str, Any]], budget: float = 1.0) -> dict[str, Any] | None:
    """The measured Transformer row and parameter set at ``budget`` with the best dev s-BLEU
    (document models are not candidates)."""
    pool = [
        x
        for x in lines
        if x["measured"] and x["budget"] == budget and x["config"] == "configs/transformer.py"
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
        if x["check"]:
            continue
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
    rows += checks_table(lines)
    described = sorted({(x["row"], x["description"]) for x in lines}, key=lambda r: r[0])
    legend = ["", "Rows:", ""] + [f"- `{name}`: {text}" for name, text in described]
    sig = next((x["test"].get("signatures") for x in lines if x["test"]), None)
    tail = ["", f"sacreBLEU signatures: {sig}"] if sig else []
    findings = os.path.join(os.path.dirname(os.path.abspath(__file__)), "recipe_findings.md")
    if os.path.exists(findings):
        with open(findings, encoding="utf-8") as f:
            tail += ["", f.read().rstrip()]
    return "\n".join(head + rows + legend + tail) + "\n"


def checks_table(lines: Sequence[dict[str, Any]]) -> list[str]:
    """Every document model's run with its default parameter set (EMA where kept): does it
    train under the defaults, or does it diverge or collapse?"""
    head = [
        "",
        "## Does every document model train under the defaults?",
        "",
        f"Diverged: the last logged training loss over {DIVERGED_RISE:g} nat above the lowest, "
        f"or non-finite. Collapsed: over {COLLAPSED_SHARE:.0%} of the test outputs empty or "
        "one repeated sentence. FINAL's rows train with the recipe the defaults are.",
        "",
        "| row | params | steps | train loss first / lowest / last | bad steps | dev ppl "
        "| test s-BLEU | d-BLEU | empty | distinct outputs | most frequent | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    body = []
    for x in lines:
        if x["config"] == "configs/transformer.py" or x["params"] not in ("ema", "last"):
            continue
        if x["params"] == "last" and any(
            y["row"] == x["row"] and y["params"] == "ema" for y in lines
        ):
            continue
        loss, out, test = x["loss"], x["outputs"] or {}, x["test"]
        body.append(
            f"| {x['row']} | {x['params']} | {_f(x['steps'], 'd')} "
            f"| {_f(loss.get('first'))} / {_f(loss.get('lowest'))} / {_f(loss.get('last'))} "
            f"| {_f(loss.get('bad_steps'), 'd')} | {_f(x['dev_ppl'], '.1f')} "
            f"| {_f(test.get('s_bleu'))} | {_f(test.get('d_bleu'))} | {_f(out.get('empty'), 'd')} "
            f"| {_f(out.get('distinct_share'), '.1%')} | {_f(out.get('top_share'), '.1%')} "
            f"| {verdict(loss, x['outputs'])} |"
        )
    return head + body if body else []


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
