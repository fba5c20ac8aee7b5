#!/usr/bin/env bash
# Multi-process training on one machine: N processes on 127.0.0.1, each running what one host of
# a cluster runs (its own actors, queue and rate controller; one global learner step over every
# process's learner devices, gloo collectives on CPU). The way to try the multi-host path
# without a cluster.
#
#   experiments/launch/local_two_process.sh RUN_DIR [train flags...]
#   NUM_PROCESSES=2 PORT=12355 experiments/launch/local_two_process.sh runs/cp2 \
#       --preset=cartpole_impala
#   # two learner devices per process (CPU devices are forced):
#   XLA_FLAGS=--xla_force_host_platform_device_count=2 \
#       experiments/launch/local_two_process.sh runs/cp2x2 --learner_devices=2
#
# Process 0 prints its progress here; every process logs to RUN_DIR/logs/process_<p>.log.
# Process 0's metrics.jsonl and summary.json (in RUN_DIR) hold the run-wide counts (global_sps,
# global_env_steps); process p > 0 writes its own under RUN_DIR/process_<p>/. Ctrl-C stops every
# process at the same version, with a final checkpoint; rerun with --resume to continue.
set -euo pipefail

if [[ $# -lt 1 || $1 == -* ]]; then
  echo "usage: $0 RUN_DIR [train flags...]" >&2
  exit 2
fi
run_dir=$1
shift
cd "$(dirname "$0")/../.."
num=${NUM_PROCESSES:-2}
port=${PORT:-$(python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
mkdir -p "$run_dir/logs"
export JAX_PLATFORMS=${JAX_PLATFORMS:-cpu}

pids=()
stop_all() {
  # Each process asks to stop; the learners agree on the version and every process saves it.
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
}
trap stop_all INT TERM

for ((p = 0; p < num; p++)); do
  cmd=(python -m experiments.train --num_processes="$num" --process_id="$p"
       --coordinator_address="127.0.0.1:$port" --run_dir="$run_dir" "$@")
  if ((p == 0)); then  # $! must be python's pid (for the TERM above), so no pipe into tee
    "${cmd[@]}" > >(tee "$run_dir/logs/process_$p.log") 2>&1 &
  else
    "${cmd[@]}" --quiet >"$run_dir/logs/process_$p.log" 2>&1 &
  fi
  pids+=($!)
done

status=0
for pid in "${pids[@]}"; do
  while true; do
    rc=0
    wait "$pid" || rc=$?
    # A trapped signal interrupts `wait` (status > 128) while the process still runs: wait on.
    if ((rc > 128)) && kill -0 "$pid" 2>/dev/null; then continue; fi
    break
  done
  ((rc == 0)) || status=$rc
done
echo "local_two_process: $num processes finished (status $status); logs in $run_dir/logs" >&2
exit "$status"
