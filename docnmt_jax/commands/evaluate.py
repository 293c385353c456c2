"""Scores document translations: s-BLEU, d-BLEU and chrF (sacreBLEU defaults), optionally
pronoun overlap.

Usage (from the repository root)::

    python launch/evaluate.py --hyp runs/NAME/test.hyp.tsv --ref data/bible/test.tsv \\
        [--json] [--lowercase] [--pronouns [--pronoun_lang en | --pronoun_list FILE]] \\
        [--baseline runs/BASE/test.hyp.tsv [--paired bs,ar] [--paired_samples N]]

``--baseline`` adds sacreBLEU's paired tests of ``--hyp`` against that baseline (bootstrap
resampling and approximate randomisation, seed 12345 in the signature): s-BLEU and chrF with
sentences as the resampled segments, d-BLEU with documents
(:mod:`docnmt_jax.evaluation.significance`).

``--hyp``: TSV ``doc_id<TAB>hyp`` (header optional; ``launch/translate.py`` writes it) or plain
text, one sentence per line, blank lines between documents. ``--ref``: the corpus TSV
``doc_id<TAB>src<TAB>tgt``, a TSV ``doc_id<TAB>tgt``, or plain text. A file is a TSV when its
first line holds a tab. Documents are matched by doc id (by position if either file is plain
text); see :mod:`docnmt_jax.evaluation.metrics`. Prints a report, or with ``--json`` one JSON
object, on stdout; a malformed or mismatched file exits with status 2 and a one-line error.

**How much a document model uses its context** (Jean & Cho 2019, Table 1, Sec. 4.4, Fig. 1)::

    python launch/evaluate.py --workdir runs/NAME --ref data/bible/test.tsv \
        [--checkpoint best|latest|STEP] [--context_draws 3 --context_seed 0] \
        [--beam 5 --alpha 0.6] [--out_dir DIR] [--json]

translates ``--ref`` (a corpus TSV with sources) with the run's model, once with the true
context and once per random-context draw, and prints BLEU, the context-marginalised BLEU (mean
over the draws), Delta_BLEU, the Delta^D log-likelihood per token and the share of sentences
that had a foreign context (:mod:`docnmt_jax.evaluation.context_marginal`). With
``--out_dir`` it writes the translations (``hyp.true.tsv``, ``hyp.random_SEED.tsv``), the
scores (``context.json``) and Fig. 1 (``figure1.tsv``, ``figure1.png``) there. ``--hyp``
then also scores that file as usual.

**Contrastive test sets** (forced choice; Voita et al. 2019, ContraPro, Bawden et al. 2018)::

    python launch/evaluate.py --contrastive voita|contrapro|bawden --data PATH \\
        --workdir runs/NAME [--checkpoint best|latest|STEP] [--contrastive_langs SRC,TGT] [--json]

scores every candidate of the set with the run's model (``model.score``, the instance's
context sentences given as the model's document context) and prints the accuracy overall and
per breakdown (Voita: ``ctx_dist``; ContraPro: reference pronoun and antecedent distance
0/1/2/3/>3; Bawden: per set); an instance is right when its correct candidate scores strictly
higher than every other. ``--data``: voita -- the JSON (or JSON Lines) file; contrapro --
``contrapro.json``, with ``contrapro.{text,context}.{en,de}`` (from ContraPro's
``json2text_and_context.pl``) beside it; bawden -- the ``test-sets`` directory (every
``anaphora``/``lexical_choice`` set in it) or one set's prefix (``DIR/anaphora``). The result
(with every candidate's score) is written to ``WORKDIR/contrastive/FORMAT.NAME.json``
(``NAME``: ``--data``'s base name without ``.json``/``.jsonl``). Formats: see
:mod:`docnmt_jax.data.contrastive_sets`. A malformed or missing file exits with status 2 and
one line ``evaluate.py: error: FILE:LINE: reason``.

**Context labels** of the synthetic tasks (:mod:`docnmt_jax.data.synthetic`,
:mod:`docnmt_jax.data.synthetic_long`)::

    python launch/evaluate.py --hyp runs/NAME/test.hyp.tsv --ref data/synthetic_long/test.tsv \\
        --labels data/synthetic_long/test.labels.jsonl [--label_chunk_size 20] [--json]

adds the accuracy on the labelled target words (a label is right when the hypothesis has its
correct word at its token index): overall, per phenomenon, per phenomenon and distance,
``elided_verb`` at chunk starts vs elsewhere and ``register`` per chunk of distances
(:func:`docnmt_jax.data.synthetic_long.long_context_accuracy`).

**Spanish→English pronoun sets** (docs/evaluation.md; built by ``docnmt-prepare --corpus
pronoun_sets``,
:mod:`docnmt_jax.data.pronoun_set`) and **CXMI** (Fernandes et al. 2021)::

    python launch/evaluate.py --contrastive pronouns --data data/bible/test.pronouns.jsonl \
        --workdir RUN [--contrastive_baseline RUN2] [--contrastive_contexts true,none,random] \
        [--cxmi --ref data/bible/test.tsv [--cxmi_sizes 1,2,3,5,10]] [--context_seed 0] [--json]

scores the set with the true context, none and another document's (random), overall and by
gender, antecedent distance and the context-only subset; with ``--contrastive_baseline``
also the baseline run (or release) and McNemar's exact test per context
(:mod:`docnmt_jax.evaluation.pronoun_eval`). ``--cxmi`` (also alone, with ``--workdir`` and
``--ref``) adds CXMI per target token (true context minus none), by context size, and Jean &
Cho's Delta^D on the same windows with ``--context_draws`` random contexts
(:mod:`docnmt_jax.evaluation.cxmi`). Results go to ``WORKDIR/contrastive/pronouns.NAME.json``
and ``WORKDIR/contrastive/cxmi.NAME.json``.

``--pronouns`` adds a "pronouns" section: precision, recall and F1 of clipped per-sentence
pronoun matches against the reference, overall and per pronoun (case-insensitive whatever
``--lowercase`` says; not APT, see :mod:`docnmt_jax.evaluation.pronouns`). The pronouns are
the built-in list of ``--pronoun_lang`` (default ``en``) or those of ``--pronoun_list FILE``
(one word per line, blank and ``#`` lines skipped; implies ``--pronouns``).
"""

