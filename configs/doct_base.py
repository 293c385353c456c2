"""DocT (Zhang et al. 2018) at the paper's size: Transformer base, d_model 512, feed-forward
2048, 8 heads, 6 encoder and 6 decoder layers (Sec. 3.1), k = 2, N_c = 1. Everything else is
``configs/doct.py`` (``configs/doct_base.py:two_step`` for two-step training)."""

import ml_collections

from docnmt_jax.config_files import paper_variant, sibling_config
from docnmt_jax.sizes import BASE


@paper_variant
def get_config(variant: str = "") -> ml_collections.ConfigDict:
    config = sibling_config(__file__, f"doct.py:{variant}" if variant else "doct.py")
    config.model.update(BASE)
    return config
