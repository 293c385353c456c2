"""FINAL (Zheng et al. 2020): all of Table 3's switches on, at their TED size, on the Bible.

Train: ``python launch/train.py --config configs/final.py --workdir runs/final`` (recurrent,
context across chunks: ``--config final.py:recurrent``). Documents are
cut into chunks of up to 20 sentences; the encoder sees the whole chunk, the decoder translates
sentence by sentence with the previous target sentence as Transformer-XL memory. Training also
sees every document cut into 2, 4, 8, ... parts and single sentences (``data.train_as``).
"""

import ml_collections

from docnmt_jax.config_files import paper_variant, sibling_config


@paper_variant
def get_config(variant: str = "") -> ml_collections.ConfigDict:
    """FINAL; ``final.py:recurrent``: context across chunks (``model.recurrent``)."""
    if variant not in ("", "recurrent"):
        raise ValueError(f"configs/final.py: unknown variant {variant!r} (known: recurrent, paper)")
    config = sibling_config(__file__, "transformer.py")
    config.model.name = "final"  # docnmt_jax/models/final.py
    config.model.reset_word_positions = True  # word positions restart in every sentence
    config.model.segment_embedding = True  # learned embedding of the sentence index k
    config.model.segment_relative_attention = True  # global layer with Eq. (1) attention
    config.model.context_fusion_gate = True  # h = LN((1-g) h_L + g h_G)
    config.model.xl_decoder = True  # decoder attends to the previous target sentence's states
    config.model.doc2sent = False  # lower encoder layers see each sentence alone
    # With doc2sent: each target sentence cross-attends over its own sentence's slice of the
    # chunk's encoding ("own_slice", Table 3's Doc2Sent) or over the whole chunk ("chunk", a
    # named variant); without doc2sent, ignored.
    config.model.doc2sent_cross_attention = "own_slice"
    config.model.max_relative_distance = 20  # clip of the sentence distance k - kappa
    config.model.max_segments = 20  # segment-embedding table size (>= data.max_sentences)
    config.model.packed_block = 64  # packed training: block width of the banded attention
    config.model.packed_drift = 16  # packed training: most a sentence's src/tgt offsets differ
    config.model.max_sentence_len = 128  # packed training: >= data.max_src_len, max_tgt_len
    # Packed training's rows: "two_layout" (aligned rows read per sentence and per chunk:
    # models/final_two_layout.py; equal loss and gradients, tests/test_final_two_layout.py;
    # 1.56x the banded rows' real tokens/s on the Bible, docs/performance.md) or "banded"
    # (chunks in rows of 1024, banded attention; what recurrent streams train on).
    config.model.packed_layout = "banded" if variant == "recurrent" else "two_layout"
    if variant != "recurrent":
        # Two-layout rows of 1024 * n slots whose global layer reads n spans of 1024
        # (models/final_two_layout.py: chunk_layout): 2 where a batch holds 2,048 tokens
        # (final.py:paper sets it; 6% less padding on the Bible, docs/performance.md); 1 for
        # the default 1,024-token batches (a row a batch).
        config.model.packed_chunk_spans = 1
    # Context across the chunk boundary (docnmt_jax/models/final_recurrence.py): the target
    # memory and a summary of the previous chunk carried from chunk to chunk, trained on
    # document streams, packed several a row while data.packed is on (data/packed_stream_plan.py;
    # data.packed=False: one stream a grid row). Off: the paper's chunked FINAL
    # (docs/papers/final.md, "Recurrence").
    config.model.recurrent = variant == "recurrent"
    # Recurrent: consecutive chunks of a stream back-propagated through together (1: the
    # carried state is stop-gradient at every chunk; k: gradients cross k - 1 boundaries).
    config.model.bptt_chunks = 1
    # Train on every document also cut into 2, 4, 8, ... parts and single sentences (Sun et al.
    # 2022): batches of many documents. Chosen on dev by the recipe study (docs/recipe_study.md:
    # dev s-BLEU 7.18 against 6.01 on whole 20-sentence chunks at the same tokens, ~2x the
    # training speed on CPU); the paper variant (final.py:paper) trains on the documents.
    config.data.train_as = "multi_resolution"
    if config.model.recurrent:  # streams read whole documents, chunk after chunk
        config.data.train_as = "documents"
    # Pretrain-then-finetune (Zheng et al. 2020, Table 4) with the keys of transformer.py:
    # init_from=<a run of configs/transformer.py or final.py> and init_from_rules=source (the
    # encoder side only, "+ source TL") or all ("+ source & target TL"); FinalModel declares
    # how a sentence Transformer's parameters fill it (FinalModel.transformer_rules).
    return config
