"""Contrastive (forced-choice) scoring of context-dependent words, teacher-forced.

For every labelled target word (:class:`~docnmt_jax.data.synthetic.ContextLabel`) the
reference document is scored once per candidate form: the labelled sentence with the word
replaced by the candidate, every other sentence as in the reference. The model "chooses" the
candidate whose sentence gets the highest log-probability. Unlike scoring a translation, an
error elsewhere in the sentence cannot hide what the model knows about the context, and no
search is involved, so it is cheap enough to run during training. A model that sees only the
labelled sentence is at chance: the class or topic is drawn independently of that sentence.

Document models see the chunk holding the labelled sentence (sentences ``[c*S, (c+1)*S)``),
and a model with a context window (``model.context_sentences = K``, DocT) also the ``K``
source sentences before the chunk, as the pipeline gives them (``context_src``); sentence
models (``model.layout``: one sentence per row) see the sentence alone.

**Published contrastive sets** (Voita et al. 2019, ContraPro, Bawden et al. 2018; readers in
:mod:`docnmt_jax.data.contrastive_sets`): :func:`instance_scores` makes every instance one
document per candidate -- the context sentences and the current one, source side from the
instance, target side the candidate's (its target context teacher-forced) -- and takes the
model's ``log p`` of the current (last) sentence; :func:`forced_choice_accuracy` counts an
instance right when its correct candidate scores strictly higher than every other (a tie is
wrong). The same views as above: a sentence model sees the current sentence alone, a chunk
model the last ``max_sentences`` sentences of the document (all of them for a model of whole
documents), a window model also the ``K`` source sentences before its chunk.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from docnmt_jax.data.contrastive_sets import ContrastiveInstance
from docnmt_jax.data.documents import Document
from docnmt_jax.data.schema import batch_from_grids
from docnmt_jax.data.synthetic import ContextLabel
from docnmt_jax.data.tokenizer import Tokenizer
from docnmt_jax.models.base import Model


@dataclasses.dataclass(frozen=True)
class ContrastiveItem:
    """One variant: a chunk's sources and targets, the scored sentence ``segment`` (index
    inside the chunk) and which label/candidate it stands for."""

    label: int
    candidate: int
    src: tuple[list[int], ...]
    tgt: tuple[list[int], ...]
    segment: int
    context: tuple[list[int], ...] = ()  # the K source sentences before the chunk (with EOS)


def _variant(sentence: str, index: int, word: str) -> str:
    tokens = sentence.split()
    if not 0 <= index < len(tokens):
        raise ValueError(f"token index {index} outside the sentence {sentence!r}")
    tokens[index] = word
    return " ".join(tokens)


def make_items(
    documents: Sequence[Document],
    labels: Sequence[ContextLabel],
    tokenizer: Tokenizer,
    max_sentences: int,
    sentence_level: bool,
    context_sentences: int = 0,
) -> list[ContrastiveItem]:
    """The variants of every label (candidates in :attr:`ContextLabel.candidates` order),
    each with the ``context_sentences`` source sentences before its chunk (fewer at the
    document's start)."""
    by_id = {d.doc_id: d for d in documents}
    items = []
    for n, lb in enumerate(labels):
        if lb.doc_id not in by_id:
            raise KeyError(f"label {n}: document {lb.doc_id!r} is not in the corpus")
        doc = by_id[lb.doc_id]
        if sentence_level:
            lo, hi = lb.segment, lb.segment + 1
        else:
            lo = (lb.segment // max_sentences) * max_sentences
            hi = min(lo + max_sentences, len(doc.src))
        src = tuple(tokenizer.encode_batch(doc.src[lo:hi]))
        before = doc.src[max(0, lo - context_sentences) : lo] if context_sentences else ()
        context = tuple(ids + [tokenizer.eos_id] for ids in tokenizer.encode_batch(list(before)))
        for c, word in enumerate(lb.candidates):
            tgt_text = list(doc.tgt[lo:hi])
            tgt_text[lb.segment - lo] = _variant(tgt_text[lb.segment - lo], lb.token_index, word)
            tgt = tuple(ids + [tokenizer.eos_id] for ids in tokenizer.encode_batch(tgt_text))
            src_eos = tuple(ids + [tokenizer.eos_id] for ids in src)
            items.append(ContrastiveItem(n, c, src_eos, tgt, lb.segment - lo, context))
    return items


def grid_batch(
    items: Sequence[ContrastiveItem],
    rows: int,
    sentences: int,
    length: int,
    context_sentences: int = 0,
) -> dict[str, np.ndarray]:
    """Pipeline-format batch ``[rows, sentences, length]`` of ``items`` (padding rows after),
    with ``context_src`` ``[rows, K, length]`` when ``context_sentences = K > 0`` (the last
    slot the sentence right before the chunk, as the pipeline lays it)."""
    shape = (rows, sentences, length)
    tokens = {side: np.zeros(shape, np.int32) for side in ("src", "tgt")}
    for r, item in enumerate(items):
        for side in ("src", "tgt"):
            for k, ids in enumerate(getattr(item, side)):
                if len(ids) > length:
                    raise ValueError(f"sentence of {len(ids)} tokens > grid length {length}")
                tokens[side][r, k, : len(ids)] = ids
    batch = batch_from_grids(tokens["src"], tokens["tgt"])
    if context_sentences:
        context = np.zeros((rows, context_sentences, length), np.int32)
        for r, item in enumerate(items):
            first = context_sentences - len(item.context)
            for k, ids in enumerate(item.context):
                context[r, first + k, : len(ids)] = ids
        batch["context_src"], batch["context_src_mask"] = context, (context > 0).astype(np.int32)
    return batch


def make_sentence_scorer(model: Model) -> Callable[[Any, dict[str, np.ndarray]], jax.Array]:
    """Jitted ``(params, batch) -> log p(sentence) [B, S]``: the model's own
    :meth:`~docnmt_jax.models.base.Model.score` (sum over each sentence's tokens)."""
    return jax.jit(model.score)


def _batches(
    items: Sequence[ContrastiveItem], rows: int, sentences: int, bucket: int, context: int
) -> Iterator[tuple[Sequence[ContrastiveItem], dict[str, np.ndarray]]]:
    for start in range(0, len(items), rows):
        chunk = items[start : start + rows]
        longest = max(len(ids) for it in chunk for ids in it.src + it.tgt + it.context)
        length = -(-longest // bucket) * bucket
        yield chunk, grid_batch(chunk, rows, sentences, length, context)


def candidate_scores(
    model: Model,
    params: Any,
    tokenizer: Tokenizer,
    documents: Sequence[Document],
    labels: Sequence[ContextLabel],
    max_sentences: int = 20,
    rows: int = 32,
    scorer: Callable[[Any, dict[str, np.ndarray]], jax.Array] | None = None,
) -> list[np.ndarray]:
    """Per label, ``log p`` of the labelled sentence with each candidate form (in
    :attr:`ContextLabel.candidates` order), teacher-forced with its chunk as context."""
    sentence_level = model.layout.sentence_level
    context = model.context_sentences
    if model.whole_documents:  # its chunks are whole documents
        max_sentences = max([len(doc.src) for doc in documents] + [max_sentences])
    items = make_items(documents, labels, tokenizer, max_sentences, sentence_level, context)
    sentences = 1 if sentence_level else max_sentences
    scorer = scorer or make_sentence_scorer(model)
    scores = [np.full(len(lb.candidates), np.nan) for lb in labels]
    for chunk, batch in _batches(items, rows, sentences, bucket=16, context=context):
        logp = np.asarray(scorer(params, batch))
        for r, item in enumerate(chunk):
            scores[item.label][item.candidate] = logp[r, item.segment]
    return scores


def contrastive_accuracy(
    model: Model,
    params: Any,
    tokenizer: Tokenizer,
    documents: Sequence[Document],
    labels: Sequence[ContextLabel],
    max_sentences: int = 20,
    rows: int = 32,
    scorer: Callable[[Any, dict[str, np.ndarray]], jax.Array] | None = None,
) -> dict[str, Any]:
    """Share of labels whose correct form scores strictly highest (:func:`candidate_scores`);
    overall, per phenomenon and per distance (the bucket format of
    :func:`~docnmt_jax.data.synthetic.context_accuracy`)."""
    scores = candidate_scores(
        model, params, tokenizer, documents, labels, max_sentences, rows, scorer
    )
    tallies: dict[tuple[str, Any], list[int]] = {}
    for lb, by_candidate in zip(labels, scores, strict=True):
        right = lb.candidates.index(lb.correct)
        others = np.delete(by_candidate, right)
        ok = int(bool(np.all(by_candidate[right] > others)))
        for key in (("all", None), ("ph", lb.phenomenon), ("d", lb.distance)):
            t = tallies.setdefault(key, [0, 0])
            t[0] += ok
            t[1] += 1
    return _summary(tallies)


def _bucket(correct: int, total: int) -> dict[str, Any]:
    return {"accuracy": correct / total if total else 0.0, "correct": correct, "total": total}


def _summary(tallies: Mapping[tuple[str, Any], list[int]]) -> dict[str, Any]:
    result: dict[str, Any] = _bucket(*tallies.get(("all", None), [0, 0]))
    for name, key in (("by_phenomenon", "ph"), ("by_distance", "d")):
        result[name] = {
            k[1]: _bucket(*tallies[k]) for k in sorted(t for t in tallies if t[0] == key)
        }
    return result


# --------------------------------------------------------------- published contrastive sets


def instance_items(
    instances: Sequence[ContrastiveInstance],
    tokenizer: Tokenizer,
    max_sentences: int,
    sentence_level: bool,
    context_sentences: int = 0,
    whole_documents: bool = False,
) -> list[ContrastiveItem]:
    """One item per candidate (``label`` = instance index): the chunk of the document
    ``context + current sentence`` the model sees (see the module docstring), the current
    sentence its last, the ``context_sentences`` source sentences before the chunk."""
    eos = tokenizer.eos_id
    items = []
    for n, inst in enumerate(instances):
        src_doc = [*inst.context_src, inst.src]
        current = len(src_doc) - 1
        if sentence_level:
            lo = current
        elif whole_documents:
            lo = 0
        else:
            lo = max(0, len(src_doc) - max_sentences)
        src = tuple(ids + [eos] for ids in tokenizer.encode_batch(src_doc[lo:]))
        before = src_doc[max(0, lo - context_sentences) : lo] if context_sentences else []
        context = tuple(ids + [eos] for ids in tokenizer.encode_batch(before))
        for c, candidate in enumerate(inst.candidates):
            tgt_doc = [*inst.context_tgt[c], candidate][lo:]
            tgt = tuple(ids + [eos] for ids in tokenizer.encode_batch(tgt_doc))
            items.append(ContrastiveItem(n, c, src, tgt, current - lo, context))
    return items


def _longest(items: Sequence[ContrastiveItem]) -> int:
    return max(len(ids) for it in items for ids in it.src + it.tgt + it.context)


def _instance_batches(
    items: Sequence[ContrastiveItem], rows: int, sentences: int, bucket: int, context: int
) -> Iterator[tuple[list[ContrastiveItem], dict[str, np.ndarray]]]:
    """Batches ``[rows, sentences, T]`` holding whole instances (all candidates of one
    together), instances in order of length, ``T`` the longest sentence rounded up to a
    multiple of ``bucket`` (few distinct shapes: few compilations)."""
    groups: dict[int, list[ContrastiveItem]] = {}
    for item in items:
        groups.setdefault(item.label, []).append(item)
    chunk: list[ContrastiveItem] = []

    def flush() -> tuple[list[ContrastiveItem], dict[str, np.ndarray]]:
        length = -(-_longest(chunk) // bucket) * bucket
        return chunk, grid_batch(chunk, rows, sentences, length, context)

    for group in sorted(groups.values(), key=_longest):
        if chunk and len(chunk) + len(group) > rows:
            yield flush()
            chunk = []
        chunk = chunk + group
    if chunk:
        yield flush()


def instance_scores(
    model: Model,
    params: Any,
    tokenizer: Tokenizer,
    instances: Sequence[ContrastiveInstance],
    max_sentences: int = 20,
    rows: int = 32,
    bucket: int = 16,
    scorer: Callable[[Any, dict[str, np.ndarray]], Any] | None = None,
) -> list[np.ndarray]:
    """Per instance, the model's ``log p`` of its current sentence with each candidate (in
    candidate order), teacher-forced in the document of its context (:func:`instance_items`);
    ``rows`` candidates per batch (at least the most candidates of one instance), sentence
    lengths padded to multiples of ``bucket``. ``scorer(params, batch) -> [B, S]`` defaults to
    the jitted ``model.score``."""
    context = model.context_sentences
    items = instance_items(
        instances,
        tokenizer,
        max_sentences,
        model.layout.sentence_level,
        context,
        model.whole_documents,
    )
    scores = [np.full(len(inst.candidates), np.nan) for inst in instances]
    if not items:
        return scores
    sentences = max(len(item.src) for item in items)
    rows = max([rows] + [len(inst.candidates) for inst in instances])
    scorer = scorer or make_sentence_scorer(model)
    for chunk, batch in _instance_batches(items, rows, sentences, bucket, context):
        logp = np.asarray(scorer(params, batch))
        for r, item in enumerate(chunk):
            scores[item.label][item.candidate] = logp[r, item.segment]
    return scores


def _bucket_order(key: str) -> tuple[int, float, str]:
    try:
        return (0, float(key), key)
    except ValueError:
        return (1, 0.0, key)


def _choice(inst: ContrastiveInstance, by_candidate: np.ndarray) -> tuple[int, int]:
    """``(right, tie)``: the correct candidate scores strictly higher than every other; it
    ties with the best other."""
    by_candidate = np.asarray(by_candidate, np.float64)
    best_other = np.max(np.delete(by_candidate, inst.correct))
    right = int(bool(by_candidate[inst.correct] > best_other))
    return right, int(bool(by_candidate[inst.correct] == best_other))


def choice_outcomes(
    instances: Sequence[ContrastiveInstance], scores: Sequence[np.ndarray]
) -> np.ndarray:
    """Per instance, whether it is right under the strictly-higher rule (bool ``[N]``): the
    paired outcomes McNemar's test compares
    (:func:`~docnmt_jax.evaluation.significance.mcnemar_exact`)."""
    return np.array([bool(_choice(i, s)[0]) for i, s in zip(instances, scores, strict=True)], bool)


#: The contexts an instance can be scored with (:func:`with_context`).
CONTEXTS = ("true", "none", "random")


def with_context(
    instances: Sequence[ContrastiveInstance],
    mode: str,
    groups: Sequence[str] | None = None,
    seed: int = 0,
) -> list[ContrastiveInstance]:
    """The instances with their ``true`` context, with ``none`` (the current sentence alone)
    or with a ``random`` one: for an instance with ``L`` context sentences, the last ``L``
    sentences (source, and reference target for every candidate) of the context-plus-current
    sentence of another instance whose ``groups`` value (document) differs, drawn uniformly
    (``seed``) among those with at least ``L``; when none has, the longest other (a shorter
    context). ``groups`` defaults to the instances' own contexts (every instance its group)."""
    if mode not in CONTEXTS:
        raise ValueError(f"context must be one of {CONTEXTS}, got {mode!r}")
    if mode == "true":
        return list(instances)
    if mode == "none":
        return [
            dataclasses.replace(i, context_src=(), context_tgt=((),) * len(i.candidates))
            for i in instances
        ]
    groups = list(groups) if groups is not None else [str(n) for n in range(len(instances))]
    pool: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}
    for inst, group in zip(instances, groups, strict=True):
        src = (*inst.context_src, inst.src)
        tgt = (*inst.context_tgt[inst.correct], inst.candidates[inst.correct])
        if len(src) > len(pool.get(group, ((), ()))[0]):
            pool[group] = (src, tgt)
    rng = np.random.default_rng(seed)
    names = sorted(pool)
    out = []
    for inst, group in zip(instances, groups, strict=True):
        need = len(inst.context_src)
        others = [g for g in names if g != group]
        if not need or not others:
            out.append(inst)
            continue
        donors = [g for g in others if len(pool[g][0]) >= need]
        donors = donors or [max(others, key=lambda g: len(pool[g][0]))]
        src, tgt = pool[donors[int(rng.integers(len(donors)))]]
        src, tgt = src[-need:], tgt[-need:]
        out.append(
            dataclasses.replace(inst, context_src=src, context_tgt=(tgt,) * len(inst.candidates))
        )
    return out


def forced_choice_accuracy(
    instances: Sequence[ContrastiveInstance], scores: Sequence[np.ndarray]
) -> dict[str, Any]:
    """Share of instances whose correct candidate scores strictly higher than every other
    (a tie or a NaN is wrong): ``accuracy``, ``correct``, ``total``, ``ties`` (instances lost
    to a tie) and ``by_<attribute>`` ``{value: {accuracy, correct, total}}`` for every
    attribute of the instances (values as strings)."""
    tallies: dict[tuple[str, str], list[int]] = {}
    ties = 0
    for inst, by_candidate in zip(instances, scores, strict=True):
        ok, tie = _choice(inst, by_candidate)
        ties += tie
        keys = [("", "")] + [(str(k), str(v)) for k, v in inst.attributes.items()]
        for key in keys:
            t = tallies.setdefault(key, [0, 0])
            t[0] += ok
            t[1] += 1
    result: dict[str, Any] = _bucket(*tallies.get(("", ""), [0, 0]))
    result["ties"] = ties
    for name in sorted({k for k, _ in tallies if k}):
        values = sorted((v for k, v in tallies if k == name), key=_bucket_order)
        result[f"by_{name}"] = {v: _bucket(*tallies[(name, v)]) for v in values}
    return result


def format_forced_choice(result: Mapping[str, Any], title: str) -> str:
    """A readable table of :func:`forced_choice_accuracy`: overall, then each breakdown."""

    def row(label: str, b: Mapping[str, Any]) -> str:
        return f"  {label:<16} {100 * b['accuracy']:6.2f}%  ({b['correct']}/{b['total']})"

    lines = [title, row("overall", result) + f"; {result['ties']} lost to ties"]
    for key in sorted(k for k in result if k.startswith("by_")):
        lines.append(f"  by {key[3:]}:")
        lines.extend(row(f"  {value}", b) for value, b in result[key].items())
    return "\n".join(lines)
