"""Decoding options of the one search module: sampling (temperature, top-k, top-p) against
the distribution a naive NumPy computation gives, and n-best lists whose scores equal the
model's teacher-forced score of the same hypotheses (every sentence-aligned model)."""

from __future__ import annotations

import functools
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_translation_golden import _documents, _model_and_params, _tokenizer  # noqa: E402

from docnmt_jax.data import pipeline as pipeline_lib  # noqa: E402
from docnmt_jax.data.documents import Document  # noqa: E402
from docnmt_jax.data.spec import PipelineConfig  # noqa: E402
from docnmt_jax.decoding import beam_search as bs  # noqa: E402
from docnmt_jax.decoding.search import SearchConfig  # noqa: E402
from docnmt_jax.decoding.translator import Translator  # noqa: E402
from docnmt_jax.errors import CapabilityError  # noqa: E402

V = 8
#: Fixed next-token logits (independent of the history): tokens 0-2 are PAD, EOS, BOS.
LOGITS = np.array([0.0, 0.0, -1.0, 2.0, 1.5, 1.0, 0.2, -0.5], np.float32)


def _fixed_step(cache, tokens, extra):
    del tokens, extra
    rows = cache["x"].shape[0]
    return jnp.broadcast_to(jnp.asarray(LOGITS), (rows, V)), cache


