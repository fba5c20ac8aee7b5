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
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from jaxrl_async.metrics import STEP_SPLIT
from tools.bench_common import Progress, SuiteResult, md_table, write_results

MODES = ("env_only", "actors_only", "learner_only", "pipeline_async", "pipeline_sync")
# The order the modes run in: the headline's (env_only, pipeline_async) early, learner_only
# before the pipelines (its update time sizes their window), so a time budget cuts the rest.
RUN_ORDER = ("env_only", "learner_only", "pipeline_async", "actors_only", "pipeline_sync")
TASKS = ("cartpole", "breakout", "pong", "halfcheetah")
# The sizes a layout chooses, recorded on every row (what env_only shares with the pipeline).
SIZES = ("num_actors", "num_envs", "env_batch_size", "env_threads", "rollouts_per_update")
SYNC_NOTE = ("K=0 with sync EnvPool (env_batch_size=0: each recv is all num_envs envs), which "
             "K=0 has needed; other sizes as the layout's")
# How long the pipeline may take to compile and make its first update before it is failed.
_FIRST_UPDATE_TIMEOUT_S = 240.0
_RESULT_PREFIX = "RESULT "

# Overrides that turn a training config into a benchmark config: no target, no end, no
# checkpoints (their writes would sit in the window), frequent records (the window is short).
BENCH_OVERRIDES = dict(stop_at_return=float("nan"), total_env_steps=10**10,
                       checkpoint_at_end=False, checkpoint_every_s=0.0, log_every_s=0.5)


@dataclasses.dataclass(frozen=True)
class Window:
  warmup_s: float
  measure_s: float


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


def sizes(config: Any) -> dict[str, int]:
  """The layout's sizes as `config` runs them."""
  return {"num_actors": config.actor.num_actors, "num_envs": config.env.num_envs,
          "env_batch_size": config.env.batch_size, "env_threads": config.env.env_threads,
          "rollouts_per_update": config.rate.rollouts_per_update}


def bench_config(flat: dict[str, Any], **overrides: Any) -> Any:
  from jaxrl_async.config import TrainConfig

  return TrainConfig.from_flat({**flat, **BENCH_OVERRIDES, **overrides})


# -- the parts --------------------------------------------------------------------------------


class _Parts:
  """What the actor and learner measurements use: the run's parts as the trainer gets them
  (runtime/build.py), and an initial state on the learner mesh."""

  def __init__(self, config: Any, spec: Any):
    import jax

    from jaxrl_async.runtime.build import build
    from jaxrl_async.runtime.sharding import replicate

    built = build(config, spec)
    self.config, self.spec, self.algo = config, spec, built.algo
    self.device, self.mesh = built.actor_device, built.mesh
    self.state = replicate(jax.jit(self.algo.init)(jax.random.key(config.run.seed)), self.mesh)

  def policy_step(self) -> Any:
    """The actors' policy step, compiled ahead of time as the trainer does, so no compilation
    falls into a measured window."""
    from jaxrl_async.runtime.pipeline.policy_step import compile_policy_step

    return compile_policy_step(self.algo.make_policy(0), self.algo.actor_params(self.state),
                               self.spec, self.config.env.batch_size, self.device)


def _sample_window(count: Any, window: Window, snapshot: Any = lambda: None
                   ) -> tuple[float, float, Any, Any]:
  """(count per second over the measured window, its length, `snapshot()` at its start and
  end)."""
  time.sleep(window.warmup_s)
  s0, c0, t0 = snapshot(), count(), time.perf_counter()
  time.sleep(window.measure_s)
  s1, c1, t1 = snapshot(), count(), time.perf_counter()
  return (c1 - c0) / (t1 - t0), t1 - t0, s0, s1


