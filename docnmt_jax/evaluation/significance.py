"""Paired significance of a system against a baseline: sacreBLEU's paired bootstrap resampling
(Koehn 2004) and approximate randomisation (Riezler & Maxwell 2005), as its CLI runs them.

Two levels, because the document scores resample documents, not sentences:

* ``sentence``: segments are sentences -- s-BLEU and chrF (``sacrebleu REF -i BASE SYS -m bleu
  chrf --paired-bs``/``--paired-ar`` on one sentence a line gives the same numbers);
* ``document``: segments are whole documents, each the concatenation of its sentences --
  d-BLEU (the same CLI on one document a line).

The seed is sacreBLEU's (``SACREBLEU_SEED``, default 12345) and goes into the signature with
the test and its sample count. ``p_value`` is the probability, under the null hypothesis that
the two systems are the same, of a difference at least as large as the observed one (the
bootstrap's one-sided estimate, the randomisation's two-sided one, as sacreBLEU computes them).

Paired right/wrong outcomes (forced-choice contrastive sets): McNemar's exact test,
:func:`mcnemar_exact`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.significance import PairedTest

TESTS = ("bs", "ar")
TEST_NAMES = {"bs": "paired bootstrap resampling", "ar": "approximate randomisation"}


def _metrics(level: str, lowercase: bool) -> dict[str, Any]:
    if level == "sentence":
        return {"s_bleu": BLEU(lowercase=lowercase), "chrf": CHRF(lowercase=lowercase)}
    return {"d_bleu": BLEU(lowercase=lowercase)}


def _number(value: Any) -> float | None:
    """A JSON-able float (sacreBLEU's bootstrap means are numpy float32), or None."""
    return None if value is None else float(value)


def paired_segments(
    system: Sequence[str],
    baseline: Sequence[str],
    references: Sequence[str],
    level: str,
    test: str = "bs",
    n_samples: int = 0,
    lowercase: bool = False,
) -> dict[str, dict[str, Any]]:
    """``{metric: {system, baseline, p_value, system_mean, system_ci, baseline_mean,
    baseline_ci, signature}}`` of one test (``bs`` or ``ar``; ``n_samples`` 0: sacreBLEU's
    default, 1,000 resamples / 10,000 trials) over aligned segments of one ``level``."""
    if test not in TESTS:
        raise ValueError(f"paired test must be one of {TESTS}, got {test!r}")
    if not len(system) == len(baseline) == len(references):
        raise ValueError(
            f"{len(system)} system, {len(baseline)} baseline and {len(references)} reference "
            "segments: they must be aligned"
        )
    metrics = _metrics(level, lowercase)
    # AR estimates no confidence interval here (-1), as the CLI's default; bootstrap always.
    paired = PairedTest(
        [("baseline", list(baseline)), ("system", list(system))],
        {name: metric for name, metric in metrics.items()},
        [list(references)],
        test_type=test,
        n_samples=n_samples,
        n_ar_confidence=-1,
    )
    signatures, scores = paired()
    out = {}
    for name, (key, results) in zip(
        metrics, ((k, v) for k, v in scores.items() if k != "System"), strict=True
    ):
        base, sys_ = results
        out[name] = {
            "system": _number(sys_.score),
            "baseline": _number(base.score),
            "p_value": _number(sys_.p_value),
            "system_mean": _number(sys_.mean),
            "system_ci": _number(sys_.ci),
            "baseline_mean": _number(base.mean),
            "baseline_ci": _number(base.ci),
            "signature": str(signatures[key]),
        }
    return out


def paired_documents(
    system: Sequence[Sequence[str]],
    baseline: Sequence[Sequence[str]],
    references: Sequence[Sequence[str]],
    tests: Sequence[str] = TESTS,
    n_samples: int = 0,
    lowercase: bool = False,
) -> dict[str, Any]:
    """Both levels of every test in ``tests`` for aligned documents (lists of sentences):
    ``{test: {s_bleu, chrf, d_bleu: ...}}`` plus the segment counts."""
    sents = [[s for doc in docs for s in doc] for docs in (system, baseline, references)]
    joined = [[" ".join(doc) for doc in docs] for docs in (system, baseline, references)]
    result: dict[str, Any] = {"sentences": len(sents[2]), "documents": len(joined[2])}
    for test in tests:
        result[test] = {
            **paired_segments(*sents, "sentence", test, n_samples, lowercase),
            **paired_segments(*joined, "document", test, n_samples, lowercase),
        }
    return result


def paired_files(
    hyp_path: str,
    baseline_path: str,
    ref_path: str,
    tests: Sequence[str] = TESTS,
    n_samples: int = 0,
    lowercase: bool = False,
) -> dict[str, Any]:
    """:func:`paired_documents` of two hypothesis files against one reference file, each
    aligned to the references by doc id (:func:`~docnmt_jax.evaluation.metrics.align_documents`;
    a missing or extra document is a :class:`CorpusFormatError` naming it)."""
    from docnmt_jax.evaluation.metrics import align_documents, read_hypotheses, read_references

    refs = read_references(ref_path)
    system = [h.sentences for h, _ in align_documents(read_hypotheses(hyp_path), refs)]
    baseline = [h.sentences for h, _ in align_documents(read_hypotheses(baseline_path), refs)]
    references = [r.sentences for r in refs]
    result = paired_documents(system, baseline, references, tests, n_samples, lowercase)
    return {**result, "hyp": hyp_path, "baseline": baseline_path}


def format_paired(result: dict[str, Any], system: str, baseline: str) -> str:
    """The text block ``evaluate.py --baseline`` prints."""
    lines = [
        f"paired significance of {system} against the baseline {baseline} "
        f"({result['sentences']} sentences, {result['documents']} documents):"
    ]
    names = {"s_bleu": "s-BLEU", "d_bleu": "d-BLEU", "chrf": "chrF"}
    for test in TESTS:
        if test not in result:
            continue
        lines.append(f"  {TEST_NAMES[test]}:")
        for key in ("s_bleu", "d_bleu", "chrf"):
            r = result[test][key]
            ci = f" (mean {r['system_mean']:.2f} +- {r['system_ci']:.2f})" if r["system_ci"] else ""
            lines.append(
                f"    {names[key]:7s} {r['system']:6.2f} vs {r['baseline']:6.2f}{ci}  "
                f"p = {r['p_value']:.4f}  ({r['signature']})"
            )
    return "\n".join(lines)


def mcnemar_exact(system: Sequence[bool], baseline: Sequence[bool]) -> dict[str, Any]:
    """McNemar's exact test on paired binary outcomes (e.g. forced-choice instances right or
    wrong under two models): of the ``n = b + c`` discordant pairs (``b``: only ``system``
    right, ``c``: only ``baseline`` right) the two-sided exact binomial p-value under
    ``Binomial(n, 1/2)``, ``p = min(1, 2 * sum_{k <= min(b, c)} C(n, k) / 2^n)``; 1 when
    ``n = 0``. Computed with integers (exact for any ``n``)."""
    if len(system) != len(baseline):
        raise ValueError(f"{len(system)} vs {len(baseline)} outcomes: they must be paired")
    b = sum(1 for s, t in zip(system, baseline, strict=True) if s and not t)
    c = sum(1 for s, t in zip(system, baseline, strict=True) if t and not s)
    n = b + c
    tail = sum(math.comb(n, k) for k in range(min(b, c) + 1))
    p = 1.0 if n == 0 else min(1.0, float(Fraction(2 * tail, 2**n)))
    both = sum(1 for s, t in zip(system, baseline, strict=True) if s and t)
    return {
        "pairs": len(system),
        "system_only": b,
        "baseline_only": c,
        "both": both,
        "neither": len(system) - n - both,
        "p_value": p,
    }
