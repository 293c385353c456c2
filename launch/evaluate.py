"""Scores document translations: s-BLEU, d-BLEU and chrF (sacreBLEU defaults), optionally
pronoun overlap.

Usage (from the repository root)::

    python launch/evaluate.py --hyp runs/NAME/test.hyp.tsv --ref data/bible/test.tsv \\
        [--json] [--lowercase] [--pronouns [--pronoun_lang en | --pronoun_list FILE]]

``--hyp``: TSV ``doc_id<TAB>hyp`` (header optional; ``launch/translate.py`` writes it) or plain
text, one sentence per line, blank lines between documents. ``--ref``: the corpus TSV
``doc_id<TAB>src<TAB>tgt``, a TSV ``doc_id<TAB>tgt``, or plain text. A file is a TSV when its
first line holds a tab. Documents are matched by doc id (by position if either file is plain
text); see :mod:`docnmt_jax.evaluation.metrics`. Prints a report, or with ``--json`` one JSON
object, on stdout; a malformed or mismatched file exits with status 1 and a one-line error.

``--pronouns`` adds a "pronouns" section: precision, recall and F1 of clipped per-sentence
pronoun matches against the reference, overall and per pronoun (case-insensitive whatever
``--lowercase`` says; not APT, see :mod:`docnmt_jax.evaluation.pronouns`). The pronouns are
the built-in list of ``--pronoun_lang`` (default ``en``) or those of ``--pronoun_list FILE``
(one word per line, blank and ``#`` lines skipped; implies ``--pronouns``).
"""

from __future__ import annotations

import json
import sys

from absl import app, flags

from docnmt_jax.data.documents import CorpusFormatError
from docnmt_jax.evaluation.metrics import evaluate_files, format_report
from docnmt_jax.evaluation.pronouns import PRONOUNS, read_pronoun_list

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
flags.mark_flags_as_required(["hyp", "ref"])


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    pronouns = source = None
    if FLAGS.pronouns or FLAGS.pronoun_list:
        pronouns = source = FLAGS.pronoun_lang
    try:
        if FLAGS.pronoun_list:
            pronouns, source = read_pronoun_list(FLAGS.pronoun_list), FLAGS.pronoun_list
        result = evaluate_files(FLAGS.hyp, FLAGS.ref, lowercase=FLAGS.lowercase, pronouns=pronouns)
    except (CorpusFormatError, OSError) as e:
        print(f"evaluate.py: error: {e}", file=sys.stderr)
        sys.exit(1)
    if pronouns is not None:
        result["pronouns"]["list"] = source
    if FLAGS.json:
        print(json.dumps(result, indent=2, ensure_ascii=False))
    else:
        print(format_report(result))


if __name__ == "__main__":
    app.run(main)
