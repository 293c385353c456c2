"""RNNSearch with HM-GDC in its encoder (Tan et al. 2019, Table 1, first group, "Ours"), on
the Bible: every sentence of a document translated at once with the global context of the
whole document (``model.document_scope``; False: chunks of ``data.max_sentences``).

Train from scratch (Table 1's RNNSearch rows have no pre-training):
``python launch/train.py --config configs/rnnsearch_hmgdc.py --workdir runs/rnnsearch_hmgdc``.

Two-step training (Sec. 2.3): train ``configs/rnnsearch.py`` first, then
``python launch/train.py --config configs/rnnsearch_hmgdc.py:two_step
--config.init_from runs/rnnsearch --workdir runs/rnnsearch_hmgdc_two_step``: ``theta_s``
(every parameter named as in RNNSearch) is restored from that run, ``theta_d`` (sentence and
context attention, unshared document layers) starts fresh, and both train (Eq. 12).
Model: ``docnmt_jax/models/hmgdc_rnn.py`` (blocks: ``rnnsearch.py``, ``rnn_layers.py``).
"""

import ml_collections

from docnmt_jax.config_files import paper_variant, sibling_config


@paper_variant
def get_config(variant: str = "") -> ml_collections.ConfigDict:
    if variant not in ("", "two_step"):
        raise ValueError(
            f"configs/rnnsearch_hmgdc.py: unknown variant {variant!r}; variants: two_step"
        )
    config = sibling_config(__file__, "rnnsearch.py")
    config.model.name = "rnnsearch_hmgdc"  # docnmt_jax/models/hmgdc_rnn.py
    config.model.num_heads = 4  # sentence self-attention (Eq. 2) and context attention (Eq. 5)
    config.model.num_document_layers = 2  # DocEnc bi-GRU layers (Eq. 4)
    config.model.share_encoder = True  # DocEnc layer l is SentEnc layer l (Sec. 2.3)
    config.model.context_dropout_rate = 0.1  # Eq. 7's residual dropout P
    config.model.attention_dropout_rate = 0.0  # dropout on the HM-GDC attention weights
    config.model.document_scope = True  # chunks are whole documents; False: max_sentences
    if variant == "two_step":
        config.init_from_rules = "all"  # theta_s from the RNNSearch run's same paths
    return config