from __future__ import annotations

import json
import os

from absl import app, flags, logging

from docnmt_jax import cli
from docnmt_jax.data import context_labels, contrastive_sets, pronoun_set, readers, synthetic_long
from docnmt_jax.decoding.search import SearchConfig
from docnmt_jax.errors import UserError
from docnmt_jax.evaluation import (
    analysis,
    context_marginal,
    contrastive,
    cxmi,
    metrics,
    pronoun_eval,
    significance,
)
from docnmt_jax.evaluation.metrics import evaluate_files, format_report, score_documents
from docnmt_jax.evaluation.pronouns import PRONOUNS, pronoun_scores, read_pronoun_list
from docnmt_jax.files import write_atomic
from docnmt_jax.training import restore

FLAGS = flags.FLAGS

flags.DEFINE_string("hyp", None, "Hypotheses: TSV doc_id<TAB>hyp, or blank-line separated text.")
flags.DEFINE_string(
    "ref", None, "References: TSV doc_id<TAB>src<TAB>tgt or doc_id<TAB>tgt, or plain text."
)
flags.DEFINE_bool("json", False, "Print one JSON object instead of the text report.")
flags.DEFINE_bool("lowercase", False, "Case-insensitive scores (sacreBLEU lowercase=True).")
flags.DEFINE_bool("pronouns", False, "Also score pronoun overlap (precision/recall/F1).")
flags.DEFINE_enum("pronoun_lang", "en", sorted(PRONOUNS), "Built-in pronoun list for --pronouns.")
flags.DEFINE_string(
    "pronoun_list", None, "Pronoun list file, one word per line (implies --pronouns)."
)
flags.DEFINE_string(
    "workdir", None, "A document model's run: measure its use of context on --ref (see above)."
)
flags.DEFINE_string(
    "checkpoint", "best", "With --workdir: best, latest, averaged or a step number."
)
flags.DEFINE_enum(
    "params", "auto", ["auto", "ema", "raw"], "With --workdir: the EMA (auto: when kept) or raw."
)
flags.DEFINE_string(
    "baseline",
    None,
    "With --hyp: a baseline's hypotheses (same formats): paired significance of --hyp against "
    "it (sacreBLEU; s-BLEU/chrF over sentences, d-BLEU over documents).",
)
flags.DEFINE_list("paired", ["bs", "ar"], "With --baseline: bs (bootstrap) and/or ar tests.")
flags.DEFINE_integer(
    "paired_samples", 0, "With --baseline: resamples/trials (0: sacreBLEU's 1000 / 10000)."
)
flags.DEFINE_integer("context_draws", 3, "With --workdir: random-context draws (Table 1: 3).")
flags.DEFINE_integer("context_seed", 0, "With --workdir: seed of the first random draw.")
flags.DEFINE_integer("beam", 5, "With --workdir: beam size (1 = greedy).")
flags.DEFINE_float("alpha", 0.6, "With --workdir: length penalty exponent.")
flags.DEFINE_integer("batch_tokens", 4096, "With --workdir: padded source tokens per batch.")
flags.DEFINE_string("out_dir", None, "With --workdir: write translations, scores and Fig. 1.")
flags.DEFINE_string(
    "contrastive",
    None,
    "Score a contrastive test set with --workdir's model: voita, contrapro, bawden or "
    "pronouns (the set in --data; see above).",
)
flags.DEFINE_string(
    "data",
    None,
    "With --contrastive: voita -- the JSON/JSON Lines file; contrapro -- contrapro.json with "
    "its .text/.context files beside it; bawden -- the test-sets directory or a set's prefix.",
)
flags.DEFINE_string(
    "contrastive_langs",
    None,
    "With --contrastive: SRC,TGT suffixes of the text files (default: contrapro en,de; "
    "bawden en,fr).",
)
flags.DEFINE_integer("contrastive_rows", 32, "With --contrastive: candidates per batch.")
flags.DEFINE_list(
    "contrastive_contexts",
    list(contrastive.CONTEXTS),
    "With --contrastive pronouns: the contexts to score with (true, none, random).",
)
flags.DEFINE_string(
    "contrastive_baseline",
    None,
    "With --contrastive pronouns: a second run or release scored the same way, compared "
    "with McNemar's exact test.",
)
flags.DEFINE_bool(
    "cxmi", False, "With --workdir and --ref: CXMI (true context - none) and Delta^D per token."
)
flags.DEFINE_list("cxmi_sizes", ["1", "2", "3", "5", "10"], "With --cxmi: context sizes.")
flags.DEFINE_string(
    "labels",
    None,
    "With --hyp: a synthetic task's .labels.jsonl: accuracy on the labelled words, per "
    "phenomenon and distance.",
)
flags.DEFINE_integer(
    "label_chunk_size", 20, "With --labels: chunk size of the chunk-start split.", lower_bound=2
)


