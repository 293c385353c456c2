"""docnmt-export --format ctranslate2: the sentence Transformer converted through
CTranslate2's TransformerSpec searches token for token as ours (greedy; beam at alpha 0), and
the command's refusals. Skipped without the optional ctranslate2 package."""

import contextlib
import io
import json
import os
import shutil
import sys

import flax.linen as nn
import jax
import numpy as np
import pytest
from conftest import ROOT, tiny_config, tiny_final_config
from flax import traverse_util

ctranslate2 = pytest.importorskip(
    "ctranslate2", reason="the optional ctranslate2 package: pip install -e .[ctranslate2]"
)

from docnmt_jax import cli  # noqa: E402
from docnmt_jax.commands import benchmark as benchmark_command  # noqa: E402
from docnmt_jax.commands import export as export_command  # noqa: E402
from docnmt_jax.data import synthetic  # noqa: E402
from docnmt_jax.data.documents import Document, write_tsv  # noqa: E402
from docnmt_jax.data.tokenizer import load_tokenizer, train_tokenizer  # noqa: E402
from docnmt_jax.decoding.search import SearchConfig  # noqa: E402
from docnmt_jax.export import ctranslate2 as conversion  # noqa: E402
from docnmt_jax.export import ctranslate2_equality as equality  # noqa: E402
from docnmt_jax.export import release  # noqa: E402
from docnmt_jax.models.base import build_model  # noqa: E402
from docnmt_jax.training import restore  # noqa: E402

sys.path.insert(0, ROOT)
from experiments import ctranslate2_equality as equality_script  # noqa: E402

RELEASE = os.path.join(ROOT, "releases", "bible-transformer")
BIBLE_TEST = os.path.join(ROOT, "data", "bible", "test.tsv")


def _export(*args: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert export_command.main(list(args)) == 0
    return out.getvalue()


def _refused(capsys, *args: str) -> str:
    """The one stderr line of an export refused at the boundary (status 2)."""
    with pytest.raises(SystemExit) as exit_info:
        cli.run_argparse(export_command.main, list(args))
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1, err
    return err


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A generated corpus's documents and a 320-piece tokenizer trained on them."""
    docs, _ = synthetic.generate(synthetic.SyntheticConfig(num_documents=40, seed=7), "train")
    path = tmp_path_factory.mktemp("spm") / "spm.model"
    train_tokenizer(docs, path, vocab_size=320)
    return docs, str(path)


def _random_params(model, seed: int) -> dict[str, np.ndarray]:
    """Flat random parameters of ``model``, every one drawn (biases and norms too, so the
    conversion of each is checked) and sharpened (weights ~ 3 / sqrt(fan in), the EOS row of
    the embedding x9) so greedy outputs differ by source and some stop at EOS early."""
    shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), restore.dummy_batch())["params"]
    rng = np.random.default_rng(seed)
    flat = {}
    for name, x in traverse_util.flatten_dict(nn.meta.unbox(shapes), sep="/").items():
        if name.endswith("/scale"):
            value = 1.0 + 0.1 * rng.standard_normal(x.shape)
        elif name.endswith("/bias"):
            value = 0.1 * rng.standard_normal(x.shape)
        else:  # kernels [in..., out...] ([H, d, D] for attention outputs), embedding [V, D]
            inputs = 2 if name.endswith("out/kernel") else 1
            fan_in = x.shape[1] if name == "embed/embedding" else np.prod(x.shape[:inputs])
            value = 3.0 * rng.standard_normal(x.shape) / np.sqrt(fan_in)
        flat[name] = value.astype(np.float32)
    flat["embed/embedding"][1] *= 3
    return flat


def _release(directory, corpus, config) -> str:
    """A release of ``config``'s model with :func:`_random_params`."""
    _, spm = corpus
    os.makedirs(directory)
    model = build_model(config.model, load_tokenizer(spm).vocab_size)
    release.write_params(os.path.join(directory, release.PARAMS_FILE), _random_params(model, 3))
    config.data.tokenizer = ""
    with open(os.path.join(directory, release.CONFIG_FILE), "w", encoding="utf-8") as f:
        f.write(config.to_json())
    shutil.copyfile(spm, os.path.join(directory, release.TOKENIZER_FILE))
    info = {"model": config.model.name, "source_step": 0, "parameter_set": "raw"}
    release.write_manifest(str(directory), info)
    return str(directory)


@pytest.fixture(scope="module")
def pre_ln_release(corpus, tmp_path_factory):
    """Pre-LN (the recipe's Transformer), one layer each side: the searches compile fast."""
    config = tiny_config(str(tmp_path_factory.mktemp("data")))
    config.model.pre_ln = True
    return _release(tmp_path_factory.mktemp("pre") / "release", corpus, config)


