#!/usr/bin/env bash
# One prepared accelerator check, under 9 minutes on a 1-GPU host (issue 16): nvidia-smi; JAX's
# devices; the throughput suite at the host's layout for Breakout and Pong (--quick); the
# transfer suite (--quick); 300 s of `experiments.train --preset=pong_impala` (layout auto, no
# other size flags) and its return-against-time plot. OUT_DIR gets only a few files, for tools
# that fetch a handful: summary.md (steps, both suites' results.md, the Pong run's key fields),
# log.txt, steps.tsv, pong_return.png, and device_check.tar.gz with everything else (the work
# folder, outside OUT_DIR).
#
#   bash tools/device_check.sh OUT_DIR [--dry-run] [--skip-install] [--balance]
#
# --dry-run prints the steps without running them. --skip-install uses the Python as it is.
# --balance runs issue 18's GPU regime instead of the suites and the training: the balance grid
# on Breakout at K = 1 (tools/suites/balance_grid.py), a few fixed settings of rollouts per
# update x actors against --balance=auto, one seed, DEVICE_CHECK_BALANCE_RUN_S (default 60) per
# run with its first DEVICE_CHECK_BALANCE_WARMUP_S (default 30) left out; the settings are
# DEVICE_CHECK_BALANCE_SETTINGS (balance:U:N, comma separated). On a CPU it runs the `fast`
# regime briefly instead, to try the path. summary.md gets the grid's results.md.
# An offline GPU host (/work/shared/device/README.md): when $REPO/.device/site.tar.xz exists
# (`bash ../shared/device/make_site.sh .device/site.tar.xz`) and envpool or rlax does not import,
# it is unpacked to DEVICE_CHECK_SITE (default /tmp/site), which goes first on PYTHONPATH.
# DEVICE_CHECK_FORCE_SITE=1 uses the tarball even where envpool imports (to try that path).
# Without a GPU it falls back to the CPU with test sizes (--tiny, a short training run), so the
# whole path can be tried anywhere.
# Environment: PYTHON (default python3), WHEELHOUSE (a folder of wheels for offline installs),
# DEVICE_CHECK_BUDGET_S (default 530: every step's timeout is cut to what is left of it, and the
# training's --max_wall_s to what is left after the suites), DEVICE_CHECK_THROUGHPUT_S (the
# throughput suite's own budget, default 100 s on a GPU: modes that would start past a task's
# share are skipped rows), DEVICE_CHECK_TRAIN_S (default 300).
#
# Expected on the reference host (16 cores, 1 H200): devices ~10 s, throughput ~100-130 s,
# transfer ~30 s, training 300 s plus ~40 s start-up, plot and summary ~15 s: ~500 s.
set -u -o pipefail

usage="usage: bash tools/device_check.sh OUT_DIR [--dry-run] [--skip-install] [--balance]"
OUT=${1:?$usage}
shift
DRY=0
INSTALL=1
BALANCE=0
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY=1 ;;
    --skip-install) INSTALL=0 ;;
    --balance) BALANCE=1 ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-python3}
BUDGET_S=${DEVICE_CHECK_BUDGET_S:-530}
T0=$(date +%s)
DEADLINE=$(( T0 + BUDGET_S ))
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
rm -f "$OUT/log.txt" "$OUT/steps.tsv" "$OUT/summary.md" "$OUT/pong_return.png" \
  "$OUT/device_check.tar.gz"
exec > >(tee -a "$OUT/log.txt") 2>&1
cd "$REPO" || exit 1
# Everything but the few files above goes to a work folder outside OUT_DIR, then into the tarball.
if (( DRY )); then
  WORK="${TMPDIR:-/tmp}/device_check.XXXXXX"
else
  WORK=$(mktemp -d "${TMPDIR:-/tmp}/device_check.XXXXXX")
fi
export TF_CPP_MIN_LOG_LEVEL=3 PYTHONUNBUFFERED=1
# Several processes share the GPU one after another; none should grab 75% of it up front.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"  # importable even if the install fails

left() { echo $(( DEADLINE - $(date +%s) )); }

