"""HM-GDC (Tan et al. 2019) at the paper's size (Sec. 3.1): hidden 512, filter 2048, 8 heads,
6 encoder and 6 decoder layers, and ``N_d = 5`` document layers (Table 2's best row with the
context in encoder and decoder). Everything else is ``configs/hmgdc.py``
(``configs/hmgdc_base.py:finetune`` after pretraining)."""

import ml_collections

from docnmt_jax.config_files import paper_variant, sibling_config
from docnmt_jax.sizes import BASE


@paper_variant
def get_config(variant: str = "") -> ml_collections.ConfigDict:
    config = sibling_config(__file__, f"hmgdc.py:{variant}" if variant else "hmgdc.py")
    config.model.update(BASE)
    config.model.num_document_layers = 5
    return config