def score_labels() -> dict:
    """``--labels``: the accuracy of ``--hyp`` (aligned with ``--ref``) on the labels."""
    labels = context_labels.read_labels(FLAGS.labels)
    pairs = metrics.align_documents(
        metrics.read_hypotheses(FLAGS.hyp), metrics.read_references(FLAGS.ref)
    )
    hypotheses = {ref.doc_id: list(hyp.sentences) for hyp, ref in pairs}
    if labels and not any(lb.doc_id in hypotheses for lb in labels):
        raise UserError(
            f"{FLAGS.labels}: none of its documents (e.g. {labels[0].doc_id!r}) is in {FLAGS.ref}"
        )
    return synthetic_long.long_context_accuracy(hypotheses, labels, FLAGS.label_chunk_size)


def context_report(usage: context_marginal.ContextUsage, step: int) -> str:
    """The text report of :func:`context_marginal.model_context_usage`."""
    draws = ", ".join(f"{b:.2f}" for b in usage.bleu_random)
    return "\n".join(
        [
            f"context use of {FLAGS.workdir} (step {step}) on {FLAGS.ref}:",
            f"  BLEU (true context)         {usage.bleu_true:6.2f}",
            f"  context-marginalised BLEU   {usage.bleu_marginal:6.2f}   (draws: {draws}; "
            f"seeds {usage.seeds[0]}..{usage.seeds[-1]})",
            f"  Delta_BLEU                  {usage.delta_bleu:6.2f}",
            f"  Delta^D log-likelihood      {usage.delta_loglik:+.4f} per token "
            f"({usage.tokens} tokens; {usage.delta_loglik_all:+.4f} over every sentence)",
            f"  foreign-context coverage    {100 * usage.coverage:5.1f}% of sentences",
        ]
    )


