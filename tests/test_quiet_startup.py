"""Commands start without TensorFlow's C++ log lines ("oneDNN custom operations are on", CPU
feature notes, cuDNN/TF-TRT registration warnings): ``docnmt_jax/__init__.py`` sets the
environment before anything imports TensorFlow, and a user's own setting wins."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import pytest
from conftest import ROOT, run_launch

NOISE = re.compile(r"oneDNN|cuDNN|TF-TRT|absl::InitializeLog|cpu_feature_guard|TensorFlow binary")
VARIABLES = ("TF_CPP_MIN_LOG_LEVEL", "TF_ENABLE_ONEDNN_OPTS")
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("tensorflow") is None, reason="TensorFlow is not installed"
)

# What the training loader does: import docnmt_jax, then TensorFlow (data.loader="auto").
IMPORT_TENSORFLOW = """
import os
import docnmt_jax
print(*(os.environ[name] for name in {names}))
from docnmt_jax.data import loader
assert loader.tensorflow_importable()
"""


def run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter, without the TensorFlow variables unless ``env`` sets
    them."""
    environ = {k: v for k, v in os.environ.items() if k not in VARIABLES} | env
    return subprocess.run(
        [sys.executable, "-c", code.format(names=VARIABLES)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=environ,
        timeout=300,
    )


def noise(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if NOISE.search(line)]


def test_tensorflow_imports_quietly():
    proc = run_python(IMPORT_TENSORFLOW)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["2", "0"]
    assert noise(proc.stderr) == [], proc.stderr


def test_the_users_own_settings_win():
    code = "import os, docnmt_jax; print(*(os.environ[name] for name in {names}))"
    proc = run_python(code, TF_CPP_MIN_LOG_LEVEL="0", TF_ENABLE_ONEDNN_OPTS="1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["0", "1"]


@pytest.mark.slow
def test_the_users_settings_reach_tensorflow():
    """With oneDNN's options turned on by the user TensorFlow says so (which also shows that
    the check above sees the line when it is there)."""
    proc = run_python(IMPORT_TENSORFLOW, TF_CPP_MIN_LOG_LEVEL="0", TF_ENABLE_ONEDNN_OPTS="1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["0", "1"]
    assert any("oneDNN custom operations are on" in line for line in noise(proc.stderr))


@pytest.mark.slow
@pytest.mark.parametrize(
    "script", sorted(n for n in os.listdir(os.path.join(ROOT, "launch")) if n.endswith(".py"))
)
def test_launch_script_help_is_quiet(script):
    proc = run_launch(script, "--help")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert noise(proc.stderr) == [], proc.stderr[-2000:]
