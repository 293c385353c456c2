"""The main job's summary (:mod:`docnmt_jax.commands.demo`): the sentence model and the
document model side by side on the test books, the time against the job's budget, and the
verses where the true context changed the document model's translation most.

**Budget.** The main job should finish in 30 minutes on a host whose sentence Transformer
(the TED size) trains :data:`REFERENCE_RATE` real target tokens/s, and on a slower host in
``30 * REFERENCE_RATE / rate`` minutes, never over 60: :func:`time_budget`. The rate is the
demo's own Transformer training (``train.log``), and the host's float32 matmul peak is
measured beside it (:func:`~docnmt_jax.benchmarking.peak.matmul_gflops`).

**Examples** (:func:`context_examples`), chosen by a rule, not by hand: among the verses
whose translation with the true context differs from the translation with another chapter's
context (Jean & Cho 2019's random context), those where the true context gains the most
sentence BLEU (sacreBLEU, exponential smoothing, effective order), ties in corpus order.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

REFERENCE_RATE = 1800.0  # real target tokens/s of the TED-size Transformer: 30 minutes
BASE_MINUTES = 30.0
MAX_MINUTES = 60.0


def time_budget(rate: float) -> float:
    """Minutes the main job may take on a host training ``rate`` real target tokens/s."""
    if rate <= 0:
        return MAX_MINUTES
    return min(MAX_MINUTES, BASE_MINUTES * max(1.0, REFERENCE_RATE / rate))


def float32_peak() -> float:
    """This host's float32 matmul rate (GFLOP/s, a 2,048-square product)."""
    import jax.numpy as jnp

    from docnmt_jax.benchmarking.peak import matmul_gflops

    return matmul_gflops(2048, jnp.float32)[0]


def train_summary(path: str) -> dict[str, Any]:
    """Steps, real target tokens/s and the last dev perplexity from ``train.log``."""
    from docnmt_jax.training.budget import train_speed

    out: dict[str, Any] = dict(train_speed(path))
    with open(path, encoding="utf-8") as f:
        for line in f:
            if " step=" in line and "dev_ppl=" in line:
                fields = dict(p.split("=", 1) for p in line.split() if "=" in p)
                out["step"], out["dev_ppl"] = int(fields["step"]), float(fields["dev_ppl"])
    return out


@dataclasses.dataclass(frozen=True)
class Example:
    """One verse: its document and 1-based position there, its source and reference, and the
    translations."""

    doc_id: str
    index: int
    source: str
    reference: str
    sentence_model: str
    document_model: str
    random_context: str
    bleu_true: float
    bleu_random: float

    @property
    def gain(self) -> float:
        return self.bleu_true - self.bleu_random


def context_examples(
    test_path: str, hyp_paths: Mapping[str, str], sentence: str, document: str, n: int
) -> tuple[list[Example], dict[str, int]]:
    """The ``n`` verses of the module docstring's rule and the counts of verses whose
    translation the true context changed, improved (sentence BLEU) or worsened."""
    from sacrebleu.metrics import BLEU

    from docnmt_jax.data.readers import read_tsv
    from docnmt_jax.evaluation.metrics import TextDocument, align_documents, read_hypotheses

    docs = read_tsv(test_path)
    refs = [TextDocument(d.doc_id, tuple(d.tgt), test_path, 0) for d in docs]
    aligned = {
        name: [h.sentences for h, _ in align_documents(read_hypotheses(path), refs)]
        for name, path in hyp_paths.items()
    }
    bleu = BLEU(effective_order=True)
    found: list[Example] = []
    for d, doc in enumerate(docs):
        for i, (src, ref) in enumerate(zip(doc.src, doc.tgt, strict=True)):
            true, random = aligned[document][d][i], aligned["random"][d][i]
            if true == random:
                continue
            found.append(
                Example(
                    doc.doc_id, i + 1, src, ref, aligned[sentence][d][i], true, random,
                    bleu.sentence_score(true, [ref]).score,
                    bleu.sentence_score(random, [ref]).score,
                )
            )  # fmt: skip
    counts = {
        "verses": sum(len(d.tgt) for d in docs),
        "changed": len(found),
        "better": sum(e.gain > 0 for e in found),
        "worse": sum(e.gain < 0 for e in found),
    }
    ranked = sorted(enumerate(found), key=lambda p: (-p[1].gain, p[0]))
    return [e for _, e in ranked[:n]], counts


def _p(paired: Mapping[str, Any], test: str, metric: str) -> str:
    return f"{paired[test][metric]['p_value']:.3f}"