def write_outputs(
    usage: context_marginal.ContextUsage, docs: list, result: dict, out_dir: str
) -> None:
    os.makedirs(out_dir, exist_ok=True)
    named = [("true", usage.hypotheses_true)] + [
        (f"random_{s}", h) for s, h in zip(usage.seeds, usage.hypotheses_random, strict=True)
    ]
    for name, hyps in named:
        analysis.write_hypotheses(os.path.join(out_dir, f"hyp.{name}.tsv"), docs, hyps)
    rows = context_marginal.figure_table(usage, docs)
    title = f"{os.path.basename(os.path.normpath(FLAGS.workdir))}: cumulative BLEU"
    result["figure"] = context_marginal.write_figure(rows, os.path.join(out_dir, "figure1"), title)
    write_atomic(os.path.join(out_dir, "context.json"), json.dumps(result, indent=2) + "\n")


def measure_context(pronouns: object) -> dict:
    """``--workdir``: translate and score ``--ref`` with true and random contexts."""
    search = SearchConfig(beam_size=FLAGS.beam, alpha=FLAGS.alpha)
    translator, step = restore.load_translator(
        FLAGS.workdir,
        FLAGS.checkpoint,
        search,
        batch_tokens=FLAGS.batch_tokens,
        params=FLAGS.params,
    )
    docs = readers.read_tsv(FLAGS.ref)  # sources and references: 3 columns, none empty
    config = restore.load_config(FLAGS.workdir)
    max_len = max(config.data.max_src_len, config.data.max_tgt_len)
    usage = context_marginal.model_context_usage(
        translator, docs, max_len, FLAGS.context_draws, FLAGS.context_seed, FLAGS.batch_tokens
    )
    result = {"workdir": FLAGS.workdir, "step": step, "ref": FLAGS.ref, **usage.to_json()}
    result["true_context"] = score_documents(
        usage.hypotheses_true, [list(d.tgt) for d in docs], lowercase=FLAGS.lowercase
    )
    if pronouns is not None:
        result["true_context"]["pronouns"] = pronoun_scores(
            [h for d in usage.hypotheses_true for h in d],
            [s for d in docs for s in d.tgt],
            pronouns,
        )
    if FLAGS.out_dir:
        write_outputs(usage, docs, result, FLAGS.out_dir)
    result["report"] = context_report(usage, step)
    return result


