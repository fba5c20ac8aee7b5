"""Throughput: env steps per second of each part alone, and of the whole pipeline, at the
host's layout.

For one config per task (CartPole IMPALA MLP, Breakout and Pong IMPALA with the Nature CNN,
HalfCheetah PPO MLP), sized for the host the suite runs on (`jaxrl_async/layout.py`, as
`--layout=auto` sizes a training run: on a small CPU the presets' sizes, on an accelerator host
a few actors x 64 envs in async EnvPool mode), in one process, each for a warm-up and a measured
window:
- `env_only`: the actors' EnvPools alone, at the pipeline's own num_actors x (num_envs,
  env_batch_size, env_threads), one thread per pool, async recv/send with random actions (when
  the batch is all the envs, each recv returns them all): the environment-side limit;
- `actors_only`: the actor threads (EnvPool + jitted policy + rollout placement on the learner
  devices), with a drain thread that frees each rollout at once (no learner);
- `learner_only`: the compiled update on a synthetic batch already on the learner devices;
- `pipeline_async`: the Trainer with the task's lag cap K;
- `pipeline_sync`: the same with K = 0, and with sync EnvPool (env_batch_size = 0: every recv
  is all num_envs envs), which K = 0 has needed; the row's `note` says so.
The headline is `vs_limit` = pipeline_async / env_only ("pipeline / limit"): how much of what
the environments alone can make the whole system turns into learning data. Pipeline rows also
carry the actors' per-step split over their window, as fractions of actor-thread wall time (env
recv, host -> device, inference, device -> host, env send, buffer writes, blocked on the rate
controller or the queue), plus dropped_stale and idle_env_steps, where the run's metrics
records have those counters (`.get`: older records lack some). results.json holds each task's
layout (`config.layouts`) and the headline (`config.headline`).
$JAXRL_BENCH_TASKS (comma-separated) picks tasks; $JAXRL_BENCH_BUDGET_S bounds the suite's
time: each task gets its share, modes run headline first (env_only, learner_only,
pipeline_async, actors_only, pipeline_sync) and a mode that would start past its task's share is
a row marked `skipped`. Each finished task rewrites results.json, so a killed run keeps them.
`python -m tools.suites.throughput --worker MODE ...` measures one mode of a given flat config
in a process of its own (the scaling suite uses it with forced CPU devices; no layout applied).
The measurements are in throughput_measure.py; the ratios, headline, plot and tables in
throughput_report.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tools.bench_common import Progress, SuiteResult, write_results

# The measurements and the report are modules of their own. The names tests and other suites
# take from here stay importable from here (`x as x`: re-exported, not unused).
from tools.suites.throughput_measure import (
  MODES,
  Parts,
  Window,
  measure_actors_only,
  measure_env_only,
  measure_learner_only,
  measure_pipeline,
  sizes,
)
from tools.suites.throughput_measure import SIZES as SIZES
from tools.suites.throughput_measure import window_profile as window_profile
from tools.suites.throughput_report import add_ratios, headline, plot, tables

# The order the modes run in: the headline's (env_only, pipeline_async) early, learner_only
# before the pipelines (its update time sizes their window), so a time budget cuts the rest.
RUN_ORDER = ("env_only", "learner_only", "pipeline_async", "actors_only", "pipeline_sync")
TASKS = ("cartpole", "breakout", "pong", "halfcheetah")
SYNC_NOTE = ("K=0 with sync EnvPool (env_batch_size=0: each recv is all num_envs envs), which "
             "K=0 has needed; other sizes as the layout's")
_RESULT_PREFIX = "RESULT "

# Overrides that turn a training config into a benchmark config: no target, no end, no
# checkpoints (their writes would sit in the window), frequent records (the window is short).
BENCH_OVERRIDES = dict(stop_at_return=float("nan"), total_env_steps=10**10,
                       checkpoint_at_end=False, checkpoint_every_s=0.0, log_every_s=0.5)

WINDOWS = {"tiny": Window(0.5, 1.5), "quick": Window(2.0, 6.0), "full": Window(5.0, 30.0)}


def selected(names: Any) -> list[str]:
  """`names` kept by $JAXRL_BENCH_TASKS (comma-separated; unset or empty: all)."""
  keep = [t for t in os.environ.get("JAXRL_BENCH_TASKS", "").split(",") if t]
  return [n for n in names if n in keep] if keep else list(names)


def task_configs(tiny: bool = False) -> dict[str, dict[str, Any]]:
  """task -> flat config, before any layout. A preset of that name is used where one exists
  (presets change). $JAXRL_BENCH_TASKS keeps only the tasks it names; with `tiny` (test sizes)
  only CartPole unless it names others."""
  out = _all_task_configs(tiny)
  if tiny and not os.environ.get("JAXRL_BENCH_TASKS"):
    return {"cartpole": out["cartpole"]}
  return {t: out[t] for t in selected(out)}


def _all_task_configs(tiny: bool) -> dict[str, dict[str, Any]]:
  from experiments.presets import PRESETS

  if tiny:
    small = dict(algo="impala", num_actors=1, num_envs=4, rollout_len=8, max_policy_lag=1,
                 num_epochs=1, num_minibatches=1)
    atari = dict(small, network="nature_cnn", frame_stack=4, reward_clip=True)
    return {"cartpole": dict(small, env_id="CartPole-v1", hidden_sizes="16,16"),
            "breakout": dict(atari, env_id="Breakout-v5", episodic_life=True),
            "pong": dict(atari, env_id="Pong-v5", episodic_life=False),
            "halfcheetah": dict(algo="ppo", env_id="HalfCheetah-v4", num_actors=1, num_envs=4,
                                rollout_len=8, max_policy_lag=0, num_epochs=1,
                                num_minibatches=1, hidden_sizes="16,16")}
  # The presets users train with, where they exist; the fallbacks keep the suite running if
  # one is renamed. Breakout and Pong are measured with the Nature CNN whatever their presets'
  # torso (the IMPALA ResNet's update is too slow for a CPU window).
  atari = dict(algo="impala", network="nature_cnn", frame_stack=4, reward_clip=True,
               num_envs=16, rollout_len=32, max_policy_lag=1, num_epochs=1, num_minibatches=1)
  fallback = {
      "cartpole": dict(algo="impala", env_id="CartPole-v1", num_envs=16, rollout_len=16,
                       max_policy_lag=1, num_epochs=4, num_minibatches=2),
      "breakout": dict(atari, env_id="Breakout-v5", episodic_life=True),
      "pong": dict(atari, env_id="Pong-v5", episodic_life=False),
      "halfcheetah": dict(algo="ppo", env_id="HalfCheetah-v4", num_actors=1, num_envs=32,
                          rollout_len=64, max_policy_lag=0, num_epochs=10, num_minibatches=32,
                          normalize_obs=True),
  }
  presets = {"cartpole": "cartpole_impala", "breakout": "breakout_impala", "pong": "pong_impala",
             "halfcheetah": "halfcheetah_ppo"}
  out = {task: dict(PRESETS.get(presets[task], flat)) for task, flat in fallback.items()}
  out["breakout"]["network"] = out["pong"]["network"] = "nature_cnn"
  return out


def laid_out(tasks: dict[str, dict[str, Any]], host: Any = None
             ) -> dict[str, tuple[dict[str, Any], Any]]:
  """task -> (flat config with the host's layout, the Layout), as `--layout=auto` with no size
  flags sizes a training run on `host` (default: this process's)."""
  from jaxrl_async import layout

  host = host or layout.detect_host()
  return {task: layout.choose("auto", flat, set(), host) for task, flat in tasks.items()}


def pipeline_overrides(mode: str, flat: dict[str, Any]) -> dict[str, Any]:
  """Sync is K = 0 with sync EnvPool (env_batch_size = 0; SYNC_NOTE); async is the config's
  own K, or K = 1 where the config is synchronous (an on-policy preset), so the two always
  differ. Every other mode keeps the config's sizes, so env_only steps the pipeline's pools."""
  if mode == "pipeline_sync":
    return {"max_policy_lag": 0, "env_batch_size": 0, "free_running": False}
  if mode == "pipeline_async" and not flat.get("free_running") and not flat.get(
      "max_policy_lag", 1):
    return {"max_policy_lag": 1}
  return {}


def mode_config(mode: str, flat: dict[str, Any]) -> Any:
  """The TrainConfig `mode` measures for the task config `flat`."""
  return bench_config(flat, **pipeline_overrides(mode, flat))


def bench_config(flat: dict[str, Any], **overrides: Any) -> Any:
  from jaxrl_async.config import TrainConfig

  return TrainConfig.from_flat({**flat, **BENCH_OVERRIDES, **overrides})


# -- one mode, in this process ------------------------------------------------------------------


def measure(mode: str, flat: dict[str, Any], window: Window, run_dir: Path,
            parts: Parts | None = None) -> dict[str, Any]:
  """One mode of one config, in this process; returns at least {"sps": ...}."""
  from jaxrl_async.runtime.trainer import validate

  config = mode_config(mode, flat)
  spec = validate(config)
  # The host's load when the window starts: this machine is shared, and a busy neighbour is
  # the first suspect for an odd number. The sizes say what ran (env_only: the pipeline's).
  load = {"loadavg_1m": os.getloadavg()[0], **sizes(config)}
  if mode == "pipeline_sync":
    load["note"] = SYNC_NOTE
  if mode == "env_only":
    return measure_env_only(config, spec, window) | load
  if mode == "actors_only":
    return measure_actors_only(config, spec, window, parts) | load
  if mode == "learner_only":
    return measure_learner_only(config, spec, window, parts) | load
  return measure_pipeline(config, spec, window, run_dir) | load


def configure(flat: dict[str, Any]) -> None:
  """Process-wide JAX settings (PRNG, compilation cache), as the launcher applies them."""
  from jaxrl_async.runtime import jax_config

  jax_config.configure_jax(bench_config(flat))


# -- a mode in a process of its own -------------------------------------------------------------


def run_worker(mode: str, flat: dict[str, Any], window: Window, run_dir: Path,
               env: dict[str, str] | None = None, timeout_s: float = 600.0) -> dict[str, Any]:
  """`measure` in a fresh Python (e.g. with XLA_FLAGS forcing CPU devices); errors are rows."""
  cmd = [sys.executable, "-m", "tools.suites.throughput", "--worker", mode,
         "--flat", json.dumps(flat), "--warmup_s", str(window.warmup_s),
         "--measure_s", str(window.measure_s), "--run_dir", str(run_dir)]
  try:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env,
                          cwd=Path(__file__).resolve().parents[2])
  except subprocess.TimeoutExpired:
    return {"sps": None, "error": f"timed out after {timeout_s:.0f}s"}
  for line in reversed(done.stdout.splitlines()):
    if line.startswith(_RESULT_PREFIX):
      return json.loads(line[len(_RESULT_PREFIX):])
  tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
  return {"sps": None, "error": f"exit {done.returncode}: {' | '.join(tail)}"}


def _worker_main(argv: list[str]) -> int:
  p = argparse.ArgumentParser(prog="throughput-worker")
  p.add_argument("--worker", choices=MODES, required=True)
  p.add_argument("--flat", required=True, help="The flat config, as JSON.")
  p.add_argument("--warmup_s", type=float, required=True)
  p.add_argument("--measure_s", type=float, required=True)
  p.add_argument("--run_dir", type=Path, required=True)
  args = p.parse_args(argv)
  flat = json.loads(args.flat)
  configure(flat)
  try:
    out = measure(args.worker, flat, Window(args.warmup_s, args.measure_s), args.run_dir)
  except Exception as e:  # noqa: BLE001 - the parent records it as the row's error
    out = {"sps": None, "error": f"{type(e).__name__}: {e}"}
  print(_RESULT_PREFIX + json.dumps(out, default=str), flush=True)
  return 0


# -- the suite ----------------------------------------------------------------------------------


def run(out_dir: Path, quick: bool, tiny: bool = False, host: Any = None) -> SuiteResult:
  window = WINDOWS["tiny" if tiny else "quick" if quick else "full"]
  raw = task_configs(tiny)
  if not raw:
    raise SystemExit(f"throughput: JAXRL_BENCH_TASKS={os.environ.get('JAXRL_BENCH_TASKS')!r} "
                     f"names none of the tasks {', '.join(TASKS)}")
  configure(next(iter(raw.values())))
  tasks = laid_out(raw, host)
  budget_s = float(os.environ.get("JAXRL_BENCH_BUDGET_S") or 0) or None
  out_dir.mkdir(parents=True, exist_ok=True)
  progress = Progress(len(tasks) * len(MODES), "throughput")
  rows: list[dict[str, Any]] = []
  t0 = time.time()
  for i, (task, (flat, _)) in enumerate(tasks.items()):
    deadline = t0 + budget_s * (i + 1) / len(tasks) if budget_s else math.inf
    parts, task_window, done = None, window, {}
    for mode in RUN_ORDER:
      row: dict[str, Any] = {"task": task, "mode": mode}
      if time.time() >= deadline:
        row.update(sps=None, skipped=True, note=f"skipped: the task's share of "
                   f"JAXRL_BENCH_BUDGET_S={budget_s:g} was spent")
      else:
        try:
          if mode in ("actors_only", "learner_only"):
            parts = parts or Parts(mode_config(mode, flat), _spec(flat))
          row.update(measure(mode, flat, task_window, out_dir / "runs" / f"{task}-{mode}",
                             parts))
          if mode == "learner_only":
            task_window = pipeline_window(window, row["update_ms"] / 1000)
        except Exception as e:  # noqa: BLE001 - one failed mode must not lose the others
          row.update(sps=None, error=f"{type(e).__name__}: {e}")
      done[mode] = row
      sps = row.get("sps")
      progress.step(f"{task} {mode}: " + (f"{sps:,.0f} sps" if sps else
                                           row.get("error") or row.get("note", "")))
    rows += [done[m] for m in MODES]
    result = _result(rows, tasks, window, budget_s, out_dir)
    if i + 1 < len(tasks):  # so a run killed later keeps the tasks done
      write_results(out_dir, "throughput", result, f"(partial: {i + 1} of {len(tasks)} tasks)")
  return result


def _result(rows: list[dict[str, Any]], tasks: dict[str, tuple[dict[str, Any], Any]],
            window: Window, budget_s: float | None, out_dir: Path) -> SuiteResult:
  add_ratios(rows)
  plots = [plot(rows, out_dir / "throughput.png").name]
  layouts = {task: lay.to_json() for task, (_, lay) in tasks.items()}
  return SuiteResult(rows, tables(rows, layouts),
                     {"tasks": {task: flat for task, (flat, _) in tasks.items()},
                      "layouts": layouts, "headline": headline(rows),
                      "window": dataclasses.asdict(window), "budget_s": budget_s,
                      "overrides": BENCH_OVERRIDES}, plots)


def pipeline_window(window: Window, update_s: float) -> Window:
  """At least 2 updates of warm-up and 10 measured: a slow learner (a CNN on a CPU) needs a
  longer window than the suite's default for a stable rate."""
  return Window(max(window.warmup_s, 2 * update_s), max(window.measure_s, 10 * update_s))


def _spec(flat: dict[str, Any]) -> Any:
  from jaxrl_async.runtime.trainer import validate

  return validate(bench_config(flat))


if __name__ == "__main__":
  sys.exit(_worker_main(sys.argv[1:]))
