"""Zheng et al. (2020), Table 3 row ``sent2doc_xl``: TED size, Bible.

Sent2Doc (Transformer-XL decoder): a sentence-local encoder (no global layer, no segment
embedding, positions reset per sentence) and the XL decoder that attends to the previous
target sentence's states.

Derived from ``configs/final.py``: only the Table 3 switches differ (they equal
``docnmt_jax.models.final.TABLE3_SWITCHES['sent2doc_xl']``). Train:
``python launch/train.py --config configs/sent2doc.py --workdir WORKDIR``.
"""

import ml_collections

from docnmt_jax.config_files import sibling_config
from docnmt_jax.models.final import TABLE3_SWITCHES

TABLE3_ROW = "sent2doc_xl"  # key of docnmt_jax.models.final.TABLE3_SWITCHES


def get_config() -> ml_collections.ConfigDict:
    config = sibling_config(__file__, "final.py")
    config.model.update(TABLE3_SWITCHES[TABLE3_ROW])
    return config
