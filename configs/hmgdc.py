"""HM-GDC (Tan et al. 2019) at Zheng et al.'s TED size, on the Bible.

No pretraining (Table 4, first row):
``python launch/train.py --config configs/hmgdc.py --workdir runs/hmgdc``.

Pretraining then finetuning (Sec. 2.3, Table 4): train the sentence Transformer
(``configs/transformer.py``) on sentence pairs first -- a sentence corpus ``D_s``
(``--config.data.train=DS.tsv --config.data.dev=DEV.tsv --config.data.train_as=sentences``,
Table 4 row 2) or ``D_s`` mixed with the document corpus's shuffled sentences
(``--config.data.mix="DS.tsv 1 sentences; data/bible/train.tsv 1 sentences"``, row 3) -- then
``python launch/train.py --config configs/hmgdc.py:finetune --config.init_from runs/PRETRAIN
--workdir runs/hmgdc_finetune``: ``theta_s`` (every parameter named as in the Transformer)
is restored, ``theta_d`` starts fresh, and every parameter is finetuned (Eq. 12).
``experiments/recipes/hmgdc_bible.sh`` runs the recipe on the Bible.

Every sentence sees its whole document (``document_scope``: the pipeline's chunks are whole
documents, however long). Ablations: ``configs/hmgdc_ablations.py``; paper size:
``configs/hmgdc_base.py``.
"""

import ml_collections

from docnmt_jax.config_files import paper_variant, sibling_config

VARIANTS = ("", "finetune")


@paper_variant
def get_config(variant: str = "") -> ml_collections.ConfigDict:
    if variant not in VARIANTS:
        raise ValueError(f"configs/hmgdc.py: unknown variant {variant!r}; variants: finetune")
    config = sibling_config(__file__, "transformer.py")
    config.model.name = "hmgdc"  # docnmt_jax/models/hmgdc.py
    config.model.num_document_layers = 1  # N_d (Table 2: little difference between 1 and 6)
    config.model.context_in_encoder = True  # global context into every source word (Eq. 5-7)
    config.model.context_in_decoder = True  # DocEnc-Decoder attention in every layer (Eq. 8-10)
    config.model.share_self_attention = True  # DocEnc shares SentEnc's self-attention (Sec. 2.3)
    config.model.context_dropout_rate = 0.1  # P of the residual dropout of Eq. 7
    config.model.document_scope = True  # whole documents; False: the chunk of max_sentences
    # A whole document lies within one batch: the papers' 2,048-token batches (not the
    # recipe's 1,024), so that a long chapter fits (the schedule is the default recipe's).
    config.data.batch_src_tokens = config.data.batch_tgt_tokens = 2048
    if variant == "finetune":
        config.init_from_rules = "all"  # theta_s from the sentence Transformer's same paths
    return config
