"""Throughput: env steps per second of each part alone, and of the whole pipeline.

For one config per task (CartPole IMPALA MLP, Breakout IMPALA Nature CNN, HalfCheetah PPO MLP),
in one process, each for a warm-up and a measured window:
- `env_only`: the actors' EnvPools stepped with random actions (the environment-side limit);
- `actors_only`: the actor threads (EnvPool + jitted policy + rollout placement on the learner
  devices), with a drain thread that frees each rollout at once (no learner);
- `learner_only`: the compiled update on a synthetic batch already on the learner devices;
- `pipeline_async`: the Trainer with the task's lag cap K;
- `pipeline_sync`: the same with K = 0 (actors wait for every new version).
Pipeline rows carry the profile of their window (fractions of wall time per actor thread spent
in env recv, inference, blocked on the rate controller or queue; learner idle), which says where
a shortfall comes from. `python -m tools.suites.throughput --worker MODE ...` measures one mode
in a process of its own (the scaling suite uses it with forced CPU devices).
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

from tools.bench_common import Progress, SuiteResult, md_table

MODES = ("env_only", "actors_only", "learner_only", "pipeline_async", "pipeline_sync")
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


def task_configs(tiny: bool = False) -> dict[str, dict[str, Any]]:
  """task -> flat config. A preset of that name is used where one exists (presets change).

  $JAXRL_BENCH_TASKS (comma-separated task names) keeps only those tasks.
  """
  out = _all_task_configs(tiny)
  keep = [t for t in os.environ.get("JAXRL_BENCH_TASKS", "").split(",") if t]
  return {t: c for t, c in out.items() if t in keep} if keep else out


def _all_task_configs(tiny: bool) -> dict[str, dict[str, Any]]:
  from experiments.presets import PRESETS

  if tiny:
    return {"cartpole": dict(algo="impala", env_id="CartPole-v1", num_actors=1, num_envs=4,
                             rollout_len=8, hidden_sizes="16,16", max_policy_lag=1,
                             num_epochs=1, num_minibatches=1)}
  # The presets users train with, where they exist; the fallbacks keep the suite running if
  # one is renamed. Breakout is measured with the Nature CNN whatever its preset's torso.
  fallback = {
      "cartpole": dict(algo="impala", env_id="CartPole-v1", num_actors=2, num_envs=16,
                       rollout_len=16, max_policy_lag=1, num_epochs=4, num_minibatches=2),
      "breakout": dict(algo="impala", env_id="Breakout-v5", episodic_life=True, num_actors=2,
                       num_envs=16, rollout_len=32, max_policy_lag=1, num_epochs=1,
                       num_minibatches=1),
      "halfcheetah": dict(algo="ppo", env_id="HalfCheetah-v4", num_actors=1, num_envs=32,
                          rollout_len=64, max_policy_lag=0, num_epochs=10, num_minibatches=32,
                          normalize_obs=True),
  }
  presets = {"cartpole": "cartpole_impala", "breakout": "breakout_impala",
             "halfcheetah": "halfcheetah_ppo"}
  out = {task: dict(PRESETS.get(presets[task], flat)) for task, flat in fallback.items()}
  out["breakout"]["network"] = "nature_cnn"
  return out


def pipeline_overrides(mode: str, flat: dict[str, Any]) -> dict[str, Any]:
  """Sync is K = 0 (with sync EnvPool, which K = 0 needs); async is the config's own K, or
  K = 1 where the config is synchronous (an on-policy preset), so the two always differ."""
  if mode == "pipeline_sync":
    return {"max_policy_lag": 0, "env_batch_size": 0, "free_running": False}
  if mode == "pipeline_async" and not flat.get("free_running") and not flat.get(
      "max_policy_lag", 1):
    return {"max_policy_lag": 1}
  return {}


def bench_config(flat: dict[str, Any], **overrides: Any) -> Any:
  from jaxrl_async.config import TrainConfig

  return TrainConfig.from_flat({**flat, **BENCH_OVERRIDES, **overrides})


# -- the parts --------------------------------------------------------------------------------


class _Parts:
  """What the actor and learner measurements build, from public pieces of the runtime only."""

  def __init__(self, config: Any, spec: Any):
    import jax

    from jaxrl_async.algos import make_algorithm
    from jaxrl_async.runtime.sharding import LEARNER_AXIS, learner_mesh, replicate
    from jaxrl_async.runtime.trainer import check_devices

    self.config, self.spec = config, spec
    devices = check_devices(config)
    self.device, self.mesh = devices[0], learner_mesh(devices)
    self.algo = make_algorithm(config, spec, LEARNER_AXIS)
    self.state = replicate(jax.jit(self.algo.init)(jax.random.key(config.run.seed)), self.mesh)

  def policy_step(self) -> Any:
    """The actors' policy step, compiled ahead of time as the trainer does, so no compilation
    falls into a measured window."""
    from jaxrl_async.runtime.actor import compile_policy_step

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
  """One thread per actor, each stepping its own EnvPool with pre-drawn random actions."""
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

  def loop(i: int) -> None:
    pool = pools[i]
    pool.async_reset()
    k = 0
    while not stop.is_set():
      *_, info = pool.recv()
      ids = info["env_id"]
      pool.send(actions[k % 64][:len(ids)], ids)
      counts[i] += len(ids)
      k += 1

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
  return {"sps": sps, "window_s": secs}


def measure_actors_only(config: Any, spec: Any, window: Window,
                        parts: _Parts | None = None) -> dict[str, Any]:
  """The Actor threads as in training, never throttled; a drain thread waits for each rollout's
  transfer to finish (part of the actors' work) and gives its permit back."""
  import jax

  from jaxrl_async.config import RateConfig
  from jaxrl_async.metrics import EpisodeStats
  from jaxrl_async.runtime.actor import Actor
  from jaxrl_async.runtime.params import ParamStore
  from jaxrl_async.runtime.queue import QueueClosed, RolloutQueue
  from jaxrl_async.runtime.rate import RateController
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
  frac = lambda k: sum(a[k] - b[k] for a, b in zip(after, before, strict=True)) / secs / A
  return {"sps": sps, "window_s": secs, "env_recv_frac": frac("env_recv_s"),
          "inference_frac": frac("inference_s"), "put_frac": frac("put_s")}


def synthetic_batch(parts: _Parts, seed: int = 0) -> tuple[Any, ...]:
  """U rollouts of plausible random data, placed on the learner devices like an actor's."""
  import numpy as np

  from jaxrl_async.algos.base import Rollout
  from jaxrl_async.runtime.learner import batch_shapes
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
                      extras, None if shape.weights is None else np.ones((1, E), np.float32))
    out.append(put_batch(rollout, parts.mesh))
  return tuple(out)


