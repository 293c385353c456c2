"""Our search and CTranslate2's on the same weights, token for token (docs/export.md).

The model converted by :mod:`docnmt_jax.export.ctranslate2` is searched by both engines on the
same sentences: ours by the compiled search the Translator runs (its batches), CTranslate2's
by ``Translator.translate_batch`` with :func:`~docnmt_jax.export.ctranslate2.search_options`.
Our output limit is per sentence (``min(max_len, floor(len_a * source_tokens + len_b))``,
EOS included), CTranslate2's ``max_decoding_length`` per call: sentences are grouped by their
limit, one call per group (in chunks of ``max_batch_size``).

Greedy search (beam 1, alpha 0) is argmax decoding in both: outputs are identical unless two
logits tie within float32 rounding. Beam search is compared at alpha 0 (both rank by the
summed log-probability; with alpha > 0 the length normalisations differ). A sentence whose
outputs differ is explained (:func:`explain`) by scoring both outputs teacher-forced with our
model (EOS appended): ``limit`` when either reached the output limit (we force EOS there
and score it, CTranslate2 stops without one, so such hypotheses rank differently), ``tie``
when both log-probabilities agree within :data:`TIE`, else the engine whose output is the
more probable (a beam kept by one search and pruned by the other).
"""

from __future__ import annotations

import collections
import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from docnmt_jax.data.documents import Document
from docnmt_jax.data.tokenizer import EOS_ID, PAD_ID, Tokenizer
from docnmt_jax.decoding.compiled import compile_translate
from docnmt_jax.decoding.search import SearchConfig
from docnmt_jax.decoding.translator import Translator
from docnmt_jax.export import ctranslate2 as conversion

#: Log-probabilities this close are a tie (float32 sums of a few dozen terms).
TIE = 1e-3
#: Differences listed in full in a comparison's summary.
LISTED = 20


def output_limit(source_tokens: int, search: SearchConfig) -> int:
    """Our output limit (EOS included) for a source of ``source_tokens`` pieces (EOS not
    counted: the model's input has one more)."""
    limit = math.floor(search.len_a * (source_tokens + 1) + search.len_b)
    return int(max(1, min(search.max_len, limit)))


def _until_eos(ids: Sequence[int]) -> list[int]:
    out = []
    for i in ids:
        if int(i) in (EOS_ID, PAD_ID):
            break
        out.append(int(i))
    return out


def sentence_ids(
    batches: Sequence[dict[str, np.ndarray]],
    outputs: Sequence[np.ndarray],
    documents: Sequence[Document],
) -> list[list[int]]:
    """The output ids (EOS dropped) of every sentence of ``documents`` in order, from the
    Translator's ``batches`` of them and the search's ids ``[B, S, L]`` of each."""
    out: list[list[Any]] = [[None] * len(d) for d in documents]
    for batch, ids in zip(batches, outputs, strict=True):
        for row, doc in enumerate(batch["doc_index"]):
            if doc < 0:
                continue
            offset = int(batch["sentence_offset"][row])
            for k in np.flatnonzero(batch["sentence_mask"][row]):
                out[doc][offset + k] = _until_eos(ids[row, k])
    return [ids for doc in out for ids in doc]


def library_outputs(
    model: Any,
    params: Any,
    tokenizer: Tokenizer,
    documents: Sequence[Document],
    search: SearchConfig,
    batch_tokens: int = 4096,
) -> list[list[int]]:
    """Our search's output ids (EOS dropped) of every sentence of ``documents`` in order:
    the Translator's batches and compiled search."""
    translator = Translator(model, params, tokenizer, search, batch_tokens=batch_tokens)
    translate = compile_translate(model, search)
    batches = list(translator.batches(documents))
    outputs = [np.asarray(jax.device_get(translate(params, b)[0])) for b in batches]
    return sentence_ids(batches, outputs, documents)


def ctranslate2_outputs(
    translator: Any,
    pieces: Sequence[str],
    sources: Sequence[Sequence[int]],
    limits: Sequence[int],
    search: SearchConfig,
    max_batch_size: int = 64,
) -> tuple[list[list[int]], list[float]]:
    """CTranslate2's output ids (no EOS) and scores for ``sources`` (piece ids, no EOS),
    one ``translate_batch`` call per output limit and chunk of ``max_batch_size``."""
    index = {piece: i for i, piece in enumerate(pieces)}
    options = conversion.search_options(search, pieces)
    outputs: list[list[int]] = [[] for _ in sources]
    scores = [0.0] * len(sources)
    groups: dict[int, list[int]] = collections.defaultdict(list)
    for i, limit in enumerate(limits):
        groups[int(limit)].append(i)
    for limit, members in sorted(groups.items()):
        for start in range(0, len(members), max_batch_size):
            chunk = members[start : start + max_batch_size]
            results = translator.translate_batch(
                [[pieces[t] for t in sources[i]] for i in chunk],
                max_decoding_length=conversion.decoding_length(limit),
                return_scores=True,
                **options,
            )
            for i, result in zip(chunk, results, strict=True):
                outputs[i] = [index[t] for t in result.hypotheses[0]]
                scores[i] = float(result.scores[0])
    return outputs, scores


