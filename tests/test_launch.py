"""Command-line entry points: help text covers every config key; configs load."""

import importlib.util
import os
import subprocess
import sys

from conftest import ROOT


def _load(path):
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _keys(config, prefix=""):
    for key, value in config.items():
        if hasattr(value, "items"):
            yield from _keys(value, f"{prefix}{key}.")
        else:
            yield prefix + key


def test_helpfull_explains_every_config_key():
    config = _load(os.path.join(ROOT, "configs", "transformer.py")).get_config()
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "launch", "train.py"), "--helpfull"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    ).stdout
    flat = " ".join(out.split())
    for key in _keys(config):
        assert f"--config.{key} (default" in flat, key
        # every key carries an explanation after its default
        line = flat.split(f"--config.{key} (default", 1)[1].split("--config.", 1)[0]
        assert "):" in line, f"{key} has no explanation"