# step NAME TIMEOUT_S CMD...: runs CMD under a timeout cut to the budget left, records its exit
# status and duration in steps.tsv, and never stops the script.
step() {
  local name=$1 limit=$2
  shift 2
  local remaining
  remaining=$(left)
  (( limit > remaining )) && limit=$remaining
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

echo "device_check: repo $REPO at $(git -C "$REPO" rev-parse HEAD 2>/dev/null || echo '?'), out $OUT, work $WORK, budget ${BUDGET_S}s"
(( DRY )) || printf 'step\texit\tseconds\n' >"$OUT/steps.tsv"
step nvidia-smi 20 nvidia-smi

# The offline host's missing packages (EnvPool, rlax, ...), from the tarball beside the repo.
SITE_TAR="$REPO/.device/site.tar.xz"
SITE=${DEVICE_CHECK_SITE:-/tmp/site}
if [[ -f "$SITE_TAR" ]]; then
  if [[ "${DEVICE_CHECK_FORCE_SITE:-0}" == 1 ]] || (( DRY )) \
      || ! timeout 60 "$PY" -c "import envpool, rlax" 2>/dev/null; then
    step site 90 bash -c "mkdir -p '$SITE' && tar -xJf '$SITE_TAR' -C '$SITE'"
    export PYTHONPATH="$SITE:$REPO"
    echo "device_check: PYTHONPATH=$PYTHONPATH (packages from $SITE_TAR)"
  fi
fi

# pip from WHEELHOUSE when given (the device machine may have no network), else the index,
# failing fast.
if [[ -n "${WHEELHOUSE:-}" ]]; then
  PIP=("$PY" -m pip install --no-index --find-links "$WHEELHOUSE")
else
  PIP=("$PY" -m pip install --retries 1 --timeout 20)
fi
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
# EnvPool and rlax (through tfp) are what the offline host lacks: import both here, where a
# missing package shows first.
step devices 60 "$PY" -c "import jax, envpool, rlax; print('jax', jax.__version__, jax.devices(), '| envpool', envpool.__version__, envpool.__file__, '| rlax', rlax.__file__)"

if (( BALANCE )); then
  if [[ "$BACKEND" == "gpu" || "$BACKEND" == "cuda" ]] || (( DRY )); then
    REGIME=breakout
    SETTINGS=${DEVICE_CHECK_BALANCE_SETTINGS:-auto:1:8,off:1:8,off:4:8,off:8:8,off:8:4}
    RUN_S=${DEVICE_CHECK_BALANCE_RUN_S:-60}
    WARMUP_S=${DEVICE_CHECK_BALANCE_WARMUP_S:-30}
  else
    echo "device_check: no GPU (backend '$BACKEND'): the fast CPU regime, briefly"
    export JAX_PLATFORMS=cpu
    REGIME=fast
    SETTINGS=${DEVICE_CHECK_BALANCE_SETTINGS:-auto:1:6,off:1:6,off:6:2}
    RUN_S=${DEVICE_CHECK_BALANCE_RUN_S:-20}
    WARMUP_S=${DEVICE_CHECK_BALANCE_WARMUP_S:-8}
  fi
  RUNS=$(( $(tr -cd , <<<"$SETTINGS" | wc -c) + 1 ))
  # Each run: its wall cap, plus start-up past it and the process's exit; auto's programs
  # compile first (one process, up to ~90 s cold). Auto runs first: a budget cut short takes a
  # fixed setting. A timeout writes no results.md; the runs' own files are in the tarball.
  step balance-grid $(( RUNS * (RUN_S + 20) + 90 )) "$PY" -m tools.suites.balance_grid \
    "$WORK/balance" --regimes "$REGIME" --settings "$SETTINGS" --seeds 0 \
    --max_wall_s "$RUN_S" --warmup_s "$WARMUP_S"
  if (( ! DRY )); then
    {
      echo "# device check --balance $(date -Is)"
      echo
      echo "backend: $BACKEND; repo at $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo '?'); regime $REGIME; settings $SETTINGS; ${RUN_S} s a run, warm-up ${WARMUP_S} s"
      echo
      echo '```'
      cat "$OUT/steps.tsv"
      echo '```'
      [[ -f "$WORK/balance/results.md" ]] && { echo; sed 's/^#/##/' "$WORK/balance/results.md"; }
      # Auto's path: its decisions, and its windows by setting (throughput and its scatter).
      for run in "$WORK"/balance/runs/*-auto-*; do
        [[ -f "$run/summary.json" ]] || continue
        echo; echo "## $(basename "$run"): decisions and windows"; echo; echo '```'
        "$PY" -m tools.run_summary --decisions "$run"
        "$PY" -m tools.run_summary --windows "$run"
        echo '```'
      done
    } >"$OUT/summary.md" 2>&1
    tar -czf "$OUT/device_check.tar.gz" -C "$WORK" --exclude='*/cache' . 2>/dev/null
    echo "device_check: done in $(( $(date +%s) - T0 ))s; see $OUT/summary.md (everything: $OUT/device_check.tar.gz, from $WORK)"
  fi
  exit 0
fi

TRAIN_S=${DEVICE_CHECK_TRAIN_S:-300}
if [[ "$BACKEND" == "gpu" || "$BACKEND" == "cuda" ]] || (( DRY )); then
  SIZE=(--quick)
  THROUGHPUT_S=${DEVICE_CHECK_THROUGHPUT_S:-100}
  TRAIN_SIZES=()  # the layout's, for this host
else
  echo "device_check: no GPU (backend '$BACKEND'): CPU fallback with test sizes"
  export JAX_PLATFORMS=cpu
  SIZE=(--tiny)
  THROUGHPUT_S=${DEVICE_CHECK_THROUGHPUT_S:-150}
  TRAIN_S=${DEVICE_CHECK_TRAIN_S:-30}
  TRAIN_SIZES=(--num_envs=4 --rollout_len=8 --network=nature_cnn)
fi

# The throughput suite's own budget skips modes (as rows) instead of being killed; the step's
# timeout is only the backstop.
step throughput $(( THROUGHPUT_S + 60 )) env JAXRL_BENCH_TASKS=breakout,pong \
  JAXRL_BENCH_BUDGET_S="$THROUGHPUT_S" \
  "$PY" -m tools.benchmark throughput "${SIZE[@]}" --out "$WORK/throughput"
step transfer 45 "$PY" -m tools.benchmark transfer "${SIZE[@]}" --out "$WORK/transfer"

# Training gets what is left after start-up (~40 s), the plot and the summary, up to TRAIN_S.
MARGIN_S=65
if (( ! DRY )) && (( $(left) - MARGIN_S < TRAIN_S )); then
  TRAIN_S=$(( $(left) - MARGIN_S ))
  (( TRAIN_S < 10 )) && TRAIN_S=10
  echo "device_check: the steps before ran long; training cut to --max_wall_s=$TRAIN_S"
fi
step pong-train $(( TRAIN_S + MARGIN_S - 15 )) \
  "$PY" -m experiments.train --preset=pong_impala --layout=auto "${TRAIN_SIZES[@]}" --seed=0 \
  --run_dir="$WORK/pong" --quiet --max_wall_s="$TRAIN_S" --stop_at_return=nan \
  --log_every_s=5 --checkpoint_at_end=false --checkpoint_every_s=0
step plot 40 "$PY" tools/plot.py "$WORK/pong" --out "$WORK/pong"

if (( ! DRY )); then
  [[ -f "$WORK/pong/learning_curves.png" ]] && cp "$WORK/pong/learning_curves.png" \
    "$OUT/pong_return.png"
  {
    echo "# device check $(date -Is)"
    echo
    echo "backend: $BACKEND; repo at $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo '?'); PYTHONPATH=$PYTHONPATH"
    echo
    echo '```'
    cat "$OUT/steps.tsv"
    echo '```'
    for f in "$WORK"/throughput/results.md "$WORK"/transfer/results.md; do
      [[ -f "$f" ]] && { echo; sed 's/^#/##/' "$f" | grep -v '^!\['; }
    done
    echo
    echo "## Pong training (pong_impala, --layout=auto, --max_wall_s=$TRAIN_S)"
    echo
    "$PY" - "$WORK/pong" <<'PYEOF'
import json, sys
from pathlib import Path

run = Path(sys.argv[1])
try:
  s = json.loads((run / "summary.json").read_text())
except (OSError, ValueError) as e:
  sys.exit(f"no summary.json: {e}")
t = s.get("timings") or {}
start = t.get("train_start_wall_s") or 0.0
rows = {k: s.get(k) for k in ("stop_reason", "env_steps", "wall_s", "final_return_mean",
                               "version", "max_policy_lag_seen", "dropped_stale",
                               "idle_env_steps")}
rows["sps (env steps / s since training started)"] = (
    s["env_steps"] / (s["wall_s"] - start) if s.get("env_steps") and s["wall_s"] > start else None)
rows["timings.first_update_wall_s"] = t.get("first_update_wall_s")
rows["timings.compile_update_s"] = t.get("compile_update_s")
layout = s.get("layout") or {}
rows["layout"] = json.dumps({"values": layout.get("values"), "host": layout.get("host")})
rows["layout.why"] = " / ".join(layout.get("why") or [])
print("| field | value |\n|---|---|")
for k, v in rows.items():
  print(f"| {k} | {v:.4g} |" if isinstance(v, float) else f"| {k} | {v} |")
PYEOF
  } >"$OUT/summary.md" 2>&1
  tar -czf "$OUT/device_check.tar.gz" -C "$WORK" --exclude='*/cache' . 2>/dev/null
  echo "device_check: done in $(( $(date +%s) - T0 ))s; see $OUT/summary.md (everything: $OUT/device_check.tar.gz, from $WORK)"
fi
exit 0
