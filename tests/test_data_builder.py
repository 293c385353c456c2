"""The data builder: every registered model's data needs (``data_spec``) become the pipeline
configs the trainer, its token budget and the translator used before the builder existed,
written out here field by field; the plans of those configs are pinned in
``test_plan_pins.py``."""

from __future__ import annotations

import dataclasses
import os

import pytest
from conftest import ROOT, shipped_models
from test_plan_pins import DEV, TRAIN, TRANSLATE

from docnmt_jax.config_files import load_config_module
from docnmt_jax.data import builder
from docnmt_jax.data.spec import (
    Bound,
    DataLimitError,
    DataLimits,
    DataSpec,
    PackingConfig,
    PipelineConfig,
)
from docnmt_jax.decoding.search import SearchConfig
from docnmt_jax.decoding.translator import Translator
from docnmt_jax.models import build_model
from docnmt_jax.models.base import ModelError
from docnmt_jax.training import data_setup

SMALL = {"d_model": 16, "num_heads": 2, "ffn_dim": 32}
SMALL_RNN = {"d_model": 16, "embed_dim": 16}


@dataclasses.dataclass(frozen=True)
class Needs:
    """What a model variant asks of the pipeline, written out: sentence rows, the window, whole
    documents, its packed rows (None: the grid only), slot-by-slot search."""

    sentence_level: bool
    context_sentences: int
    whole_documents: bool
    packing: PackingConfig | None
    sequential: bool = False
    uses_context: bool = True


#: variant -> (model config, its needs).
VARIANTS: dict[str, tuple[dict, Needs]] = {
    "transformer": (
        {"name": "transformer", **SMALL},
        Needs(True, 0, False, PackingConfig("sentence", 128), uses_context=False),
    ),
    "rnnsearch": ({"name": "rnnsearch", **SMALL_RNN}, Needs(True, 0, False, None, False, False)),
    "doc2doc": ({"name": "doc2doc", **SMALL}, Needs(False, 0, False, PackingConfig("chunk", 1024))),
    "final": (
        {"name": "final", **SMALL},
        Needs(False, 0, False, PackingConfig("chunk", 1024, drift=16), sequential=True),
    ),
    "final_parallel": (
        {"name": "final", **SMALL, "xl_decoder": False},
        Needs(False, 0, False, PackingConfig("chunk", 1024, drift=16)),
    ),
    "hmgdc": (
        {"name": "hmgdc", **SMALL},
        Needs(False, 0, True, PackingConfig("grouped", 128, max_row_sentences=16)),
    ),
    "hmgdc_chunks": (
        {"name": "hmgdc", **SMALL, "document_scope": False},
        Needs(False, 0, False, PackingConfig("grouped", 128, max_row_sentences=16)),
    ),
    "rnnsearch_hmgdc": ({"name": "rnnsearch_hmgdc", **SMALL_RNN}, Needs(False, 0, True, None)),
    "rnnsearch_hmgdc_chunks": (
        {"name": "rnnsearch_hmgdc", **SMALL_RNN, "document_scope": False},
        Needs(False, 0, False, None),
    ),
    "doct": ({"name": "doct", **SMALL}, Needs(False, 2, False, PackingConfig("sentence", 128))),
    "doct_rows": (
        {"name": "doct", **SMALL, "sentence_rows": True, "context_sentences": 3},
        Needs(True, 3, False, PackingConfig("sentence", 128)),
    ),
    "jean_cho": ({"name": "jean_cho", **SMALL}, Needs(False, 1, False, None)),
    "jean_cho_rows": (
        {"name": "jean_cho", **SMALL, "sentence_rows": True},
        Needs(True, 1, False, None),
    ),
}


def data_section():
    """The shipped configs' data section at the small sizes of ``test_plan_pins.TRAIN``."""
    data = load_config_module(os.path.join(ROOT, "configs", "transformer.py")).get_config().data
    data.max_sentences, data.max_src_len, data.max_tgt_len = 5, 24, 20
    data.batch_src_tokens, data.batch_tgt_tokens, data.eval_batch_tokens = 96, 80, 200
    data.packed_row_tokens = 32
    data.on_long = "truncate"
    return data


def model_of(variant: str):
    return build_model(VARIANTS[variant][0], 300)


