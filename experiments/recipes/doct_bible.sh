#!/bin/bash
# DocT (Zhang et al. 2018) on the Bible with the budget of the sentence Transformer and FINAL
# the real target tokens of 450 steps of the sentence Transformer (~2,000
# a step) for every row, the flags and tokenizer of experiments/recipes/table4_bible.sh
# (whose "FINAL from scratch" row, 450 steps of ~1,850, is the FINAL row of the same table).
# Rows: the sentence Transformer, DocT trained jointly from scratch, and DocT's two-step
# training (150 steps of the sentence Transformer from table4's pretraining + DocT with
# theta_s frozen for the tokens of the other 300). Test books translated with beam 5
# (alpha 0.6), scored with sacreBLEU (s-BLEU, d-BLEU, chrF).
#
#   bash experiments/recipes/doct_bible.sh [OUT_DIR] [TABLE4_DIR]
#        (env: TOTAL_STEPS=450 PRETRAIN_STEPS=150)
#
# Needs TABLE4_DIR/pretrain_sentences (bash experiments/recipes/table4_bible.sh TABLE4_DIR).
# Resumable.
set -euo pipefail
OUT=${1:-runs/doct_bible}
T4=${2:-runs/table4}
source "$(dirname "$0")/bible_budget.sh"
common=("${BIBLE_FLAGS[@]}" --config.data.tokenizer="$T4/pretrain_sentences/spm.model")
mkdir -p "$OUT"
if [ ! -d "$T4/pretrain_sentences/checkpoints" ]; then
  echo "$T4/pretrain_sentences: run bash experiments/recipes/table4_bible.sh $T4 first" >&2
  exit 2
fi

$PY launch/train.py --config configs/transformer.py --workdir "$OUT/transformer_scratch" \
  "${common[@]}" --config.train.num_steps="$TOTAL"
# DocT trains on sentence rows (each with its k predecessors): 1,120 real target tokens a step
# on the Bible where chunks of 20 carry 668; its steps give the Transformer's token budget.
rows=(--config.model.sentence_rows=True)
steps() {
  $PY experiments/steps_for_tokens.py --config configs/doct.py --reference configs/transformer.py \
    --reference_steps "$1" --tokenizer "$T4/pretrain_sentences/spm.model" \
    --set model.sentence_rows=True
}
$PY launch/train.py --config configs/doct.py --workdir "$OUT/doct_joint" \
  "${common[@]}" "${rows[@]}" --config.train.num_steps="$(steps "$TOTAL")"
$PY launch/train.py --config configs/doct.py:two_step --workdir "$OUT/doct_two_step" \
  "${common[@]}" "${rows[@]}" --config.train.num_steps="$(steps $((TOTAL - PRE)))" \
  --config.init_from="$T4/pretrain_sentences"

PYTHON="$PY" bash experiments/recipes/score_rows.sh "$OUT" "$DATA" \
  transformer_scratch doct_joint doct_two_step
