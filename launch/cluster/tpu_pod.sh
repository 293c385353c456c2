#!/usr/bin/env bash
# Train on a Cloud TPU VM pod slice (e.g. v4-32: 4 workers x 4 chips), one process per worker.
#
# The same command runs on every worker (`gcloud ... ssh --worker=all`). `--distributed` makes
# train.py call jax.distributed.initialize() with no arguments: on a TPU VM JAX finds the
# coordinator, the number of processes and this worker's index itself. Every worker reads its
# own rows of each global batch; process 0 writes train.log, TensorBoard and config.json; every
# worker writes its part of each checkpoint. So WORKDIR must be one directory that all workers
# see at the same path: a GCS bucket mounted with gcsfuse, or a Filestore (NFS) share.
#
# Once, before the first run (every worker needs the code, the environment and the corpus):
#   gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" --worker=all --command="
#     git clone <this repository> ~/docnmt_jax && cd ~/docnmt_jax &&
#     python3 -m venv .venv && .venv/bin/pip install -e . 'jax[tpu]'"
#   and the prepared corpus (launch/prepare_data.py) at ~/docnmt_jax/data/bible on every
#   worker, or on the shared mount (add --config.data.data_dir=/mnt/shared/data/bible).
# A shared tokenizer avoids one per worker when WORKDIR is not yet shared at startup:
#   add --config.data.tokenizer=/mnt/shared/spm.model (process 0 trains it otherwise).
#
# Usage:
#   TPU_NAME=my-v4-32 ZONE=us-central2-b WORKDIR=/mnt/shared/runs/final_base \
#     bash launch/cluster/tpu_pod.sh [more train.py flags, e.g. --config.train.num_steps=200000]
#
# Mesh: data parallel over all chips by default. For bigger models shard parameters and
# optimiser state too, e.g. --config.mesh.data=-1 --config.mesh.fsdp=4 (4 = chips per worker);
# --config.mesh.model splits heads / feed-forward / vocabulary (it must divide the heads).
# Batch rows per step are a multiple of data x fsdp (every chip gets the same number).
set -euo pipefail

: "${TPU_NAME:?set TPU_NAME to the pod slice name}"
: "${ZONE:?set ZONE to its zone}"
: "${WORKDIR:?set WORKDIR to a directory every worker sees}"
CONFIG=${CONFIG:-configs/final_base.py}
REPO=${REPO:-'~/docnmt_jax'}
EXTRA_FLAGS=$(printf ' %q' "$@")

gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" --worker=all --command="
cd $REPO && TF_CPP_MIN_LOG_LEVEL=2 .venv/bin/python launch/train.py \
  --config=$CONFIG \
  --workdir=$WORKDIR \
  --distributed \
  --config.mesh.data=-1 \
  --config.mesh.fsdp=1 \
  --config.mesh.model=1 $EXTRA_FLAGS"
