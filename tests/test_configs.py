"""Every config file loads and builds its model; every Table 3 row of
``configs/final_table3.py`` carries exactly its switches; the batch layout comes from the
model, never from a config key."""

import glob
import os

import pytest
from conftest import ROOT, TABLE3_CONFIG, TABLE3_SWITCHES

from docnmt_jax.config_files import load_config
from docnmt_jax.models import BatchLayout, build_model
from docnmt_jax.models.concat import Doc2DocModel
from docnmt_jax.models.doct import SENTENCE_PARAMETERS, DocTModel
from docnmt_jax.models.final import FinalModel
from docnmt_jax.models.hmgdc import HMGDCModel
from docnmt_jax.models.hmgdc_rnn import RNNSearchHMGDCModel
from docnmt_jax.models.jean_cho import JeanChoModel
from docnmt_jax.models.rnnsearch import RNNSearchModel
from docnmt_jax.models.transformer import TransformerModel

CONFIG_FILES = sorted(glob.glob(os.path.join(ROOT, "configs", "*.py")))
# What each config file builds: (model class, layout), for every file in configs/.
EXPECTED = {
    "transformer.py": (TransformerModel, BatchLayout.SENTENCES),
    "doc2doc.py": (Doc2DocModel, BatchLayout.CHUNKS),
    "jean_cho.py": (JeanChoModel, BatchLayout.CHUNKS),
    "final.py": (FinalModel, BatchLayout.SEQUENTIAL_CHUNKS),
    "final_base.py": (FinalModel, BatchLayout.SEQUENTIAL_CHUNKS),
    "final_table3.py": (FinalModel, BatchLayout.SEQUENTIAL_CHUNKS),
    "doct.py": (DocTModel, BatchLayout.CHUNKS),
    "doct_base.py": (DocTModel, BatchLayout.CHUNKS),
    "doct_ablations.py": (DocTModel, BatchLayout.CHUNKS),
    "hmgdc.py": (HMGDCModel, BatchLayout.CHUNKS),
    "hmgdc_base.py": (HMGDCModel, BatchLayout.CHUNKS),
    "hmgdc_ablations.py": (HMGDCModel, BatchLayout.CHUNKS),
    "rnnsearch.py": (RNNSearchModel, BatchLayout.SENTENCES),
    "rnnsearch_hmgdc.py": (RNNSearchHMGDCModel, BatchLayout.CHUNKS),
}
# Paper's table: which rows decode with the XL memory (slot by slot).
XL_ROWS = {"sent2doc_xl", "final"}


@pytest.mark.parametrize("path", CONFIG_FILES, ids=os.path.basename)
def test_config_loads_and_builds_its_model(path):
    name = os.path.basename(path)
    assert name in EXPECTED, f"{name}: add it to EXPECTED"
    config = load_config(path)
    model = build_model(config.model, vocab_size=100)
    model_class, layout = EXPECTED[name]
    assert isinstance(model, model_class) and model.layout is layout
    assert "sentence_level" not in config.data  # derived from the model's layout
    if name in ("final_base.py", "doct_base.py", "hmgdc_base.py"):
        m = config.model
        assert (m.d_model, m.ffn_dim, m.num_heads) == (512, 2048, 8)
        assert (m.num_encoder_layers, m.num_decoder_layers) == (6, 6)


@pytest.mark.parametrize("row", sorted(TABLE3_SWITCHES))
def test_table3_row_has_its_switches(row):
    config = load_config(f"{TABLE3_CONFIG}:{row}")
    model = build_model(config.model, vocab_size=100)
    assert isinstance(model, FinalModel)
    switches = {key: getattr(model.config, key) for key in TABLE3_SWITCHES[row]}
    assert switches == TABLE3_SWITCHES[row]
    expected = BatchLayout.SEQUENTIAL_CHUNKS if row in XL_ROWS else BatchLayout.CHUNKS
    assert model.layout is expected
    # Every row differs from every other row in at least one switch.
    others = [s for r, s in TABLE3_SWITCHES.items() if r != row]
    assert all(s != TABLE3_SWITCHES[row] for s in others)


def test_table3_default_row_is_final_and_unknown_rows_are_named():
    assert (
        load_config(TABLE3_CONFIG).model.to_dict()
        == load_config(os.path.join(ROOT, "configs", "final.py")).model.to_dict()
    )
    with pytest.raises(ValueError, match="unknown Table 3 row 'nope'"):
        load_config(f"{TABLE3_CONFIG}:nope")


