"""The rows of the recipe study (``experiments/recipe_study.py``): one training recipe each.

A row names every setting its recipe depends on (normalisation, warm-up, peak, clipping,
batch, regularisation), so it means the same whatever the shipped defaults are. ``budget``
is in units of the study's budget (1.21M real target tokens, about 1.3 Bible epochs).
"""

from __future__ import annotations

import dataclasses
from typing import Any

TRANSFORMER = "configs/transformer.py"
#: The EMA decay every row keeps (ramped: min(0.999, (1+t)/(10+t)); ~70 updates at step 600).
EMA = 0.999
FINAL = "configs/final.py"


@dataclasses.dataclass(frozen=True)
class Recipe:
    name: str
    description: str
    overrides: tuple[tuple[str, Any], ...]
    config: str = TRANSFORMER
    budget: float = 1.0
    init_from: str = ""  # a row whose trained run initialises this one (finetuning)
    average: int = 0  # also measure the average of this many last checkpoints (0: no)
    #: a row with the same recipe whose last checkpoint this one resumes from (its schedule and
    #: data order are functions of the step, so continuing it equals training from scratch)
    continues: str = ""
    #: a divergence check: the config's shipped defaults, measured with its default parameter
    #: set on the test books only (a row that asks whether the model trains, not how well)
    check: bool = False

    def key(self) -> dict[str, Any]:
        """What the row's records depend on (a changed row is run again)."""
        return {
            "config": self.config,
            "overrides": [list(kv) for kv in self.overrides],
            "budget": self.budget,
            "init_from": self.init_from,
        }


def schedule(
    pre_ln: bool,
    warmup: int,
    lr_scale: float = 1.0,
    peak: float = 0.0,
    clip: float = 0.0,
    batch: int = 2048,
    ema: float = EMA,
) -> tuple[tuple[str, Any], ...]:
    """The overrides of one recipe: layer-norm placement, inverse-sqrt warm-up and peak
    (``peak`` absolute, else d_model-scaled times ``lr_scale``), clipping, batch tokens, and
    the EMA kept beside the parameters (it does not change their training: both are
    measured)."""
    return (
        ("model.pre_ln", pre_ln),
        ("train.warmup_steps", warmup),
        ("train.lr_scale", lr_scale),
        ("train.learning_rate", peak),
        ("train.clip_norm", clip),
        ("data.batch_src_tokens", batch),
        ("data.batch_tgt_tokens", batch),
    ) + ((("train.ema_decay", ema),) if ema else ())


#: The recipes screened at the budget, in the order they are run (the most informative first).
SCREEN: tuple[Recipe, ...] = (
    Recipe(
        "preln_w150_x0.3_clip",
        "pre-LN, warm-up 150, x0.3 (peak 1.53e-3), clip 1 (the flags measured before the study)",
        schedule(True, 150, lr_scale=0.3, clip=1.0, ema=0.0),  # trained before the EMA
    ),
    Recipe(
        "preln_b1024",
        "pre-LN, 1,024-token batches (2x the updates), warm-up 300, peak 1.5e-3, clip 1",
        schedule(True, 300, peak=1.5e-3, clip=1.0, batch=1024),
    ),
    Recipe(
        "preln_b512",
        "pre-LN, 512-token batches (4x the updates), warm-up 600, peak 1e-3, clip 1",
        schedule(True, 600, peak=1e-3, clip=1.0, batch=512),
    ),
    Recipe(
        "preln_peak3e-3",
        "pre-LN, warm-up 150, peak 3e-3, clip 1",
        schedule(True, 150, peak=3e-3, clip=1.0),
    ),
    Recipe(
        "postln_table",
        "post-LN, warm-up 400, x0.5 (peak 1.56e-3): the budget table's recipe",
        schedule(False, 400, lr_scale=0.5),
    ),
    Recipe(
        "preln_table",
        "pre-LN with the budget table's schedule (warm-up 400, x0.5)",
        schedule(True, 400, lr_scale=0.5),
    ),
    Recipe(
        "postln_peak7e-4_clip",
        "post-LN, warm-up 150, peak 7e-4, clip 1",
        schedule(False, 150, peak=7e-4, clip=1.0),
    ),
    Recipe(
        "preln_peak7e-4",
        "pre-LN, warm-up 150, peak 7e-4, clip 1",
        schedule(True, 150, peak=7e-4, clip=1.0),
    ),
    Recipe(
        "postln_paper",
        "post-LN, warm-up 8,000, x1 (the papers' schedule, the shipped default until now)",
        schedule(False, 8000),
    ),
)


