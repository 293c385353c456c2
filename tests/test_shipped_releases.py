"""The trained models shipped in ``releases/`` (committed by the converged campaign,
docs/log/2026-12-02-converged-campaign.md): each release is whole (every file's sha256 as its
manifest says, at most 32 MiB, float32, how it was trained recorded: an interim release its
dev score, a final one its test scores too), and translates from any directory:
``docnmt-translate`` from a temporary directory with known verses in and their key words out,
``docnmt_jax.load`` the same, and ``docnmt-serve`` (slow). The sentence Transformer's release
must be there; the others are tested once committed."""

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT

from docnmt_jax.export import release

MIB = 1 << 20
#: (release, Spanish verses, an English word each translation must hold): verses the test
#: books hold (John 11:35, Ruth 1:16's start, Gal. 1:3) -- words no adequate model drops.
RELEASES = {
    "bible-transformer": (
        [
            "Y lloró Jesús.",
            "Gracia sea á vosotros, y paz de Dios el Padre, y de nuestro Señor Jesucristo.",
        ],
        ["Jesus", "God"],
    ),
    "bible-final": (
        [
            "Y lloró Jesús.",
            "Gracia sea á vosotros, y paz de Dios el Padre, y de nuestro Señor Jesucristo.",
        ],
        ["Jesus", "God"],
    ),
}


#: The releases committed in this checkout (bible-transformer must be one of them).
SHIPPED = sorted(n for n in RELEASES if release.is_release(os.path.join(ROOT, "releases", n)))


def _release(name: str) -> str:
    return os.path.join(ROOT, "releases", name)


def test_the_sentence_transformer_is_shipped():
    assert "bible-transformer" in SHIPPED, f"{_release('bible-transformer')} is not a release"


@pytest.mark.parametrize("name", SHIPPED)
def test_a_shipped_release_is_whole_and_says_how_it_was_trained(name):
    path = _release(name)
    manifest = release.read_manifest(path)
    assert release.directory_bytes(path) <= 32 * MIB
    assert manifest["dtype"] == "float32" and manifest["parameter_set"] == "ema"
    for file, entry in manifest["files"].items():
        assert release.sha256(os.path.join(path, file)) == entry["sha256"], file
    training = manifest["training"]
    for key in ("commit", "command", "steps_trained", "chosen_step", "target_tokens_trained"):
        assert training.get(key), key
    assert training["dev_at_chosen_step"].get("dev_bleu") is not None
    if training["stopped_by"] != "interim":  # a final release: chosen on dev, scored on test
        assert training["test"]["s_bleu"] is not None and training["test_beam"]


@pytest.mark.parametrize("name", SHIPPED)
def test_a_shipped_release_translates_from_any_directory(name, tmp_path):
    path = _release(name)
    verses, words = RELEASES[name]
    command = os.path.join(os.path.dirname(sys.executable), "docnmt-translate")
    out = subprocess.run(
        [command, "--workdir", path, "--beam", "1"],
        input="\n".join(verses) + "\n",
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=900,
        check=True,
    )
    lines = out.stdout.splitlines()
    assert len(lines) == len(verses)
    for line, word in zip(lines, words, strict=True):
        assert word in line, (line, out.stderr[-2000:])


@pytest.mark.slow
@pytest.mark.parametrize("name", SHIPPED)
def test_a_shipped_release_loads_in_the_api_and_the_server(name, tmp_path):
    from docnmt_jax import api

    path = _release(name)
    verses, words = RELEASES[name]
    translated = api.load(path).translate([[v] for v in verses], beam=1)
    assert all(word in t[0] for t, word in zip(translated, words, strict=True))
    serve = os.path.join(os.path.dirname(sys.executable), "docnmt-serve")
    proc = subprocess.Popen(
        [serve, "--workdir", path, "--port", "0", "--beam", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=tmp_path,
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("serving "), line
        import urllib.request

        url = line.split(" on ")[-1].strip() + "/translate"
        body = json.dumps({"sentences": verses}).encode()
        with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=600) as r:
            answer = json.loads(r.read().decode())
        assert answer["translations"] == [t[0] for t in translated]
    finally:
        proc.terminate()
        proc.wait(60)
