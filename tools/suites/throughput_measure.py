"""The throughput suite's measurements (tools/suites/throughput.py): each part alone (env_only,
actors_only, learner_only) and the whole pipeline over a window, in this process. A row is a
dict with at least "sps"; the suite adds the sizes, the load and the ratios.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from jaxrl_async.metrics import STEP_SPLIT

MODES = ("env_only", "actors_only", "learner_only", "pipeline_async", "pipeline_sync")
# The sizes a layout chooses, recorded on every row (what env_only shares with the pipeline).
SIZES = ("num_actors", "num_envs", "env_batch_size", "env_threads", "rollouts_per_update")
# How long the pipeline may take to compile and make its first update before it is failed.
_FIRST_UPDATE_TIMEOUT_S = 240.0


@dataclasses.dataclass(frozen=True)
class Window:
  warmup_s: float
  measure_s: float


def sizes(config: Any) -> dict[str, int]:
  """The layout's sizes as `config` runs them."""
  return {"num_actors": config.actor.num_actors, "num_envs": config.env.num_envs,
          "env_batch_size": config.env.batch_size, "env_threads": config.env.env_threads,
          "rollouts_per_update": config.rate.rollouts_per_update}


class Parts:
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
                        parts: Parts | None = None) -> dict[str, Any]:
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

  parts = parts or Parts(config, spec)
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


def synthetic_batch(parts: Parts, seed: int = 0) -> tuple[Any, ...]:
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
                         parts: Parts | None = None) -> dict[str, Any]:
  """The compiled update, back to back on one synthetic device batch; env steps per second are
  the batch's (reuse by epochs not counted), so they compare with the actors'."""
  import jax

  from jaxrl_async.runtime.learners.on_policy import compile_update

  parts = parts or Parts(config, spec)
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
