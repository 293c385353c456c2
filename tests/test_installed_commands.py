"""The installed commands (``docnmt-train``, ...) run from any directory: ``--help`` works,
a shipped config is found by name (``--config final``), a user's own file of that name wins,
``--helpfull`` lists the chosen config's keys, and a config's unknown row is one line."""

import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import zipfile

import pytest
from conftest import ROOT

from docnmt_jax.config_files import load_config, resolve_config_path, shipped_configs_dir

BIN = os.path.dirname(sys.executable)
COMMANDS = {  # installed command -> the module whose run() it calls
    "docnmt-prepare": "docnmt_jax.commands.prepare_data",
    "docnmt-train": "docnmt_jax.commands.train",
    "docnmt-translate": "docnmt_jax.commands.translate",
    "docnmt-evaluate": "docnmt_jax.commands.evaluate",
    "docnmt-analyze": "docnmt_jax.commands.analyze",
    "docnmt-serve": "docnmt_jax.commands.serve",
    "docnmt-export": "docnmt_jax.commands.export",
}
# A user's own config named final.py, built on the shipped transformer config.
OWN_CONFIG = """
from docnmt_jax.config_files import load_config


def get_config():
    config = load_config("transformer")
    config.model.name = "own"
    return config
"""


def _command(name: str) -> str:
    path = shutil.which(name, path=os.pathsep.join([BIN, os.environ.get("PATH", "")]))
    assert path is not None, f"{name} is not installed (make venv: pip install -e .)"
    return path


def _run(args: list[str], cwd: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, cwd=cwd, timeout=timeout)


def _dry_run(config: str, cwd: str) -> dict:
    done = _run([_command("docnmt-train"), "--config", config, "--dry_run"], cwd)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _keys(config, prefix=""):
    for key, value in config.items():
        if hasattr(value, "items"):
            yield from _keys(value, f"{prefix}{key}.")
        else:
            yield prefix + key


def test_every_command_is_installed():
    entry_points = {
        ep.name: ep.value
        for ep in importlib.metadata.entry_points(group="console_scripts")
        if ep.name.startswith("docnmt-")
    }
    assert entry_points == {name: f"{module}:run" for name, module in COMMANDS.items()}
    for name in COMMANDS:
        assert os.access(_command(name), os.X_OK), name


_FAST = ("docnmt-train", "docnmt-prepare")  # the others' --help (jax imports) in test-slow


