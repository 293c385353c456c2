"""Training recipes for the Bible at one budget of real target tokens: which learns to translate.

    python experiments/recipe_study.py [--out runs/recipe_study] [--rows a,b,...]
        [--doc docs/recipe_study.md] [--data_dir data/bible] [--stages train,measure]

Every row of :data:`RECIPES` is a config file plus the overrides that make its recipe
(schedule, normalisation, clipping, batch size, regularisation), written out in full, so a
row does not change when the shipped defaults do. Each row is trained for the same number of
**real target tokens** (``budget`` x 1.21M, the results runner's budget: 600 steps of the
sentence Transformer's 2,048-token batches, about 1.3 Bible epochs); a row with other batch
sizes gets the same tokens, not the same steps. Stages, each saved as
``OUT/rows/ROW/STAGE.json`` when done (rerun the same command to resume; training resumes
from its checkpoints):

``train``
    ``docnmt_jax.training.trainer.train_and_evaluate`` with the row's config, one shared
    tokenizer (``OUT/spm.model``); dev perplexity at the end, checkpoints every eighth of it.
``measure``
    dev and test books translated with beam 5, alpha 0.6 (the results table's search) from
    the last checkpoint, and from its EMA parameters and the average of the last checkpoints
    where the row has them; sacreBLEU s-BLEU, d-BLEU, chrF, length ratio and empty outputs;
    the source-use probe (log-likelihood per target token lost with another chapter's or
    blank sources, first 6 test chapters).

Recipes are chosen on dev (perplexity and BLEU) and reported on test. The report goes to
``OUT/recipe_study.md`` / ``.json`` and ``--doc``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import traceback
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from experiments import recipe_rows  # noqa: E402
from experiments.recipe_rows import RECIPES, Recipe  # noqa: E402

#: The results runner's budget: 600 steps x 2,015.7 real target tokens (docs/results.json).
BUDGET_TOKENS = 1_209_393
SOURCE_PROBE_DOCS = 6
MAX_LEN = 128  # the training limit of a sentence (tokens with EOS): what the scorer lays out


@dataclasses.dataclass(frozen=True)
class Study:
    out: str
    data_dir: str
    budget_tokens: int = BUDGET_TOKENS
    beam: int = 5
    alpha: float = 0.6
    vocab_size: int = 8000
    model: tuple[tuple[str, Any], ...] = ()  # size overrides (--quick: tiny models)

    def row_dir(self, name: str) -> str:
        return os.path.join(self.out, "rows", name)


def row_config(recipe: Recipe, study: Study, tokenizer_path: str, steps: int) -> Any:
    """The training config of ``recipe``: its file, its overrides, the shared tokenizer and the
    study's step count; dev loss at the end, eight checkpoints kept."""
    from docnmt_jax.config_files import load_config
    from docnmt_jax.training.budget import resize_model, set_key

    config = load_config(recipe.config)
    for key, value in recipe.overrides:
        set_key(config, key, value)
    resize_model(config, study.model)
    config.data.data_dir = study.data_dir
    config.data.tokenizer = tokenizer_path
    config.train.num_steps = steps
    config.train.dev_bleu = False
    config.train.best_metric = "dev_loss"
    config.train.best_mode = "min"
    config.train.eval_every = steps
    config.train.checkpoint_every = max(steps // 8, 1)
    config.train.keep_checkpoints = 8
    config.train.log_every = max(min(50, steps // 8), 1)
    if recipe.init_from:
        config.init_from = study.row_dir(recipe.init_from)
        config.init_from_which = "latest"
    return config


def steps_for(recipe: Recipe, study: Study, tokenizer: Any) -> tuple[int, float, int]:
    """Steps that give the row ``recipe.budget * study.budget_tokens`` real target tokens,
    with its tokens per step and the epoch's target tokens."""
    from docnmt_jax.training.budget import tokens_per_step

    per_step, epoch = tokens_per_step(row_config(recipe, study, tokenizer.model_path, 1), tokenizer)
    return max(round(recipe.budget * study.budget_tokens / per_step), 1), per_step, epoch


def host_peak_gflops() -> float:
    """This host's float32 matmul rate now (2,048-square, GFLOP/s): hosts of one kind differ."""
    import jax.numpy as jnp

    from docnmt_jax.benchmarking.peak import matmul_gflops

    return matmul_gflops(2048, jnp.float32)[0]


def continue_from(source: str, workdir: str) -> None:
    """Copies the newest checkpoint of ``source`` into ``workdir`` when ``workdir`` has none,
    so that training resumes there (the rows share their recipe)."""
    import shutil

    from docnmt_jax.training import averaging, checkpoints

    if checkpoints.has_steps(workdir):
        return
    steps = averaging.step_dirs(source)
    if not steps:
        raise FileNotFoundError(f"{source}: no checkpoint to continue from (train that row first)")
    step, directory = steps[-1]
    target = os.path.join(workdir, "checkpoints", str(step))
    shutil.rmtree(target + ".tmp", ignore_errors=True)
    shutil.copytree(directory, target + ".tmp")
    os.rename(target + ".tmp", target)


def train_stage(recipe: Recipe, study: Study, tokenizer: Any) -> dict[str, Any]:
    from docnmt_jax.training import trainer
    from docnmt_jax.training.budget import train_speed

    peak = host_peak_gflops()
    steps, per_step, epoch = steps_for(recipe, study, tokenizer)
    workdir = study.row_dir(recipe.name)
    if recipe.continues:
        continue_from(study.row_dir(recipe.continues), workdir)
    result = trainer.train_and_evaluate(
        row_config(recipe, study, tokenizer.model_path, steps), workdir
    )
    if result.step < steps:
        raise KeyboardInterrupt(f"{recipe.name}: training stopped at step {result.step}")
    return {
        "steps": result.step,
        "tokens_per_step": per_step,
        "epochs": steps * per_step / epoch,
        "dev": result.dev_metrics,
        "host_peak_gflops": peak,
        **train_speed(os.path.join(workdir, "train.log")),
    }


def bleu_numbers(scores: dict[str, Any]) -> dict[str, Any]:
    return {
        "s_bleu": scores["s_bleu"]["score"],
        "d_bleu": scores["d_bleu"]["score"],
        "chrf": scores["chrf"]["score"],
        "length_ratio": scores["s_bleu"]["ratio"],
        "empty": scores["empty_hypotheses"],
        "signatures": {k: scores[k]["signature"] for k in ("s_bleu", "chrf")},
    }


def translate_and_score(translator: Any, name: str, split: str, study: Study, out: str) -> dict:
    from docnmt_jax.data import readers
    from docnmt_jax.evaluation.metrics import score_documents
    from docnmt_jax.files import write_hypotheses

    documents = readers.read_tsv(os.path.join(study.data_dir, f"{split}.tsv"))
    hyps = translator.translate(documents, progress=f"{name} {split}")
    write_hypotheses(os.path.join(out, f"{split}.{name}.hyp.tsv"), documents, hyps)
    return bleu_numbers(score_documents(hyps, [list(d.tgt) for d in documents]))


def scoring_config(translator: Any) -> Any:
    """The translator's pipeline laid out for teacher-forced scoring: whole target sentences
    (up to the training limit, 128 tokens), not the one-token stubs of translation batches."""
    return dataclasses.replace(
        translator.pipeline_config,
        max_src_len=MAX_LEN,
        max_tgt_len=MAX_LEN,
        sequential_sentences=False,
    )


def source_probe(translator: Any, study: Study) -> dict[str, float]:
    from docnmt_jax.data import readers
    from docnmt_jax.evaluation import context_marginal, source_use

    documents = readers.read_tsv(os.path.join(study.data_dir, "test.tsv"))[:SOURCE_PROBE_DOCS]
    config = scoring_config(translator)
    score = context_marginal.sentence_scorer(
        translator.model, translator.params, translator.tokenizer, config
    )
    measured = source_use.source_sensitivity(score, documents)
    return {"drop_other": measured.drop_other, "drop_blank": measured.drop_blank}


def dev_perplexity(translator: Any, study: Study) -> float:
    """Teacher-forced perplexity of the dev set (exp of the NLL per target token, no label
    smoothing: the trainer's ``dev_ppl``) under the translator's parameters."""
    import math

    from docnmt_jax.data import readers
    from docnmt_jax.evaluation import context_marginal, source_use

    documents = readers.read_tsv(os.path.join(study.data_dir, "dev.tsv"))
    config = scoring_config(translator)
    score = context_marginal.sentence_scorer(
        translator.model, translator.params, translator.tokenizer, config
    )
    loglik, _ = source_use.per_token(score, documents)
    return math.exp(-loglik)


def parameter_sets(workdir: str, average: int) -> list[str]:
    """The parameter sets a row is measured with: the last checkpoint's, its EMA (when the run
    keeps one) and the average of the last ``average`` checkpoints (when it has them)."""
    from docnmt_jax.training import averaging

    names = ["last"]
    if averaging.has_ema(workdir):
        names.append("ema")
    if average > 1 and len(averaging.step_dirs(workdir)) >= average:
        names.append(f"avg{average}")
    return names


def check_measure(recipe: Recipe, study: Study, search: Any, which: str) -> dict[str, Any]:
    """A divergence check's measurement: the test books translated with the run's default
    parameter set ``which`` (its EMA where it keeps one), as a user's ``translate.py`` would."""
    from docnmt_jax.training import restore

    workdir = study.row_dir(recipe.name)
    translator, step = restore.load_translator(workdir, "latest", search, params="auto")
    return {
        "step": step,
        "test": translate_and_score(translator, which, "test", study, workdir),
        "decode_sentences_per_s": translator.stats.sentences / max(translator.stats.seconds, 1e-9),
    }


def measure_stage(recipe: Recipe, study: Study) -> dict[str, Any]:
    from docnmt_jax.decoding.search import SearchConfig
    from docnmt_jax.training import averaging, restore

    workdir = study.row_dir(recipe.name)
    search = SearchConfig(beam_size=study.beam, alpha=study.alpha)
    record: dict[str, Any] = {"beam": study.beam, "alpha": study.alpha}
    if recipe.check:
        which = "ema" if averaging.has_ema(workdir) else "last"
        return {**record, which: check_measure(recipe, study, search, which)}
    for which in parameter_sets(workdir, recipe.average):
        if which.startswith("avg"):
            averaging.average_run(workdir, int(which[3:]))
            translator, step = restore.load_translator(workdir, "averaged", search)
        else:
            translator, step = restore.load_translator(
                workdir, "latest", search, params="ema" if which == "ema" else "raw"
            )
        record[which] = {
            "step": step,
            "dev_ppl": dev_perplexity(translator, study),
            "dev": translate_and_score(translator, which, "dev", study, workdir),
            "test": translate_and_score(translator, which, "test", study, workdir),
            "source_probe": source_probe(translator, study),
            "decode_sentences_per_s": translator.stats.sentences
            / max(translator.stats.seconds, 1e-9),
        }
    return record


STAGES = {"train": train_stage, "measure": measure_stage}


def run_row(recipe: Recipe, study: Study, stages: list[str], tokenizer: Any) -> bool:
    """Runs the row's missing stages; True when every asked stage is done."""
    from docnmt_jax.files import read_record, write_record

    ok = True
    for stage in stages:
        path = os.path.join(study.row_dir(recipe.name), f"{stage}.json")
        inputs = {"recipe": recipe.key(), "budget_tokens": study.budget_tokens}
        saved = read_record(path)
        if saved is not None and saved.get("inputs") == inputs:
            continue
        if stage == "measure" and read_record(path.replace("measure", "train")) is None:
            return False
        print(f"recipe_study: {recipe.name}: {stage}", file=sys.stderr, flush=True)
        try:
            args = (recipe, study, tokenizer) if stage == "train" else (recipe, study)
            record = STAGES[stage](*args)
        except KeyboardInterrupt:
            raise
        except Exception as e:  # one row's failure is reported; the others go on
            os.makedirs(study.row_dir(recipe.name), exist_ok=True)
            with open(path.replace(".json", ".error"), "w", encoding="utf-8") as f:
                f.write(traceback.format_exc())
            print(f"recipe_study: {recipe.name}: {stage} failed: {e}", file=sys.stderr)
            return False
        write_record(path, {**record, "inputs": inputs})
    return ok


def shared_tokenizer(study: Study) -> Any:
    from docnmt_jax.config_files import load_config
    from docnmt_jax.data.tokenizer import get_or_train_tokenizer
    from docnmt_jax.training import data_setup

    config = load_config("configs/transformer.py")
    config.data.data_dir = study.data_dir
    docs = data_setup.load_documents(config.data, "train")
    os.makedirs(study.out, exist_ok=True)
    return get_or_train_tokenizer(
        os.path.join(study.out, "spm.model"), docs, vocab_size=study.vocab_size
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", default="runs/recipe_study", help="run directory")
    p.add_argument("--data_dir", default="data/bible", help="the prepared Bible corpus")
    p.add_argument("--rows", default="", help="comma-separated rows (default: all, in order)")
    p.add_argument("--stages", default="train,measure", help="stages to run ('': report only)")
    p.add_argument("--doc", default="docs/recipe_study.md", help="also write the report here")
    p.add_argument(
        "--quick", action="store_true", help="tiny models, a budget of a few steps (tests)"
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    study = Study(out=args.out, data_dir=args.data_dir)
    if args.quick:
        from docnmt_jax.training.budget import TINY_MODEL

        study = dataclasses.replace(
            study, budget_tokens=6000, beam=2, vocab_size=300, model=TINY_MODEL
        )
    chosen = recipe_rows.select(args.rows)
    stages = [s for s in args.stages.split(",") if s]
    unknown = [s for s in stages if s not in STAGES]
    if unknown:
        print(f"recipe_study.py: error: unknown stage {unknown[0]!r}", file=sys.stderr)
        return 2
    failed = 0
    if stages:
        tokenizer = shared_tokenizer(study)
        for recipe in chosen:
            failed += not run_row(recipe, study, stages, tokenizer)
    from experiments import recipe_report

    recipe_report.write(study, RECIPES, args.doc)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
