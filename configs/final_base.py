"""FINAL (Zheng et al. 2020), Table 3 row ``final``, at the Transformer-base size.

d_model 512, feed-forward 2048, 8 heads, 6 encoder and 6 decoder layers (Vaswani et al.
2017's base model; Zheng et al.'s setting for the larger corpora). Everything else, the
switches included, is ``configs/final.py``. Train:
``python launch/train.py --config configs/final_base.py --workdir runs/final_base``.
"""

import ml_collections

from docnmt_jax.config_files import paper_variant, sibling_config
from docnmt_jax.sizes import BASE


@paper_variant
def get_config() -> ml_collections.ConfigDict:
    config = sibling_config(__file__, "final.py")
    config.model.update(BASE)
    return config