def measure_learner_only(config: Any, spec: Any, window: Window,
                         parts: _Parts | None = None) -> dict[str, Any]:
  """The compiled update, back to back on one synthetic device batch; env steps per second are
  the batch's (reuse by epochs not counted), so they compare with the actors'."""
  import jax

  from jaxrl_async.runtime.learner import compile_update

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
  """SPS and where the time went, between the first and last of `records` (a window)."""
  if len(records) < 2:
    return {"sps": None}
  a, b = records[0], records[-1]
  dt = max(b["wall_s"] - a["wall_s"], 1e-9)
  per_actor = lambda k: (b.get(k, 0.0) - a.get(k, 0.0)) / dt / max(num_actors, 1)
  mean = lambda k: statistics.fmean(r.get(k) or 0.0 for r in records[1:])
  return {
      "sps": (b["env_steps"] - a["env_steps"]) / dt,
      "window_s": dt,
      "updates_per_s": (b["version"] - a["version"]) / dt,
      "env_recv_frac": per_actor("env_recv_s"),
      "inference_frac": per_actor("inference_s"),
      "actor_blocked_frac": mean("actor_blocked_frac"),
      "learner_idle_frac": mean("learner_idle_frac"),
      "queue_get_frac": (b.get("queue_get_s", 0.0) - a.get("queue_get_s", 0.0)) / dt,
      "policy_lag_mean": mean("policy_lag_mean"),
      "dropped_stale": b.get("dropped_stale", 0) - a.get("dropped_stale", 0),
  }


def measure_pipeline(config: Any, spec: Any, window: Window, run_dir: Path) -> dict[str, Any]:
  """The Trainer in a thread; the window starts `warmup_s` after the first update (compiling
  is the startup suite's business) and the run is stopped when it ends."""
  from jaxrl_async.metrics import wall_s
  from jaxrl_async.runtime.trainer import Trainer

  trainer = Trainer(config, spec, run_dir, quiet=True)
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

  config = bench_config(flat, **pipeline_overrides(mode, flat))
  spec = validate(config)
  # The host's load when the window starts: this machine is shared, and a busy neighbour is
  # the first suspect for an odd number.
  load = {"loadavg_1m": os.getloadavg()[0]}
  if mode == "env_only":
    return measure_env_only(config, spec, window) | load
  if mode == "actors_only":
    return measure_actors_only(config, spec, window, parts) | load
  if mode == "learner_only":
    return measure_learner_only(config, spec, window, parts) | load
  return measure_pipeline(config, spec, window, run_dir) | load


