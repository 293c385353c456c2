#!/usr/bin/env bash
# Ends a session of the converged campaign without losing the base in training:
#
#   bash experiments/recipes/campaign_interim.sh WORK BASE_COMMIT FINETUNE_COMMIT
#
# SIGTERMs the campaign (WORK/campaign.pgid; the row in flight saves its checkpoint) and, while
# the base (the sentence Transformer) is still training, exports its best checkpoint so far as
# the interim release releases/bible-transformer of this checkout (experiments/release_row.py
# --interim). Commit that release: on a new machine converged_campaign.sh continues the base
# from it (step, learning-rate schedule and best dev BLEU; Adam's moments fresh). A finetune
# row in flight is only checkpointed here: it restarts on a new machine.
set -euo pipefail
WORK=${1:?usage: campaign_interim.sh WORK BASE_COMMIT FINETUNE_COMMIT}
BASE_COMMIT=${2:?BASE_COMMIT}
FINETUNE_COMMIT=${3:?FINETUNE_COMMIT}
REPO=$(cd "$(dirname "$0")/../.." && pwd)
RELEASE=$REPO/releases/bible-transformer
ROW=$WORK/out/rows/transformer
if [ -s "$WORK/campaign.pgid" ]; then
  pgid=$(cat "$WORK/campaign.pgid")
  kill -CONT -- "-$pgid" 2>/dev/null || true
  if kill -TERM -- "-$pgid" 2>/dev/null; then
    for _ in $(seq 600); do  # the checkpoint save takes seconds; a dev evaluation minutes
      pgrep -g "$pgid" > /dev/null || break
      sleep 1
    done
  fi
  if pgrep -g "$pgid" > /dev/null; then
    echo "campaign_interim: process group $pgid still running" >&2
    exit 1
  fi
fi
if [ -f "$ROW/train.json" ] || [ ! -d "$ROW/best" ]; then
  echo "campaign_interim: the base is not in training ($ROW): nothing to release"
  exit 0
fi
commit=$BASE_COMMIT  # the commit this stretch of training ran at (see converged_campaign.sh)
python3 -c 'import json, sys; sys.exit(json.load(open(sys.argv[1]))["training"].get("stopped_by") != "interim")' \
  "$RELEASE/release.json" 2>/dev/null && commit=$FINETUNE_COMMIT  # its own record, not the chain's
(cd "$REPO" && .venv/bin/python experiments/release_row.py --run_dir "$WORK/out" --row transformer \
  --out "$RELEASE" --interim --overwrite --commit "$commit" \
  --command "python experiments/results.py --converged --rows transformer --seeds 0")
echo "campaign_interim: commit $RELEASE (git add releases/bible-transformer)"
