#!/usr/bin/env bash
# Copies the converged campaign's finished rows into the checkout and rewrites the report:
#
#   bash experiments/recipes/sync_converged.sh WORK/out [more results.py flags, e.g. --quick]
#
# Per finished row (its params stage saved), docs/results_converged/rows/ROW/ gets its stage
# records (train, measure, synthetic, params, paired .json), test translations (test.hyp.tsv,
# and the random-context and single-sentence ones), train.log, init_from.tsv and config.json;
# then docs/results_converged.md/.json are written from WORK/out by the runner (no training:
# --stages ""). Commit what it copied.
set -euo pipefail
OUT=${1:?usage: sync_converged.sh WORK/out}
REPO=$(cd "$(dirname "$0")/../.." && pwd)
DEST=$REPO/docs/results_converged/rows
RELEASE=$REPO/releases/bible-transformer
copied=()
for dir in "$OUT"/rows/*/; do
  row=$(basename "$dir")
  [ -f "$dir/params.json" ] || continue
  mkdir -p "$DEST/$row"
  for f in train.json measure.json synthetic.json params.json paired.json cpu_seconds.json \
           train.log init_from.tsv config.json "$dir"/*.hyp.tsv; do
    f=$(basename "$f")
    [ -f "$dir/$f" ] && cp "$dir/$f" "$DEST/$row/$f"
  done
  copied+=("$row")
done
rows=$(IFS=,; echo "${copied[*]}")
[ -n "$rows" ] || { echo "sync_converged: no finished row in $OUT" >&2; exit 1; }
release_flag=()
[ -f "$RELEASE/release.json" ] && release_flag=(--init_release "transformer=$RELEASE")
cd "$REPO"
.venv/bin/python experiments/results.py --converged --stages "" --rows "$rows" --seeds 0,1,2 \
  --out "$OUT" --doc docs/results_converged.md "${release_flag[@]}" "${@:2}" > /dev/null
echo "synced rows: $rows -> docs/results_converged/, docs/results_converged.md"
