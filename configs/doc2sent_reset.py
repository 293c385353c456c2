"""Zheng et al. (2020), Table 3 row ``doc2sent+reset``: TED size, Bible.

Doc2Sent + reset word positions: as doc2sent, but source word positions restart in every
sentence.

Derived from ``configs/final.py``: only the Table 3 switches differ (they equal
``docnmt_jax.models.final.TABLE3_SWITCHES['doc2sent+reset']``). Train:
``python launch/train.py --config configs/doc2sent_reset.py --workdir WORKDIR``.
"""

import ml_collections

from docnmt_jax.config_files import sibling_config
from docnmt_jax.models.final import TABLE3_SWITCHES

TABLE3_ROW = "doc2sent+reset"  # key of docnmt_jax.models.final.TABLE3_SWITCHES


def get_config() -> ml_collections.ConfigDict:
    config = sibling_config(__file__, "final.py")
    config.model.update(TABLE3_SWITCHES[TABLE3_ROW])
    return config
