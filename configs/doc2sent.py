"""Zheng et al. (2020), Table 3 row ``doc2sent``: TED size, Bible.

Doc2Sent: the Transformer encoder reads the whole chunk as one sequence (all N layers
attend across sentences, word positions continue over the chunk); sentence decoder.

Derived from ``configs/final.py``: only the Table 3 switches differ (they equal
``docnmt_jax.models.final.TABLE3_SWITCHES['doc2sent']``). Train:
``python launch/train.py --config configs/doc2sent.py --workdir WORKDIR``.
"""

import ml_collections

from docnmt_jax.config_files import sibling_config
from docnmt_jax.models.final import TABLE3_SWITCHES

TABLE3_ROW = "doc2sent"  # key of docnmt_jax.models.final.TABLE3_SWITCHES


def get_config() -> ml_collections.ConfigDict:
    config = sibling_config(__file__, "final.py")
    config.model.update(TABLE3_SWITCHES[TABLE3_ROW])
    return config