@pytest.mark.parametrize(
    "name",
    [
        *_FAST,
        *(pytest.param(n, marks=pytest.mark.slow) for n in sorted(COMMANDS) if n not in _FAST),
    ],
)
def test_help_exits_0_anywhere(name, tmp_path):
    module = COMMANDS[name]
    assert importlib.util.find_spec(module) is not None, f"{name}: no module {module}"
    done = _run([_command(name), "--help"], str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    if name == "docnmt-train":  # absl's --help shows the command module's docstring
        assert done.stdout.startswith("Train a model: ``docnmt-train --config final")


def test_shipped_configs_are_found_by_name(tmp_path, monkeypatch):
    configs = os.path.join(ROOT, "configs")
    assert shipped_configs_dir() == configs  # a checkout (editable install)
    monkeypatch.chdir(tmp_path)
    final = os.path.join(configs, "final.py")
    for value in ("final", "final.py", "configs/final", "configs/final.py"):
        assert resolve_config_path(value) == final, value
    table3 = os.path.join(configs, "final_table3.py")
    assert resolve_config_path("final_table3:doc2sent") == table3 + ":doc2sent"
    assert resolve_config_path("final.py:two_step,paper") == final + ":two_step,paper"
    for value in ("nonexistent", "sub/final.py", "nonexistent.py:paper", ""):
        assert resolve_config_path(value) == value  # left for the caller's "no such file"
    (tmp_path / "final.py").write_text(OWN_CONFIG)  # the user's own file wins
    assert resolve_config_path("final") == "final.py"
    assert resolve_config_path("final.py") == "final.py"
    assert resolve_config_path("final:paper") == "final.py:paper"
    assert resolve_config_path("configs/final.py") == final  # not the user's: no configs/ here
    assert load_config("final").model.name == "own"


def test_train_finds_a_shipped_config_from_another_directory(tmp_path):
    final = _dry_run("final", str(tmp_path))
    assert final["workdir"] == "runs/final"  # relative to the current directory
    assert final["config"]["model"]["name"] == "final"
    assert final["config"]["data"]["train_as"] == "multi_resolution"
    paper = _dry_run("final.py:paper", str(tmp_path))
    assert paper["config"]["model"]["name"] == "final"
    assert paper["config"]["train"]["warmup_steps"] == 8000
    assert paper["config"]["model"]["pre_ln"] is False
    assert paper["config"]["data"]["train_as"] == "documents"
    assert not os.listdir(tmp_path)  # a dry run writes nothing


def test_own_config_in_the_current_directory_wins(tmp_path):
    (tmp_path / "final.py").write_text(OWN_CONFIG)
    own = _dry_run("final", str(tmp_path))
    assert own["config"]["model"]["name"] == "own"
    assert own["workdir"] == "runs/final"
    # a copy of a shipped config elsewhere finds its bases among the shipped configs
    copy = tmp_path / "mine"
    copy.mkdir()
    text = open(os.path.join(ROOT, "configs", "final.py"), encoding="utf-8").read()
    (copy / "my_final.py").write_text(text.replace("xl_decoder = True", "xl_decoder = False"))
    mine = _dry_run("mine/my_final.py", str(tmp_path))
    assert mine["workdir"] == "runs/my_final"
    assert mine["config"]["model"]["xl_decoder"] is False
    assert mine["config"]["model"]["segment_embedding"] is True


def test_helpfull_lists_the_chosen_configs_keys(tmp_path):
    final = load_config(os.path.join(ROOT, "configs", "final.py"))
    transformer = load_config(os.path.join(ROOT, "configs", "transformer.py"))
    final_only = sorted(set(_keys(final)) - set(_keys(transformer)))
    assert "model.xl_decoder" in final_only
    done = _run([_command("docnmt-train"), "--config", "final", "--helpfull"], str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    flat = " ".join(done.stdout.split())
    for key in _keys(final):
        assert f"--config.{key} (default" in flat, key
    assert "--config.model.xl_decoder (default True): decoder attends to" in flat
    assert '--config.model.name (default "final")' in flat


@pytest.mark.parametrize(
    "config, rows",
    [
        ("configs/final_table3.py:nosuchrow", ["doc2sent", "sent2doc_xl"]),
        pytest.param("doct_ablations:nosuchrow", ["k1", "two_step"], marks=pytest.mark.slow),
        pytest.param("hmgdc_ablations.py:nosuchrow", ["both_n1"], marks=pytest.mark.slow),
    ],
)
def test_an_unknown_row_is_one_line(config, rows, tmp_path):
    done = _run(
        [
            sys.executable,
            os.path.join(ROOT, "launch", "train.py"),
            f"--config={config}",
            "--dry_run",
        ],
        str(tmp_path),
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"train.py: error: {config}: unknown ")
    assert "'nosuchrow'" in lines[0]
    assert all(f"'{row}'" in lines[0] for row in rows), lines[0]


@pytest.mark.slow
def test_a_wheel_ships_the_configs(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(os.path.join(ROOT, name), source / name)
    ignore = shutil.ignore_patterns("__pycache__")
    for name in ("docnmt_jax", "configs"):
        shutil.copytree(os.path.join(ROOT, name), source / name, ignore=ignore)
    done = _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path / "dist"),
            str(source),
        ],
        str(tmp_path),
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").iterdir()
    names = set(zipfile.ZipFile(wheel).namelist())
    for config in os.listdir(os.path.join(ROOT, "configs")):
        if config.endswith(".py"):
            assert f"docnmt_jax/configs/{config}" in names, config
    entry_points = (
        zipfile.ZipFile(wheel)
        .read(next(n for n in names if n.endswith("entry_points.txt")))
        .decode()
    )
    assert "docnmt-train = docnmt_jax.commands.train:run" in entry_points
