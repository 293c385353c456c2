"""Tests for the synthetic context task (docnmt_jax.data.synthetic)."""

from __future__ import annotations

import collections
import dataclasses
import json
import math
from pathlib import Path

import pytest

from docnmt_jax.data.context_labels import (
    ContextLabel,
    chance_level,
    context_accuracy,
    context_blind_hypotheses,
    read_labels,
)
from docnmt_jax.data.documents import CorpusFormatError, write_tsv
from docnmt_jax.data.synthetic import (
    SRC_CONSONANTS,
    SRC_VOWELS,
    TGT_CONSONANTS,
    TGT_VOWELS,
    Lexicon,
    SyntheticConfig,
    build_lexicon,
    generate,
    write_corpus,
)

DEFAULT = SyntheticConfig()


@pytest.fixture(scope="module")
def corpus():
    return generate(DEFAULT)


@pytest.fixture(scope="module")
def heldout():
    return generate(DEFAULT, split="heldout")


def _refs(docs):
    return {d.doc_id: list(d.tgt) for d in docs}


# --- independent re-derivation -------------------------------------------------------


def _naive_translate(src_words: list[str], resolve: dict[int, str], lex: Lexicon, reorder: bool):
    """Test-side translation: (target words, source position -> target position)."""
    table = dict(lex.filler)
    table.update({s: t for s, t, _ in lex.nouns})
    table.update({s: t for s, t, _ in lex.topic_words})
    adj = [w in lex.adjectives for w in src_words]
    tgt = [resolve[i] if i in resolve else table[w] for i, w in enumerate(src_words)]
    order = list(range(len(src_words)))
    if reorder:
        i = 0
        while i < len(order) - 1:
            if adj[i] and not adj[i + 1]:
                order[i], order[i + 1] = i + 1, i
                i += 2
            else:
                i += 1
    return [tgt[j] for j in order], {j: pos for pos, j in enumerate(order)}


def _derive_labels(doc, lex: Lexicon, reorder: bool):
    """Brute-force labels of one document from its source side and the lexicon tables."""
    noun_class = {s: c for s, _, c in lex.nouns}
    topic_of = {s: t for s, _, t in lex.topic_words}
    senses = dict(lex.ambiguous)
    src = [s.split() for s in doc.src]
    topic_hits = [(k, w) for k, ws in enumerate(src) for w in ws if w in topic_of]
    derived = []
    for k, words in enumerate(src):
        resolve, found = {}, []
        for i, w in enumerate(words):
            if w == lex.pronoun:
                assert not any(x in noun_class for x in words), "pronoun sentence has a noun"
                j = next(j for j in range(k - 1, -1, -1) if any(x in noun_class for x in src[j]))
                (noun,) = [x for x in src[j] if x in noun_class]
                forms = lex.pronoun_forms
                resolve[i] = forms[noun_class[noun]]
                found.append((i, "pronoun", k - j, forms, noun_class[noun]))
            elif w in senses:
                assert len(topic_hits) == 1 and topic_hits[0][0] == 0
                t = topic_of[topic_hits[0][1]]
                resolve[i] = senses[w][t]
                found.append((i, "topic", k, senses[w], t))
        tgt, where = _naive_translate(words, resolve, lex, reorder)
        assert " ".join(tgt) == doc.tgt[k]
        for i, ph, dist, forms, value in found:
            alts = tuple(f for n, f in enumerate(forms) if n != value)
            derived.append(ContextLabel(doc.doc_id, k, where[i], ph, dist, forms[value], alts))
    return sorted(derived, key=lambda lb: (lb.segment, lb.token_index))


# --- tests ----------------------------------------------------------------------------


def test_config_validation():
    with pytest.raises(ValueError):
        SyntheticConfig(distances=(1, 20))  # crosses a 20-sentence chunk
    with pytest.raises(ValueError):
        SyntheticConfig(max_sentences=10)  # distance 15 does not fit
    with pytest.raises(ValueError):
        SyntheticConfig(num_classes=1)
    cfg = SyntheticConfig(distances=[3, 5], seed=7)
    assert cfg.distances == (3, 5)
    assert SyntheticConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


