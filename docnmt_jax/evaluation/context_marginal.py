"""How much a document model uses its context: Jean & Cho (2019)'s context-marginalised
measures, for any registered document model.

* **Context-marginalised BLEU** (Table 1): the test set translated with random contexts
  (``draws`` draws, default 3, seeds ``seed .. seed + draws - 1``), mean BLEU over the draws,
  and ``Delta_BLEU = BLEU(true context) - mean BLEU(random)``.
* **Delta^D log-likelihood** (Sec. 4.4): ``s(Y | X, C) - s(Y | X)`` over the set, per target
  token, ``s(Y | X)`` estimated with the sampled contexts as in Sec. 4.3 (per sentence, the
  log of the mean probability over the draws: :func:`log_mean_exp`).
* **Fig. 1**: sentences sorted by ``s_sent(Y | X, C) - s_sent(Y | X)`` (largest first),
  cumulative corpus BLEU of the first ``k`` sentences with the true and with random context
  (:func:`cumulative_bleu`; random: the mean over the draws), as a TSV and a PNG.

Readings (the paper draws random contexts from the data distribution, Sec. 4.3; how a
context is laid out depends on the model):

* A random context is built on the host, once per draw, for the whole evaluated set, so it
  does not depend on how batches happen to group documents: every chunk the model would see
  (``max_sentences`` consecutive sentences of a document; the whole document for a
  whole-document model, ``model.whole_documents``), preceded by its ``K =
  model.context_sentences`` window sentences, is a row of one ``[chunks, K + S]`` grid; every
  column is deranged among the chunks holding a sentence there
  (:func:`~docnmt_jax.objectives.context_margin.derangement`, the training objective's, after
  a random order of the rows), so each sentence keeps its position in its chunk and in its
  window but every other sentence it sees comes from other documents. Each new row becomes a
  document of its own (:class:`RandomContextCorpus`) and is translated and scored exactly as
  the true documents are (same translator, pipeline, shapes).
* A model with a context window (DocT, Jean & Cho) sees its window sentences as the first
  sentences of that document; they are translated too and their outputs dropped (the cost of
  ``K`` sentences a chunk). A chunk model (FINAL, doc2doc, HM-GDC) gets documents of one chunk.
* A sentence that still reads a sentence of its own document in its new row has no foreign
  context. What it reads: a window model (``K > 0``: DocT, Jean & Cho) its ``K`` predecessors
  in the row, any other model every other sentence of the row. (Cases: a column with a single
  chunk, e.g. the tail of the longest document for a whole-document model; two chunks of one
  document drawn into one row, adjacent for a window model.) It is translated all
  the same (BLEU covers every sentence) and left out of ``Delta^D`` and Fig. 1; ``coverage``
  reports the share of sentences with a foreign context in every draw. Of
  :data:`DRAW_ATTEMPTS` derangements a draw keeps the one with the most foreign sentences.
* The window belongs to the row: a document's first sentence (no context of its own) may get
  a random window, and then counts as any other sentence (its Delta compares a foreign
  context with none). A chunk model's first sentence of a chunk sees its foreign chunk mates.
* A sentence-level model sees no context: :func:`context_usage` refuses it (Table 1 row (a)
  has no context-marginalised score).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from sacrebleu.metrics import BLEU
from tqdm.auto import tqdm

from docnmt_jax.data import pipeline as pipeline_lib
from docnmt_jax.data.documents import Document
from docnmt_jax.data.tokenizer import Tokenizer
from docnmt_jax.decoding.translator import Translator
from docnmt_jax.errors import UserError
from docnmt_jax.files import atomic_open
from docnmt_jax.models.base import Model
from docnmt_jax.models.context_rotation import take_columns

#: Derangements drawn per random-context draw; the one with the most foreign sentences is kept.
DRAW_ATTEMPTS = 8

Translate = Callable[[Sequence[Document]], list[list[str]]]
Score = Callable[[Sequence[Document]], tuple[list[np.ndarray], list[np.ndarray]]]


class ContextUsageError(UserError, ValueError):
    """The model or the data cannot be evaluated with random contexts (one-line message)."""


# ------------------------------------------------------------------------ random contexts


@dataclasses.dataclass(frozen=True)
class RandomContextCorpus:
    """The documents of one random-context draw and where their sentences come from.

    ``documents[r].src[j]`` is sentence ``origin[r][j] = (d, i)`` of the original document
    ``d`` (target too), or a window sentence only there as context (``origin`` None).
    ``foreign[d][i]``: whether that sentence saw only other documents' sentences."""

    documents: list[Document]
    origin: list[list[tuple[int, int] | None]]
    foreign: list[np.ndarray]

    def gather(self, outputs: Sequence[Sequence[Any]], lengths: Sequence[int]) -> list[list[Any]]:
        """``outputs`` of :attr:`documents` (one per sentence) back in the original documents'
        order (``lengths`` sentences each); raises if a sentence is missing or repeated."""
        result: list[list[Any]] = [[None] * n for n in lengths]
        seen = [np.zeros(n, bool) for n in lengths]
        for r, row in enumerate(self.origin):
            for j, where in enumerate(row):
                if where is None:
                    continue
                d, i = where
                if seen[d][i]:
                    raise RuntimeError(f"sentence {i} of document {d} placed twice (a bug)")
                seen[d][i] = True
                result[d][i] = outputs[r][j]
        missing = [(d, int(np.flatnonzero(~s)[0])) for d, s in enumerate(seen) if not s.all()]
        if missing:
            raise RuntimeError(f"sentences without a random-context row (a bug): {missing[:5]}")
        return result


