#!/usr/bin/env bash
# The converged comparison (docs/results_converged.md) as a campaign over many sessions.
#
#   REPO=$PWD setsid nohup bash WORK/src-FINETUNE_COMMIT/experiments/recipes/converged_campaign.sh \
#       WORK BASE_COMMIT FINETUNE_COMMIT > WORK/campaign.log 2>&1 &
#
# WORK is an absolute directory outside the checkout: rows in WORK/out (the runner's --out),
# one git worktree per pinned commit in WORK/src-COMMIT (a row keeps the code it started with).
# In order, each step skipped when done, each resumable (rerun the same command):
#   1. base      the sentence Transformer, seed 0, until dev BLEU stops improving (BASE_COMMIT);
#                when releases/bible-transformer holds its interim release (a session ended:
#                experiments/release_row.py --interim, committed), it continues from there at
#                FINETUNE_COMMIT (--continue_release: step, schedule, best dev BLEU)
#   2. release   its best checkpoint (EMA) exported to releases/bible-transformer of the
#                checkout this script is in (commit it there: the finetune rows start from it)
#   3. final     FINAL finetuned from the release, seeds 0, 1, 2 (FINETUNE_COMMIT)
#   4. control   the Transformer continued from the release for the longest FINAL row's
#                tokens, seeds 0, 1, 2
#   5. others    DocT two-step, HM-GDC, Jean & Cho, Doc2Doc finetuned from the release
# Everything runs at nice 10, in a scheduling autogroup of nice 19. Pause for a benchmark:
# kill -STOP -- -PGID (the PGID in WORK/campaign.pgid), resume with kill -CONT; stop with
# kill -TERM -- -PGID (the training in flight saves its checkpoint; rerun to resume), or at a
# session's end experiments/recipes/campaign_interim.sh (stop, and commit the base in
# training as an interim release). One campaign per WORK (a lock).
set -euo pipefail
WORK=${1:?usage: converged_campaign.sh WORK BASE_COMMIT FINETUNE_COMMIT}
BASE_COMMIT=${2:?BASE_COMMIT}
FINETUNE_COMMIT=${3:?FINETUNE_COMMIT}
# REPO: the checkout that gets the release (default: this script's). Run the script from a
# pinned worktree's copy (bash reads a script as it runs: never edit the running file).
REPO=${REPO:-$(cd "$(dirname "$0")/../.." && pwd)}
RELEASE=$REPO/releases/bible-transformer
OUT=$WORK/out
mkdir -p "$OUT"
exec 9> "$WORK/campaign.lock"
flock -n 9 || { echo "converged_campaign: another campaign holds $WORK/campaign.lock" >&2; exit 2; }
ps -o pgid= $$ | tr -d ' ' > "$WORK/campaign.pgid"
# nice alone does not yield: with autogroup scheduling (setsid starts a new session, hence a
# new group) a nice-10 process still gets half the CPU against another session's tests. The
# group's own nice does (measured 2026-12-03: 123% CPU for the campaign against 65% for CI).
echo 19 > /proc/self/autogroup 2>/dev/null || true

worktree() {  # the pinned checkout of commit $1, sharing the venv and prepared data
  local src=$WORK/src-$1
  if [ ! -d "$src" ]; then
    git -C "$REPO" worktree add --detach "$src" "$1" >&2
    ln -s "$REPO/.venv" "$src/.venv"
    mkdir -p "$src/data" && ln -s "$REPO/data/bible" "$src/data/bible"
  fi
  echo "$src"
}

rows() {  # rows $1 (comma-separated) from commit $2; more results.py flags after
  local src
  src=$(worktree "$2")
  echo "$(date '+%F %T') rows $1 at $2" >&2
  (cd "$src" && PYTHONPATH=$src nice -n 10 .venv/bin/python experiments/results.py --converged \
    --rows "$1" --seeds 0,1,2 --out "$OUT" --doc "$OUT/results_converged.md" \
    --data_dir data/bible "${@:3}")
}

done_row() { [ -f "$OUT/rows/$1/params.json" ]; }

# The release's own record, not the interim releases it continued (training.continued_from)
interim() {
  python3 -c 'import json, sys; sys.exit(json.load(open(sys.argv[1]))["training"].get("stopped_by") != "interim")' \
    "$RELEASE/release.json" 2>/dev/null
}
if ! done_row transformer; then
  if interim; then  # continues its committed interim release (or its own checkpoints here)
    rows transformer "$FINETUNE_COMMIT" --init_release "" --continue_release "transformer=$RELEASE"
  else
    rows transformer "$BASE_COMMIT"  # its own run: no release yet
  fi
fi
if [ ! -f "$RELEASE/release.json" ] || interim; then
  src=$(worktree "$FINETUNE_COMMIT")
  (cd "$src" && PYTHONPATH=$src .venv/bin/python experiments/release_row.py --run_dir "$OUT" \
    --row transformer --out "$RELEASE" --commit "$BASE_COMMIT" --overwrite \
    --command "python experiments/results.py --converged --rows transformer --seeds 0")
fi
FINAL=final_finetuned,final_finetuned_seed1,final_finetuned_seed2
CONTROL=transformer_continued,transformer_continued_seed1,transformer_continued_seed2
OTHERS=doct_two_step,hmgdc_finetuned,jean_cho_finetuned,doc2doc_finetuned
for group in "$FINAL" "$CONTROL" "$OTHERS"; do
  rows "$group" "$FINETUNE_COMMIT" --init_release "transformer=$RELEASE"
done
echo "$(date '+%F %T') campaign complete: bash experiments/recipes/sync_converged.sh $OUT" >&2
