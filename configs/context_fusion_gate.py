"""Zheng et al. (2020), Table 3 row ``+context_fusion_gate``: TED size, Bible.

+ context fusion gate: as segment_relative_attention, with the gated fusion
h = LN((1-g) h^L + g h^G); sentence decoder.

Derived from ``configs/final.py``: only the Table 3 switches differ (they equal
``docnmt_jax.models.final.TABLE3_SWITCHES['+context_fusion_gate']``). Train:
``python launch/train.py --config configs/context_fusion_gate.py --workdir WORKDIR``.
"""

import ml_collections

from docnmt_jax.config_files import sibling_config
from docnmt_jax.models.final import TABLE3_SWITCHES

TABLE3_ROW = "+context_fusion_gate"  # key of docnmt_jax.models.final.TABLE3_SWITCHES


def get_config() -> ml_collections.ConfigDict:
    config = sibling_config(__file__, "final.py")
    config.model.update(TABLE3_SWITCHES[TABLE3_ROW])
    return config