def follow_ups(best: Recipe, second: Recipe) -> tuple[Recipe, ...]:
    """The rows that take the two recipes chosen on dev further: each continued to ~4 epochs
    (3x the budget; EMA and the average of the last 5 checkpoints measured beside the last
    one); FINAL under the best recipe from scratch (on the documents, and on their
    multi-resolution cuts: its batches as varied as a sentence model's), and finetuned from
    the best row's Transformer (source & target TL) beside that Transformer continued for the
    same tokens (its same-token control)."""
    longer = tuple(
        dataclasses.replace(
            r,
            name=f"{r.name}_4ep",
            description=f"{r.name} continued to ~4 epochs (3x the budget)",
            budget=3.0,
            average=5,
            continues=r.name,
        )
        for r in (best, second)
    )
    finetune = (("init_from_rules", "all"),)
    return longer + (
        Recipe(
            f"final_{best.name}",
            f"FINAL from scratch under {best.name}, on the documents' 20-sentence chunks",
            best.overrides + (("data.train_as", "documents"),),
            config=FINAL,
        ),
        Recipe(
            f"final_multires_{best.name}",
            f"FINAL from scratch under {best.name}, trained on every document also cut into "
            "2, 4, 8, ... parts and single sentences (multi-resolution, Sun et al. 2022)",
            best.overrides + (("data.train_as", "multi_resolution"),),
            config=FINAL,
        ),
        Recipe(
            f"final_finetuned_{best.name}",
            f"FINAL finetuned from {best.name}'s Transformer (source & target TL), on the "
            "multi-resolution cuts (FINAL's default)",
            best.overrides + finetune + (("data.train_as", "multi_resolution"),),
            config=FINAL,
            init_from=best.name,
        ),
        Recipe(
            f"transformer_continued_{best.name}",
            f"{best.name}'s Transformer continued for the finetune budget (its control)",
            best.overrides + finetune,
            init_from=best.name,
        ),
    )


#: The document models checked under their configs' shipped defaults (no schedule override),
#: with the layout each has in the results table. FINAL's check is ``final_preln_b1024``:
#: that recipe is the defaults.
DEFAULTS_CHECKED = ("doc2doc", "doct", "hmgdc", "jean_cho", "jean_cho_margin")


def defaults_checks() -> tuple[Recipe, ...]:
    """One divergence check per document model of :data:`DEFAULTS_CHECKED`: its config and
    layout overrides as in the results table, the schedule left at the defaults."""
    from experiments.results_rows import rows

    by_name = {row.name: row for row in rows(seeds=())}
    return tuple(
        Recipe(
            f"defaults_{name}",
            f"{by_name[name].label}: the config's defaults (does it train?)",
            tuple(by_name[name].overrides),
            config=by_name[name].config,
            check=True,
        )
        for name in DEFAULTS_CHECKED
    )


def _by_name(name: str) -> Recipe:
    return next(r for r in SCREEN if r.name == name)


#: The two recipes best on dev (s-BLEU, their better parameter set) among those measured when
#: the follow-ups were set: docs/recipe_study.md.
CHOSEN = ("preln_b1024", "preln_b512")

#: Every row in run order: the first four screened recipes, the chosen two's follow-ups, the
#: document models' divergence checks, then the rest of the screen.
RECIPES: tuple[Recipe, ...] = (
    SCREEN[:4] + follow_ups(*(_by_name(n) for n in CHOSEN)) + defaults_checks() + SCREEN[4:]
)


def select(names: str) -> list[Recipe]:
    """The rows named in the comma-separated ``names`` (all when empty); an unknown name is a
    one-line error."""
    if not names:
        return list(RECIPES)
    by_name = {r.name: r for r in RECIPES}
    chosen = []
    for name in names.split(","):
        if name not in by_name:
            raise SystemExit(
                f"recipe_study.py: error: unknown row {name!r}; rows: {', '.join(by_name)}"
            )
        chosen.append(by_name[name])
    return chosen