def chunk_starts(length: int, max_sentences: int | None) -> list[int]:
    """First sentences of a document's chunks as the pipeline cuts it (``None``: whole)."""
    if max_sentences is None:
        return [0]
    return list(range(0, length, max_sentences))


def random_context_corpus(
    documents: Sequence[Document],
    max_sentences: int | None,
    context_sentences: int,
    seed: int,
) -> RandomContextCorpus:
    """Draw ``seed`` of random contexts for ``documents`` (see the module docstring): chunks
    of ``max_sentences`` (None: whole documents) with ``context_sentences`` window sentences,
    every column deranged among the chunks of other documents. A sentence is foreign when
    no sentence it reads is of its own document: with ``context_sentences`` K > 0 (a window
    model: DocT, Jean & Cho) its K predecessors in the new row, else its whole new row."""
    from docnmt_jax.objectives.context_margin import derangement  # the objective's, reused

    K = context_sentences
    rows: list[list[tuple[int, int] | None]] = []
    for d, doc in enumerate(documents):
        S = len(doc) if max_sentences is None else max_sentences
        for start in chunk_starts(len(doc), max_sentences):
            window = [(d, i) if i >= 0 else None for i in range(start - K, start)]
            chunk = [(d, i) for i in range(start, min(start + S, len(doc)))]
            rows.append(window + chunk)
    if not rows:
        return RandomContextCorpus([], [], [])
    width = max(len(r) for r in rows)
    cells = np.full((len(rows), width, 2), -1, np.int64)
    for r, row in enumerate(rows):
        for c, where in enumerate(row):
            if where is not None:
                cells[r, c] = where
    real = cells[..., 0] >= 0
    # reads[c, c']: whether the sentence in cell c reads cell c' (a window model its K
    # predecessors, any other model every other sentence of its row)
    before = np.arange(width)[:, None] - np.arange(width)[None, :]
    reads = (before >= 1) & (before <= K) if K else before != 0
    ident = np.array([next(w[0] for w in row if w is not None) for row in rows])
    best = None
    for key in jax.random.split(jax.random.PRNGKey(seed), DRAW_ATTEMPTS):
        key_order, key_draw = jax.random.split(key)
        order = np.asarray(jax.random.permutation(key_order, len(rows)))  # no neighbour bias
        origin, _ = derangement(jnp.asarray(real[order]), jnp.asarray(ident[order]), key_draw)
        origin = order[np.asarray(origin)]  # source rows, in the original numbering
        new_cells = take_columns(cells, origin)  # [rows in drawn order, width, 2]
        docs_here = np.where(real[order], new_cells[..., 0], -1)
        # foreign: no sentence it reads in its new row is of its own document
        same = docs_here[:, :, None] == docs_here[:, None, :]  # [row, sentence, other cell]
        alone = ~np.any(same & reads[None], axis=2)
        alone &= real[order] & (np.arange(width) >= K)[None, :]
        if best is None or alone.sum() > best[3].sum():
            best = (order, new_cells, docs_here, alone)
    order, new_cells, docs_here, alone = best
    foreign = [np.zeros(len(doc), bool) for doc in documents]
    out_docs, out_origin = [], []
    for r in range(len(rows)):
        src, tgt, where = [], [], []
        for c in np.flatnonzero(real[order[r]]):
            d, i = (int(x) for x in new_cells[r, c])
            src.append(documents[d].src[i])
            tgt.append(documents[d].tgt[i])
            where.append((d, i) if c >= K else None)
            if c >= K:
                foreign[d][i] = bool(alone[r, c])
        out_docs.append(Document(f"random{seed}:{r}", tuple(src), tuple(tgt)))
        out_origin.append(where)
    return RandomContextCorpus(out_docs, out_origin, foreign)