def scores_table(
    names: Sequence[str], result: Mapping[str, Any], logs: Mapping[str, dict]
) -> list[str]:
    """The side-by-side table of the two models (sentence model first)."""
    sentence, document = names
    scores, context = result["scores"], result["context"]
    paired = scores[document]["paired"]
    s, d = scores[sentence], scores[document]

    def both(key: str, fmt: str) -> str:
        return f"{s[key]['score']:{fmt}} | {d[key]['score']:{fmt}}"

    train = {
        n: f"{'+' if n == document else ''}{logs[n].get('step', 0):,} steps, "
        f"{logs[n]['train_tokens'] / 1e6:.2f}M tokens, {logs[n]['wall_seconds'] / 60:.1f} min, "
        f"{logs[n]['train_tokens_per_s']:,.0f} tok/s, dev ppl "
        f"{logs[n].get('dev_ppl', float('nan')):.1f}"
        for n in names
    }
    return [
        f"| test books: {paired['documents']} chapters, {paired['sentences']} verses "
        f"| {sentence} | {document} |",
        "|---|---:|---:|",
        f"| s-BLEU | {both('s_bleu', '.2f')} |",
        f"| d-BLEU | {both('d_bleu', '.2f')} |",
        f"| chrF | {both('chrf', '.1f')} |",
        f"| pronoun F1 | {s['pronouns']['f1']:.3f} | {d['pronouns']['f1']:.3f} |",
        f"| BLEU with random context (Jean & Cho 2019) | – | "
        f"{context['context_marginalised_bleu']:.2f} |",
        f"| Δ_BLEU = true − random context | – | {context['delta_bleu']:+.2f} |",
        f"| Δ^D log-likelihood per token | – | {context['delta_loglik_per_token']:+.4f} |",
        f"| p, paired bootstrap: s-BLEU / d-BLEU | – | {_p(paired, 'bs', 's_bleu')} / "
        f"{_p(paired, 'bs', 'd_bleu')} |",
        f"| p, approximate randomisation: s-BLEU / d-BLEU | – | {_p(paired, 'ar', 's_bleu')} "
        f"/ {_p(paired, 'ar', 'd_bleu')} |",
        f"| training | {train[sentence]} | {train[document]} |",
    ]


def example_lines(examples: Sequence[Example], counts: Mapping[str, int], names: Sequence) -> list:
    sentence, document = names
    lines = [
        f"The true context changed {document}'s translation of {counts['changed']} of "
        f"{counts['verses']} verses (sentence BLEU up on {counts['better']}, down on "
        f"{counts['worse']}). The {len(examples)} verses it helped most (rule: largest sentence-"
        "BLEU gain of the true context over another chapter's context):",
    ]
    for e in examples:
        lines += [
            "",
            f"{e.doc_id}, sentence {e.index} (sentence BLEU {e.bleu_true:.1f} with its context, "
            f"{e.bleu_random:.1f} with another chapter's)",
            f"  source:          {e.source}",
            f"  reference:       {e.reference}",
            f"  {sentence + ':':16s} {e.sentence_model}",
            f"  {document + ':':16s} {e.document_model}",
            f"  {'random context:':16s} {e.random_context}",
        ]
    return lines


def proof_lines(proofs: Mapping[str, dict]) -> list[str]:
    """The synthetic task's table (``--proof``)."""
    distances = next(iter(proofs.values()))["by_distance"]
    lines = [
        "| synthetic task: labelled words right | "
        + " | ".join(f"distance {d}" for d in distances)
        + " | all | chance |",
        "|---|" + "---:|" * (len(distances) + 2),
    ]
    for name, s in proofs.items():
        cells = [f"{b['accuracy']:.3f}" for b in s["by_distance"].values()]
        lines.append(
            f"| {name} | " + " | ".join(cells) + f" | {s['accuracy']:.3f} | "
            f"{s['chance_level']:.3f} |"
        )
    return lines + [""]


def summary(
    document: str,
    workdirs: Mapping[str, str],
    result: Mapping[str, Any],
    elapsed_minutes: float,
    n_examples: int,
    proofs: Mapping[str, dict],
) -> str:
    """The whole summary (Markdown)."""
    names = [n for n in workdirs if n != document] + [document]
    logs = {n: train_summary(os.path.join(w, "train.log")) for n, w in workdirs.items()}
    rate = logs[names[0]]["train_tokens_per_s"]
    budget = time_budget(rate)
    examples, counts = context_examples(
        result["test"], result["hyps"], names[0], document, n_examples
    )
    within = "within" if elapsed_minutes <= budget else "OVER"
    lines = proof_lines(proofs) if proofs else []
    lines += scores_table(names, result, logs)
    lines += [
        "",
        f"Time: {elapsed_minutes:.1f} min, {within} this host's budget of {budget:.1f} min "
        f"(30 min × 1,800 / {rate:,.0f} tok/s, the sentence Transformer's measured rate; at "
        f"most 60); float32 matmul peak {float32_peak():.0f} GFLOP/s. {document} has "
        f"trained {logs[document].get('step', 0):,} steps more than {names[0]} (finetuned "
        "from it): `make results` compares them at the same tokens.",
        "",
        *example_lines(examples, counts, names),
        "",
        f"sacreBLEU: {result['scores'][document]['s_bleu']['signature']}",
    ]
    return "\n".join(lines)
