"""Zheng et al. (2020), Table 3 row ``doc2sent+reset+segment``: TED size, Bible.

Doc2Sent + reset word positions + segment embedding: as doc2sent_reset, plus the learned
sentence-index embedding E^s_k.

Derived from ``configs/final.py``: only the Table 3 switches differ (they equal
``docnmt_jax.models.final.TABLE3_SWITCHES['doc2sent+reset+segment']``). Train:
``python launch/train.py --config configs/doc2sent_reset_segment.py --workdir WORKDIR``.
"""

import ml_collections

from docnmt_jax.config_files import sibling_config
from docnmt_jax.models.final import TABLE3_SWITCHES

TABLE3_ROW = "doc2sent+reset+segment"  # key of docnmt_jax.models.final.TABLE3_SWITCHES


def get_config() -> ml_collections.ConfigDict:
    config = sibling_config(__file__, "final.py")
    config.model.update(TABLE3_SWITCHES[TABLE3_ROW])
    return config