# -------------------------------------------------------------------------------- scores


def log_mean_exp(samples: np.ndarray) -> np.ndarray:
    """``log mean_r exp(samples[r])`` over axis 0, stably (Sec. 4.3's estimate)."""
    top = np.max(samples, axis=0)
    return top + np.log(np.mean(np.exp(samples - top), axis=0))


def sentence_scorer(
    model: Model, params: Any, tokenizer: Tokenizer, config: pipeline_lib.PipelineConfig
) -> Score:
    """``score(documents) -> (log p(Y_i | X_i, context) per sentence, target tokens per
    sentence)``, document by document, teacher-forced with :meth:`Model.score` on the grid
    batches of the pipeline ``config`` (the model's chunks, window, whole documents, as the
    translator lays them): the context is whatever the documents hold."""
    score_fn = jax.jit(model.score)

    def score(documents: Sequence[Document]) -> tuple[list[np.ndarray], list[np.ndarray]]:
        logp = [np.full(len(doc), np.nan) for doc in documents]
        tokens = [np.zeros(len(doc), np.int64) for doc in documents]
        plan = pipeline_lib.plan_batches(list(documents), tokenizer.encode_batch, config)
        for batch in pipeline_lib.numpy_batches(plan):
            values = np.asarray(jax.device_get(score_fn(params, batch)))
            lengths = np.sum(batch["tgt_mask"] > 0, axis=-1)
            for row, d in enumerate(batch["doc_index"]):
                if d < 0:
                    continue
                offset = int(batch["sentence_offset"][row])
                for k in np.flatnonzero(batch["sentence_mask"][row]):
                    logp[d][offset + k] = values[row, k]
                    tokens[d][offset + k] = lengths[row, k]
        return logp, tokens

    return score


# ---------------------------------------------------------------------------------- BLEU


def bleu_statistics(hyps: Sequence[str], refs: Sequence[str]) -> np.ndarray:
    """Per-sentence sacreBLEU sufficient statistics ``[N, 10]``: hypothesis length, reference
    length, matches of 1..4-grams, hypothesis 1..4-grams (sacreBLEU's defaults)."""
    bleu = BLEU(effective_order=True)  # statistics only: effective order changes no count
    rows = []
    for h, r in zip(hyps, refs, strict=True):
        s = bleu.sentence_score(h, [r])
        rows.append([s.sys_len, s.ref_len, *s.counts, *s.totals])
    return np.asarray(rows, np.int64).reshape(-1, 10)


def _bleu_from_sums(s: np.ndarray) -> float:
    """sacreBLEU's corpus BLEU from summed statistics, with its corpus default smoothing
    (``exp``; the static ``compute_bleu`` defaults to none, which gives 0 whenever a corpus
    has no matched 4-gram, where ``sacrebleu.corpus_bleu`` and the table's s-BLEU do not)."""
    return float(
        BLEU.compute_bleu(
            list(s[2:6]), list(s[6:10]), int(s[0]), int(s[1]), smooth_method="exp"
        ).score
    )


def cumulative_bleu(stats: np.ndarray) -> np.ndarray:
    """Corpus BLEU of the first ``k`` sentences for every ``k`` (``stats`` in that order)."""
    return np.array([_bleu_from_sums(s) for s in np.cumsum(stats, axis=0)])


def corpus_bleu(stats: np.ndarray) -> float:
    return _bleu_from_sums(np.sum(stats, axis=0))


# ------------------------------------------------------------------------------ measures