DOCT_ABLATIONS = os.path.join(ROOT, "configs", "doct_ablations.py")
# Zhang et al. (2018): the row -> the DocT switches it sets (everything else the paper's:
# k = 2, N_c = 1, context in encoder and decoder, gating), and whether it is two-step.
DOCT_ROWS = {
    **{f"k{k}": ({"context_sentences": k}, False) for k in (1, 2, 3)},
    **{f"nc{n}": ({"num_context_layers": n}, False) for n in range(1, 7)},
    "joint": ({}, False),
    "two_step": ({}, True),
    "encoder_only": ({"context_in_decoder": False}, False),
    "decoder_only": ({"context_in_encoder": False}, False),
    "encoder_decoder": ({}, False),
    "residual": ({"context_gating": False}, False),
    "gating": ({}, False),
}
DOCT_PAPER = dict(
    context_sentences=2,
    num_context_layers=1,
    context_in_encoder=True,
    context_in_decoder=True,
    context_gating=True,
)


@pytest.mark.parametrize("row", sorted(DOCT_ROWS))
@pytest.mark.parametrize("size", ["", "@base"])
def test_doct_ablation_rows_carry_their_switches(row, size):
    config = load_config(f"{DOCT_ABLATIONS}:{row}{size}")
    model = build_model(config.model, vocab_size=100)
    switches, two_step = DOCT_ROWS[row]
    assert {key: getattr(model.config, key) for key in DOCT_PAPER} == dict(DOCT_PAPER, **switches)
    assert model.config.d_model == (512 if size else 256)
    assert (config.init_from_rules == "all") == two_step
    assert tuple(config.train.freeze) == ((SENTENCE_PARAMETERS,) if two_step else ())


def test_doct_unknown_rows_are_named():
    with pytest.raises(ValueError, match="unknown row 'k9'"):
        load_config(f"{DOCT_ABLATIONS}:k9")


HMGDC_ABLATIONS = os.path.join(ROOT, "configs", "hmgdc_ablations.py")
# Tan et al. (2019): the row -> the HM-GDC switches it sets (everything else configs/hmgdc.py's:
# N_d = 1, context in encoder and decoder, shared self-attention, whole-document scope).
HMGDC_PLACES = {"encoder": (True, False), "decoder": (False, True), "both": (True, True)}
HMGDC_ROWS = {
    **{
        f"{place}_n{n}": {
            "context_in_encoder": e,
            "context_in_decoder": d,
            "num_document_layers": n,
        }
        for place, (e, d) in HMGDC_PLACES.items()
        for n in range(1, 7)
    },
    "separate": {"share_self_attention": False},
    "chunk_scope": {"document_scope": False},
}
HMGDC_DEFAULT = dict(
    num_document_layers=1,
    context_in_encoder=True,
    context_in_decoder=True,
    share_self_attention=True,
    document_scope=True,
)


@pytest.mark.parametrize("row", sorted(HMGDC_ROWS))
@pytest.mark.parametrize("size", ["", "@base"])
def test_hmgdc_ablation_rows_carry_their_switches(row, size):
    config = load_config(f"{HMGDC_ABLATIONS}:{row}{size}")
    model = build_model(config.model, vocab_size=100)
    default = dict(HMGDC_DEFAULT, num_document_layers=5 if size else 1)
    assert {key: getattr(model.config, key) for key in default} == dict(default, **HMGDC_ROWS[row])
    assert model.config.d_model == (512 if size else 256)
    assert model.whole_documents == model.config.document_scope


def test_hmgdc_finetune_restores_theta_s_and_trains_everything():
    config = load_config(os.path.join(ROOT, "configs", "hmgdc.py:finetune"))
    assert config.init_from_rules == "all" and tuple(config.train.freeze) == ()
    with pytest.raises(ValueError, match="unknown row 'both_n9'"):
        load_config(f"{HMGDC_ABLATIONS}:both_n9")


@pytest.mark.parametrize("path", CONFIG_FILES, ids=os.path.basename)
def test_paper_variant_sets_the_papers_training_and_nothing_else(path):
    from docnmt_jax.config_files import PAPER_TRAINING

    plain, paper = load_config(path), load_config(path + ":paper")
    flat = lambda c: {  # noqa: E731
        f"{s}.{k}": v for s in ("model", "train", "data") for k, v in c[s].items()
    }
    before, after = flat(plain), flat(paper)
    changed = {k for k in before if before[k] != after[k]}
    assert changed <= set(PAPER_TRAINING) | {"data.train_as"}
    assert after["data.train_as"] == (
        "documents" if before["data.train_as"] == "multi_resolution" else before["data.train_as"]
    )
    for key, value in PAPER_TRAINING.items():
        if key in after:
            assert after[key] == value, key
    assert after["train.warmup_steps"] == 8000
    assert after["data.batch_src_tokens"] == after["data.batch_tgt_tokens"] == 2048
    if "model.pre_ln" in after:
        assert after["model.pre_ln"] is False


def test_paper_variant_combines_with_a_files_own_argument():
    config = load_config(os.path.join(ROOT, "configs", "doct.py:two_step,paper"))
    assert config.train.freeze == (SENTENCE_PARAMETERS,) and config.train.warmup_steps == 8000
    config = load_config(os.path.join(ROOT, "configs", "final_table3.py:doc2sent,paper"))
    assert config.model.doc2sent and config.train.lr_scale == 1.0
