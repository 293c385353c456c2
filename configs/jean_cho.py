"""The larger-context Transformer of Jean & Cho (2019, Appendix A) at Zheng et al.'s TED size.

``python launch/train.py --config configs/jean_cho.py --workdir runs/jean_cho``.

One shared encoder encodes the current sentence and its previous source sentence; a gated
context attention and a feed-forward module give the decoder ``x_c``
(``docnmt_jax/models/jean_cho.py``). Sizes, optimiser and data are ``configs/transformer.py``'s,
so ``--config.init_from runs/transformer`` with ``--config.init_from_rules all`` starts from a
sentence Transformer (the context attention, gate and FF fresh).
"""

import ml_collections

from docnmt_jax.config_files import paper_variant, sibling_config


@paper_variant
def get_config() -> ml_collections.ConfigDict:
    config = sibling_config(__file__, "transformer.py")
    config.model.name = "jean_cho"  # docnmt_jax/models/jean_cho.py
    config.model.context_sentences = 1  # previous source sentences as context (the paper: 1)
    config.model.gate = "sigmoid"  # footnote 1's bounded gate; "linear": unbounded, as printed
    config.model.sentence_rows = False  # True: rows of one sentence + its window (less padding)
    return config
