"""Zheng et al. (2020), Table 3 row ``+segment_relative_attention``: TED size, Bible.

+ segment-level relative attention: the hierarchical encoder (N-1 local layers per
sentence, one global layer with Eq. (1) attention), fused by the residual h = LN(h^L + h^G);
reset word positions and segment embedding on; sentence decoder.

Derived from ``configs/final.py``: only the Table 3 switches differ (they equal
``docnmt_jax.models.final.TABLE3_SWITCHES['+segment_relative_attention']``). Train:
``python launch/train.py --config configs/segment_relative_attention.py --workdir WORKDIR``.
"""

import ml_collections

from docnmt_jax.config_files import sibling_config
from docnmt_jax.models.final import TABLE3_SWITCHES

TABLE3_ROW = "+segment_relative_attention"  # key of docnmt_jax.models.final.TABLE3_SWITCHES


def get_config() -> ml_collections.ConfigDict:
    config = sibling_config(__file__, "final.py")
    config.model.update(TABLE3_SWITCHES[TABLE3_ROW])
    return config