def measure_env_only(config: Any, spec: Any, window: Window) -> dict[str, Any]:
  """num_actors EnvPools of the config's (num_envs, batch, threads), one thread each, stepped
  with random actions through EnvPool's async API: recv a batch, send its actions, so with a
  batch < num_envs the pool steps the other envs meanwhile, as in the actor."""
  import numpy as np

  from jaxrl_async import envs

  A, b = config.actor.num_actors, config.env.batch_size
  rng = np.random.default_rng(0)
  if spec.discrete:
    actions = rng.integers(0, spec.num_actions, (64, b)).astype(np.int32)
  else:
    actions = rng.uniform(spec.action_low, spec.action_high,
                          (64, b, spec.num_actions)).astype(np.float32)
  pools = [envs.make_pool(config.env, seed=1000 * i) for i in range(A)]
  counts, stop = [0] * A, threading.Event()
  errors: list[BaseException] = []

  def loop(i: int) -> None:
    pool = pools[i]
    try:
      pool.async_reset()
      k = 0
      while not stop.is_set():
        *_, info = pool.recv()
        ids = info["env_id"]
        pool.send(actions[k % 64][:len(ids)], ids)
        counts[i] += len(ids)
        k += 1
    except BaseException as e:  # noqa: BLE001 - reported by the measuring thread
      errors.append(e)

  threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(A)]
  for t in threads:
    t.start()
  try:
    sps, secs, _, _ = _sample_window(lambda: sum(counts), window)
  finally:
    stop.set()
    for t in threads:
      t.join(10.0)
    for p in pools:
      p.close()
  if errors:
    raise RuntimeError(f"env_only pool failed: {errors[0]!r}") from errors[0]
  return {"sps": sps, "window_s": secs, "async_envpool": config.env.is_async}


def measure_actors_only(config: Any, spec: Any, window: Window,
                        parts: _Parts | None = None) -> dict[str, Any]:
  """The Actor threads as in training, never throttled; a drain thread waits for each rollout's
  transfer to finish (part of the actors' work) and gives its permit back."""
  import jax

  from jaxrl_async.config import RateConfig
  from jaxrl_async.metrics import EpisodeStats
  from jaxrl_async.runtime.pipeline.actor import Actor
  from jaxrl_async.runtime.pipeline.params import ParamStore
  from jaxrl_async.runtime.pipeline.queue import QueueClosed, RolloutQueue
  from jaxrl_async.runtime.pipeline.rate import RateController
  from jaxrl_async.runtime.supervision import Supervised, join_all

  parts = parts or _Parts(config, spec)
  A = config.actor.num_actors
  store = ParamStore()
  store.publish(parts.algo.actor_params(parts.state), 0)
  rate = RateConfig(free_running=True, queue_capacity=4 * A)
  controller, queue = RateController(rate), RolloutQueue(rate.resolved_queue_capacity)
  stats = EpisodeStats(config.run.return_window, float("nan"), lambda: 0)
  stop = threading.Event()
  policy_step = parts.policy_step()
  actors = [Actor(i, config, spec, parts.algo, policy_step, parts.device, parts.mesh, queue,
                  store, controller, stats, stop) for i in range(A)]

  def drain() -> None:
    while not stop.is_set():
      try:
        item = queue.get(0.1)
      except QueueClosed:
        return
      if item is not None:
        batch, info = item
        jax.block_until_ready(batch)
        controller.release(info.ticket)

  threads = [Supervised(f"actor-{i}", a.run, stop) for i, a in enumerate(actors)]
  threads.append(Supervised("drain", drain, stop))
  for t in threads:
    t.start()
  timers = lambda: [dataclasses.asdict(a.timers) for a in actors]
  try:
    sps, secs, before, after = _sample_window(lambda: sum(a.timers.env_steps for a in actors),
                                              window, timers)
  finally:
    stop.set()
    queue.close()
    controller.close()
    alive = join_all(threads)
  errors = [t.error for t in threads if t.error]
  if errors or alive:
    raise RuntimeError(errors[0] if errors else f"threads left running: {alive}")
  return {"sps": sps, "window_s": secs, **timer_fractions(before, after, secs, A)}


def timer_fractions(before: list[dict[str, Any]], after: list[dict[str, Any]], secs: float,
                    num_actors: int) -> dict[str, float | None]:
  """Each actor timer's share of actor-thread wall time between two snapshots (one dict per
  actor); None for a timer these actors lack (the split is newer than some actors)."""

  def frac(k: str) -> float | None:
    if not all(k in a for a in after):
      return None
    return sum(a[k] - b.get(k, 0.0) for a, b in zip(after, before, strict=True)) / secs / max(
        num_actors, 1)

  out = {k.removesuffix("_s") + "_frac": frac(k) for k in (*STEP_SPLIT, "put_s", "permit_s")}
  steps = [out[k.removesuffix("_s") + "_frac"] for k in STEP_SPLIT]
  out["untimed_frac"] = 1.0 - sum(steps) if None not in steps else None
  return out