def test_every_registered_model_has_its_needs_written_out():
    assert {config["name"] for config, _ in VARIANTS.values()} == shipped_models()


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_data_spec_states_the_needs(variant):
    model, needs = model_of(variant), VARIANTS[variant][1]
    spec = model.data_spec()
    assert spec.rows == model.layout.value
    assert (spec.sentence_level, spec.context_sentences, spec.whole_documents) == (
        needs.sentence_level,
        needs.context_sentences,
        needs.whole_documents,
    )
    assert (spec.packing, spec.sequential, spec.uses_context) == (
        needs.packing,
        needs.sequential,
        needs.uses_context,
    )
    # The model's accessors read the spec.
    assert model.packing() == needs.packing
    assert (model.context_sentences, model.whole_documents) == (
        needs.context_sentences,
        needs.whole_documents,
    )
    assert model.uses_context is needs.uses_context


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("packed", [True, False])
def test_trainer_configs_are_the_ones_written_out(variant, train, packed):
    model, needs = model_of(variant), VARIANTS[variant][1]
    if packed and needs.packing is None:
        return
    settings = data_setup.data_settings(data_section(), 3, train, batch_multiple=2)
    got = builder.pipeline_config(model.data_spec(), settings, packed=packed, row_tokens=32)
    expected = dataclasses.replace(
        TRAIN if train else DEV,
        sentence_level=needs.sentence_level,
        context_sentences=needs.context_sentences,
        whole_documents=needs.whole_documents,
        packing=dataclasses.replace(needs.packing, row_tokens=32) if packed else None,
    )
    assert got == expected


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_translator_config_is_the_one_written_out(variant):
    model, needs = model_of(variant), VARIANTS[variant][1]
    translator = Translator(
        model, None, None, SearchConfig(), batch_tokens=300, max_src_len=24, max_sentences=5
    )
    assert translator.pipeline_config == dataclasses.replace(
        TRANSLATE,
        sentence_level=needs.sentence_level,
        context_sentences=needs.context_sentences,
        whole_documents=needs.whole_documents,
        sequential_sentences=needs.sequential,
    )


def test_limits_are_checked_for_training_data_only():
    """Doc2Doc's packed chunk bound and FINAL's sentence and chunk bounds: the builder raises
    a one-line :class:`DataLimitError` (the model's ``check_data`` a :class:`ModelError` with
    the same words); a decoding config is not checked, the grid skips the packed bounds."""
    doc2doc = build_model({"name": "doc2doc", **SMALL, "max_len": 19}, 300)
    settings = PipelineConfig(max_sentences=4, max_src_len=5, max_tgt_len=4)
    with pytest.raises(DataLimitError, match=r"up to 20 tokens .*config.model.max_len=19"):
        builder.pipeline_config(doc2doc.data_spec(), settings, packed=True)
    with pytest.raises(ModelError, match=r"up to 20 tokens .*config.model.max_len=19"):
        doc2doc.check_data(dataclasses.replace(settings, packing=doc2doc.packing()))
    builder.pipeline_config(doc2doc.data_spec(), settings)  # the grid: S * T is checked per batch
    final = build_model({"name": "final", **SMALL, "max_sentence_len": 4, "max_segments": 3}, 300)
    with pytest.raises(DataLimitError, match=r"max_src_len/max_tgt_len \(5\).*max_sentence_len"):
        builder.pipeline_config(final.data_spec(), settings, packed=True)
    with pytest.raises(DataLimitError, match=r"max_sentences \(4\) > config.model.max_segments"):
        builder.pipeline_config(final.data_spec(), settings)
    builder.pipeline_config(final.data_spec(), settings, decoding=True)


def test_row_tokens_and_decoding_drop_or_resize_the_packing():
    spec = build_model({"name": "transformer", **SMALL}, 300).data_spec()
    config = builder.pipeline_config(spec, PipelineConfig(), packed=True, row_tokens=64)
    assert config.packing == PackingConfig("sentence", 64)
    assert builder.pipeline_config(spec, PipelineConfig(), packed=True).packing.row_tokens == 128
    assert (
        builder.pipeline_config(spec, PipelineConfig(), packed=True, decoding=True).packing is None
    )


def test_data_spec_refuses_what_cannot_be():
    with pytest.raises(ValueError, match="rows must be one of"):
        DataSpec(rows="documents")
    with pytest.raises(ValueError, match="context must be one of"):
        DataSpec(context="sentence")
    with pytest.raises(ValueError, match="window context has context_sentences >= 1"):
        DataSpec(rows="chunks", context="window")
    with pytest.raises(ValueError, match="window context has context_sentences >= 1"):
        DataSpec(rows="chunks", context="chunk", context_sentences=2)
    with pytest.raises(ValueError, match="context='none'"):
        DataSpec(rows="chunks")
    limits = DataLimits(chunk_sentences=Bound(3, "max_segments"))
    assert limits.violation(PipelineConfig(max_sentences=3)) is None
    assert "max_segments" in limits.violation(PipelineConfig(max_sentences=4))
    assert limits.violation(PipelineConfig(max_sentences=4, sentence_level=True)) is None