@dataclasses.dataclass
class ContextUsage:
    """The measures of :func:`context_usage` (``to_json`` for the report)."""

    bleu_true: float
    bleu_random: list[float]
    delta_loglik: float  # per token, over the covered sentences
    delta_loglik_all: float  # per token, every sentence
    coverage: float
    tokens: int
    seeds: list[int]
    hypotheses_true: list[list[str]]
    hypotheses_random: list[list[list[str]]]
    delta_sentence: np.ndarray  # per sentence, flat in document order
    covered: np.ndarray  # per sentence, flat

    @property
    def bleu_marginal(self) -> float:
        return float(np.mean(self.bleu_random))

    @property
    def delta_bleu(self) -> float:
        return self.bleu_true - self.bleu_marginal

    def to_json(self) -> dict[str, Any]:
        return {
            "bleu": self.bleu_true,
            "context_marginalised_bleu": self.bleu_marginal,
            "delta_bleu": self.delta_bleu,
            "bleu_random_draws": self.bleu_random,
            "random_seeds": self.seeds,
            "delta_loglik_per_token": self.delta_loglik,
            "delta_loglik_per_token_all_sentences": self.delta_loglik_all,
            "random_context_coverage": self.coverage,
            "tokens": self.tokens,
            "sentences": int(self.covered.size),
        }


def context_usage(
    documents: Sequence[Document],
    translate: Translate,
    score: Score,
    max_sentences: int | None,
    context_sentences: int,
    draws: int = 3,
    seed: int = 0,
    progress: bool = True,
) -> ContextUsage:
    """Translates and scores ``documents`` with their true context and ``draws`` random ones
    (:func:`random_context_corpus`, seeds ``seed ..``); ``translate`` / ``score`` are the
    model's (:class:`~docnmt_jax.decoding.translator.Translator`, :func:`sentence_scorer`)."""
    if draws < 1:
        raise ContextUsageError(f"draws = {draws}: at least one random context is needed")
    if len({doc.doc_id for doc in documents}) < 2:
        raise ContextUsageError("random contexts need at least two documents")
    refs = [s for doc in documents for s in doc.tgt]
    lengths = [len(doc) for doc in documents]
    seeds = list(range(seed, seed + draws))
    bar = tqdm(total=draws + 1, unit="pass", desc="context", disable=not progress)
    hyps_true = translate(documents)
    logp_true, tokens = score(documents)
    bar.update(1)
    hyps_random, logp_random, covered = [], [], np.ones(len(refs), bool)
    for s in seeds:
        corpus = random_context_corpus(documents, max_sentences, context_sentences, s)
        hyps_random.append(corpus.gather(translate(corpus.documents), lengths))
        logp, _ = score(corpus.documents)
        logp_random.append(np.concatenate(corpus.gather(logp, lengths)))
        covered &= np.concatenate(corpus.foreign)
        bar.update(1)
    bar.close()
    flat_true = np.concatenate(logp_true)
    flat_tokens = np.concatenate(tokens)
    estimate = log_mean_exp(np.stack(logp_random))
    delta = flat_true - estimate
    stats_true = bleu_statistics([h for d in hyps_true for h in d], refs)
    bleu_random = [
        corpus_bleu(bleu_statistics([h for d in hyps for h in d], refs)) for hyps in hyps_random
    ]
    n_cov = max(int(np.sum(flat_tokens[covered])), 1)
    return ContextUsage(
        bleu_true=corpus_bleu(stats_true),
        bleu_random=bleu_random,
        delta_loglik=float(np.sum(delta[covered]) / n_cov),
        delta_loglik_all=float(np.sum(delta) / max(int(np.sum(flat_tokens)), 1)),
        coverage=float(np.mean(covered)),
        tokens=int(np.sum(flat_tokens)),
        seeds=seeds,
        hypotheses_true=hyps_true,
        hypotheses_random=hyps_random,
        delta_sentence=delta,
        covered=covered,
    )


def random_chunks(model: Model, max_sentences: int) -> int | None:
    """The chunks random contexts are drawn over for ``model``: whole documents (None) for a
    whole-document model, else ``max_sentences`` (the translator's; a window model such as
    DocT with ``sentence_rows`` sees only its window, so any chunking gives it the same
    context). Raises :class:`ContextUsageError` for a model without context."""
    if model.whole_documents:
        return None
    if not model.uses_context:
        raise ContextUsageError(
            f"model {model.name!r} translates sentences alone: it has no context to replace"
        )
    return max_sentences


