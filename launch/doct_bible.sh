#!/bin/bash
# DocT (Zhang et al. 2018) on the Bible with the budget of the sentence Transformer and FINAL
# (issue 16, item 8): 450 optimiser steps of ~2,000 real target tokens for every row, the
# flags and tokenizer of launch/table4_bible.sh (whose "FINAL from scratch" row is the FINAL
# row of the same table). Rows: the sentence Transformer, DocT trained jointly from scratch,
# and DocT's two-step training (150 steps of the sentence Transformer from table4's
# pretraining + 300 steps of DocT with theta_s frozen). Test books translated with beam 5
# (alpha 0.6), scored with sacreBLEU (s-BLEU, d-BLEU, chrF).
#
#   bash launch/doct_bible.sh [OUT_DIR] [TABLE4_DIR]   (env: TOTAL_STEPS=450 PRETRAIN_STEPS=150)
#
# Needs TABLE4_DIR/pretrain_sentences (bash launch/table4_bible.sh TABLE4_DIR). Resumable.
set -euo pipefail
OUT=${1:-runs/doct_bible}
T4=${2:-runs/table4}
TOTAL=${TOTAL_STEPS:-450}
PRE=${PRETRAIN_STEPS:-150}
DATA=${DATA:-data/bible}
PY=${PYTHON:-python}
common=(--config.data.data_dir="$DATA" --config.train.warmup_steps=150 --config.train.lr_scale=0.5
  --config.train.eval_every=100000 --config.train.checkpoint_every=150 --config.train.dev_bleu=False
  --config.train.best_metric=dev_loss --config.train.best_mode=min --config.train.seed=0
  --config.data.tokenizer="$T4/pretrain_sentences/spm.model")
mkdir -p "$OUT"
if [ ! -d "$T4/pretrain_sentences/checkpoints" ]; then
  echo "$T4/pretrain_sentences: run bash launch/table4_bible.sh $T4 first" >&2
  exit 2
fi

$PY launch/train.py --config configs/transformer.py --workdir "$OUT/transformer_scratch" \
  "${common[@]}" --config.train.num_steps="$TOTAL"
$PY launch/train.py --config configs/doct.py --workdir "$OUT/doct_joint" \
  "${common[@]}" --config.train.num_steps="$TOTAL"
$PY launch/train.py --config configs/doct.py:two_step --workdir "$OUT/doct_two_step" \
  "${common[@]}" --config.train.num_steps=$((TOTAL - PRE)) \
  --config.init_from="$T4/pretrain_sentences"

for row in transformer_scratch doct_joint doct_two_step; do
  if [ ! -s "$OUT/$row/test.hyp.tsv" ]; then
    $PY launch/translate.py --workdir "$OUT/$row" --input "$DATA/test.tsv" \
      --output "$OUT/$row/test.hyp.tsv" --beam 5 --alpha 0.6 --checkpoint latest
  fi
  $PY launch/evaluate.py --hyp "$OUT/$row/test.hyp.tsv" --ref "$DATA/test.tsv" --json \
    > "$OUT/$row/test.scores.json"
done
