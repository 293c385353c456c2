#!/bin/bash
# Jean & Cho (2019)'s Table 1 on the Bible, every row on the same budget:
# the real target tokens of TOTAL_STEPS (450) steps of the packed sentence Transformer
# (~0.9M), each row's steps from experiments/steps_for_tokens.py on its own batch plan (the two
# context objectives train on the [B, S, T] grid, data.packed=False; Jean & Cho's model on
# sentence rows, each sentence with its window: less padding than chunks). Rows:
#   (a) transformer          the sentence Transformer
#   (b) jean_cho_random      Jean & Cho's model, every context from another document
#                            (objective random_context)
#   (c) jean_cho             the model with its true context, maximum likelihood
#   (d) jean_cho_margin      ... and the context-aware margin regulariser (context_margin)
#   final / final_margin     FINAL (Zheng et al. 2020) as (c) / (d)
# Then launch/evaluate.py --workdir translates the test books with the true context and with
# DRAWS (3) random contexts (beam BEAM (5), alpha 0.6, latest checkpoint) into OUT/ROW/context/ and
# writes the scores (BLEU, context-marginalised BLEU, Delta_BLEU, Delta^D) and Fig. 1 there.
#
#   bash experiments/recipes/table1_bible.sh [OUT_DIR] [train|score|all] [ROW ...]
#        (env: TOTAL_STEPS=450 DRAWS=3 BEAM=5 DATA=data/bible PYTHON=python)
set -euo pipefail
OUT=${1:-runs/table1_bible}
WHAT=${2:-all}
shift $(($# < 2 ? $# : 2))
ROWS=("$@")
[ ${#ROWS[@]} -eq 0 ] && ROWS=(transformer jean_cho_random jean_cho jean_cho_margin final final_margin)
source "$(dirname "$0")/bible_budget.sh"
SPM="$OUT/transformer/spm.model"
common=("${BIBLE_FLAGS[@]}")
mkdir -p "$OUT"

row_config() {  # ROW -> config file and its --config.KEY=VALUE overrides (one per line)
  case $1 in
    transformer) echo configs/transformer.py ;;
    jean_cho_random) printf '%s\n' configs/jean_cho.py objective.name=random_context data.packed=False \
      model.sentence_rows=True ;;
    jean_cho) printf '%s\n' configs/jean_cho.py model.sentence_rows=True ;;
    jean_cho_margin) printf '%s\n' configs/jean_cho.py objective.name=context_margin data.packed=False \
      model.sentence_rows=True ;;
    final) echo configs/final.py ;;
    final_margin) printf '%s\n' configs/final.py objective.name=context_margin data.packed=False ;;
    *) echo "unknown row $1" >&2; exit 2 ;;
  esac
}

train_row() {
  local row=$1 config sets=() flags=() steps
  mapfile -t lines < <(row_config "$row")
  config=${lines[0]}
  for item in "${lines[@]:1}"; do
    flags+=(--config."$item")
    sets+=(--set "$item")
  done
  if [ "$row" = transformer ]; then
    steps=$TOTAL
  else
    [ -s "$SPM" ] || { echo "$SPM: train the transformer row first" >&2; exit 2; }
    flags+=(--config.data.tokenizer="$SPM")
    steps=$($PY experiments/steps_for_tokens.py --config "$config" \
      --reference configs/transformer.py --reference_steps "$TOTAL" --tokenizer "$SPM" "${sets[@]}")
  fi
  $PY launch/train.py --config "$config" --workdir "$OUT/$row" "${common[@]}" "${flags[@]}" \
    --config.train.num_steps="$steps"
}

score_row() {
  bash "$(dirname "$0")/context_rows.sh" "$OUT" "$DATA/test.tsv" "$1"
}

for row in "${ROWS[@]}"; do
  case $WHAT in
    train) train_row "$row" ;;
    score) score_row "$row" ;;
    all) train_row "$row"; score_row "$row" ;;
    *) echo "second argument: train, score or all" >&2; exit 2 ;;
  esac
done