def configure(flat: dict[str, Any]) -> None:
  """Process-wide JAX settings (PRNG, compilation cache), as the launcher applies them."""
  from jaxrl_async.runtime import setup

  setup.configure_jax(bench_config(flat))


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
  """On each task's pipeline rows: SPS / min(actors alone, learner alone), and async / sync.

  Also SPS against the *serial* bound 1 / (1/actors + 1/learner): what the pipeline would do
  if actors and learner took turns on one resource. Above 1 means they overlap; at 1 they
  merely share (on a small CPU the GIL and the cores are that one resource).
  """
  by = {(r["task"], r["mode"]): r.get("sps") for r in rows}
  for r in rows:
    if r["mode"].startswith("pipeline"):
      parts = [by.get((r["task"], m)) for m in ("actors_only", "learner_only")]
      bound = min(parts) if all(parts) else None
      r["vs_bottleneck"] = _ratio(r.get("sps"), bound)
      r["vs_learner"] = _ratio(r.get("sps"), parts[1])
      r["vs_actors"] = _ratio(r.get("sps"), parts[0])
      serial = 1 / (1 / parts[0] + 1 / parts[1]) if all(parts) else None
      r["vs_serial"] = _ratio(r.get("sps"), serial)
    if r["mode"] == "pipeline_async":
      r["async_vs_sync"] = _ratio(r.get("sps"), by.get((r["task"], "pipeline_sync")))


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
  ax.set(ylabel="env steps / s", yscale="log", title="throughput by mode")
  ax.legend(fontsize="small")
  ax.grid(alpha=0.3, axis="y")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path


def run(out_dir: Path, quick: bool, tiny: bool = False) -> SuiteResult:
  window = WINDOWS["tiny" if tiny else "quick" if quick else "full"]
  tasks = task_configs(tiny)
  configure(next(iter(tasks.values())))
  progress = Progress(len(tasks) * len(MODES), "throughput")
  rows = []
  for task, flat in tasks.items():
    parts, task_window = None, window
    for mode in MODES:
      row: dict[str, Any] = {"task": task, "mode": mode}
      try:
        if mode == "actors_only":
          parts = _Parts(bench_config(flat), _spec(flat))
        row.update(measure(mode, flat, task_window, out_dir / "runs" / f"{task}-{mode}", parts))
        if mode == "learner_only":
          task_window = pipeline_window(window, row["update_ms"] / 1000)
      except Exception as e:  # noqa: BLE001 - one failed mode must not lose the others
        row.update(sps=None, error=f"{type(e).__name__}: {e}")
      rows.append(row)
      sps = row.get("sps")
      progress.step(f"{task} {mode}: " + (f"{sps:,.0f} sps" if sps else row.get("error", "")))
  add_ratios(rows)
  plots = [plot(rows, out_dir / "throughput.png").name]
  return SuiteResult(rows, tables(rows), {"tasks": tasks, "window": dataclasses.asdict(window),
                                          "overrides": BENCH_OVERRIDES}, plots)


def pipeline_window(window: Window, update_s: float) -> Window:
  """At least 2 updates of warm-up and 10 measured: a slow learner (a CNN on a CPU) needs a
  longer window than the suite's default for a stable rate."""
  return Window(max(window.warmup_s, 2 * update_s), max(window.measure_s, 10 * update_s))


def _spec(flat: dict[str, Any]) -> Any:
  from jaxrl_async.runtime.trainer import validate

  return validate(bench_config(flat))


def tables(rows: list[dict[str, Any]]) -> str:
  pipelines = [r for r in rows if r["mode"].startswith("pipeline")]
  return ("## SPS by mode\n\n"
          + md_table(rows, ["task", "mode", "sps", "update_ms", "window_s", "loadavg_1m",
                            "error"])
          + "\n## Pipeline against its parts\n\n"
          + md_table(pipelines, ["task", "mode", "sps", "vs_bottleneck", "vs_actors",
                                 "vs_learner", "vs_serial", "async_vs_sync"])
          + "\n## Where the time goes (fractions of the window; per actor thread for env "
          "recv, inference and blocked)\n\n"
          + md_table([r for r in rows if r["mode"] != "learner_only"],
                     ["task", "mode", "env_recv_frac", "inference_frac", "put_frac",
                      "actor_blocked_frac", "learner_idle_frac", "queue_get_frac",
                      "updates_per_s", "policy_lag_mean", "dropped_stale"]))


if __name__ == "__main__":
  sys.exit(_worker_main(sys.argv[1:]))
