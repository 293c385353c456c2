"""The source-use probes (:mod:`docnmt_jax.evaluation.source_use`) against known answers and
naive loops; the command (``analyze.py source-use``) is tested in ``test_analysis.py``."""

import numpy as np
import pytest

from docnmt_jax.data.documents import Document
from docnmt_jax.errors import InputMismatchError
from docnmt_jax.evaluation import source_use
from docnmt_jax.evaluation.analysis import chunk_batches
from docnmt_jax.training import restore


def _docs():
    return [
        Document("a", ("a0", "a1", "a2"), ("A0", "A1", "A2")),
        Document("b", ("b0", "b1"), ("B0", "B1")),
        Document("c", ("c0",), ("C0",)),
    ]


def test_other_sources_keep_targets_and_sentence_counts():
    swapped = source_use.other_sources(_docs())
    assert [d.src for d in swapped] == [("b0", "b1", "b0"), ("c0", "c0"), ("a0",)]
    assert [d.tgt for d in swapped] == [d.tgt for d in _docs()]
    assert [d.doc_id for d in swapped] == ["a", "b", "c"]
    with pytest.raises(InputMismatchError):
        source_use.other_sources(_docs()[:1])


def test_blank_sources():
    blank = source_use.blank_sources(_docs())
    assert [d.src for d in blank] == [(".", ".", "."), (".", "."), (".",)]
    assert [d.tgt for d in blank] == [d.tgt for d in _docs()]


def test_source_sensitivity_of_a_scorer_with_a_known_answer():
    true_src = {d.tgt[j]: d.src[j] for d in _docs() for j in range(len(d))}

    def score(documents):
        # 2 target tokens a sentence; log p 0 with the true source, -3 blank, -2 otherwise;
        # the second document's last sentence is left out (NaN), as a scorer may.
        logp, tokens = [], []
        for d in documents:
            values = np.array(
                [
                    0.0 if s == true_src[t] else (-3.0 if s == "." else -2.0)
                    for s, t in zip(d.src, d.tgt, strict=True)
                ]
            )
            if d.doc_id == "b":
                values[-1] = np.nan
            logp.append(values)
            tokens.append(np.full(len(d), 2))
        return logp, tokens

    result = source_use.source_sensitivity(score, _docs())
    assert result.tokens == 2 * 5
    assert result.true == 0.0 and result.other == -1.0 and result.blank == -1.5
    assert result.drop_other == 1.0 and result.drop_blank == 1.5


def test_token_variance_share_against_a_naive_loop():
    rng = np.random.default_rng(0)
    h = rng.normal(size=(2, 3, 5, 4)).astype(np.float32) + 3.0
    mask = rng.integers(0, 2, size=(2, 3, 5))
    mask[0, 0, 0] = 1
    tokens = [h[idx] for idx in np.ndindex(*mask.shape) if mask[idx]]
    mean = [sum(float(t[k]) for t in tokens) / len(tokens) for k in range(4)]
    spread = sum(sum((float(t[k]) - mean[k]) ** 2 for k in range(4)) for t in tokens)
    norm = sum(sum(float(t[k]) ** 2 for k in range(4)) for t in tokens)
    assert source_use.token_variance_share(h, mask) == pytest.approx(spread / norm, rel=1e-9)
    # Padding is left out: changing it changes nothing.
    h2 = h.copy()
    h2[mask == 0] = 100.0
    assert source_use.token_variance_share(h2, mask) == pytest.approx(spread / norm, rel=1e-9)


def test_token_variance_share_known_answers():
    same = np.tile(np.array([1.0, -2.0, 0.5]), (7, 1))
    assert source_use.token_variance_share(same, np.ones(7)) == 0.0
    # Two tokens +v and -v: the mean is 0, so all of the norm lies across tokens.
    assert source_use.token_variance_share(np.array([[1.0, 2.0], [-1.0, -2.0]]), [1, 1]) == 1.0
    with pytest.raises(InputMismatchError):
        source_use.token_variance_share(same, np.zeros(7))


def test_captured_encoding_is_the_modules_encode(one_step_run, synthetic_dir):
    from docnmt_jax.data import readers
    from docnmt_jax.decoding.search import SearchConfig

    translator, _ = restore.load_translator(one_step_run, "latest", SearchConfig())
    model, params = translator.model, translator.params
    doc = readers.read_tsv(f"{synthetic_dir}/test.tsv")[0]
    row = chunk_batches(model, translator.tokenizer.encode_batch, translator.pipeline_config, doc)[
        0
    ]
    encodings, mask = source_use.captured_encoding(model, params, row)
    S, T = row["src"].shape[1:]
    direct = model.eval_module.apply(
        {"params": params},
        row["src"].reshape(S, T),
        row["src_mask"].reshape(S, T),
        method="encode",
    )
    np.testing.assert_allclose(encodings, np.asarray(direct), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(mask, row["src_mask"].reshape(S, T))
    share = source_use.token_variance_share(encodings, mask)
    assert 0.0 < share < 1.0
