#!/bin/bash
# The Table 4 analogue of Zheng et al. 2020 on the Bible: FINAL from scratch,
# + source TL and + source & target TL, each row with the same budget of optimiser steps,
# pretraining counted (a step is one batch of ~2,000 real target tokens for both models).
# Pretraining: the sentence Transformer on the Bible training sentences as one-sentence
# documents (data.train_as=sentences); finetuning on the documents; the test books translated
# with beam 5 (alpha 0.6) and scored with sacreBLEU (s-BLEU, d-BLEU, chrF).
#
#   bash experiments/recipes/table4_bible.sh [OUT_DIR]   (env: TOTAL_STEPS=450 PRETRAIN_STEPS=150)
#
# Resumable: a finished training resumes to its last step at once; a row with its hypotheses
# is not translated again. Results: OUT_DIR/<row>/test.scores.json and OUT_DIR/table4.md.
set -euo pipefail
OUT=${1:-runs/table4}
source "$(dirname "$0")/bible_budget.sh"
common=("${BIBLE_FLAGS[@]}")
mkdir -p "$OUT"

$PY launch/train.py --config configs/transformer.py --workdir "$OUT/pretrain_sentences" \
  "${common[@]}" --config.data.train_as=sentences --config.train.num_steps="$PRE"
$PY launch/train.py --config configs/final.py --workdir "$OUT/final_scratch" \
  "${common[@]}" --config.train.num_steps="$TOTAL" \
  --config.data.tokenizer="$OUT/pretrain_sentences/spm.model"
for rules in source all; do
  $PY launch/train.py --config configs/final.py --workdir "$OUT/final_${rules}_tl" \
    "${common[@]}" --config.train.num_steps=$((TOTAL - PRE)) \
    --config.init_from="$OUT/pretrain_sentences" --config.init_from_rules="$rules"
done

PYTHON="$PY" bash experiments/recipes/score_rows.sh "$OUT" "$DATA" \
  final_scratch final_source_tl final_all_tl

$PY - "$OUT" "$TOTAL" "$PRE" <<'EOF'
import json, sys
out, total, pre = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rows = [("FINAL from scratch", "final_scratch", f"0 + {total}"),
        ("+ source TL", "final_source_tl", f"{pre} + {total - pre}"),
        ("+ source & target TL", "final_all_tl", f"{pre} + {total - pre}")]
lines = ["| row | steps (pretrain + finetune) | s-BLEU | d-BLEU | chrF |", "|---|---|---:|---:|---:|"]
for name, row, steps in rows:
    s = json.load(open(f"{out}/{row}/test.scores.json"))
    lines.append(f"| {name} | {steps} | {s['s_bleu']['score']:.2f} | {s['d_bleu']['score']:.2f} "
                 f"| {s['chrf']['score']:.2f} |")
sig = json.load(open(f"{out}/final_scratch/test.scores.json"))
lines += ["", f"s-BLEU signature: {sig['s_bleu'].get('signature', '')}",
          f"chrF signature: {sig['chrf'].get('signature', '')}"]
open(f"{out}/table4.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