def log_probs(
    model: Any, params: Any, sources: Sequence[Sequence[int]], targets: Sequence[Sequence[int]]
) -> list[float]:
    """Teacher-forced ``log p(target + EOS | source + EOS)`` under our model, per pair."""
    if not sources:
        return []
    width = max(len(s) for s in sources) + 1
    length = max(len(t) for t in targets) + 1
    src = np.zeros((len(sources), 1, width), np.int32)
    tgt = np.zeros((len(targets), 1, length), np.int32)
    for i, (s, t) in enumerate(zip(sources, targets, strict=True)):
        src[i, 0, : len(s) + 1] = [*s, EOS_ID]
        tgt[i, 0, : len(t) + 1] = [*t, EOS_ID]
    batch = {"src": src, "src_mask": (src > 0).astype(np.int32)}
    batch.update(tgt=tgt, tgt_mask=(tgt > 0).astype(np.int32))
    return [float(x) for x in np.asarray(jax.jit(model.score)(params, batch))[:, 0]]


def explain(
    model: Any,
    params: Any,
    sources: Sequence[Sequence[int]],
    ours: Sequence[Sequence[int]],
    theirs: Sequence[Sequence[int]],
    limits: Sequence[int],
) -> list[dict[str, Any]]:
    """Why each pair of differing outputs differs (module docstring): ``reason`` (``limit``,
    ``tie``, ``ours_more_probable``, ``ctranslate2_more_probable``) and both outputs'
    teacher-forced log-probabilities."""
    ours_lp = log_probs(model, params, sources, ours)
    theirs_lp = log_probs(model, params, sources, theirs)
    explained = []
    for i, limit in enumerate(limits):
        if max(len(ours[i]), len(theirs[i])) + 1 >= limit:
            reason = "limit"
        elif abs(ours_lp[i] - theirs_lp[i]) <= TIE:
            reason = "tie"
        elif ours_lp[i] > theirs_lp[i]:
            reason = "ours_more_probable"
        else:
            reason = "ctranslate2_more_probable"
        explained.append(
            {"reason": reason, "ours_log_prob": ours_lp[i], "ctranslate2_log_prob": theirs_lp[i]}
        )
    return explained


def compare(
    model: Any,
    params: Any,
    tokenizer: Tokenizer,
    ct2_translator: Any,
    documents: Sequence[Document],
    search: SearchConfig,
    batch_tokens: int = 4096,
) -> dict[str, Any]:
    """Both engines' outputs of every sentence of ``documents`` under ``search`` (beam and
    alpha; CTranslate2 given :func:`~docnmt_jax.export.ctranslate2.search_options`): how many
    are identical, why the others differ (:func:`explain`), the first :data:`LISTED` in full."""
    documents = [Document(d.doc_id, tuple(d.src), ("",) * len(d.src)) for d in documents]
    sources = tokenizer.encode_batch([s for d in documents for s in d.src])
    limits = [output_limit(len(s), search) for s in sources]
    ours = library_outputs(model, params, tokenizer, documents, search, batch_tokens)
    pieces = conversion.vocabulary(tokenizer)
    theirs, _ = ctranslate2_outputs(ct2_translator, pieces, sources, limits, search)
    differing = [i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b]
    reasons = explain(
        model,
        params,
        [sources[i] for i in differing],
        [ours[i] for i in differing],
        [theirs[i] for i in differing],
        [limits[i] for i in differing],
    )
    listed = [
        {"sentence": i, "limit": limits[i], "ours": ours[i], "ctranslate2": theirs[i], **why}
        for i, why in zip(differing[:LISTED], reasons, strict=False)
    ]
    return {
        "beam": search.beam_size,
        "alpha": search.alpha,
        "sentences": len(sources),
        "identical": len(sources) - len(differing),
        "identical_fraction": 1.0 - len(differing) / max(len(sources), 1),
        "at_limit_ours": sum(len(o) + 1 >= lim for o, lim in zip(ours, limits, strict=True)),
        "output_tokens": sum(len(o) + 1 for o in ours),
        "reasons": dict(collections.Counter(r["reason"] for r in reasons)),
        "differences": listed,
    }