def synthetic_batch(parts: _Parts, seed: int = 0) -> tuple[Any, ...]:
  """U rollouts of plausible random data, placed on the learner devices like an actor's."""
  import numpy as np

  from jaxrl_async.algos.base import Rollout
  from jaxrl_async.runtime.learners.on_policy import batch_shapes
  from jaxrl_async.runtime.sharding import put_batch

  rng, spec = np.random.default_rng(seed), parts.spec
  out = []
  for shape in batch_shapes(parts.config, spec, parts.algo, parts.mesh):
    T, E = shape.rewards.shape
    if np.issubdtype(spec.obs_dtype, np.integer):
      obs = rng.integers(0, 256, shape.obs.shape).astype(spec.obs_dtype)
    else:
      obs = rng.standard_normal(shape.obs.shape).astype(spec.obs_dtype)
    if spec.discrete:
      actions = rng.integers(0, spec.num_actions, shape.actions.shape).astype(np.int32)
    else:
      actions = rng.uniform(-1, 1, shape.actions.shape).astype(np.float32)
    extras = {k: np.zeros(s.shape, s.dtype) for k, s in shape.extras.items()}
    if "logp" in extras and spec.discrete:
      extras["logp"][:] = -math.log(spec.num_actions)  # a uniform behaviour policy
    rollout = Rollout(obs, actions, rng.standard_normal((T, E)).astype(np.float32),
                      rng.random((T, E)) < 0.01, np.zeros((T, E), bool), np.ones((T, E), bool),
                      extras, behaviour_version=np.zeros((1, E), np.int32))
    out.append(put_batch(rollout, parts.mesh))
  return tuple(out)


def measure_learner_only(config: Any, spec: Any, window: Window,
                         parts: _Parts | None = None) -> dict[str, Any]:
  """The compiled update, back to back on one synthetic device batch; env steps per second are
  the batch's (reuse by epochs not counted), so they compare with the actors'."""
  import jax

  from jaxrl_async.runtime.learners.on_policy import compile_update

  parts = parts or _Parts(config, spec)
  t0 = time.perf_counter()
  step = compile_update(config, spec, parts.algo, parts.mesh, parts.state)
  compile_s = time.perf_counter() - t0
  batch = synthetic_batch(parts)
  state = parts.state

  def run_for(seconds: float) -> tuple[int, float]:
    nonlocal state
    n, t0 = 0, time.perf_counter()
    while True:
      # NOTE: dispatched 4 at a time, then waited on: back-to-back like the real learner, but
      # the clock only stops on finished work.
      for _ in range(4):
        state, metrics = step(state, batch)
      jax.block_until_ready(metrics)
      n += 4
      if time.perf_counter() - t0 >= seconds:
        return n, time.perf_counter() - t0

  run_for(window.warmup_s)
  n, secs = run_for(window.measure_s)
  return {"sps": n * config.env_steps_per_update / secs, "window_s": secs,
          "update_ms": 1000 * secs / n, "compile_s": compile_s}


def _read_records(path: Path) -> list[dict[str, Any]]:
  out = []
  if path.exists():
    for line in path.read_text().splitlines():
      try:
        out.append(json.loads(line))
      except json.JSONDecodeError:
        continue
  return out


