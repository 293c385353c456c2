#!/bin/bash
# HM-GDC (Tan et al. 2019) on the Bible with the budget of the sentence Transformer, FINAL and
# DocT: the real target tokens of 450 steps of the sentence Transformer
# (~2,000 a step) for every row (experiments/steps_for_tokens.py), the flags and tokenizer of
# experiments/recipes/table4_bible.sh. Rows: HM-GDC from scratch with whole-document scope
# (Table 4, no pretraining), the same with the context cut to chunks of 20 (chunk-only scope), and
# pretraining then finetuning (Table 4: the document corpus's shuffled sentences, table4's
# 150-step sentence Transformer, then every parameter finetuned for the tokens of the other
# 300 steps). Test books translated with beam 5 (alpha 0.6), scored with sacreBLEU and the
# pronoun overlap (evaluate.py --pronouns).
#
#   bash experiments/recipes/hmgdc_bible.sh [OUT_DIR] [TABLE4_DIR] [ROW ...]
#        (env: TOTAL_STEPS=450 PRETRAIN_STEPS=150; rows: document chunk finetune, default all)
#
# Needs TABLE4_DIR/pretrain_sentences (bash experiments/recipes/table4_bible.sh TABLE4_DIR).
# Resumable.
set -euo pipefail
OUT=${1:-runs/hmgdc_bible}
T4=${2:-runs/table4}
shift $(($# < 2 ? $# : 2))
ROWS=("${@:-document chunk finetune}")
read -r -a ROWS <<< "${ROWS[*]}"
source "$(dirname "$0")/bible_budget.sh"
SPM="$T4/pretrain_sentences/spm.model"
common=("${BIBLE_FLAGS[@]}" --config.data.tokenizer="$SPM")
mkdir -p "$OUT"
if [ ! -d "$T4/pretrain_sentences/checkpoints" ]; then
  echo "$T4/pretrain_sentences: run bash experiments/recipes/table4_bible.sh $T4 first" >&2
  exit 2
fi
steps() {  # steps of configs/hmgdc.py (with $2) for the tokens of $1 Transformer steps
  $PY experiments/steps_for_tokens.py --config configs/hmgdc.py --reference configs/transformer.py \
    --reference_steps "$1" --tokenizer "$SPM" ${2:+--set "$2"}
}
scored=()
for row in "${ROWS[@]}"; do
  case $row in
    document)
      $PY launch/train.py --config configs/hmgdc.py --workdir "$OUT/hmgdc_document" \
        "${common[@]}" --config.train.num_steps="$(steps "$TOTAL")" ;;
    chunk)
      $PY launch/train.py --config configs/hmgdc.py --workdir "$OUT/hmgdc_chunk" \
        "${common[@]}" --config.model.document_scope=False \
        --config.train.num_steps="$(steps "$TOTAL" model.document_scope=False)" ;;
    finetune)
      $PY launch/train.py --config configs/hmgdc.py:finetune --workdir "$OUT/hmgdc_finetune" \
        "${common[@]}" --config.init_from="$T4/pretrain_sentences" \
        --config.train.num_steps="$(steps $((TOTAL - PRE)))" ;;
    *) echo "hmgdc_bible.sh: unknown row '$row' (rows: document chunk finetune)" >&2; exit 2 ;;
  esac
  scored+=("hmgdc_$row")
done
PYTHON="$PY" bash experiments/recipes/score_rows.sh "$OUT" "$DATA" "${scored[@]}"
for row in "${scored[@]}"; do
  $PY launch/evaluate.py --hyp "$OUT/$row/test.hyp.tsv" --ref "$DATA/test.tsv" --pronouns --json \
    > "$OUT/$row/test.pronouns.json"
done
