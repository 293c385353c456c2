"""Prepares a parallel document corpus as TSV files plus ``stats.json``.

Usage (from the repository root)::

    python launch/prepare_data.py --corpus bible --out data/bible [--sword_path DIR]

    python launch/prepare_data.py --corpus synthetic --out data/synthetic [--seed 0]

    python launch/prepare_data.py --corpus synthetic_long --out data/synthetic_long [--seed 0]

``bible``: the Spanish→English Bible corpus (Reina-Valera 1909 → text derived from
the WEB), one document per chapter; see :mod:`docnmt_jax.data.bible`. Needs the
SWORD modules from ``apt-get install -y sword-text-sparv sword-text-web``.
``synthetic``: the synthetic context task (:mod:`docnmt_jax.data.synthetic`), with its
context-dependence labels (``{split}.labels.jsonl``) beside the TSVs.
``pronoun_sets``: the Spanish→English pronoun contrastive sets (docs/evaluation.md;
:mod:`docnmt_jax.data.pronoun_set`) of es→en corpus TSVs (``--pronoun_input``, default the
``test.tsv`` and ``dev.tsv`` found in ``--out``): ``NAME.pronouns.jsonl`` (gender), with
``NAME.possessors.jsonl`` (possessor number) when it holds 50 balanced instances, and
``NAME.pronoun_sets.json`` (counts) in ``--out``::

    python launch/prepare_data.py --corpus pronoun_sets --out data/bible

``synthetic_long``: the long-document task (:mod:`docnmt_jax.data.synthetic_long`; 30-200
sentences per document, dependencies across the 20-sentence chunk boundary), same files.

New corpora are added to :data:`CORPORA` (name → function(out_dir) returning stats).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable

from absl import app, flags, logging

from docnmt_jax import cli
from docnmt_jax.data import bible, pronoun_set, synthetic, synthetic_long
from docnmt_jax.errors import RunNotFoundError
from docnmt_jax.files import write_atomic

FLAGS = flags.FLAGS


def _prepare_bible(out_dir: str) -> str:
    """Builds the Bible corpus in ``out_dir``; returns the printable statistics."""
    stats = bible.prepare_bible(out_dir, sword_path=FLAGS.sword_path or None)
    return bible.format_stats(stats)


def _prepare_synthetic(out_dir: str) -> str:
    """Writes the synthetic context task with default settings; returns its statistics."""
    config = synthetic.SyntheticConfig(
        num_documents=FLAGS.synthetic_train_documents, seed=FLAGS.seed
    )
    splits = {
        "train": config.num_documents,
        "dev": FLAGS.synthetic_dev_documents,
        "test": FLAGS.synthetic_test_documents,
    }
    synthetic.write_corpus(out_dir, config, splits)
    with open(os.path.join(out_dir, "config.json"), encoding="utf-8") as f:
        info = json.load(f)["splits"]
    lines = [f"synthetic context task (seed {FLAGS.seed}) in {out_dir}"]
    for name, values in info.items():
        lines.append(f"  {name:5s}: " + "  ".join(f"{k}={v}" for k, v in sorted(values.items())))
    return "\n".join(lines)


def _prepare_synthetic_long(out_dir: str) -> str:
    """Writes the long-document synthetic task with default settings; returns its statistics."""
    config = synthetic_long.LongSyntheticConfig(
        num_documents=FLAGS.synthetic_long_train_documents, seed=FLAGS.seed
    )
    splits = {
        "train": config.num_documents,
        "dev": FLAGS.synthetic_long_dev_documents,
        "test": FLAGS.synthetic_long_test_documents,
    }
    synthetic_long.write_corpus(out_dir, config, splits)
    with open(os.path.join(out_dir, "config.json"), encoding="utf-8") as f:
        info = json.load(f)["splits"]
    lines = [f"long-document synthetic context task (seed {FLAGS.seed}) in {out_dir}"]
    for name, values in info.items():
        shown = {k: v for k, v in values.items() if not isinstance(v, dict)}
        shown.update(values["labels_by_phenomenon"])
        lines.append(f"  {name:5s}: " + "  ".join(f"{k}={v}" for k, v in sorted(shown.items())))
    return "\n".join(lines)


def _prepare_pronoun_sets(out_dir: str) -> str:
    """Builds the pronoun contrastive sets of ``--pronoun_input`` in ``out_dir``."""
    inputs = FLAGS.pronoun_input or [
        p for p in (os.path.join(out_dir, f"{s}.tsv") for s in ("test", "dev")) if os.path.exists(p)
    ]
    evidence = FLAGS.pronoun_evidence
    if evidence is None:
        evidence = [p for p in [os.path.join(out_dir, "train.tsv")] if os.path.exists(p)]
    missing = [p for p in [*inputs, *evidence] if not os.path.exists(p)]
    if missing or not inputs:
        raise RunNotFoundError(
            f"{missing[0]}: no such corpus TSV"
            if missing
            else f"{out_dir}: no test.tsv or dev.tsv to build pronoun sets from (--pronoun_input)"
        )
    os.makedirs(out_dir, exist_ok=True)
    summaries = []
    for tsv in inputs:
        name = os.path.splitext(os.path.basename(tsv))[0]
        prefix = os.path.join(out_dir, name)
        stats = pronoun_set.build_sets(tsv, prefix, evidence, FLAGS.pronoun_chunk, FLAGS.seed)
        write_atomic(f"{prefix}.pronoun_sets.json", json.dumps(stats, indent=2) + "\n")
        summaries.append(pronoun_set.format_stats(stats, tsv))
    return "\n".join(summaries)


#: corpus name -> function(out_dir) that writes the corpus and returns a stats summary.
CORPORA: dict[str, Callable[[str], str]] = {
    "bible": _prepare_bible,
    "synthetic": _prepare_synthetic,
    "synthetic_long": _prepare_synthetic_long,
    "pronoun_sets": _prepare_pronoun_sets,
}

flags.DEFINE_enum("corpus", "bible", list(CORPORA), "Which corpus to prepare.")
flags.DEFINE_string("out", None, "Output directory (created if missing).")
flags.DEFINE_string(
    "sword_path",
    None,
    "SWORD data directory holding mods.d/ and modules/ (default: $SWORD_PATH, else "
    "/usr/share/sword and ~/.sword).",
)
flags.DEFINE_integer("seed", 0, "Random seed (synthetic corpus).")
flags.DEFINE_integer("synthetic_train_documents", 2000, "Training documents (synthetic corpus).")
flags.DEFINE_integer("synthetic_dev_documents", 500, "Dev documents (synthetic corpus).")
flags.DEFINE_integer("synthetic_test_documents", 1000, "Test documents (synthetic corpus).")
flags.DEFINE_integer(
    "synthetic_long_train_documents", 1300, "Training documents (synthetic_long).", lower_bound=0
)
flags.DEFINE_integer(
    "synthetic_long_dev_documents", 100, "Dev documents (synthetic_long).", lower_bound=0
)
flags.DEFINE_integer(
    "synthetic_long_test_documents", 300, "Test documents (synthetic_long).", lower_bound=0
)
flags.DEFINE_list(
    "pronoun_input", [], "pronoun_sets: es->en corpus TSVs (default: OUT/test.tsv, OUT/dev.tsv)."
)
flags.DEFINE_list(
    "pronoun_evidence",
    None,
    "pronoun_sets: more TSVs whose sources tell verbs after la/lo (default: OUT/train.tsv).",
)
flags.DEFINE_integer(
    "pronoun_chunk", 20, "pronoun_sets: the model's chunk (sentences) for in_chunk.", lower_bound=2
)
flags.mark_flag_as_required("out")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    start = time.perf_counter()
    logging.info("preparing corpus %r in %s", FLAGS.corpus, FLAGS.out)
    summary = CORPORA[FLAGS.corpus](FLAGS.out)  # a missing SWORD module: a UserError
    print(summary)
    logging.info("done in %.1f s", time.perf_counter() - start)


def run() -> None:
    """The ``docnmt-prepare`` command (``python launch/prepare_data.py``)."""
    cli.run(main)


if __name__ == "__main__":
    run()