def test_lexicon_alphabets_and_sharing():
    lex = build_lexicon(DEFAULT)
    src_words = [s for s, _ in lex.filler] + [s for s, _, _ in lex.nouns]
    src_words += [lex.pronoun] + [s for s, _, _ in lex.topic_words] + [s for s, _ in lex.ambiguous]
    tgt_words = [t for _, t in lex.filler] + [t for _, t, _ in lex.nouns]
    tgt_words += list(lex.pronoun_forms) + [t for _, t, _ in lex.topic_words]
    tgt_words += [t for _, senses in lex.ambiguous for t in senses]
    assert len(set(src_words)) == len(src_words) == 64 + 12 + 1 + 6 + 4
    assert len(set(tgt_words)) == len(tgt_words) == 64 + 12 + 3 + 6 + 12
    assert set("".join(src_words)) <= set(SRC_CONSONANTS + SRC_VOWELS)
    assert set("".join(tgt_words)) <= set(TGT_CONSONANTS + TGT_VOWELS)
    assert not set(SRC_CONSONANTS + SRC_VOWELS) & set(TGT_CONSONANTS + TGT_VOWELS)
    assert sorted(collections.Counter(c for *_, c in lex.nouns).values()) == [4, 4, 4]
    # The lexicon depends on the seed and lexicon fields only, not on corpus fields.
    other = dataclasses.replace(DEFAULT, num_documents=5, p_topic=0.1, max_sentences=17)
    assert build_lexicon(other) == lex
    assert build_lexicon(dataclasses.replace(DEFAULT, seed=1)) != lex


def test_determinism(tmp_path: Path):
    cfg = dataclasses.replace(DEFAULT, num_documents=150)
    a, b = generate(cfg), generate(cfg)
    assert a == b
    write_tsv(a[0], tmp_path / "a.tsv")
    write_tsv(b[0], tmp_path / "b.tsv")
    assert (tmp_path / "a.tsv").read_bytes() == (tmp_path / "b.tsv").read_bytes()
    c = generate(dataclasses.replace(cfg, seed=1))
    assert [d.src for d in c[0]] != [d.src for d in a[0]]
    assert c[1] != a[1]
    # A smaller corpus is a prefix of a larger one.
    small = generate(dataclasses.replace(cfg, num_documents=40))
    assert small[0] == a[0][:40]


def test_write_corpus_and_read_labels(tmp_path: Path):
    cfg = dataclasses.replace(DEFAULT, num_documents=60)
    splits = {"train": 60, "dev": 20, "test": 30}
    written = write_corpus(tmp_path / "c", cfg, splits)
    names = {"config.json"} | {f"{s}{ext}" for s in splits for ext in (".tsv", ".labels.jsonl")}
    assert set(written) == names
    assert {p.name for p in (tmp_path / "c").iterdir()} == names
    docs, labels = generate(cfg)
    write_tsv(docs, tmp_path / "ref.tsv")
    assert (tmp_path / "c/train.tsv").read_bytes() == (tmp_path / "ref.tsv").read_bytes()
    assert read_labels(tmp_path / "c/train.labels.jsonl") == labels
    line = (tmp_path / "c/train.labels.jsonl").read_text().splitlines()[0]
    assert list(json.loads(line)) == sorted(json.loads(line))
    dev_docs, dev_labels = generate(dataclasses.replace(cfg, num_documents=20), split="dev")
    assert read_labels(tmp_path / "c/dev.labels.jsonl") == dev_labels
    assert {d.src for d in dev_docs}.isdisjoint({d.src for d in docs})
    meta = json.loads((tmp_path / "c/config.json").read_text())
    assert SyntheticConfig.from_dict(meta["config"]) == cfg
    assert meta["lexicon"] == build_lexicon(cfg).to_dict()
    assert meta["splits"]["test"]["documents"] == 30
    # Splits share the lexicon: every dev source word is in the train lexicon tables.
    lex = build_lexicon(cfg)
    known = set(lex.context_free) | {lex.pronoun} | set(lex.senses)
    assert {w for d in dev_docs for s in d.src for w in s.split()} <= known
    # Byte-identical when written again.
    write_corpus(tmp_path / "d", cfg, splits)
    for name in names:
        assert (tmp_path / "c" / name).read_bytes() == (tmp_path / "d" / name).read_bytes()


def test_read_labels_errors(tmp_path: Path):
    good = ContextLabel("d", 1, 0, "pronoun", 1, "x", ("y", "z")).to_json()
    bad = json.dumps({**json.loads(good), "segment": "1"})
    p = tmp_path / "l.jsonl"
    p.write_text(good + "\n" + bad + "\n")
    with pytest.raises(CorpusFormatError, match=r"l\.jsonl:2: 'segment'"):
        read_labels(p)
    p.write_text("{not json\n")
    with pytest.raises(CorpusFormatError, match=r":1: invalid JSON"):
        read_labels(p)


