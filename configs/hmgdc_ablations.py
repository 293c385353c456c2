"""Tan et al. (2019), Table 2 and Sec. 2.3: every ablation row as switches of the one HM-GDC
module (``docnmt_jax/models/hmgdc.py``), at the TED size of ``configs/hmgdc.py``.

Train a row: ``python launch/train.py --config=configs/hmgdc_ablations.py:decoder_n3 --workdir
runs/hmgdc_decoder_n3``. Rows (keys of :data:`ROWS`): ``{encoder,decoder,both}_n{1..6}``
(Table 2: where the global context is integrated x ``N_d``), ``separate`` (document encoder
with its own self-attention, Sec. 2.3 un-shared), ``chunk_scope`` (the context is the pipeline
chunk of ``data.max_sentences``, not the whole document); ``ROW@base`` for the paper's size
(512/2048/6, 8 heads), e.g. ``both_n5@base``.
"""

import ml_collections

from docnmt_jax.config_files import paper_variant, sibling_config

PLACES = {
    "encoder": {"context_in_encoder": True, "context_in_decoder": False},
    "decoder": {"context_in_encoder": False, "context_in_decoder": True},
    "both": {"context_in_encoder": True, "context_in_decoder": True},
}
#: Row -> model switches.
ROWS: dict[str, dict] = {
    **{
        f"{place}_n{n}": {**switches, "num_document_layers": n}
        for place, switches in PLACES.items()
        for n in range(1, 7)
    },
    "separate": {"share_self_attention": False},
    "chunk_scope": {"document_scope": False},
}


@paper_variant
def get_config(row: str = "both_n1") -> ml_collections.ConfigDict:
    name, _, size = row.partition("@")
    if name not in ROWS or size not in ("", "base"):
        raise ValueError(
            f"configs/hmgdc_ablations.py: unknown row {row!r}; rows: {sorted(ROWS)} "
            "(optionally ROW@base)"
        )
    config = sibling_config(__file__, "hmgdc_base.py" if size else "hmgdc.py")
    config.model.update(ROWS[name])
    return config
