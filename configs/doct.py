"""DocT (Zhang et al. 2018) at Zheng et al.'s TED size, on the Bible.

Joint training from scratch (Table 7's document-only row):
``python launch/train.py --config configs/doct.py --workdir runs/doct``.

Two-step training (Sec. 2.4), the paper's method: train the sentence Transformer
(``configs/transformer.py``) first, then
``python launch/train.py --config configs/doct.py:two_step --config.init_from runs/transformer
--workdir runs/doct_two_step``: ``theta_s`` (every parameter named as in the Transformer) is
restored from that run and frozen (no update, no Adam moments); only ``theta_d`` (context
encoder, context attentions, gates and their LayerNorms) trains.

Every sentence is translated with its ``context_sentences`` previous source sentences; the
pipeline adds them across chunk boundaries. Ablations: ``configs/doct_ablations.py``.
"""

import ml_collections

from docnmt_jax.config_files import paper_variant, sibling_config
from docnmt_jax.models.doct import SENTENCE_PARAMETERS


@paper_variant
def get_config(variant: str = "") -> ml_collections.ConfigDict:
    if variant not in ("", "two_step"):
        raise ValueError(f"configs/doct.py: unknown variant {variant!r}; variants: two_step")
    config = sibling_config(__file__, "transformer.py")
    config.model.name = "doct"  # docnmt_jax/models/doct.py
    config.model.context_sentences = 2  # k previous source sentences (Table 1: 2 is best)
    config.model.num_context_layers = 1  # N_c context-encoder layers (Table 2: 1 suffices)
    config.model.context_in_encoder = True  # context attention in every encoder layer (Eq. 12)
    config.model.context_in_decoder = True  # context attention in every decoder layer (Eq. 16)
    config.model.context_gating = True  # gate instead of residual after it (Eq. 21-22)
    # True: grid rows (decoding; training with data.packed=False) are sentences, less padding;
    # with data.packed (the default) training packs sentences and their windows either way.
    config.model.sentence_rows = False
    if variant == "two_step":
        config.init_from_rules = "all"  # theta_s from the sentence Transformer's same paths
        config.train.freeze = (SENTENCE_PARAMETERS,)  # and kept fixed (Eq. 25)
    return config
