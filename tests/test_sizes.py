"""The size presets (``docnmt_jax/sizes.py``) hold the papers' sizes and are what the configs,
the Transformer's defaults and the benchmarks use."""

from __future__ import annotations

import dataclasses
import os

import pytest
from conftest import ROOT

from docnmt_jax import sizes
from docnmt_jax.benchmarking.workload import SIZES
from docnmt_jax.config_files import load_config_module
from docnmt_jax.models.transformer import TransformerConfig

#: Zheng et al. (2020), Sec. 5 (TED) and Vaswani et al. (2017)'s base model, written out.
PAPERS = {
    "ted": {"d_model": 256, "ffn_dim": 512, "num_heads": 4, "layers": 4},
    "base": {"d_model": 512, "ffn_dim": 2048, "num_heads": 8, "layers": 6},
}


def _model_keys(size: dict) -> dict:
    keys = {k: v for k, v in size.items() if k != "layers"}
    return keys | {"num_encoder_layers": size["layers"], "num_decoder_layers": size["layers"]}


def _config(name: str):
    return load_config_module(os.path.join(ROOT, "configs", name)).get_config()


@pytest.mark.parametrize("name", sorted(PAPERS))
def test_presets_are_the_papers_sizes(name):
    assert dict(sizes.PRESETS[name]) == _model_keys(PAPERS[name])
    assert SIZES[name] == PAPERS[name]  # the benchmarks' --size


def test_configs_and_defaults_use_the_presets():
    fields = {f.name: f.default for f in dataclasses.fields(TransformerConfig)}
    assert {k: fields[k] for k in sizes.TED} == dict(sizes.TED)
    assert {k: _config("transformer.py").model[k] for k in sizes.TED} == dict(sizes.TED)
    for name in ("doct_base.py", "final_base.py", "hmgdc_base.py"):
        assert {k: _config(name).model[k] for k in sizes.BASE} == dict(sizes.BASE), name
