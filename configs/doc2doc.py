"""Doc2Doc (Zheng et al. 2020, Sec. 5 / Table 3): whole chunk in, whole chunk out; TED size, Bible.

The sentence Transformer of ``configs/transformer.py`` (same size, same parameters) reads a
chunk of up to 20 source sentences as one sequence and writes its target sentences as one
sequence, separated by BOS (``docnmt_jax/models/concat.py``). Translations are cut back into
sentences; the translator reports how often their count differs from the source's. Train:
``python launch/train.py --config configs/doc2doc.py --workdir runs/doc2doc``.
"""

import ml_collections

from docnmt_jax.config_files import paper_variant, sibling_config


@paper_variant
def get_config() -> ml_collections.ConfigDict:
    config = sibling_config(__file__, "transformer.py")
    config.model.name = "doc2doc"  # docnmt_jax/models/concat.py
    # Longest packed sequence accepted: >= max_sentences * max_src_len source slots and
    # >= max_sentences * (1.5 * max_src_len + 10) decoded tokens (the default search budget).
    config.model.max_len = 4096
    config.data.max_sentences = 20  # sentences per chunk: one packed sequence of <= 20*128
    return config
