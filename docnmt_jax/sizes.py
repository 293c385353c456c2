"""Model size presets, defined once: the papers' two settings as ``config.model`` keys of the
Transformer family (``d_model``, ``ffn_dim``, ``num_heads``, encoder and decoder layers).

* :data:`TED`: Zheng et al. (2020), Sec. 5, their TED / News / Europarl setting, the size of
  every ``configs/*.py`` and the defaults of :class:`~docnmt_jax.models.transformer.
  TransformerConfig`.
* :data:`BASE`: Vaswani et al. (2017)'s base model, the papers' larger-corpus setting
  (``configs/*_base.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

TED: Mapping[str, int] = MappingProxyType(
    {
        "d_model": 256,
        "ffn_dim": 512,
        "num_heads": 4,
        "num_encoder_layers": 4,
        "num_decoder_layers": 4,
    }
)

BASE: Mapping[str, int] = MappingProxyType(
    {
        "d_model": 512,
        "ffn_dim": 2048,
        "num_heads": 8,
        "num_encoder_layers": 6,
        "num_decoder_layers": 6,
    }
)

#: The presets by name (the benchmarks' ``--size``).
PRESETS: Mapping[str, Mapping[str, int]] = MappingProxyType({"ted": TED, "base": BASE})
