"""Zheng et al. (2020), Table 3: every ablation row as switches of the FINAL module.

Train a row: ``python launch/train.py --config=configs/final_table3.py:doc2sent --workdir
runs/doc2sent`` (rows: the keys of :data:`TABLE3_SWITCHES`; without a row, ``final``). Sizes
and everything else are ``configs/final.py`` (TED size, Bible). SENTNMT is
``configs/transformer.py``, Doc2Doc ``configs/doc2doc.py``; DOCNMT is not covered.

The source-side rows are cumulative; from "+segment relative attention" on, the lower
encoder layers are local (per sentence), the paper's hierarchical encoder. In the Doc2Sent rows
the lower encoder layers read the whole chunk as one sequence (the paper's "entire document
as input") and each target sentence cross-attends to its own slice of that encoding;
``doc2sent_chunk`` is the Doc2Sent row read the other way, each sentence cross-attending over
the whole chunk (``doc2sent_cross_attention``; why it is not the default: the module docstring
of ``docnmt_jax/models/final.py``).
"""

import ml_collections

from docnmt_jax.config_files import paper_variant, sibling_config

_SWITCHES_OFF: dict[str, bool | str] = dict(
    doc2sent=False,  # lower encoder layers attend over the whole chunk as one sequence
    doc2sent_cross_attention="own_slice",  # with doc2sent: cross-attention over h_k only
    reset_word_positions=False,  # source positions restart in every sentence
    segment_embedding=False,  # add the learned segment embedding E^s_k
    segment_relative_attention=False,  # top encoder layer = the global layer, Eq. (1)
    context_fusion_gate=False,  # gated fusion of local and global states (else residual)
    xl_decoder=False,  # Transformer-XL decoder with the previous target sentence as memory
)
TABLE3_SWITCHES: dict[str, dict[str, bool | str]] = {
    "doc2sent": dict(_SWITCHES_OFF, doc2sent=True),
    "doc2sent_chunk": dict(_SWITCHES_OFF, doc2sent=True, doc2sent_cross_attention="chunk"),
    "doc2sent+reset": dict(_SWITCHES_OFF, doc2sent=True, reset_word_positions=True),
    "doc2sent+reset+segment": dict(
        _SWITCHES_OFF, doc2sent=True, reset_word_positions=True, segment_embedding=True
    ),
    "+segment_relative_attention": dict(
        _SWITCHES_OFF,
        reset_word_positions=True,
        segment_embedding=True,
        segment_relative_attention=True,
    ),
    "+context_fusion_gate": dict(
        _SWITCHES_OFF,
        reset_word_positions=True,
        segment_embedding=True,
        segment_relative_attention=True,
        context_fusion_gate=True,
    ),
    "sent2doc_xl": dict(_SWITCHES_OFF, reset_word_positions=True, xl_decoder=True),
    "final": dict(
        _SWITCHES_OFF,
        reset_word_positions=True,
        segment_embedding=True,
        segment_relative_attention=True,
        context_fusion_gate=True,
        xl_decoder=True,
    ),
}


@paper_variant
def get_config(row: str = "final") -> ml_collections.ConfigDict:
    if row not in TABLE3_SWITCHES:
        raise ValueError(
            f"configs/final_table3.py: unknown Table 3 row {row!r}; rows: {sorted(TABLE3_SWITCHES)}"
        )
    config = sibling_config(__file__, "final.py")
    config.model.update(TABLE3_SWITCHES[row])
    return config