def window_profile(records: list[dict[str, Any]], num_actors: int) -> dict[str, Any]:
  """SPS and where the time went, between the first and last of `records` (a window).

  The actors' split (`STEP_SPLIT`, then the permit wait, the rollouts' placement and queueing,
  param fetches) is each cumulative counter's growth over the window as a fraction of
  actor-thread wall time (num_actors x window); `blocked_frac` is the permit wait (a queue put
  never waits); `untimed_frac` is what all of them leave (Python between the timed calls): the
  actor's `write_s` excludes the other three. A counter the records lack is None.
  """
  if len(records) < 2:
    return {"sps": None}
  a, b = records[0], records[-1]
  dt = max(b["wall_s"] - a["wall_s"], 1e-9)

  def delta(k: str) -> float | None:
    return b[k] - a.get(k, 0) if b.get(k) is not None else None

  def per_actor(k: str) -> float | None:
    d = delta(k)
    return None if d is None else d / dt / max(num_actors, 1)

  mean = lambda k: statistics.fmean(r.get(k) or 0.0 for r in records[1:])
  split = {k.removesuffix("_s") + "_frac": per_actor(k)
           for k in (*STEP_SPLIT, "permit_s", "queue_put_s", "param_fetch_s")}
  steps = [split[k.removesuffix("_s") + "_frac"] for k in STEP_SPLIT]
  steps += [split["permit_frac"], split["queue_put_frac"], split["param_fetch_frac"]]
  queue_get = delta("queue_get_s")
  return {
      "sps": (b["env_steps"] - a["env_steps"]) / dt,
      "window_s": dt,
      "updates_per_s": (b["version"] - a["version"]) / dt,
      **split,
      "blocked_frac": split["permit_frac"],
      "untimed_frac": 1.0 - sum(steps) if None not in steps else None,
      "actor_blocked_frac": mean("actor_blocked_frac"),
      "learner_idle_frac": mean("learner_idle_frac"),
      "queue_get_frac": None if queue_get is None else queue_get / dt,
      "policy_lag_mean": mean("policy_lag_mean"),
      "dropped_stale": delta("dropped_stale"),
      "idle_env_steps": delta("idle_env_steps"),
  }


def measure_pipeline(config: Any, spec: Any, window: Window, run_dir: Path) -> dict[str, Any]:
  """The Trainer in a thread; the window starts `warmup_s` after the first update (compiling
  is the startup suite's business) and the run is stopped when it ends."""
  from jaxrl_async.metrics import wall_s
  from jaxrl_async.runtime.trainer import Trainer

  trainer = Trainer.from_config(config, spec, run_dir, quiet=True)
  box: dict[str, Any] = {}

  def target() -> None:
    try:
      box["result"] = trainer.run()
    except BaseException as e:  # noqa: BLE001 - reported by the measuring thread
      box["error"] = e

  thread = threading.Thread(target=target, name="pipeline", daemon=True)
  thread.start()
  metrics_path = run_dir / "metrics.jsonl"
  first_update, deadline = None, time.time() + _FIRST_UPDATE_TIMEOUT_S
  while first_update is None and thread.is_alive() and time.time() < deadline:
    time.sleep(0.1)
    first_update = next((r["wall_s"] for r in _read_records(metrics_path)
                         if r.get("version", 0) >= 1), None)
  if first_update is not None:
    end = first_update + window.warmup_s + window.measure_s
    while thread.is_alive() and wall_s() < end:
      time.sleep(0.05)
  stop_at = wall_s()
  trainer.request_stop("benchmark window done")
  thread.join(60.0)
  if "error" in box:
    raise RuntimeError(f"pipeline failed: {box['error']}") from box["error"]
  if first_update is None:
    raise RuntimeError(f"no update within {_FIRST_UPDATE_TIMEOUT_S:.0f}s")
  start = first_update + window.warmup_s
  records = [r for r in _read_records(metrics_path) if start - 0.5 <= r["wall_s"] <= stop_at]
  out = window_profile(records, config.actor.num_actors)
  out["first_update_wall_s"] = first_update
  return out


def measure(mode: str, flat: dict[str, Any], window: Window, run_dir: Path,
            parts: _Parts | None = None) -> dict[str, Any]:
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


def _ratio(a: float | None, b: float | None) -> float | None:
  return a / b if a and b else None


def add_ratios(rows: list[dict[str, Any]]) -> None:
  """On each task's pipeline rows: SPS / env_only (`vs_limit`, the headline on pipeline_async:
  the environments alone at the same sizes are the limit), SPS / min(actors alone, learner
  alone), and async / sync.

  Also SPS against the *serial* bound 1 / (1/actors + 1/learner): what the pipeline would do
  if actors and learner took turns on one resource. Above 1 means they overlap; at 1 they
  merely share (on a small CPU the GIL and the cores are that one resource).
  """
  by = {(r["task"], r["mode"]): r.get("sps") for r in rows}
  for r in rows:
    if r["mode"].startswith("pipeline"):
      r["vs_limit"] = _ratio(r.get("sps"), by.get((r["task"], "env_only")))
      parts = [by.get((r["task"], m)) for m in ("actors_only", "learner_only")]
      bound = min(parts) if all(parts) else None
      r["vs_bottleneck"] = _ratio(r.get("sps"), bound)
      r["vs_learner"] = _ratio(r.get("sps"), parts[1])
      r["vs_actors"] = _ratio(r.get("sps"), parts[0])
      serial = 1 / (1 / parts[0] + 1 / parts[1]) if all(parts) else None
      r["vs_serial"] = _ratio(r.get("sps"), serial)
    if r["mode"] == "pipeline_async":
      r["async_vs_sync"] = _ratio(r.get("sps"), by.get((r["task"], "pipeline_sync")))