@pytest.fixture(scope="module")
def post_ln_release(corpus, tmp_path_factory):
    """Post-LN (the papers' Transformer), two layers each side."""
    config = tiny_config(str(tmp_path_factory.mktemp("data")))
    assert not config.model.pre_ln
    config.model.num_encoder_layers = config.model.num_decoder_layers = 2
    return _release(tmp_path_factory.mktemp("post") / "release", corpus, config)


def _short_documents(corpus, tokenizer, count: int = 20) -> list[Document]:
    """One document of ``count`` sentences of 12 to 14 pieces: every one in our Translator's
    one batch shape (one compiled search), their output limits 29 to 32."""
    docs, _ = corpus
    short = [s for d in docs for s in d.src if 12 <= len(tokenizer.encode(s)) <= 14]
    assert len(short) >= count
    return [Document("short", tuple(short[:count]), ("",) * count)]


def test_converted_model_searches_as_ours(pre_ln_release, corpus, tmp_path, capsys):
    out = str(tmp_path / "ct2")
    printed = _export("--workdir", pre_ln_release, "--out", out, "--format", "ctranslate2")
    assert printed.startswith(f"wrote {out}: CTranslate2 transformer step 0")
    files = set(os.listdir(out))
    assert {"model.bin", "config.json", "shared_vocabulary.json", "spm.model"} <= files
    metadata = json.loads(open(os.path.join(out, conversion.METADATA_FILE)).read())
    assert metadata["quantization"] == "float32" and metadata["pre_ln"] is True
    config = json.loads(open(os.path.join(out, "config.json")).read())
    assert config["add_source_eos"] and config["decoder_start_token"] == "<s>"

    model, tokenizer, _ = restore.load_model(pre_ln_release)
    params, _ = restore.load_params(model, pre_ln_release, "best")
    translator = ctranslate2.Translator(out, intra_threads=1)
    documents = _short_documents(corpus, tokenizer)
    greedy = equality.compare(model, params, tokenizer, translator, documents, SearchConfig(1, 0.0))
    assert greedy["identical"] == greedy["sentences"] == 20, greedy["differences"]
    # Not a degenerate case: outputs differ by source, some stop at EOS, some at the limit.
    assert 0 < greedy["at_limit_ours"] < greedy["sentences"]
    beam = equality.compare(model, params, tokenizer, translator, documents, SearchConfig(5, 0.0))
    assert set(beam["reasons"]) <= {"limit", "tie"}, beam["differences"]
    assert beam["identical"] > beam["sentences"] // 2

    # An earlier export is replaced only when asked; another directory never.
    assert "--overwrite replaces it" in _refused(
        capsys, "--workdir", pre_ln_release, "--out", out, "--format", "ctranslate2"
    )
    _export("--workdir", pre_ln_release, "--out", out, "--format", "ctranslate2", "--overwrite")
    assert "not a CTranslate2 export" in _refused(
        capsys,
        "--workdir",
        pre_ln_release,
        "--out",
        str(tmp_path),
        "--format",
        "ctranslate2",
        "--overwrite",
    )


def test_post_ln_scores_equal_ours(post_ln_release, corpus, tmp_path):
    """Post-LN converted: CTranslate2's teacher-forced log-probabilities are ours."""
    out = str(tmp_path / "ct2")
    _export("--workdir", post_ln_release, "--out", out, "--format", "ctranslate2")
    model, tokenizer, _ = restore.load_model(post_ln_release)
    params, _ = restore.load_params(model, post_ln_release, "best")
    docs, _ = corpus
    sources = tokenizer.encode_batch(list(docs[0].src[:6]))
    targets = tokenizer.encode_batch(list(docs[0].tgt[:6]))
    pieces = conversion.vocabulary(tokenizer)
    translator = ctranslate2.Translator(out, intra_threads=1)
    scored = translator.score_batch(
        [[pieces[i] for i in s] for s in sources], [[pieces[i] for i in t] for t in targets]
    )
    theirs = [sum(r.log_probs) for r in scored]
    assert [r.tokens[-1] for r in scored] == ["</s>"] * 6
    ours = equality.log_probs(model, params, sources, targets)
    np.testing.assert_allclose(theirs, ours, rtol=1e-5, atol=1e-3)
    assert len({round(x, 2) for x in ours}) == 6