def test_labels_match_brute_force(corpus):
    docs, labels = corpus
    lex = build_lexicon(DEFAULT)
    by_doc = collections.defaultdict(list)
    for lb in labels:
        by_doc[lb.doc_id].append(lb)
    assert set(by_doc) <= {d.doc_id for d in docs}
    for doc in docs:
        assert _derive_labels(doc, lex, DEFAULT.reorder) == by_doc.get(doc.doc_id, [])
        for lb in by_doc.get(doc.doc_id, []):
            assert doc.tgt[lb.segment].split()[lb.token_index] == lb.correct


def test_brute_force_without_reordering():
    cfg = dataclasses.replace(DEFAULT, num_documents=100, reorder=False, seed=3)
    docs, labels = generate(cfg)
    lex = build_lexicon(cfg)
    derived = [lb for d in docs for lb in _derive_labels(d, lex, reorder=False)]
    assert derived == labels


def test_distances_and_chunks(corpus):
    docs, labels = corpus
    assert max(len(d) for d in docs) <= 20
    assert min(len(d) for d in docs) >= DEFAULT.min_sentences
    for ph in ("pronoun", "topic"):
        counts = collections.Counter(lb.distance for lb in labels if lb.phenomenon == ph)
        assert set(counts) == set(range(1, 16))
        assert min(counts.values()) >= 50
    assert all((lb.segment - lb.distance) // 20 == lb.segment // 20 for lb in labels)
    # Longer documents: every dependency stays inside its 20-sentence chunk.
    cfg = dataclasses.replace(
        DEFAULT, num_documents=300, min_sentences=25, max_sentences=45, seed=5
    )
    long_docs, long_labels = generate(cfg)
    lex = build_lexicon(cfg)
    assert max(len(d) for d in long_docs) > 40
    derived = [lb for d in long_docs for lb in _derive_labels(d, lex, cfg.reorder)]
    assert derived == long_labels
    assert any(lb.segment >= 20 for lb in long_labels)
    assert all((lb.segment - lb.distance) // 20 == lb.segment // 20 for lb in long_labels)


def _chi2_critical(df: int, z: float = 3.29) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile (z=3.29: p ~ 0.0005)."""
    h = 2.0 / (9.0 * df)
    return df * (1.0 - h + z * math.sqrt(h)) ** 3


def _chi2_independent(pairs) -> bool:
    """Chi-square independence test of (feature, form) pairs; rare features are pooled."""
    feat_counts = collections.Counter(f for f, _ in pairs)
    pooled = [(f if feat_counts[f] >= 30 else "rare", y) for f, y in pairs]
    table = collections.Counter(pooled)
    rows = sorted({f for f, _ in pooled}, key=str)
    cols = sorted({y for _, y in pooled})
    n = len(pooled)
    row_tot = collections.Counter(f for f, _ in pooled)
    col_tot = collections.Counter(y for _, y in pooled)
    stat = sum(
        (table[r, c] - row_tot[r] * col_tot[c] / n) ** 2 / (row_tot[r] * col_tot[c] / n)
        for r in rows
        for c in cols
    )
    df = (len(rows) - 1) * (len(cols) - 1)
    return df == 0 or stat < _chi2_critical(df)


def _features(docs, labels):
    """Per label: what a context-blind model sees (the source sentence) and the answer."""
    lex = build_lexicon(DEFAULT)
    src = {d.doc_id: d.src for d in docs}
    out = []
    for lb in labels:
        sent = src[lb.doc_id][lb.segment]
        words = sent.split()
        special = lex.pronoun if lb.phenomenon == "pronoun" else None
        pos = next(
            i for i, w in enumerate(words) if w == special or (special is None and w in lex.senses)
        )
        pattern = (lb.segment, len(words), pos, words[pos])
        out.append((lb.phenomenon, sent, pattern, lb.candidates.index(lb.correct), lb))
    return out


def test_context_blind_is_at_chance(corpus, heldout):
    train, test = _features(*corpus), _features(*heldout)
    for ph, n_forms in (("pronoun", DEFAULT.num_classes), ("topic", DEFAULT.num_topics)):
        tr = [x for x in train if x[0] == ph]
        te = [x for x in test if x[0] == ph]
        # Forms are balanced and independent of sentence length, position, segment, word.
        forms = collections.Counter(y for *_, y, _ in tr)
        assert len(forms) == n_forms
        expected = len(tr) / n_forms
        assert sum((c - expected) ** 2 / expected for c in forms.values()) < _chi2_critical(
            n_forms - 1
        )
        for idx in range(4):
            assert _chi2_independent([(pat[idx], y) for _, _, pat, y, _ in tr]), (ph, idx)
        # Best context-blind predictor (majority form given the source sentence, backing
        # off to its pattern, then to the global majority) scores chance on held-out data.
        by_sent = collections.defaultdict(collections.Counter)
        by_pat = collections.defaultdict(collections.Counter)
        for _, sent, pat, y, _ in tr:
            by_sent[sent][y] += 1
            by_pat[pat][y] += 1
        top = forms.most_common(1)[0][0]
        hits = 0
        for _, sent, pat, y, _ in te:
            table = by_sent.get(sent) or by_pat.get(pat)
            guess = table.most_common(1)[0][0] if table else top
            hits += guess == y
        p = 1.0 / n_forms
        sigma = math.sqrt(p * (1 - p) / len(te))
        assert abs(hits / len(te) - p) < 4 * sigma, (ph, hits / len(te))


def test_scoring(corpus):
    docs, labels = corpus
    refs = _refs(docs)
    res = context_accuracy(refs, labels)
    assert res["accuracy"] == 1.0 and res["total"] == len(labels) and res["missing"] == 0
    assert list(res["by_distance"]) == list(range(1, 16))
    assert set(res["by_phenomenon"]) == {"pronoun", "topic"}
    for ph in ("pronoun", "topic"):
        assert list(res["by_phenomenon_distance"][ph]) == list(range(1, 16))
        assert all(b["accuracy"] == 1.0 for b in res["by_phenomenon_distance"][ph].values())
    assert sum(b["total"] for b in res["by_distance"].values()) == len(labels)
    # Every labelled word swapped to a wrong alternative: 0.0 everywhere.
    wrong = {k: [s.split() for s in v] for k, v in refs.items()}
    for lb in labels:
        wrong[lb.doc_id][lb.segment][lb.token_index] = lb.alternatives[0]
    res = context_accuracy({k: [" ".join(t) for t in v] for k, v in wrong.items()}, labels)
    assert res["accuracy"] == 0.0 and res["correct"] == 0
    assert all(b["accuracy"] == 0.0 for b in res["by_distance"].values())
    # Missing documents count as wrong.
    res = context_accuracy({}, labels[:10])
    assert res["correct"] == 0 and res["missing"] == 10
    assert context_accuracy({}, [])["total"] == 0


def test_chance_level_and_blind_baseline(corpus):
    docs, labels = corpus
    assert chance_level(labels) == pytest.approx(1 / 3)
    cfg = dataclasses.replace(DEFAULT, num_documents=300, num_classes=2, num_topics=4)
    _, mixed = generate(cfg)
    n_p = sum(lb.phenomenon == "pronoun" for lb in mixed)
    assert chance_level(mixed) == pytest.approx((n_p / 2 + (len(mixed) - n_p) / 4) / len(mixed))
    n = len(labels)
    sigma = math.sqrt((1 / 3) * (2 / 3) / n)
    for strategy in ("random", "first"):
        hyps = context_blind_hypotheses(docs, labels, strategy=strategy, seed=1)
        res = context_accuracy(hyps, labels)
        assert abs(res["accuracy"] - 1 / 3) < 4 * sigma, strategy
        # Everything but the labelled tokens is left as in the reference.
        changed = sum(
            a != b
            for d in docs
            for h, r in zip(hyps[d.doc_id], d.tgt, strict=True)
            for a, b in zip(h.split(), r.split(), strict=True)
        )
        assert changed == n - res["correct"]
    with pytest.raises(ValueError):
        context_blind_hypotheses(docs, labels, strategy="oracle")


def test_word_level_vocab_size_is_the_largest_and_keeps_words_mostly_whole(tmp_path):
    from docnmt_jax.data.synthetic import word_level_vocab_size
    from docnmt_jax.data.tokenizer import train_tokenizer

    docs = generate(SyntheticConfig(num_documents=400, seed=3), "train")[0]
    size = word_level_vocab_size(docs)
    tokenizer = train_tokenizer(docs, str(tmp_path / "w.model"), vocab_size=size)
    words = sorted({w for d in docs for s in d.src + d.tgt for w in s.split()})
    whole = sum(len(tokenizer.encode(w)) == 1 for w in words)
    assert whole >= 0.9 * len(words), (whole, len(words))
    with pytest.raises(ValueError, match="too large"):
        train_tokenizer(docs, str(tmp_path / "x.model"), vocab_size=size + 1)
