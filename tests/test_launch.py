"""Command-line entry points: help text covers every config key; configs load."""

import os
import subprocess
import sys

from conftest import ROOT

from docnmt_jax.config_files import load_config


def _keys(config, prefix=""):
    for key, value in config.items():
        if hasattr(value, "items"):
            yield from _keys(value, f"{prefix}{key}.")
        else:
            yield prefix + key


def test_helpfull_explains_every_config_key():
    config = load_config(os.path.join(ROOT, "configs", "transformer.py"))
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
