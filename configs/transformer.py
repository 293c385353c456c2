"""Sentence-level Transformer (SENTNMT of Zheng et al. 2020) at their TED size, on the Bible.

Its training defaults -- the base of every config here -- are the recipe chosen on dev by the
recipe study (docs/recipe_study.md: pre-LN, 1,024-token batches, warm-up 300 to a peak of
1.5e-3, clipping at 1, the parameters' EMA), which learns to translate from the first hundred
steps on a corpus of the Bible's size. The papers' settings (post-LN, 2,048-token batches,
warm-up 8,000, d_model-scaled peak) are the ``paper`` argument: ``configs/transformer.py:paper``
(any config: ``configs/final.py:paper``, ``configs/doct.py:two_step,paper``).

Train: ``python launch/train.py --config configs/transformer.py --workdir runs/transformer``.
Every key below can be overridden on the command line, e.g. ``--config.train.num_steps=2000``.
"""

import math

import ml_collections

from docnmt_jax.config_files import paper_variant
from docnmt_jax.sizes import TED


@paper_variant
def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()

    # Model: Zheng et al. 2020, Sec. 5 (TED): d_model 256, ffn 512, 4 layers, 4 heads.
    config.model = ml_collections.ConfigDict()
    config.model.name = "transformer"  # which model module builds the network
    config.model.d_model = TED["d_model"]  # model (embedding) dimension
    config.model.num_heads = TED["num_heads"]  # attention heads
    config.model.ffn_dim = TED["ffn_dim"]  # feed-forward inner dimension
    config.model.num_encoder_layers = TED["num_encoder_layers"]  # encoder layers (N)
    config.model.num_decoder_layers = TED["num_decoder_layers"]  # decoder layers (N)
    config.model.dropout_rate = 0.1  # residual and embedding dropout
    config.model.attention_dropout_rate = 0.0  # dropout on attention weights
    config.model.relu_dropout_rate = 0.0  # dropout inside the feed-forward block
    config.model.pre_ln = True  # True: pre-LN (the study's); False: post-LN as in the papers
    config.model.dtype = "float32"  # compute dtype: float32 or bfloat16 (params stay float32)

    # Data: the prepared Bible corpus, or your own files via data.train / data.dev.
    config.data = ml_collections.ConfigDict()
    config.data.corpus = "bible"  # name of a prepared corpus directory (launch/prepare_data.py)
    config.data.data_dir = "data/bible"  # where that corpus's train/dev/test.tsv live
    config.data.train = ""  # own training corpus: FILE.tsv or "SRC,TGT" (plain or <d> format)
    config.data.dev = ""  # own dev corpus, same formats (required when data.train is set)
    config.data.format = "auto"  # reader format: auto | tsv | text | maruf
    config.data.document_unit = "chapter"  # chapter: as in the files; book: Ps.1, Ps.2.. -> Ps
    config.data.stream_rows = 0  # document streams (recurrent FINAL): rows; 0: from the budget
    config.data.tokenizer = ""  # existing sentencepiece model; empty: train WORKDIR/spm.model
    config.data.vocab_size = 8000  # joint sentencepiece vocabulary (trained on train only)
    config.data.max_sentences = 20  # sentences per chunk (document models; sentence models: 1)
    config.data.max_src_len = 128  # tokens per source sentence incl. EOS (longer: data.on_long)
    config.data.max_tgt_len = 128  # tokens per target sentence incl. EOS
    # A training/dev sentence pair with a side over max_src_len/max_tgt_len: "error" stops with
    # FILE:LINE, document and count; "skip" drops the pair and splits its document there;
    # "truncate" keeps the first max_len - 1 tokens + EOS. Skips/truncations are counted in
    # train.log. (Translation never cuts: translate.py grows its buckets or stops, naming the line.)
    config.data.on_long = "error"  # a pair over the max lengths: error | skip | truncate
    config.data.batch_src_tokens = 1024  # padded source tokens per training batch (papers: 2048)
    config.data.batch_tgt_tokens = 1024  # padded target tokens per training batch (papers: 2048)
    config.data.eval_batch_tokens = 4096  # padded tokens per side per dev batch
    config.data.batch_multiple = 1  # batch rows are a multiple of this and of mesh data x fsdp
    config.data.packed = True  # train on packed rows (the model's packing); False: [B,S,T] grid
    config.data.packed_row_tokens = 0  # shortest packed row length; 0: the model's default
    # multi_resolution: every document also in 2, 4, 8, ... parts and single sentences (Sun et
    # al. 2022); sentences: every pair its own document.
    config.data.train_as = "documents"  # documents | sentences | multi_resolution
    config.data.mix = ""  # "PATH [WEIGHT] [documents|sentences]; ...": train on these corpora
    # Who builds the training batches: tf.data (TensorFlow installed) or a prefetching NumPy
    # iterator; both give the same batches. auto: tf.data when TensorFlow imports, else NumPy.
    config.data.loader = "auto"  # auto | tf | numpy

    # Training: Adam(0.9, 0.98, 1e-9), inverse-sqrt schedule (Vaswani et al. 2017, Eq. 3) with
    # the recipe study's warm-up and peak (the papers': warm-up 8000, learning_rate 0).
    config.train = ml_collections.ConfigDict()
    config.train.seed = 0  # parameters, dropout and data order
    config.train.num_steps = 100_000  # optimiser steps (one batch each)
    config.train.warmup_steps = 300  # linear warm-up, then 1/sqrt(step) decay
    config.train.lr_scale = 1.0  # multiplies the whole learning-rate curve
    config.train.learning_rate = 1.5e-3  # absolute peak (end of warm-up); 0: d_model-scaled
    config.train.label_smoothing = 0.1  # eps of the smoothed target distribution
    config.train.clip_norm = 1.0  # global gradient-norm clipping; 0 disables
    config.train.weight_decay = 0.0  # AdamW decoupled decay of the 2+-D weights (not norms, biases)
    # k > 1: each update sums the gradients of k batches (loss normalised over all their
    # tokens), so an update sees k x the batch; steps, warm-up and *_every count updates.
    config.train.accumulate_steps = 1  # micro-batches per optimiser update
    # > 0: an exponential moving average of the parameters (ramped: min(d, (1+t)/(10+t))),
    # used for dev evaluation, the best checkpoint and translation (translate.py --params).
    config.train.ema_decay = 0.999  # 0: off
    config.train.log_every = 50  # steps between log lines / TensorBoard points
    config.train.eval_every = 1000  # steps between dev evaluations (and best-checkpoint checks)
    config.train.checkpoint_every = 1000  # steps between checkpoints
    config.train.keep_checkpoints = 3  # how many of the latest checkpoints to keep
    config.train.dev_bleu = True  # translate the dev set at each evaluation: dev_bleu, dev_dbleu
    config.train.dev_bleu_beam = 1  # beam size for dev BLEU (1 = greedy, fastest)
    config.train.dev_bleu_alpha = 0.0  # length penalty for dev BLEU (0: beam 1 is pure argmax)
    config.train.best_metric = "dev_bleu"  # dev metric that picks the best checkpoint
    config.train.best_mode = "max"  # max for BLEU, min for dev_loss
    config.train.patience = 0  # stop after this many dev evaluations without a better best_metric
    config.train.time_budget_minutes = 0.0  # stop (and save) after this long; 0 = no limit
    config.train.aot_compile = True  # compile the train step for every batch shape up front
    config.train.freeze = ()  # regexes over parameter paths: matching parameters are not trained
    config.train.unfreeze_at_step = 0  # frozen parameters train from this step, fresh Adam; 0 never
    config.train.schedule_offset = 0  # the LR schedule (warm-up too) restarts at this step; 0 never
    # A step whose loss or gradient norm is NaN/Inf leaves the parameters as they were; that many
    # in a row stop the run (0: never), naming the step, its documents and the last checkpoint.
    config.train.max_bad_steps = 5  # skip NaN/Inf loss/grad steps; stop after this many in a row

    # Objective (docnmt_jax/objectives/): the learning algorithm wrapping the model's loss.
    config.objective = ml_collections.ConfigDict()
    config.objective.name = "maximum_likelihood"  # registered objective
    # Each objective's options in a section of its name (only the named objective's is read;
    # the defaults equal the objectives' own, tests/test_context_margin.py checks).
    config.objective.context_margin = ml_collections.ConfigDict()
    config.objective.context_margin.alpha_token = 1.0  # Jean & Cho Eq. 3 alpha_tau, token hinge
    config.objective.context_margin.alpha_sentence = 0.0  # alpha_s, sentence hinge (Sec. 5: 0)
    config.objective.context_margin.alpha_data = 1.0  # alpha_d, data (= batch) hinge
    config.objective.context_margin.margin_token = 0.0  # delta_tau, per token
    config.objective.context_margin.margin_sentence = 0.0  # delta_s, per target token (T_n delta_s)
    config.objective.context_margin.margin_data = math.log(1.1)  # delta_d, per target token
    config.objective.context_margin.samples = 1  # M random contexts per sentence (Sec. 4.3)
    config.objective.context_margin.random_context_gradient = True  # False: random scores fixed
    config.objective.context_margin.seed = 0  # random contexts of the dev batches
    config.objective.random_context = ml_collections.ConfigDict()
    config.objective.random_context.seed = 0  # random contexts of the dev batches
    config.objective.coword = ml_collections.ConfigDict()
    config.objective.coword.probability = 0.1  # CoWord: P(drop a current-source token)

    # Device mesh (docnmt_jax/parallel.py): data x fsdp x model = all devices; -1 = the rest.
    config.mesh = ml_collections.ConfigDict()
    config.mesh.data = -1  # data parallelism (batch rows split, parameters replicated)
    config.mesh.fsdp = 1  # data parallelism that also shards parameters and optimiser state
    config.mesh.model = 1  # tensor parallelism over heads, feed-forward units and vocabulary

    # Initialise parameters from another run (pretrain-then-finetune); optimiser starts fresh.
    # Never applied when the workdir has its own checkpoint (resuming wins); the mapping table
    # goes to WORKDIR/init_from.tsv (docnmt_jax/training/param_mapping.py).
    config.init_from = ""  # workdir, checkpoint directory or step directory
    config.init_from_which = "best"  # in a workdir: best (else latest), latest, or a step number
    config.init_from_rules = ""  # "": same paths; all | source; "REGEX -> PATH|skip; ..." rules
    config.init_from_params = "params"  # params | ema (its moving average) | auto (ema if kept)
    config.init_from_allow_new = False  # parameters no rule maps and init_from lacks stay fresh
    config.init_from_ignore_unused = False  # without rules: skip checkpoint parameters unused
    # A release's training continued: its chosen step (data position, learning-rate schedule)
    # and best dev value from its manifest; Adam's moments start fresh.
    config.init_from_continue = False
    return config
