#!/bin/bash
# Context-use side by side (pronoun set, CXMI, margin, CoWord): FINAL finetuned from the
# committed sentence release at 0.3M target tokens (300 packed Transformer steps) by maximum
# likelihood (packed, and on the grid the margin trains on), the margin regulariser (with and
# without gradients through the random context) and CoWord, beside the same-token control.
# The converged campaign is stopped for the duration and continued after. Resumable.
set -u
cd /work/ctx64/src
PG=$(cat /work/campaign/campaign.pgid)
kill -STOP -- -$PG
trap 'kill -CONT -- -$PG' EXIT
ROWS=transformer_continued,final_finetuned,final_finetuned_grid,final_finetuned_margin,final_finetuned_margin_stopgrad,final_finetuned_coword
[ -s data/bible/test.pronouns.jsonl ] || nice -n 10 .venv/bin/python launch/prepare_data.py --corpus pronoun_sets --out data/bible
nice -n 10 .venv/bin/python experiments/results.py --out /work/ctx64/out --doc /work/ctx64/results.md \
  --base_steps 300 --init_release transformer=releases/bible-transformer --rows "$ROWS" \
  --stages train,measure,params
for set in dev test; do
  nice -n 10 .venv/bin/python experiments/context_use.py --run_dir /work/ctx64/out --rows "$ROWS" \
    --set data/bible/$set.pronouns.jsonl --ref data/bible/$set.tsv
done
