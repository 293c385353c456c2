"""Tests of the Bible es→en corpus: OSIS cleaning, shift detection, alignment, prepare, tfds."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest

pytest.importorskip("pysword", reason="the SWORD reader needs pysword (absent on a lent device)")

from docnmt_jax.data import bible, bible_alignment, osis, sword  # noqa: E402
from docnmt_jax.data.documents import Document, write_tsv
from docnmt_jax.data.readers import read_tsv

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MISSING_MODULES = (
    "SWORD modules spaRV1909eb/engWEB2015eb not installed: "
    "run apt-get install -y sword-text-sparv sword-text-web"
)


def _modules_installed() -> bool:
    try:
        for name in (bible.SRC_MODULE, bible.TGT_MODULE):
            sword.find_module(name, None)
    except sword.SwordModuleNotFoundError:
        return False
    return True


needs_modules = pytest.mark.skipif(not _modules_installed(), reason=MISSING_MODULES)


# --------------------------------------------------------------------------- clean_osis

# Raw markup copied from the installed modules (verse text as stored, OSIS).
WEB_GEN_1_1 = (
    '<w lemma="strong:H0430">In</w> <w lemma="strong:H0853">the</w> '
    '<w lemma="strong:H7225">beginning</w>, <w lemma="strong:H0430">God</w><note '
    'placement="foot"><reference type="annotateRef">1:1 </reference>The Hebrew word '
    'rendered “God” is “אֱלֹהִ֑ים” (Elohim).</note><w lemma="strong:H1254">created</w> '
    '<w lemma="strong:H0853">the</w> <w lemma="strong:H8064">heavens</w> '
    '<w lemma="strong:H0430">and</w> <w lemma="strong:H0853">the</w> '
    '<w lemma="strong:H0776">earth</w>. '
)
SPA_GEN_1_1 = (
    '<w lemma="strong:H7225">EN el principio</w> <w lemma="strong:H1254">crió</w> '
    '<w lemma="strong:H0430">Dios</w> <w lemma="strong:H8064">los cielos</w> '
    '<w lemma="strong:H0776">y la tierra</w>. '
)
WEB_PS_23_1 = (
    '<div type="x-milestone" subType="x-preverse" sID="pv5154"/><title canonical="true" '
    'type="psalm">A Psalm by David.</title> <lg sID="gen8524"/> <l level="1" '
    'sID="gen8525"/><div type="x-milestone" subType="x-preverse" eID="pv5154"/>'
    '<w lemma="strong:H3068">Yahweh</w> <w lemma="strong:H3068">is</w> '
    '<w lemma="strong:H3068">my</w> <w lemma="strong:H7462">shepherd</w>;<l '
    'eID="gen8525" level="1"/> <l level="2" sID="gen8526"/><w lemma="strong:H3068">I</w> '
    '<w lemma="strong:H3068">shall</w> <w lemma="strong:H2637">lack</w> '
    '<w lemma="strong:H3808">nothing</w>. <l eID="gen8526" level="2"/>'
)
WEB_JOHN_3_16 = (
    '<q marker="" who="Jesus"><w lemma="strong:G1063">For</w> <w lemma="strong:G2316">God'
    '</w> <w lemma="strong:G2443">so</w> <w lemma="strong:G0025">loved</w> the world, '
    '<w lemma="strong:G3439">only</w> born</q><note placement="foot"><reference '
    'type="annotateRef">3:16 </reference>The phrase “only born” is from the Greek word '
    '“μονογενη”.</note><q marker="" who="Jesus"><w lemma="strong:G5207">Son</w>, '
    '<w lemma="strong:G2443">that</w> <w lemma="strong:G0166">eternal</w> '
    '<w lemma="strong:G2222">life</w>. </q>'
)
WEB_PS_118_22 = (
    '<l level="2" sID="gen12382"/><w lemma="strong:H1961">has</w> <w lemma="strong:H1961">'
    'become</w> <w lemma="strong:H1129">the</w> <w lemma="strong:H6438">cornerstone</w>.'
    '<note placement="foot"><reference type="annotateRef">118:22 </reference>Literally, '
    '<rdg type="alternate">head of the corner</rdg></note><l eID="gen12382" level="2"/>'
)
WEB_2KGS_12_4_PART = (
    '<w lemma="strong:H3808">is</w> evaluated,<note type="crossReference"><reference '
    'subType="x-origin" type="annotateRef">12:4 </reference><reference>Exodus 30:12'
    '</reference></note> <w lemma="strong:H2076">and</w> all'
)
WEB_SONG_1_2_PART = (
    '<div type="x-milestone" subType="x-preverse" sID="pv8242"/><speaker>Beloved</speaker> '
    '<lg sID="gen15617"/> <l level="1" sID="gen15618"/><div type="x-milestone" '
    'subType="x-preverse" eID="pv8242"/>Let <w lemma="strong:H3588">him</w> kiss'
)
WEB_REV_22_21_PART = (
    '<w lemma="strong:G3956">the</w> saints. Amen.  <chapter eID="Rev.22"/><div '
    'eID="gen35836" type="x-p"/> <div canonical="true" eID="gen35575" osisID="Rev" '
    'type="book"/> <div sID="gen35837" type="glossary"/> <title level="1" type="main">'
    'World English Bible Glossary</title> <div sID="gen35839" type="x-p"/> The '
    "following words used in the World English Bible (WEB) are not very common"
)
SPA_GEN_2_12_PART = (
    '<w lemma="strong:H8033">hay allí</w><transChange type="added">también</transChange>'
    '<w lemma="strong:H0916">bdelio</w> <w lemma="strong:H0068">y piedra</w>'
)
SPA_GEN_19_12_PART = (
    '<w lemma="strong:H5892">en la ciudad</w>, <w lemma="strong:H3318">sáca</w>'
    '<transChange type="added">lo</transChange> <w lemma="strong:H4480">de</w>'
)
SPA_JOSH_5_4_PART = (
    '<w lemma="strong:H0834">por la cual</w> <w lemma="strong:H3091">Josué</w>'
    '<transChange type="added">los</transChange> circuncidó:'
)


@pytest.mark.parametrize(
    "raw, expected",
    [
        (SPA_GEN_1_1, "EN el principio crió Dios los cielos y la tierra."),
        (WEB_GEN_1_1, "In the beginning, God created the heavens and the earth."),
        (WEB_PS_23_1, "A Psalm by David. Yahweh is my shepherd; I shall lack nothing."),
        (
            WEB_JOHN_3_16,
            "For God so loved the world, only born Son, that eternal life.",
        ),
        (WEB_PS_118_22, "has become the cornerstone."),
        (WEB_2KGS_12_4_PART, "is evaluated, and all"),
        (WEB_SONG_1_2_PART, "Let him kiss"),
        (WEB_REV_22_21_PART, "the saints. Amen."),
        (SPA_GEN_2_12_PART, "hay allí también bdelio y piedra"),
        (SPA_GEN_19_12_PART, "en la ciudad, sácalo de"),
        (SPA_JOSH_5_4_PART, "por la cual Josué los circuncidó:"),
        ('<chapter eID="Jonah.1"/><div eID="gen923" type="x-p"/>', ""),
        ("<w>salt</w> &amp; <w>light</w> &lt;sic&gt;", "salt & light <sic>"),
        ("  plain\n text  ", "plain text"),
        ('<divineName>Yahweh</divineName> <w lemma="x">is</w> good', "Yahweh is good"),
    ],
)
def test_clean_osis(raw: str, expected: str) -> None:
    assert osis.clean_osis(raw) == expected


def test_clean_osis_footnote_before_punctuation_leaves_no_space() -> None:
    raw = 'the <w lemma="x">God</w><note placement="foot">a note</note>, and <q>x</q>'
    assert osis.clean_osis(raw) == "the God, and x"


# --------------------------------------------------------------------------- shift detection


def _lengths(n: int, seed: int) -> dict[int, int]:
    rng = random.Random(seed)
    return {v: rng.randint(20, 300) for v in range(1, n + 1)}


def _noisy(lengths: dict[int, int], seed: int, scale: float = 1.1) -> dict[int, int]:
    rng = random.Random(seed)
    return {v: max(1, round(n * scale * rng.uniform(0.9, 1.1))) for v, n in lengths.items()}


def test_chapter_shift_unshifted_is_zero() -> None:
    src = _lengths(30, seed=1)
    assert bible_alignment.chapter_shift(src, _noisy(src, seed=2)) == 0


def test_chapter_shift_detects_whole_chapter_shift() -> None:
    # Source verse v is target verse v-1 (as Spanish Jonah 2:2 = English Jonah 2:1).
    tgt = _lengths(20, seed=3)
    src = {v + 1: n for v, n in _noisy(tgt, seed=4, scale=1.0).items()}
    assert bible_alignment.chapter_shift(src, tgt) == -1
    # ... and the mirror image.
    assert bible_alignment.chapter_shift(tgt, src) == 1


def test_chapter_shift_detects_shift_from_some_verse_on() -> None:
    # Verses 1-12 aligned, from 13 on the source runs 2 verses behind the target.
    tgt = _lengths(30, seed=5)
    src = {v: tgt[v] for v in range(1, 13)}
    src.update({v: tgt[v + 2] for v in range(13, 29)})
    assert bible_alignment.chapter_shift(src, tgt) == 2


def test_chapter_shift_uniform_lengths_is_zero() -> None:
    # Poetry-like chapters: all verses about the same length, no evidence for a shift.
    src = {v: 60 + (v % 3) for v in range(1, 12)}
    tgt = {v: 62 - (v % 2) for v in range(1, 12)}
    assert bible_alignment.chapter_shift(src, tgt) == 0


def test_chapter_shift_too_few_verses_is_zero() -> None:
    assert bible_alignment.chapter_shift({1: 10, 2: 300, 3: 40}, {1: 300, 2: 40, 3: 90}) == 0


def test_chapter_shift_uses_center() -> None:
    src = _lengths(25, seed=6)
    tgt = _noisy(src, seed=7, scale=2.0)  # target systematically twice as long
    assert bible_alignment.chapter_shift(src, tgt, center=-0.69) == 0


def _texts(lengths: dict[int, int], book: str, chapter: int) -> dict:
    return {(book, chapter, v): "x" * n for v, n in lengths.items()}


def test_detect_shifted_chapters_and_align_rules() -> None:
    good = _lengths(25, seed=8)
    tgt_shifted = _lengths(20, seed=9)
    src = _texts(good, "Gen", 1) | _texts({v + 1: n for v, n in tgt_shifted.items()}, "Jonah", 2)
    tgt = _texts(_noisy(good, seed=10), "Gen", 1) | _texts(tgt_shifted, "Jonah", 2)
    assert bible_alignment.detect_shifted_chapters(src, tgt) == {("Jonah", 2): -1}

    src[("Gen", 1, 3)] = ""  # empty source verse
    tgt[("Gen", 1, 4)] = ""  # empty target verse
    src[("Gen", 1, 5)] = tgt[("Gen", 1, 5)] = ""  # empty on both sides
    del tgt[("Gen", 1, 25)]  # verse only in the source versification
    tgt[("Gen", 1, 26)] = "y" * 40  # verse only in the target versification
    src[("Tob", 1, 1)] = tgt[("Tob", 1, 1)] = "not in the shared books"
    alignment = bible_alignment.align(src, tgt)
    assert alignment.shifted == {("Jonah", 2): -1}
    assert list(alignment.chapters) == [("Gen", 1)]
    verses = [v for v, _, _ in alignment.chapters[("Gen", 1)]]
    assert verses == [1, 2] + list(range(6, 25))
    assert alignment.drops[("Gen", 1)] == {
        "empty_src": 1,
        "empty_tgt": 1,
        "empty_both": 1,
        "src_only": 1,
        "tgt_only": 1,
    }
    assert alignment.drops[("Jonah", 2)] == {"shifted_chapter": 21}

    splits = bible_alignment.split_books(alignment)
    assert [d.doc_id for d in splits["train"]] == ["Gen.1"]
    assert splits["dev"] == splits["test"] == []


def test_split_of_book() -> None:
    split_of_book, canon = bible_alignment.split_of_book, bible_alignment.PROTESTANT_CANON
    assert [split_of_book(b) for b in ("Esth", "Lam", "Dan", "Heb", "1Pet")] == ["dev"] * 5
    assert [split_of_book(b) for b in ("Ruth", "Eccl", "John", "Gal", "Jas")] == ["test"] * 5
    assert sum(split_of_book(b) == "train" for b in canon) == 56
    assert len(set(canon)) == 66


def test_missing_modules_error(tmp_path, monkeypatch) -> None:
    with pytest.raises(sword.SwordModuleNotFoundError, match="apt-get install -y sword-text-sparv"):
        sword.read_module_verses(bible.SRC_MODULE, sword_path=tmp_path)
    monkeypatch.setenv("SWORD_PATH", str(tmp_path))
    assert sword.sword_search_paths() == [str(tmp_path)]
    with pytest.raises(sword.SwordModuleNotFoundError, match=str(tmp_path)):
        bible.prepare_bible(tmp_path / "out")


# --------------------------------------------------------------------------- real modules


@pytest.fixture(scope="module")
def verses() -> tuple[dict, dict]:
    if not _modules_installed():
        pytest.skip(MISSING_MODULES)
    return sword.read_module_verses(bible.SRC_MODULE), sword.read_module_verses(bible.TGT_MODULE)


def test_real_genesis_1(verses) -> None:
    src, tgt = verses
    assert max(v for b, c, v in src if (b, c) == ("Gen", 1)) == 31
    assert max(v for b, c, v in tgt if (b, c) == ("Gen", 1)) == 31
    assert src[("Gen", 1, 1)] == "EN el principio crió Dios los cielos y la tierra."
    assert tgt[("Gen", 1, 1)] == "In the beginning, God created the heavens and the earth."
    assert tgt[("John", 3, 16)].startswith("For God so loved the world, that he gave his only")


def test_real_psalm_titles_kept_on_both_sides(verses) -> None:
    src, tgt = verses
    assert src[("Ps", 3, 1)].startswith("Salmo de David, cuando huía de delante de Absalom")
    assert tgt[("Ps", 3, 1)].startswith("A Psalm by David, when he fled from Absalom his son.")
    assert tgt[("Ps", 3, 1)].endswith("Many are those who rise up against me.")
    assert tgt[("Ps", 23, 1)] == "A Psalm by David. Yahweh is my shepherd; I shall lack nothing."


def test_real_text_is_clean(verses) -> None:
    for side in verses:
        for key, text in side.items():
            if key[0] not in bible_alignment.PROTESTANT_CANON:
                continue
            assert "<" not in text and ">" not in text and "\x00" not in text, key
            assert "  " not in text and text == text.strip(), key
            assert "\t" not in text and "\n" not in text, key
    _, tgt = verses
    glued = [k for k, t in tgt.items() if "Godcreated" in t or "bornSon" in t]
    assert glued == []
    assert "Glossary" not in tgt[("Rev", 22, 21)]


def test_real_shifted_chapters(verses) -> None:
    src, tgt = verses
    shared = set(bible_alignment.PROTESTANT_CANON)
    shifted = bible_alignment.detect_shifted_chapters(
        {k: v for k, v in src.items() if k[0] in shared},
        {k: v for k, v in tgt.items() if k[0] in shared},
    )
    # Spanish Jonah 2:1 = English 1:17; likewise Num 13, Num 30, 1Sam 24, Hos 12.
    for chapter in [("Jonah", 2), ("Num", 13), ("Num", 30), ("1Sam", 24), ("Hos", 12)]:
        assert shifted.get(chapter) == -1, chapter
    assert ("Gen", 1) not in shifted and ("Ps", 23) not in shifted
    assert 8 <= len(shifted) <= 20
    assert src[("Jonah", 2, 1)].startswith("MAS Jehová había prevenido un gran pez")
    assert tgt[("Jonah", 1, 17)].startswith("Yahweh prepared a huge fish")


# --------------------------------------------------------------------------- full prepare


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> tuple[str, dict, str]:
    """The corpus prepared twice: through the API and through the command line."""
    if not _modules_installed():
        pytest.skip(MISSING_MODULES)
    first = str(tmp_path_factory.mktemp("bible_api"))
    second = str(tmp_path_factory.mktemp("bible_cli"))
    stats = bible.prepare_bible(first)
    script = os.path.join(REPO, "launch", "prepare_data.py")
    proc = subprocess.run(
        [sys.executable, script, "--corpus", "bible", "--out", second],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "shifted chapters dropped" in proc.stdout
    return first, stats, second


def test_prepare_deterministic(prepared) -> None:
    first, _, second = prepared
    names = ["dev.tsv", "stats.json", "test.tsv", "train.tsv"]
    assert sorted(os.listdir(first)) == sorted(os.listdir(second)) == names
    for name in names:
        with (
            open(os.path.join(first, name), "rb") as a,
            open(os.path.join(second, name), "rb") as b,
        ):
            assert a.read() == b.read(), name


def test_prepare_stats(prepared) -> None:
    out, stats, _ = prepared
    with open(os.path.join(out, "stats.json"), encoding="utf-8") as f:
        assert json.load(f) == stats
    total, train = stats["total"], stats["splits"]["train"]
    assert 1100 <= total["documents"] <= 1200
    assert 29_000 <= total["segments"] <= 31_500
    assert 1050 <= train["documents"] <= 1100 and 27_000 <= train["segments"] <= 29_000
    assert 40 <= stats["splits"]["dev"]["documents"] <= 50
    assert 40 <= stats["splits"]["test"]["documents"] <= 55
    assert 8 <= len(stats["shifted_chapters"]) <= 20
    assert {"doc_id": "Jonah.2", "shift": -1} in stats["shifted_chapters"]
    assert total["drops"]["shifted_chapter"] > 0 and total["drops"]["empty_src"] > 0
    assert sum(s["documents"] for s in stats["splits"].values()) == total["documents"]
    assert 600_000 < total["src_tokens"] < 800_000 and 650_000 < total["tgt_tokens"] < 850_000
    assert "derived from the WEB" in stats["description"]


def _rows(path: str) -> list[list[str]]:
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    assert lines[0] == "doc_id\tsrc\ttgt" and lines[-1] == ""
    return [line.split("\t") for line in lines[1:-1]]


def test_prepare_tsv_layout(prepared) -> None:
    out, stats, _ = prepared
    canon = {b: i for i, b in enumerate(bible_alignment.PROTESTANT_CANON)}
    for split in bible_alignment.SPLITS:
        rows = _rows(os.path.join(out, f"{split}.tsv"))
        assert all(len(r) == 3 and r[1] and r[2] for r in rows)
        doc_ids = [r[0] for r in rows]
        runs = [d for i, d in enumerate(doc_ids) if i == 0 or doc_ids[i - 1] != d]
        assert len(runs) == len(set(runs)) == stats["splits"][split]["documents"]  # contiguous
        order = [(canon[d.split(".")[0]], int(d.split(".")[1])) for d in runs]
        assert order == sorted(order)  # canonical order
        assert {bible_alignment.split_of_book(d.split(".")[0]) for d in runs} == {split}
        assert len(rows) == stats["splits"][split]["segments"]
    train_ids = {r[0] for r in _rows(os.path.join(out, "train.tsv"))}
    assert "Gen.1" in train_ids and "Jonah.2" not in train_ids and "Jonah.1" in train_ids
    test_rows = _rows(os.path.join(out, "test.tsv"))
    assert test_rows[0][0] == "Ruth.1"
    assert test_rows[0][2].startswith("In the days when the judges judged")


# --------------------------------------------------------------------------- tfds builder


def test_tfds_round_trip(tmp_path) -> None:
    tfds = pytest.importorskip("tensorflow_datasets")
    from docnmt_jax.data import tfds_bible

    manual = tmp_path / "prepared"
    manual.mkdir()
    corpus = {
        "train": [
            Document("Gen.1", ("uno", "dos"), ("one", "two")),
            Document("Gen.2", ("tres",), ("three",)),
            Document("Gen.10", ("á, “x” ¿y?",), ("a, “x” y?",)),
        ],
        "dev": [Document("Esth.1", ("cuatro", "cinco", "seis"), ("four", "five", "six"))],
        "test": [
            Document("Ruth.1", ("siete",), ("seven",)),
            Document("Ruth.2", ("ocho", "nueve"), ("eight", "nine")),
        ],
    }
    for split, docs in corpus.items():
        write_tsv(docs, manual / f"{split}.tsv")
        assert read_tsv(manual / f"{split}.tsv") == docs

    data_dir = tmp_path / "tfds"
    for split, docs in corpus.items():
        assert tfds_bible.load_documents(data_dir, manual, split) == docs

    ds = tfds.load(
        "docnmt_bible",
        split="train",
        data_dir=str(data_dir),
        download_and_prepare_kwargs={
            "download_config": tfds.download.DownloadConfig(manual_dir=str(manual))
        },
    )
    examples = sorted(tfds.as_numpy(ds), key=lambda ex: ex["index"])
    assert [ex["doc_id"].decode() for ex in examples] == ["Gen.1", "Gen.2", "Gen.10"]
    assert [s.decode() for s in examples[0]["tgt"]] == ["one", "two"]


# --------------------------------------------------------------------------- packed plans


def test_packed_plans_of_the_prepared_corpus(prepared, tmp_path) -> None:
    """With the 8k sentencepiece and the default config, sentence packing (rows of
    128) gives one shape and < 5% padding, chunk packing (rows of 1024, drift 16) at most two
    shapes and < 10% padding (docs/design/packing_plan.md §0)."""
    import dataclasses

    from docnmt_jax.data.pipeline import PipelineConfig, plan_batches, tokenize_corpus
    from docnmt_jax.data.spec import PackingConfig
    from docnmt_jax.data.tokenizer import get_or_train_tokenizer

    docs = read_tsv(os.path.join(prepared[0], "train.tsv"))
    tokenizer = get_or_train_tokenizer(tmp_path / "spm.model", docs, vocab_size=8000)
    corpus = tokenize_corpus(docs, tokenizer.encode_batch, PipelineConfig())
    sentences = PackingConfig("sentence", row_tokens=128)
    plan = plan_batches(corpus, config=dataclasses.replace(corpus.config, packing=sentences))
    assert len(plan.shapes) == 1 and plan.stats.padding_fraction < 0.05, plan.stats
    chunks = PackingConfig("chunk", row_tokens=1024, drift=16)
    plan = plan_batches(corpus, config=dataclasses.replace(corpus.config, packing=chunks))
    assert len(plan.shapes) <= 2 and plan.stats.padding_fraction < 0.10, plan.stats
