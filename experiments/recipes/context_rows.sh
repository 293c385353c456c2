#!/bin/bash
# Measure the rows of a Table 1 run (experiments/recipes/table1_bible.sh,
# experiments/recipes/table1_synthetic.sh) on a test TSV: a row without context (the
# sentence Transformer, named "transformer") is translated and scored
# (OUT/ROW/context/scores.json); every other row is measured with
# launch/evaluate.py --workdir (true context and DRAWS random contexts, beam BEAM, alpha 0.6,
# latest checkpoint) into OUT/ROW/context/. A row already measured is skipped.
#
#   bash experiments/recipes/context_rows.sh OUT TEST_TSV ROW [ROW ...]
#        (env: DRAWS=3 BEAM=5 PYTHON=python)
set -euo pipefail
OUT=$1
TEST=$2
shift 2
PY=${PYTHON:-python}
for row in "$@"; do
  dir="$OUT/$row/context"
  if [ -s "$dir/context.json" ] || [ -s "$dir/scores.json" ]; then
    continue
  elif [ "$row" = transformer ]; then  # no context: BLEU only (Table 1 row (a))
    $PY launch/translate.py --workdir "$OUT/$row" --input "$TEST" --checkpoint latest \
      --output "$dir/hyp.true.tsv" --beam "${BEAM:-5}" --alpha 0.6
    $PY launch/evaluate.py --hyp "$dir/hyp.true.tsv" --ref "$TEST" --json > "$dir/scores.json.partial"
    mv "$dir/scores.json.partial" "$dir/scores.json"
  else
    $PY launch/evaluate.py --workdir "$OUT/$row" --checkpoint latest --ref "$TEST" \
      --context_draws "${DRAWS:-3}" --out_dir "$dir" --beam "${BEAM:-5}" --alpha 0.6
  fi
done