def test_benchmark_section(pre_ln_release, corpus, tmp_path, capsys):
    """launch/benchmark.py --sections ctranslate2 on the tiny model: every engine and search
    timed; with one output limit per CTranslate2 batch its float32 greedy outputs are ours."""
    test_tsv = tmp_path / "test.tsv"
    write_tsv(_short_documents(corpus, load_tokenizer(corpus[1])), test_tsv)
    argv = ["--quick", "--sections", "ctranslate2", "--ctranslate2-workdir", pre_ln_release]
    argv += ["--corpus-test-tsv", str(test_tsv), "--ctranslate2-batching", "limit"]
    argv += ["--ctranslate2-profile", str(tmp_path / "trace")]
    result = benchmark_command.main([*argv, "--ctranslate2-threads", "1"])["ctranslate2"]
    rows = {(r["engine"], r["search"]): r for r in result["runs"]}
    engines = ["ours (jit, float32)", "CTranslate2 float32", "CTranslate2 int8"]
    assert set(rows) == {(e, s) for e in engines for s in ("beam 5", "greedy")}
    assert all(r["sentences"] == 20 and r["tokens_per_s"] > 0 for r in rows.values())
    greedy = rows["CTranslate2 float32", "greedy"]
    assert greedy["identical"] == 20 and greedy["batches"] == 3  # limits 29, 31, 32
    assert rows["ours (jit, float32)", "greedy"]["sentences_per_s_ratio"] == 1.0
    assert result["float32_peak_gflops"] > 0 and result["threads"] == 1
    assert any(
        name.endswith(".xplane.pb") for _, _, names in os.walk(result["profile"]) for name in names
    )
    assert "| CTranslate2 int8 | beam 5 | 20 |" in capsys.readouterr().out


@pytest.mark.slow
def test_post_ln_equality_script(post_ln_release, corpus, tmp_path):
    """experiments/ctranslate2_equality.py on a post-LN model: greedy identical."""
    test_tsv, out = tmp_path / "test.tsv", tmp_path / "equality.json"
    docs, _ = corpus
    write_tsv(docs[:3], test_tsv)
    args = ["--workdir", post_ln_release, "--test", str(test_tsv), "--out", str(out)]
    assert equality_script.main([*args, "--threads", "1"]) == 0
    result = json.loads(out.read_text())
    greedy, beam = result["greedy"], result["beam"]
    assert greedy["identical"] == greedy["sentences"] >= 15, greedy["differences"]
    assert result["greedy_target_met"]
    assert set(beam["reasons"]) <= {"limit", "tie"}, beam["differences"]


def test_int8_export_is_smaller_and_translates(pre_ln_release, corpus, tmp_path):
    out32, out8 = str(tmp_path / "fp32"), str(tmp_path / "int8")
    _export("--workdir", pre_ln_release, "--out", out32, "--format", "ctranslate2")
    args = ["--workdir", pre_ln_release, "--out", out8, "--format", "ctranslate2"]
    _export(*args, "--quantization", "int8")
    metadata = json.loads(open(os.path.join(out8, conversion.METADATA_FILE)).read())
    assert metadata["quantization"] == "int8"
    size = {d: os.path.getsize(os.path.join(d, "model.bin")) for d in (out32, out8)}
    assert size[out8] < 0.7 * size[out32]  # the position table stays float32
    translator = ctranslate2.Translator(out8, compute_type="int8", intra_threads=1)
    result = translator.translate_batch([["▁a", "b"], ["c"]], max_decoding_length=5)
    vocab = set(json.loads(open(os.path.join(out8, "shared_vocabulary.json")).read()))
    assert all(1 <= len(r.hypotheses[0]) <= 5 and set(r.hypotheses[0]) <= vocab for r in result)


def test_refusals(pre_ln_release, corpus, tmp_path, capsys):
    final_dir = tmp_path / "final"
    final_dir.mkdir()
    config = tiny_final_config(str(tmp_path))
    config.data.tokenizer = ""
    (final_dir / "config.json").write_text(config.to_json())
    shutil.copyfile(corpus[1], final_dir / "spm.model")
    out = str(tmp_path / "out")
    err = _refused(capsys, "--workdir", str(final_dir), "--out", out, "--format", "ctranslate2")
    assert "converts the sentence Transformer only" in err and "'final'" in err
    assert not os.path.exists(out) and not os.path.exists(out + ".tmp")
    args = ["--workdir", pre_ln_release, "--out", out]
    assert "--format ctranslate2 only" in _refused(capsys, *args, "--quantization", "int8")
    assert "--stablehlo" in _refused(capsys, *args, "--format", "ctranslate2", "--stablehlo")
    assert "invalid choice" in _refused(
        capsys, *args, "--format", "ctranslate2", "--quantization", "int4"
    )


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir(RELEASE), reason=f"no release at {RELEASE} (committed later)")
@pytest.mark.skipif(not os.path.exists(BIBLE_TEST), reason=f"{BIBLE_TEST}: prepare the Bible")
def test_bible_release_searches_as_ours(tmp_path):
    """The committed Transformer release on the Bible test books: greedy identical on every
    sentence, beam 5 (alpha 0) on at least 99% with the rest explained."""
    out = tmp_path / "equality.json"
    args = ["--workdir", RELEASE, "--test", BIBLE_TEST, "--out", str(out)]
    assert equality_script.main(args) == 0
    result = json.loads(out.read_text())
    assert result["greedy"]["identical"] == result["greedy"]["sentences"], result["greedy"]
    assert result["beam"]["identical_fraction"] >= equality_script.BEAM_TARGET, result["beam"]
