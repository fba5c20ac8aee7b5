#!/usr/bin/env bash
# Multi-host training on a Cloud TPU VM slice (e.g. v4-32: 4 hosts x 4 chips): the same command
# runs on every host (--worker=all); JAX finds the coordinator, the process count and each
# host's id from the TPU metadata (--cluster_detection=auto). Each host runs its actors on its
# CPUs (the policy on its first chip) and feeds its share of every global learner step over all
# chips (ICI).
#
#   TPU_NAME=my-v4-32 ZONE=us-central2-b RUN_DIR=/mnt/shared/runs/breakout \
#       experiments/launch/tpu_vm.sh --preset=breakout_impala
#
# RUN_DIR must be a folder every host sees (NFS/Filestore, or a gcsfuse mount of a bucket):
# checkpoints are written by all hosts together. Code and environment must already be on every
# host, e.g.
#   gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" --worker=all --command='
#     git clone <repo> ~/jaxrl_async && cd ~/jaxrl_async && pip install -e . "jax[tpu]"'
set -euo pipefail

: "${TPU_NAME:?set TPU_NAME}" "${ZONE:?set ZONE}" "${RUN_DIR:?set RUN_DIR (shared by all hosts)}"
repo=${REPO_DIR:-'$HOME/jaxrl_async'}  # expanded on the hosts
chips=${CHIPS_PER_HOST:-4}

# All chips of a host learn (the policy shares chip 0: a TPU host has no spare chip to give);
# pass --learner_devices=3 to give the actors chip 0 alone.
flags=(--cluster_detection=auto --learner_devices="$chips" --num_envs=$((32 * chips))
       --num_actors=4 --peer_timeout_s=120 --run_dir="$RUN_DIR" --resume "$@")
printf -v cmd '%q ' python -m experiments.train "${flags[@]}"

gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" --worker=all \
  --command="set -o pipefail; cd $repo && $cmd 2>&1 | tee -a \$HOME/jaxrl_async_train.log"
