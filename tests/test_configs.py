"""Every config file loads, builds its model, and the Table 3 rows carry their switches."""

import glob
import importlib.util
import os

import pytest
from conftest import ROOT

from docnmt_jax.models import build_task
from docnmt_jax.models.concat import Doc2DocTask
from docnmt_jax.models.final import TABLE3_SWITCHES, FinalTask
from docnmt_jax.models.transformer import SentenceTransformerTask

CONFIG_FILES = sorted(
    p for p in glob.glob(os.path.join(ROOT, "configs", "*.py")) if "__init__" not in p
)
# Config files without a TABLE3_ROW attribute: the row they are (None: not a FINAL model).
ROWS_BY_NAME = {"final.py": "final", "transformer.py": None, "doc2doc.py": None}
# Models other than FINAL: (task class, data.sentence_level) by config.model.name.
OTHER_MODELS = {"transformer": (SentenceTransformerTask, True), "doc2doc": (Doc2DocTask, False)}


def _load(path):
    spec = importlib.util.spec_from_file_location("config_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_table3_row_has_a_config_file():
    rows = {
        getattr(_load(p), "TABLE3_ROW", ROWS_BY_NAME.get(os.path.basename(p))) for p in CONFIG_FILES
    }
    assert set(TABLE3_SWITCHES) <= rows


@pytest.mark.parametrize("path", CONFIG_FILES, ids=os.path.basename)
def test_config_loads_builds_and_has_its_row_switches(path):
    module = _load(path)
    config = module.get_config()
    task = build_task(config.model, vocab_size=100)
    row = getattr(module, "TABLE3_ROW", ROWS_BY_NAME.get(os.path.basename(path), "unknown"))
    assert row != "unknown", f"{path}: set TABLE3_ROW or list it in ROWS_BY_NAME"
    if row is None:
        task_class, sentence_level = OTHER_MODELS[config.model.name]
        assert isinstance(task, task_class)
        assert config.data.sentence_level == sentence_level == task.sentence_level
        return
    assert isinstance(task, FinalTask)
    assert not config.data.sentence_level
    switches = {key: getattr(task.config, key) for key in TABLE3_SWITCHES[row]}
    assert switches == TABLE3_SWITCHES[row]
    if os.path.basename(path) == "final_base.py":
        m = config.model
        assert (m.d_model, m.ffn_dim, m.num_heads) == (512, 2048, 8)
        assert (m.num_encoder_layers, m.num_decoder_layers) == (6, 6)
