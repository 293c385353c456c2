"""RNNSearch (Bahdanau et al. 2015, as OpenNMT builds it): the sentence baseline of Tan et al.
(2019), Table 1, first group, at their size (Sec. 3.1: 2 layers, hidden 500), on the Bible.

Train: ``python launch/train.py --config configs/rnnsearch.py --workdir runs/rnnsearch``.
Data, training and decoding settings are the sentence Transformer's (``configs/transformer.py``:
Adam with the inverse-square-root schedule over ``d_model``, label smoothing 0.1, beam 5);
the paper borrows the rest from Bahdanau et al. (Adadelta, 64 sentences a batch), which this
trainer does not offer. Model: ``docnmt_jax/models/rnnsearch.py``.
"""

import ml_collections

from docnmt_jax.config_files import paper_variant, sibling_config


@paper_variant
def get_config() -> ml_collections.ConfigDict:
    config = sibling_config(__file__, "transformer.py")
    config.model = ml_collections.ConfigDict()  # the Transformer's keys do not apply
    config.model.name = "rnnsearch"  # docnmt_jax/models/rnnsearch.py
    config.model.embed_dim = 500  # word embeddings (source and target tables)
    config.model.d_model = 500  # hidden size: decoder GRUs, attention; 250 per encoder direction
    config.model.num_layers = 2  # bi-GRU encoder layers = GRU decoder layers
    config.model.dropout_rate = 0.1  # embeddings, between GRU layers, attentional output
    config.model.dtype = "float32"  # compute dtype: float32 or bfloat16 (params stay float32)
    config.data.packed = False  # the RNN reads the [B, S, T] grid (no packed rows)
    # Its own training recipe, the one it was measured with (docs/results.md: s-BLEU 17.6 at
    # the budget), not the Transformer family's: 2,048-token batches, warm-up 400 to
    # 0.5 x d_model^-0.5 x 400^-0.5 = 1.1e-3, no clipping, no EMA.
    config.data.batch_src_tokens = config.data.batch_tgt_tokens = 2048
    config.train.warmup_steps = 400
    config.train.lr_scale = 0.5
    config.train.learning_rate = 0.0
    config.train.clip_norm = 0.0
    config.train.ema_decay = 0.0
    return config