def _expected_first_token(temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """The distribution of the first sampled token, computed naively: PAD and BOS banned,
    logits / temperature, the top-k, then the nucleus of mass top_p, renormalised."""
    logits = LOGITS.astype(np.float64) / temperature
    allowed = np.ones(V, bool)
    allowed[[bs.PAD_ID, bs.BOS_ID]] = False
    probs = np.where(allowed, np.exp(logits - logits.max()), 0.0)
    probs /= probs.sum()
    order = sorted(range(V), key=lambda i: -probs[i])
    keep = set(order[:top_k] if top_k else order)
    mass = 0.0
    nucleus = set()
    for i in order:
        if mass >= top_p:
            break
        nucleus.add(i)
        mass += probs[i]
    kept = np.array([probs[i] if i in keep and i in nucleus else 0.0 for i in range(V)])
    return kept / kept.sum()


@pytest.mark.parametrize(
    "temperature,top_k,top_p", [(1.0, 0, 1.0), (0.5, 0, 1.0), (1.0, 2, 1.0), (1.3, 0, 0.6)]
)
def test_sampled_tokens_follow_the_shaped_distribution(temperature, top_k, top_p):
    rows = 4000
    rule = bs.Sampling(temperature=temperature, top_k=top_k, top_p=top_p, seed=3)
    result = bs.beam_search(
        _fixed_step, {"x": jnp.zeros((rows, 1))}, {}, beam_size=1, max_len=2, sampling=rule
    )
    first = np.asarray(result.sequences[:, 0, 0])
    counts = np.bincount(first, minlength=V) / rows
    expected = _expected_first_token(temperature, top_k, top_p)
    assert np.all(counts[expected == 0] == 0)
    # 4000 draws: the standard error of a frequency is at most 0.008
    np.testing.assert_allclose(counts, expected, atol=0.035)


def test_samples_are_independent_scored_by_the_model_and_ranked():
    rows, K, max_len = 64, 4, 6
    rule = bs.Sampling(seed=11)
    result = bs.beam_search(
        _fixed_step, {"x": jnp.zeros((rows, 1))}, {}, beam_size=K, alpha=0.6, max_len=max_len,
        sampling=rule,
    )  # fmt: skip
    seqs, scores, lengths = map(np.asarray, (result.sequences, result.scores, result.lengths))
    log_softmax = LOGITS - np.log(np.sum(np.exp(LOGITS)))
    distinct = 0
    for b in range(rows):
        assert np.all(np.diff(scores[b]) <= 1e-6), "samples ranked best first"
        distinct += len({tuple(s) for s in seqs[b].tolist()}) > 1
        for j in range(K):
            n = lengths[b, j]
            tokens = seqs[b, j, :n]
            assert tokens[-1] == bs.EOS_ID and np.all(seqs[b, j, n:] == bs.PAD_ID)
            assert not np.isin(tokens, [bs.PAD_ID, bs.BOS_ID]).any()
            log_prob = float(np.sum(log_softmax[tokens]))
            penalty = ((5.0 + n) / 6.0) ** 0.6
            assert scores[b, j] == pytest.approx(log_prob / penalty, rel=1e-5, abs=1e-5)
    assert distinct > rows // 2, "the samples of a row differ"
    again = bs.beam_search(
        _fixed_step, {"x": jnp.zeros((rows, 1))}, {}, beam_size=K, alpha=0.6, max_len=max_len,
        sampling=rule,
    )  # fmt: skip
    np.testing.assert_array_equal(np.asarray(again.sequences), seqs)  # same seed, same draws


class _IdsOfText:
    """The tokenizer, remembering the ids (EOS excluded) of every text it decodes, so a
    hypothesis is rescored on exactly its searched tokens (decoding then encoding need not
    give them back); a text decoded from two different id sequences is ambiguous."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self.ids: dict[str, tuple[int, ...] | None] = {}

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)

    def decode(self, ids):
        row = []
        for i in map(int, ids):
            if i == bs.EOS_ID:
                break
            if i not in (bs.PAD_ID, bs.BOS_ID):
                row.append(i)
        text = self._tokenizer.decode(ids)
        known = self.ids.setdefault(text, tuple(row))
        if known != tuple(row):
            self.ids[text] = None
        return text

    def encode_batch(self, texts):
        return [list(self.ids[t]) if self.ids.get(t) else self._tokenizer.encode(t) for t in texts]


@functools.cache
def _scorer(model):
    return jax.jit(model.score)


def _teacher_forced(model, params, tokenizer, sources, targets) -> list[float]:
    """``log p`` of every target sentence of one document, teacher-forced (the model's own
    score over a grid batch of the document in one chunk)."""
    config = PipelineConfig(
        max_sentences=len(sources),
        max_src_len=64,
        max_tgt_len=64,
        on_long="error",
        shuffle=False,
        num_epochs=1,
        pad_batch=True,
        sentence_level=model.layout.sentence_level,
        context_sentences=model.context_sentences,
        whole_documents=model.whole_documents,
    )
    doc = Document("d", tuple(sources), tuple(targets))
    by_sentence = {}
    for batch in pipeline_lib.numpy_batches([doc], tokenizer.encode_batch, config):
        scores = np.asarray(_scorer(model)(params, batch))
        for row in np.flatnonzero(batch["doc_index"] >= 0):
            offset = int(batch["sentence_offset"][row])
            for k in np.flatnonzero(batch["sentence_mask"][row]):
                by_sentence[offset + k] = float(scores[row, k])
    return [by_sentence[k] for k in range(len(sources))]


@pytest.mark.parametrize(
    "key",
    [
        "transformer",
        "final",
        pytest.param("doct", marks=pytest.mark.slow),
        pytest.param("jean_cho", marks=pytest.mark.slow),
    ],
)
def test_nbest_scores_equal_teacher_forced_scores(key):
    """Every hypothesis of a sentence's n-best list, put in its document with the chosen
    translations of the other sentences, scores under teacher forcing what the search
    reported (FINAL: the memory of the chosen previous sentence, as in the search)."""
    model, params = _model_and_params(key)
    tokenizer = _IdsOfText(_tokenizer())
    search = SearchConfig(beam_size=3, alpha=0.6, len_a=1.0, len_b=4, nbest=3)
    translator = Translator(model, params, tokenizer, search, max_sentences=3)
    doc = _documents()[0]
    nbest = translator.translate_nbest([doc])[0]
    best = [hyps[0].text for hyps in nbest]
    assert best == translator.translate([doc])[0]
    checked = 0
    for k, hyps in enumerate(nbest):
        scores = [h.score for h in hyps]
        assert len(hyps) >= 2 and scores == sorted(scores, reverse=True)
        for hyp in hyps:
            targets = best[:k] + [hyp.text] + best[k + 1 :]
            if any(tokenizer.ids.get(t) is None for t in targets):
                continue  # ambiguous text: its ids are not known
            forced = _teacher_forced(model, params, tokenizer, doc.src, targets)[k]
            assert forced == pytest.approx(hyp.log_prob, abs=2e-3), (k, hyp)
            penalty = ((5.0 + hyp.tokens) / 6.0) ** 0.6
            assert hyp.score == pytest.approx(hyp.log_prob / penalty, abs=1e-4)
            checked += 1
    assert checked >= 2 * len(nbest)


@pytest.mark.slow
def test_sampling_translates_with_every_search_model_and_doc2doc_refuses_nbest():
    doc = _documents()[0]
    for key in ("doc2doc", "final"):
        model, params = _model_and_params(key)
        search = SearchConfig(len_a=1.0, len_b=4, sample=True, nbest=2, seed=5)
        translator = Translator(model, params, _tokenizer(), search, max_sentences=3)
        first = translator.translate([doc])[0]
        assert len(first) == len(doc.src) and first == translator.translate([doc])[0]
    with pytest.raises(CapabilityError, match="n-best"):
        translator = Translator(
            *_model_and_params("doc2doc"), _tokenizer(), search, max_sentences=3
        )
        translator.translate_nbest([doc])
