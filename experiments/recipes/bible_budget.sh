# Sourced by the Bible table scripts (table4_bible.sh, doct_bible.sh, hmgdc_bible.sh,
# table1_bible.sh): the shared budget and training flags. Environment: TOTAL_STEPS (450) is
# the budget in steps of the packed sentence Transformer (~2,000 real target tokens a step),
# PRETRAIN_STEPS (150), DATA (data/bible), PYTHON (python). Every row: warm-up 150, learning
# rate scale 0.5, checkpoints every 150 steps, best checkpoint by dev loss, seed 0.
TOTAL=${TOTAL_STEPS:-450}
PRE=${PRETRAIN_STEPS:-150}
DATA=${DATA:-data/bible}
PY=${PYTHON:-python}
BIBLE_FLAGS=(--config.data.data_dir="$DATA" --config.train.warmup_steps=150
  --config.train.lr_scale=0.5 --config.train.eval_every=100000 --config.train.checkpoint_every=150
  --config.train.dev_bleu=False --config.train.best_metric=dev_loss --config.train.best_mode=min
  --config.train.seed=0)
