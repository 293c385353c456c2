"""Zhang et al. (2018), Tables 1, 2, 7, 8 and 9: every ablation row as switches of the one DocT
module (``docnmt_jax/models/doct.py``), at the TED size of ``configs/doct.py``.

Train a row: ``python launch/train.py --config=configs/doct_ablations.py:k3 --workdir
runs/doct_k3``; rows are the keys of :data:`ROWS` (``ROW@base`` for the paper's base size,
e.g. ``nc6@base``). Rows of the two-step strategy (``two_step``, and every other row is joint
training from scratch unless it says so) need ``--config.init_from`` a sentence Transformer run.
"""

import ml_collections

from docnmt_jax.config_files import paper_variant, sibling_config

#: Row -> (configs/doct.py variant, model switches).
ROWS: dict[str, tuple[str, dict]] = {
    **{f"k{k}": ("", {"context_sentences": k}) for k in (1, 2, 3)},  # Table 1
    **{f"nc{n}": ("", {"num_context_layers": n}) for n in range(1, 7)},  # Table 2
    "joint": ("", {}),  # Table 7: document-level corpus only, all parameters from scratch
    "two_step": ("two_step", {}),  # Table 7: theta_s restored and frozen, theta_d trained
    "encoder_only": ("", {"context_in_decoder": False}),  # Table 8
    "decoder_only": ("", {"context_in_encoder": False}),
    "encoder_decoder": ("", {}),
    "residual": ("", {"context_gating": False}),  # Table 9
    "gating": ("", {}),
}


@paper_variant
def get_config(row: str = "joint") -> ml_collections.ConfigDict:
    name, _, size = row.partition("@")
    if name not in ROWS or size not in ("", "base"):
        raise ValueError(
            f"configs/doct_ablations.py: unknown row {row!r}; rows: {sorted(ROWS)} "
            "(optionally ROW@base)"
        )
    variant, switches = ROWS[name]
    base = "doct_base.py" if size else "doct.py"
    config = sibling_config(__file__, f"{base}:{variant}" if variant else base)
    config.model.update(switches)
    return config
