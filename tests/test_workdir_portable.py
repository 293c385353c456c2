"""Self-contained workdirs: a run keeps the tokenizer it trained with inside its workdir and
records it relative to it, so that the workdir (and a release) translates from any current
directory and after being moved; workdirs written before that still load and resume."""

import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import tiny_config

from docnmt_jax.errors import ConfigError
from docnmt_jax.training import restore, run_tokenizer

TRANSLATE = os.path.join(os.path.dirname(sys.executable), "docnmt-translate")


def _config(workdir: str) -> dict:
    with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
        return json.load(f)


def _name_tokenizer(workdir: str, named: str) -> None:
    """Rewrites ``workdir``'s config.json as an older run naming its tokenizer ``named``."""
    config = _config(workdir)
    config["data"]["tokenizer"] = named
    with open(os.path.join(workdir, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f)


def test_older_workdirs_naming_a_tokenizer_load_from_anywhere(one_step_run, tmp_path, monkeypatch):
    """An older run trained from ``tmp/`` with ``runs/tok/spm.model`` (relative to ``tmp/``) or
    an absolute path, loaded with ``/`` as the current directory; resuming it copies the
    tokenizer in and records ``spm.model``."""
    runs = tmp_path / "runs"
    workdir = str(runs / "old")
    shutil.copytree(one_step_run, workdir)
    (runs / "tok").mkdir()
    tokenizer = str(runs / "tok" / "spm.model")
    shutil.move(os.path.join(workdir, "spm.model"), tokenizer)
    monkeypatch.chdir("/")
    for named in (tokenizer, "runs/tok/spm.model"):
        _name_tokenizer(workdir, named)
        loaded = restore.load_run_tokenizer(restore.load_config(workdir), workdir)
        assert loaded.model_path == os.path.join(str(tmp_path), "runs/tok/spm.model")
    model, loaded, _ = restore.load_model(workdir)
    restore.load_params(model, workdir, "best", loaded.model_path)  # the vocabulary fits
    copy = run_tokenizer.keep_in_workdir("runs/tok/spm.model", workdir)  # what a resume does
    assert copy == os.path.join(workdir, "spm.model")
    assert open(copy, "rb").read() == open(tokenizer, "rb").read()
    assert _config(workdir)["data"]["tokenizer"] == "spm.model"
    os.remove(tokenizer)  # self-contained now
    assert restore.load_model(workdir)[1].model_path == copy
    other = tmp_path / "other.model"
    other.write_bytes(b"not the same tokenizer")
    with pytest.raises(ConfigError, match="a run keeps the tokenizer it started with"):
        run_tokenizer.keep_in_workdir(str(other), workdir)


def _train_one_step(synthetic_dir: str, workdir: str, tokenizer: str) -> None:
    from docnmt_jax.training import trainer

    config = tiny_config(synthetic_dir, num_steps=1)
    config.data.tokenizer = tokenizer
    trainer.train_and_evaluate(config, workdir)


@pytest.mark.slow
def test_train_move_and_translate_from_root(one_step_run, synthetic_dir, tmp_path, monkeypatch):
    """Train naming a tokenizer by a relative path (as ``make demo`` does), move the workdir
    and delete the original tokenizer, translate from ``/`` with the installed command."""
    shutil.copyfile(os.path.join(one_step_run, "spm.model"), tmp_path / "shared.model")
    monkeypatch.chdir(tmp_path)
    _train_one_step(synthetic_dir, "runs/first", "shared.model")
    assert _config("runs/first")["data"]["tokenizer"] == "spm.model"
    moved = str(tmp_path / "elsewhere" / "run")
    shutil.move("runs/first", moved)
    os.remove(tmp_path / "shared.model")
    done = subprocess.run(
        [TRANSLATE, "--workdir", moved, "--beam", "1"],
        input="pibu moroni\n\nruka nipisa\n",
        capture_output=True,
        text=True,
        cwd="/",
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(done.stdout.splitlines()) == 3  # plain text in, plain text out, line for line
