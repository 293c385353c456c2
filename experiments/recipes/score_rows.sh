#!/bin/bash
# Translate the test books with each row's latest checkpoint (beam 5, alpha 0.6; skipped when
# OUT/ROW/test.hyp.tsv exists) and score them with sacreBLEU into OUT/ROW/test.scores.json.
#
#   bash experiments/recipes/score_rows.sh OUT DATA ROW [ROW ...]      (env: PYTHON)
set -euo pipefail
OUT=$1
DATA=$2
shift 2
PY=${PYTHON:-python}
for row in "$@"; do
  if [ ! -s "$OUT/$row/test.hyp.tsv" ]; then
    $PY launch/translate.py --workdir "$OUT/$row" --input "$DATA/test.tsv" \
      --output "$OUT/$row/test.hyp.tsv" --beam 5 --alpha 0.6 --checkpoint latest
  fi
  $PY launch/evaluate.py --hyp "$OUT/$row/test.hyp.tsv" --ref "$DATA/test.tsv" --json \
    > "$OUT/$row/test.scores.json"
done