def score_contrastive_set() -> dict:
    """``--contrastive``: read the set, score it with the run's model, write the result."""
    fmt = FLAGS.contrastive
    if fmt not in contrastive_sets.READERS:
        raise UserError(
            f"--contrastive: unknown format {fmt!r}; one of {', '.join(contrastive_sets.READERS)}"
        )
    if not FLAGS.data:
        raise UserError("--contrastive needs --data (the test set)")
    if not FLAGS.workdir:
        raise UserError("--contrastive needs --workdir (the run whose model scores the set)")
    langs = FLAGS.contrastive_langs.split(",") if FLAGS.contrastive_langs else None
    instances = contrastive_sets.read_contrastive_set(fmt, FLAGS.data, langs)
    model, tokenizer, config = restore.load_model(FLAGS.workdir)
    params, step = restore.load_params(model, FLAGS.workdir, FLAGS.checkpoint, params=FLAGS.params)
    scores = contrastive.instance_scores(
        model,
        params,
        tokenizer,
        instances,
        max_sentences=config.data.max_sentences,
        rows=FLAGS.contrastive_rows,
    )
    summary = contrastive.forced_choice_accuracy(instances, scores)
    name = os.path.basename(os.path.normpath(FLAGS.data))
    for ext in (".jsonl", ".json"):
        name = name[: -len(ext)] if name.endswith(ext) else name
    out_path = os.path.join(FLAGS.workdir, "contrastive", f"{fmt}.{name}.json")
    result = {
        "format": fmt,
        "data": FLAGS.data,
        "workdir": FLAGS.workdir,
        "model": model.name,
        "step": step,
        "instances": len(instances),
        "candidates": sum(len(inst.candidates) for inst in instances),
        **summary,
        "scores": [
            {"where": inst.where, "correct": inst.correct, "log_probs": [float(x) for x in s]}
            for inst, s in zip(instances, scores, strict=True)
        ],
    }
    write_atomic(out_path, json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    title = (
        f"{fmt} contrastive set {FLAGS.data}: {result['instances']} instances, "
        f"{result['candidates']} candidates; {model.name} of {FLAGS.workdir} (step {step})"
    )
    result["report"] = contrastive.format_forced_choice(summary, title) + f"\nwritten: {out_path}"
    return result


def _load_run(workdir: str) -> tuple:
    """``(model, tokenizer, config, params, step)`` of a workdir or release."""
    model, tokenizer, config = restore.load_model(workdir)
    params, step = restore.load_params(model, workdir, FLAGS.checkpoint, params=FLAGS.params)
    return model, tokenizer, config, params, step


def _out_path(kind: str, data: str) -> str:
    name = os.path.basename(os.path.normpath(data))
    for ext in (".jsonl", ".json", ".tsv"):
        name = name[: -len(ext)] if name.endswith(ext) else name
    return os.path.join(FLAGS.workdir, "contrastive", f"{kind}.{name}.json")


def score_pronoun_set() -> dict:
    """``--contrastive pronouns``: the set under each context, for the run (and baseline)."""
    if not FLAGS.data or not FLAGS.workdir:
        raise UserError("--contrastive pronouns needs --data (the set) and --workdir (the run)")
    bad = [c for c in FLAGS.contrastive_contexts if c not in contrastive.CONTEXTS]
    if bad or not FLAGS.contrastive_contexts:
        raise UserError(
            f"--contrastive_contexts: {bad[0] if bad else ''!r} is not one of "
            f"{', '.join(contrastive.CONTEXTS)}"
        )
    instances, records = pronoun_set.read_pronoun_set(FLAGS.data)
    groups = [str(r["doc_id"]) for r in records]
    runs = {"system": FLAGS.workdir}
    if FLAGS.contrastive_baseline:
        runs["baseline"] = FLAGS.contrastive_baseline
    result: dict = {"format": "pronouns", "data": FLAGS.data, "instances": len(instances)}
    reports = []
    for role, workdir in runs.items():
        model, tokenizer, config, params, step = _load_run(workdir)
        contexts = pronoun_eval.score_conditions(
            model,
            params,
            tokenizer,
            instances,
            groups,
            FLAGS.contrastive_contexts,
            FLAGS.context_seed,
            config.data.max_sentences,
            FLAGS.contrastive_rows,
        )
        result[role] = {"workdir": workdir, "model": model.name, "step": step, **contexts}
        title = f"{FLAGS.data}: {len(instances)} instances; {model.name} of {workdir} (step {step})"
        reports.append(pronoun_eval.format_conditions(contexts, title))
    if "baseline" in result:
        pick = {r: {c: result[r][c] for c in FLAGS.contrastive_contexts} for r in runs}
        result["mcnemar"] = pronoun_eval.compare(pick["system"], pick["baseline"], instances)
        reports.append(pronoun_eval.format_compare(result["mcnemar"], *runs.values()))
    out_path = _out_path("pronouns", FLAGS.data)
    write_atomic(out_path, json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    result["report"] = "\n".join(reports) + f"\nwritten: {out_path}"
    return result


def measure_cxmi() -> dict:
    """``--cxmi``: CXMI and Delta^D of the run on ``--ref``'s documents."""
    if not FLAGS.workdir or not FLAGS.ref:
        raise UserError("--cxmi needs --workdir (the run) and --ref (a corpus TSV with sources)")
    try:
        sizes = [int(k) for k in FLAGS.cxmi_sizes]
    except ValueError:
        raise UserError(f"--cxmi_sizes: not integers: {','.join(FLAGS.cxmi_sizes)}") from None
    if any(k < 1 for k in sizes):
        raise UserError("--cxmi_sizes: context sizes must be >= 1")
    docs = readers.read_tsv(FLAGS.ref)
    model, tokenizer, config, params, step = _load_run(FLAGS.workdir)
    result = cxmi.cxmi(
        model,
        params,
        tokenizer,
        docs,
        config.data.max_sentences,
        sizes,
        FLAGS.context_draws,
        FLAGS.context_seed,
        FLAGS.contrastive_rows,
    )
    result = {
        "workdir": FLAGS.workdir,
        "model": model.name,
        "step": step,
        "ref": FLAGS.ref,
        **result,
    }
    out_path = _out_path("cxmi", FLAGS.ref)
    write_atomic(out_path, json.dumps(result, indent=2) + "\n")
    title = f"CXMI of {model.name} ({FLAGS.workdir}, step {step}) on {FLAGS.ref}:"
    result["report"] = cxmi.format_cxmi(result, title) + f"\nwritten: {out_path}"
    return result


def contrastive_main() -> None:
    """``--contrastive`` and/or ``--cxmi``: score and print the results."""
    results = {}
    if FLAGS.contrastive == "pronouns":
        results["contrastive"] = score_pronoun_set()
    elif FLAGS.contrastive is not None:
        results["contrastive"] = score_contrastive_set()
    if FLAGS.cxmi:
        results["cxmi"] = measure_cxmi()
    if FLAGS.json:
        clean = {k: {x: y for x, y in v.items() if x != "report"} for k, v in results.items()}
        print(json.dumps(clean if len(clean) > 1 else next(iter(clean.values())), indent=2))
    else:
        print("\n".join(r["report"] for r in results.values()))


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    logging.set_verbosity(logging.WARNING)
    if FLAGS.contrastive is not None or FLAGS.cxmi:
        contrastive_main()
        return
    if not FLAGS.ref:
        raise app.UsageError("--ref is required (or score a contrastive set: --contrastive)")
    if not FLAGS.hyp and not FLAGS.workdir:
        raise app.UsageError("give --hyp (score a translation) or --workdir (context use)")
    pronouns = source = None
    if FLAGS.pronouns or FLAGS.pronoun_list:
        pronouns = source = FLAGS.pronoun_lang
    if FLAGS.pronoun_list:
        pronouns, source = read_pronoun_list(FLAGS.pronoun_list), FLAGS.pronoun_list
    result = context = None
    if FLAGS.hyp:
        result = evaluate_files(FLAGS.hyp, FLAGS.ref, lowercase=FLAGS.lowercase, pronouns=pronouns)
        if pronouns is not None:
            result["pronouns"]["list"] = source
        if FLAGS.baseline:
            bad = [t for t in FLAGS.paired if t not in significance.TESTS]
            if bad:
                raise app.UsageError(f"--paired: {bad[0]!r} is not one of bs, ar")
            result["paired"] = significance.paired_files(
                FLAGS.hyp,
                FLAGS.baseline,
                FLAGS.ref,
                FLAGS.paired,
                FLAGS.paired_samples,
                FLAGS.lowercase,
            )
        if FLAGS.labels:
            result["context_labels"] = score_labels()
    elif FLAGS.baseline:
        raise app.UsageError("--baseline needs --hyp (the system to compare with it)")
    elif FLAGS.labels:
        raise app.UsageError("--labels needs --hyp (the translation to score)")
    if FLAGS.workdir:
        context = measure_context(pronouns)
    if FLAGS.json:
        out = dict(result or {})
        if context is not None:
            out["context"] = {k: v for k, v in context.items() if k != "report"}
        print(json.dumps(out, indent=2, ensure_ascii=False))
        return
    if result is not None:
        print(format_report(result))
        if "paired" in result:
            print(significance.format_paired(result["paired"], FLAGS.hyp, FLAGS.baseline))
        if "context_labels" in result:
            print(synthetic_long.format_label_accuracy(result["context_labels"]))
    if context is not None:
        print(context["report"])


def run() -> None:
    """The ``docnmt-evaluate`` command (``python launch/evaluate.py``)."""
    cli.run(main)


if __name__ == "__main__":
    run()