def headline(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
  """task -> pipeline / limit: pipeline_async's SPS over env_only's at the same sizes."""
  by = {(r["task"], r["mode"]): r for r in rows}
  out = {}
  for task in dict.fromkeys(r["task"] for r in rows):
    pipe, env = by.get((task, "pipeline_async"), {}), by.get((task, "env_only"), {})
    out[task] = {"pipeline_sps": pipe.get("sps"), "limit_sps": env.get("sps"),
                 "pipeline_vs_limit": _ratio(pipe.get("sps"), env.get("sps")),
                 **{k: env.get(k, pipe.get(k)) for k in SIZES}}
  return out


def plot(rows: list[dict[str, Any]], path: Path) -> Path:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  tasks = list(dict.fromkeys(r["task"] for r in rows))
  fig, ax = plt.subplots(figsize=(2 + 2.5 * len(tasks), 4))
  width = 0.8 / len(MODES)
  for i, mode in enumerate(MODES):
    sps = [next((r.get("sps") or 0.0 for r in rows if r["task"] == t and r["mode"] == mode), 0.0)
           for t in tasks]
    ax.bar([k - 0.4 + width * (i + 0.5) for k in range(len(tasks))], sps, width, label=mode)
  ax.set_xticks(range(len(tasks)), tasks)
  ax.set(ylabel="env steps / s", title="throughput by mode")
  if any(r.get("sps") for r in rows):
    ax.set_yscale("log")
  ax.legend(fontsize="small")
  ax.grid(alpha=0.3, axis="y")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path


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
            parts = parts or _Parts(mode_config(mode, flat), _spec(flat))
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


def tables(rows: list[dict[str, Any]], layouts: dict[str, dict[str, Any]] | None = None) -> str:
  pipelines = [r for r in rows if r["mode"].startswith("pipeline")]
  heads = [{"task": t, **h} for t, h in headline(rows).items()]
  lay = [{"task": t, "host": "{cores} cores, {devices} x {platform}".format(**j["host"]),
          **j["values"], "chosen": ",".join(j["chosen"]), "why": "; ".join(j["why"])}
         for t, j in (layouts or {}).items()]
  return ("## Pipeline / limit (pipeline_async over env_only at the same sizes)\n\n"
          + md_table(heads, ["task", *SIZES[:4], "limit_sps", "pipeline_sps",
                             "pipeline_vs_limit"])
          + ("\n## Layout (`--layout=auto` on this host)\n\n"
             + md_table(lay, ["task", "host", *SIZES, "chosen", "why"]) if lay else "")
          + "\n## SPS by mode\n\n"
          + md_table(rows, ["task", "mode", "sps", *SIZES[:4], "update_ms", "window_s",
                            "loadavg_1m", "note", "error"])
          + "\n## Pipeline against its parts\n\n"
          + md_table(pipelines, ["task", "mode", "sps", "vs_limit", "vs_bottleneck",
                                 "vs_actors", "vs_learner", "vs_serial", "async_vs_sync"])
          + "\n## The actors' step, split (fractions of actor-thread wall time; blocked and "
          "param fetch are timed inside write too)\n\n"
          + md_table([r for r in rows if r["mode"] in ("actors_only", "pipeline_async",
                                                       "pipeline_sync")],
                     ["task", "mode", "env_recv_frac", "h2d_frac", "inference_frac",
                      "d2h_frac", "env_send_frac", "write_frac", "blocked_frac",
                      "param_fetch_frac", "untimed_frac", "put_frac"])
          + "\n## Pipeline health over the window\n\n"
          + md_table(pipelines, ["task", "mode", "actor_blocked_frac", "learner_idle_frac",
                                 "queue_get_frac", "updates_per_s", "policy_lag_mean",
                                 "dropped_stale", "idle_env_steps"]))


if __name__ == "__main__":
  sys.exit(_worker_main(sys.argv[1:]))