def translate_with_random_context(
    translator: Translator, documents: Sequence[Document], seed: int
) -> tuple[list[list[str]], float]:
    """``documents`` translated with draw ``seed`` of random contexts (translations in the
    original order) and the share of sentences that had a foreign context."""
    model = translator.model
    chunks = random_chunks(model, translator.pipeline_config.max_sentences)
    corpus = random_context_corpus(documents, chunks, model.context_sentences, seed)
    hyps = corpus.gather(translator.translate(corpus.documents), [len(d) for d in documents])
    return hyps, float(np.mean(np.concatenate(corpus.foreign))) if documents else 1.0


def model_context_usage(
    translator: Translator,
    documents: Sequence[Document],
    max_len: int,
    draws: int = 3,
    seed: int = 0,
    batch_tokens: int = 4096,
    progress: bool = True,
    true_hypotheses: list[list[str]] | None = None,
) -> ContextUsage:
    """:func:`context_usage` of the translator's model (its search, chunks and window) with
    :func:`sentence_scorer` (sentences of at most ``max_len`` tokens, as in training);
    ``true_hypotheses``: the translator's translation of ``documents`` with their true
    context when it is at hand (not translated again)."""
    model = translator.model
    chunks = random_chunks(model, translator.pipeline_config.max_sentences)
    config = dataclasses.replace(
        translator.pipeline_config,
        max_src_len=max_len,
        max_tgt_len=max_len,
        batch_src_tokens=batch_tokens,
        batch_tgt_tokens=batch_tokens,
        sequential_sentences=False,
    )
    scorer = sentence_scorer(model, translator.params, translator.tokenizer, config)

    def translate(docs: Sequence[Document]) -> list[list[str]]:
        if true_hypotheses is not None and docs is documents:
            return true_hypotheses
        return translator.translate(docs, progress="translate" if progress else None)

    return context_usage(
        documents,
        translate,
        scorer,
        chunks,
        model.context_sentences,
        draws,
        seed,
        progress,
    )


# -------------------------------------------------------------------------------- Fig. 1


def figure_table(usage: ContextUsage, documents: Sequence[Document]) -> list[dict[str, Any]]:
    """Fig. 1's rows: the covered sentences sorted by ``delta_sentence`` (largest first, ties
    in document order), each with its cumulative BLEU with the true and the random contexts
    (the mean over draws of the cumulative BLEU of each draw)."""
    refs = [s for doc in documents for s in doc.tgt]
    ids = [(doc.doc_id, i) for doc in documents for i in range(len(doc))]
    keep = np.flatnonzero(usage.covered)
    order = keep[np.argsort(-usage.delta_sentence[keep], kind="stable")]
    pick = [refs[i] for i in order]

    def curve(hyps: list[list[str]]) -> np.ndarray:
        flat = [h for d in hyps for h in d]
        return cumulative_bleu(bleu_statistics([flat[i] for i in order], pick))

    true_curve = curve(usage.hypotheses_true)
    random_curve = np.mean([curve(h) for h in usage.hypotheses_random], axis=0)
    return [
        {
            "rank": k + 1,
            "doc_id": ids[i][0],
            "sentence": ids[i][1],
            "delta_sentence": float(usage.delta_sentence[i]),
            "cumulative_bleu_true": float(true_curve[k]),
            "cumulative_bleu_random": float(random_curve[k]),
        }
        for k, i in enumerate(order)
    ]


def write_figure(rows: Sequence[dict[str, Any]], prefix: str, title: str = "") -> list[str]:
    """Writes ``PREFIX.tsv`` and ``PREFIX.png`` (cumulative BLEU against the share of
    sentences, true and random context); returns the two paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(os.path.dirname(os.path.abspath(prefix)), exist_ok=True)
    columns = list(rows[0]) if rows else ["rank"]
    with atomic_open(prefix + ".tsv") as f:
        f.write("\t".join(columns) + "\n")
        for row in rows:
            f.write("\t".join(_cell(row[c]) for c in columns) + "\n")
    n = max(len(rows), 1)
    x = [100.0 * row["rank"] / n for row in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(x, [r["cumulative_bleu_true"] for r in rows], label="true context (LC)")
    ax.plot(x, [r["cumulative_bleu_random"] for r in rows], label="random context (LC+Rand)")
    ax.set_xlabel("sentences sorted by s(Y|X,C) - s(Y|X), largest first (%)")
    ax.set_ylabel("cumulative BLEU")
    ax.set_title(title or "Cumulative BLEU (Jean & Cho 2019, Fig. 1)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(prefix + ".png", dpi=120)
    plt.close(fig)
    return [prefix + ".tsv", prefix + ".png"]


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.6g}"
    return str(value)
