"""launch/export.py: the parameters-only release directory, loading it in place of a workdir,
and the StableHLO export of the sentence Transformer driven greedily without the library."""

import contextlib
import hashlib
import io
import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT, run_launch

from docnmt_jax import cli
from docnmt_jax.commands import export as export_command
from docnmt_jax.data import readers
from docnmt_jax.data.documents import Document, write_tsv
from docnmt_jax.decoding.compiled import compile_translate
from docnmt_jax.decoding.search import SearchConfig
from docnmt_jax.errors import ModelError, UserError
from docnmt_jax.export import release, stablehlo
from docnmt_jax.training import restore

RELEASE_FILES = {"params.npz", "config.json", "spm.model", "release.json"}


def _export(*args: str) -> str:
    """Runs the export command in this process; returns what it printed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert export_command.main(list(args)) == 0
    return out.getvalue()


def _refused(capsys, *args: str) -> str:
    """The one stderr line of an export the boundary refuses (status 2)."""
    with pytest.raises(SystemExit) as exit_info:
        cli.run_argparse(export_command.main, list(args))
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith("export.py: error: ")
    return err


def _tree_bytes(path: str) -> int:
    return sum(
        os.path.getsize(os.path.join(root, name))
        for root, _, names in os.walk(path)
        for name in names
    )


def _flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}/"))
        else:
            out[f"{prefix}{key}"] = np.asarray(value)
    return out


@pytest.fixture(scope="module")
def exported(one_step_run, tmp_path_factory):
    """(release directory of ``one_step_run``'s default checkpoint, what the command printed)."""
    out = str(tmp_path_factory.mktemp("export") / "release")
    return out, _export("--workdir", one_step_run, "--out", out)


def test_release_holds_one_parameter_set_config_and_tokenizer(one_step_run, exported):
    out, printed = exported
    assert set(os.listdir(out)) == RELEASE_FILES
    manifest = json.loads(open(os.path.join(out, "release.json"), encoding="utf-8").read())
    model, _, _ = restore.load_model(one_step_run)
    params, step = restore.load_params(model, one_step_run, "best")  # Orbax restore
    expected = _flat(params)
    with np.load(os.path.join(out, "params.npz")) as npz:
        assert sorted(npz.files) == sorted(expected)
        for name, value in expected.items():
            np.testing.assert_array_equal(npz[name], value)
    assert manifest["format_version"] == 1 and manifest["model"] == "transformer"
    assert manifest["source_step"] == step == 1
    assert manifest["parameter_count"] == sum(v.size for v in expected.values())
    assert manifest["dtype"] == "float32" and manifest["parameter_set"] in ("ema", "raw")
    for name in RELEASE_FILES - {"release.json"}:
        digest = hashlib.sha256(open(os.path.join(out, name), "rb").read()).hexdigest()
        assert manifest["files"][name]["sha256"] == digest
    run_spm = open(os.path.join(one_step_run, "spm.model"), "rb").read()
    assert open(os.path.join(out, "spm.model"), "rb").read() == run_spm
    size, run_size = _tree_bytes(out), _tree_bytes(one_step_run)
    assert size < run_size
    assert f"{size / 1e6:.2f} MB" in printed and f"{run_size / 1e6:.2f} MB" in printed
    assert not os.path.exists(out + ".tmp")


def test_release_loads_in_place_of_the_workdir(one_step_run, exported, tmp_path):
    out, _ = exported
    run_model, _, run_config = restore.load_model(one_step_run)
    model, tokenizer, config = restore.load_model(out)
    assert config.model.to_dict() == run_config.model.to_dict()
    assert tokenizer.model_path == os.path.join(out, "spm.model")
    run_params, _ = restore.load_params(run_model, one_step_run, "best")
    params, step = restore.load_params(model, out, "best")
    assert step == 1
    for name, value in _flat(run_params).items():
        np.testing.assert_array_equal(_flat(params)[name], value)
    # A release reads its own spm.model, whatever tokenizer path its config names.
    moved = str(tmp_path / "moved")
    shutil.copytree(out, moved)
    config_path = os.path.join(moved, "config.json")
    moved_config = json.loads(open(config_path, encoding="utf-8").read())
    moved_config["data"]["tokenizer"] = "/nonexistent/spm.model"
    _listed(moved, "config.json", json.dumps(moved_config).encode())  # hashes re-listed
    tokenizer = restore.load_run_tokenizer(restore.load_config(moved), moved)
    assert tokenizer.model_path == os.path.join(moved, "spm.model")


def test_a_release_holds_one_checkpoint(exported, capsys):
    out, _ = exported
    model, _, _ = restore.load_model(out)
    for which in ("latest", "averaged", "1"):
        with pytest.raises(UserError, match=f"--checkpoint {which} does not apply"):
            restore.load_params(model, out, which)
    held = json.loads(open(os.path.join(out, "release.json"), encoding="utf-8").read())
    other = "ema" if held["parameter_set"] == "raw" else "raw"
    with pytest.raises(UserError, match=f"--params {other} does not apply"):
        restore.load_params(model, out, "best", params=other)
    err = _refused(capsys, "--workdir", out, "--out", out + "2", "--checkpoint", "latest")
    assert "is a release holding one parameter set" in err and "--checkpoint latest" in err
    assert not os.path.exists(out + "2") and not os.path.exists(out + "2.tmp")


def test_overwrite_is_refused_unless_asked(one_step_run, exported, tmp_path, capsys):
    out = str(tmp_path / "release")
    shutil.copytree(exported[0], out)
    before = open(os.path.join(out, "release.json"), encoding="utf-8").read()
    err = _refused(capsys, "--workdir", one_step_run, "--out", out)
    assert "exists and is not empty (--overwrite replaces it)" in err
    assert open(os.path.join(out, "release.json"), encoding="utf-8").read() == before
    assert not os.path.exists(out + ".tmp")
    _export("--workdir", one_step_run, "--out", out, "--overwrite")
    assert set(os.listdir(out)) == RELEASE_FILES
    assert sorted(os.listdir(tmp_path)) == ["release"]  # no staging or replaced copy left
    other = tmp_path / "notes"
    other.mkdir()
    (other / "todo.txt").write_text("mine", encoding="utf-8")
    err = _refused(capsys, "--workdir", one_step_run, "--out", str(other), "--overwrite")
    assert "not a release" in err and (other / "todo.txt").exists()
    err = _refused(capsys, "--workdir", one_step_run, "--out", one_step_run, "--overwrite")
    assert "would replace the run" in err


def test_stablehlo_exports_only_the_sentence_transformer():
    class FinalLike:
        name = "final"

    with pytest.raises(ModelError, match="sentence Transformer only"):
        stablehlo.check_exportable(FinalLike())


# ------------------------------------------------------------------------ StableHLO export


def _sharpened_release(exported: str, directory: str) -> str:
    """A copy of the release whose parameters are scaled up, its EOS embedding most, so
    greedy outputs differ by source and some stop at EOS before their limit (the one-step
    run's repeat one token to the limit)."""
    shutil.copytree(exported, directory)
    with np.load(os.path.join(directory, "params.npz")) as npz:
        flat = {k: npz[k] * 3 if npz[k].ndim > 1 else npz[k] for k in npz.files}
    flat["embed/embedding"][1] *= 3  # the EOS row
    os.remove(os.path.join(directory, "release.json"))
    release.write_params(os.path.join(directory, "params.npz"), flat)
    manifest = json.loads(open(os.path.join(exported, "release.json"), encoding="utf-8").read())
    del manifest["files"]
    release.write_manifest(directory, manifest)
    return directory


def _library_greedy(workdir: str, sentences: list[str]) -> list[list[int]]:
    """Token ids (EOS included) of the library's greedy search: beam 1, alpha 0."""
    search = SearchConfig(beam_size=1, alpha=0.0)
    translator, _ = restore.load_translator(workdir, "best", search)
    translate = compile_translate(translator.model, search)
    docs = [Document(f"d{i}", (s,), ("",)) for i, s in enumerate(sentences)]
    outputs: list = [None] * len(sentences)
    for batch in translator.batches(docs):
        ids = np.asarray(translate(translator.params, batch)[0])
        for row, doc in enumerate(batch["doc_index"]):
            if doc >= 0:
                seq = [int(i) for i in ids[row, 0]]
                outputs[doc] = seq[: seq.index(1) + 1] if 1 in seq else seq
    return outputs


READER = """
import json, sys
sys.path.insert(0, sys.argv[1])
import greedy  # the copy export.py writes next to the artifacts
translator = greedy.GreedyTranslator(sys.argv[1])
sentences = json.loads(sys.stdin.read())
ids = translator.greedy_ids([translator.source_ids(s) for s in sentences])
assert "docnmt_jax.models" not in sys.modules and "flax" not in sys.modules
assert not [m for m in sys.modules if m.startswith("docnmt_jax")]
print(json.dumps({"ids": ids, "text": translator.translate(sentences)}))
"""


@pytest.mark.slow
def test_exported_greedy_equals_library_greedy(exported, synthetic_dir, tmp_path):
    sharpened = _sharpened_release(exported[0], str(tmp_path / "sharpened"))
    out = str(tmp_path / "with_stablehlo")
    _export("--workdir", sharpened, "--out", out, "--stablehlo")
    spec = json.loads(open(os.path.join(out, "stablehlo", "model.json")).read())
    assert spec["decode_step"]["cache"][1]["shape"][0] == "b"  # symbolic batch
    docs = readers.read_tsv(os.path.join(synthetic_dir, "test.tsv"))
    sentences = [s for d in docs for s in d.src][:8]
    reader = subprocess.run(
        [sys.executable, "-c", READER, os.path.join(out, "stablehlo")],
        input=json.dumps(sentences),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert reader.returncode == 0, reader.stderr[-3000:]
    exported_ids = json.loads(reader.stdout)["ids"]
    expected = _library_greedy(out, sentences)
    assert exported_ids == expected
    # Not a degenerate case: outputs differ by source, some stop at EOS, some at the limit.
    _, tokenizer, _ = restore.load_model(out)
    limits = [min(256, math.floor(1.5 * (len(tokenizer.encode(s)) + 1) + 10)) for s in sentences]
    pairs = list(zip(expected, limits, strict=True))
    assert len({tuple(ids) for ids in expected}) >= 4
    assert all(ids[-1] == 1 and len(ids) <= limit for ids, limit in pairs)
    assert any(len(ids) < limit for ids, limit in pairs)
    assert any(len(ids) == limit for ids, limit in pairs)


@pytest.mark.slow
def test_translate_py_reads_a_release(one_step_run, exported, synthetic_dir, tmp_path):
    docs = readers.read_tsv(os.path.join(synthetic_dir, "test.tsv"))[:2]
    source = tmp_path / "in.tsv"
    write_tsv(docs, source)
    hyp = tmp_path / "hyp.tsv"
    args = [f"--input={source}", f"--output={hyp}", "--beam=2"]
    result = run_launch("translate.py", f"--workdir={exported[0]}", *args)
    assert result.returncode == 0, result.stderr[-3000:]
    translator, _ = restore.load_translator(one_step_run, "best", SearchConfig(beam_size=2))
    hyps = translator.translate(docs)
    rows = [f"{d.doc_id}\t{h}" for d, doc_hyps in zip(docs, hyps, strict=True) for h in doc_hyps]
    # Whitespace collapsed: translate.py writes a hypothesis' tabs/newlines as spaces.
    assert hyp.read_text().split() == "\n".join(["doc_id\thyp", *rows]).split()
    refused = run_launch("translate.py", f"--workdir={exported[0]}", "--checkpoint=latest", *args)
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines()[-1].startswith("translate.py: error: ")
    assert "--checkpoint latest does not apply" in refused.stderr


# ------------------------------------------------------------- a release verified whole


def _listed(directory: str, name: str, text: bytes) -> None:
    """Adds file ``name`` to the release in ``directory`` and re-lists every file."""
    path = os.path.join(directory, *name.split("/"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    open(path, "wb").write(text)
    manifest = json.loads(open(os.path.join(directory, "release.json"), encoding="utf-8").read())
    del manifest["files"]
    os.remove(os.path.join(directory, "release.json"))
    release.write_manifest(directory, manifest)


@pytest.mark.parametrize("name", ["config.json", "spm.model", "params.npz", "stablehlo/x.bin"])
def test_every_file_of_a_release_is_checked_on_load(exported, tmp_path, name):
    out = str(tmp_path / "release")
    shutil.copytree(exported[0], out)
    _listed(out, "stablehlo/x.bin", b"listed")
    model, _, _ = restore.load_model(out)
    restore.load_params(model, out, "best")  # intact: loads
    with open(os.path.join(out, *name.split("/")), "ab") as f:
        f.write(b" ")
    with pytest.raises(UserError) as error:
        restore.load_params(*restore.load_model(out)[:1], out, "best")
    message = str(error.value)
    assert "\n" not in message and os.path.join(out, name) in message and "sha256" in message


@pytest.mark.parametrize("name", ["../outside", "/etc/passwd", "a/../../b", "a\\b", "./x", ""])
def test_a_manifest_names_only_files_inside_the_release(exported, tmp_path, name):
    out = str(tmp_path / "release")
    shutil.copytree(exported[0], out)
    path = os.path.join(out, "release.json")
    manifest = json.loads(open(path, encoding="utf-8").read())
    manifest["files"][name] = {"bytes": 1, "sha256": "0" * 64}
    open(path, "w", encoding="utf-8").write(json.dumps(manifest))
    with pytest.raises(UserError, match="is not a file name inside the release"):
        restore.load_model(out)
    with pytest.raises(UserError, match="is not a file name inside the release"):
        release.check_file(out, release.read_manifest(exported[0]), name)


def test_the_stablehlo_reader_checks_its_files(exported, tmp_path, capsys):
    from docnmt_jax.export import greedy

    out = str(tmp_path / "release")
    shutil.copytree(exported[0], out)
    spec = {"format": greedy.FORMAT, "format_version": greedy.FORMAT_VERSION}
    _listed(out, "stablehlo/model.json", json.dumps(spec).encode())
    files = greedy.CheckedFiles(os.path.join(out, "stablehlo"))
    assert files.path("../params.npz") == os.path.join(out, "params.npz")
    for name in ("../release.json", "../../x", "/etc/passwd", "sub/x", "..", 3):
        with pytest.raises(ValueError, match="is not a file of the release"):
            files.path(name)
    open(os.path.join(out, "spm.model"), "ab").write(b" ")
    with pytest.raises(ValueError, match="spm.model: sha256 differs"):
        files.path("../spm.model")
    open(os.path.join(out, "stablehlo", "model.json"), "a").write(" ")
    assert greedy.main([os.path.join(out, "stablehlo")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "model.json: sha256 differs" in err
