#!/usr/bin/env bash
# One prepared accelerator check, under 8 minutes: installs the package, then measures a short
# throughput suite (Breakout and CartPole), rollout transfer to the GPU, and a few minutes of
# Breakout IMPALA training, all into OUT_DIR (log.txt, steps.tsv, summary.md, and
# device_check.tar.gz with every results file, for tools that fetch only a few files).
#
#   bash tools/device_check.sh OUT_DIR [--dry-run] [--skip-install]
#
# --dry-run prints the steps without running them. --skip-install uses the Python as it is.
# Without a GPU it falls back to the CPU with test sizes, so the path can be tried anywhere.
# Environment: PYTHON (default python3), WHEELHOUSE (a folder of wheels for offline installs),
# DEVICE_CHECK_BUDGET_S (default 470: every step's timeout is cut to what is left of it).
set -u -o pipefail

usage="usage: bash tools/device_check.sh OUT_DIR [--dry-run] [--skip-install]"
OUT=${1:?$usage}
shift
DRY=0
INSTALL=1
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY=1 ;;
    --skip-install) INSTALL=0 ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-python3}
BUDGET_S=${DEVICE_CHECK_BUDGET_S:-470}
DEADLINE=$(( $(date +%s) + BUDGET_S ))
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
exec > >(tee -a "$OUT/log.txt") 2>&1
cd "$REPO" || exit 1
export TF_CPP_MIN_LOG_LEVEL=3
# Several processes share the GPU one after another; none should grab 75% of it up front.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"  # importable even if the install fails

# step NAME TIMEOUT_S CMD...: runs CMD under a timeout cut to the budget left, records its exit
# status and duration in steps.tsv, and never stops the script.
step() {
  local name=$1 limit=$2
  shift 2
  local left=$(( DEADLINE - $(date +%s) ))
  (( limit > left )) && limit=$left
  echo "=== $(date +%T) $name (timeout ${limit}s): $*"
  if (( DRY )); then
    return 0
  fi
  if (( limit < 10 )); then
    echo "=== $name: skipped, budget spent"
    printf '%s\tskipped\t0\n' "$name" >>"$OUT/steps.tsv"
    return 0
  fi
  local t0 rc
  t0=$(date +%s)
  timeout --kill-after=15 "$limit" "$@"
  rc=$?
  printf '%s\t%s\t%s\n' "$name" "$rc" "$(( $(date +%s) - t0 ))" >>"$OUT/steps.tsv"
  echo "=== $(date +%T) $name: exit $rc after $(( $(date +%s) - t0 ))s"
  return 0
}

# pip from WHEELHOUSE when given (the device machine may have no network), else the index,
# failing fast.
if [[ -n "${WHEELHOUSE:-}" ]]; then
  PIP=("$PY" -m pip install --no-index --find-links "$WHEELHOUSE")
else
  PIP=("$PY" -m pip install --retries 1 --timeout 20)
fi

echo "device_check: repo $REPO at $(git -C "$REPO" rev-parse HEAD 2>/dev/null || echo '?'), out $OUT"
(( DRY )) || printf 'step\texit\tseconds\n' >"$OUT/steps.tsv"
step nvidia-smi 20 nvidia-smi

if (( INSTALL )); then
  # jax with CUDA only if this jax does not see a GPU already.
  if (( DRY )) || ! timeout 60 "$PY" -c "import jax, sys; sys.exit(jax.default_backend() != 'gpu')" 2>/dev/null; then
    step install-jax-cuda 180 "${PIP[@]}" "jax[cuda12]"
  fi
  step install-package 120 "${PIP[@]}" -e "$REPO"
  if (( ! DRY )) && ! timeout 60 "$PY" -c "import jaxrl_async, envpool, flax, optax" 2>/dev/null; then
    step install-package-no-deps 60 "${PIP[@]}" --no-deps --no-build-isolation -e "$REPO"
  fi
fi

BACKEND=unknown
if (( ! DRY )); then
  BACKEND=$(timeout 90 "$PY" -c "import jax; print(jax.default_backend())" 2>/dev/null | tail -1)
fi
step devices 90 "$PY" -c "import jax; print(jax.__version__, jax.devices())"

if [[ "$BACKEND" == "gpu" || "$BACKEND" == "cuda" ]] || (( DRY )); then
  SIZE=(--quick)
  TRAIN=(--algo=impala --env_id=Breakout-v5 --network=nature_cnn --num_actors=4 --num_envs=32
         --env_threads=4 --rollout_len=32 --max_policy_lag=1 --num_epochs=1
         --num_minibatches=1 --learning_rate=6e-4 --entropy_coef=0.01
         --total_env_steps=1000000000)
  TRAIN_S=120
else
  echo "device_check: no GPU (backend '$BACKEND'): CPU fallback with test sizes"
  export JAX_PLATFORMS=cpu
  SIZE=(--tiny)
  TRAIN=(--algo=impala --env_id=Breakout-v5 --network=nature_cnn --num_actors=1 --num_envs=4
         --rollout_len=8 --max_policy_lag=1 --num_epochs=1 --num_minibatches=1
         --total_env_steps=1000000000)
  TRAIN_S=40
fi
# A breakout_impala preset, where one exists, replaces the flags above (on the GPU only: the
# CPU fallback keeps its test sizes).
PRESET=()
if [[ "${SIZE[0]}" == --quick ]] && (( ! DRY )) && timeout 60 "$PY" -c "import sys; from experiments.presets import PRESETS; sys.exit('breakout_impala' not in PRESETS)" 2>/dev/null; then
  PRESET=(--preset=breakout_impala)
  TRAIN=()
fi

step throughput 240 env JAXRL_BENCH_TASKS=breakout,cartpole \
  "$PY" -m tools.benchmark throughput "${SIZE[@]}" --out "$OUT/throughput"
step transfer 60 "$PY" -m tools.benchmark transfer "${SIZE[@]}" --out "$OUT/transfer"
step breakout-train $(( TRAIN_S + 90 )) \
  "$PY" -m experiments.train "${PRESET[@]}" "${TRAIN[@]}" --seed=0 \
  --run_dir="$OUT/breakout" --quiet --max_wall_s=$TRAIN_S --stop_at_return=nan \
  --log_every_s=5 --checkpoint_at_end=false --checkpoint_every_s=0
step plot 60 "$PY" tools/plot.py "$OUT/breakout" --out "$OUT/breakout"

if (( ! DRY )); then
  {
    echo "# device check $(date -Is)"
    echo
    echo "backend: $BACKEND"
    echo
    echo '```'
    cat "$OUT/steps.tsv"
    echo '```'
    for f in "$OUT"/throughput/results.md "$OUT"/transfer/results.md; do
      [[ -f "$f" ]] && { echo; cat "$f"; }
    done
    if [[ -f "$OUT/breakout/summary.json" ]]; then
      echo
      echo "## Breakout training"
      echo
      "$PY" -c "import json,sys; s=json.load(open(sys.argv[1])); print({k: s.get(k) for k in ('env_steps','wall_s','final_return_mean','version','max_policy_lag_seen','dropped_stale','timings')})" "$OUT/breakout/summary.json"
    fi
  } >"$OUT/summary.md" 2>&1
  tar -czf "$OUT/device_check.tar.gz" -C "$OUT" --exclude=device_check.tar.gz --exclude='*/cache' . 2>/dev/null
  echo "device_check: done in $(( BUDGET_S - (DEADLINE - $(date +%s)) ))s; see $OUT/summary.md"
fi
exit 0
