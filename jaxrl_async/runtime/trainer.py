"""Wiring, supervision and shutdown: builds the components from a validated config, runs the
threads, stops at the budget or the return target, and always shuts down cleanly.

An exception in any thread ends the run: the main thread re-raises it with its traceback.
Ctrl-C (KeyboardInterrupt in the main thread) stops every thread the same way.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import math
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import jax

from jaxrl_async import envs
from jaxrl_async.algos import make_algorithm
from jaxrl_async.config import ConfigError, TrainConfig
from jaxrl_async.metrics import Ema, EpisodeStats, MetricsWriter, wall_s
from jaxrl_async.runtime.actor import Actor
from jaxrl_async.runtime.learner import Learner
from jaxrl_async.runtime.params import ParamStore
from jaxrl_async.runtime.queue import RolloutQueue
from jaxrl_async.runtime.rate import RateController
from jaxrl_async.runtime.sharding import LEARNER_AXIS, learner_mesh, replicate, replicated

_JOIN_TIMEOUT_S = 10.0


class ThreadFailed(RuntimeError):
  """A component thread raised; the message carries its traceback."""


def check_devices(config: TrainConfig) -> list[jax.Device]:
  devices = jax.local_devices()
  n = config.learner.learner_devices
  if n > len(devices):
    raise ConfigError("learner_devices", n, f"must be <= the {len(devices)} local devices "
                      f"({devices[0].platform}); on CPU set XLA_FLAGS="
                      f"--xla_force_host_platform_device_count={n}")
  return devices[:n]


def validate(config: TrainConfig) -> envs.EnvSpec:
  """Everything that can be checked before a thread starts; raises ConfigError."""
  spec = envs.env_spec(config.env)
  if config.learner.algo in ("impala", "dqn") and not spec.discrete:
    raise ConfigError("algo", config.learner.algo,
                      f"needs discrete actions, but {config.env.env_id} has continuous ones "
                      "(use --algo=ppo)")
  check_devices(config)
  return spec


@dataclasses.dataclass
class RunResult:
  summary: dict[str, Any]
  state: Any
  version: int


class _Supervised(threading.Thread):
  """A daemon thread that records its exception (with traceback) and signals the stop event."""

  def __init__(self, name: str, target: Any, stop: threading.Event):
    super().__init__(name=name, daemon=True)
    self._target_fn, self._stop_event = target, stop
    self.error: str | None = None

  def run(self) -> None:
    try:
      self._target_fn()
    except BaseException:  # noqa: BLE001 - everything is reported to the main thread
      self.error = f"{self.name} failed:\n{traceback.format_exc()}"
      self._stop_event.set()


class Trainer:
  """One training run on this host. `run()` returns a RunResult or raises ThreadFailed."""

  def __init__(self, config: TrainConfig, spec: envs.EnvSpec | None = None,
               run_dir: Path | None = None, quiet: bool = False, timings: dict | None = None,
               pool_factory: Any = None):
    self.config = config
    self.spec = spec or validate(config)
    self.run_dir = Path(run_dir or config.run.run_dir or "runs/default")
    self.quiet = quiet
    self.timings = dict(timings or {})
    self.stop = threading.Event()
    self._stop_reason: str | None = None
    self.pool_factory = pool_factory or envs.make_pool
    self.devices = check_devices(config)
    self.mesh = learner_mesh(self.devices)
    self.actor_device = self.devices[0]
    self.algo = make_algorithm(config, self.spec, LEARNER_AXIS)

  def request_stop(self, reason: str) -> None:
    """Asks the run to end cleanly (from a signal handler or another thread)."""
    self._stop_reason = self._stop_reason or reason

  def _init_state(self) -> Any:
    t0 = time.perf_counter()
    key = jax.random.key(self.config.run.seed)
    state = replicate(jax.jit(self.algo.init)(key), self.mesh)
    jax.block_until_ready(state)
    self.timings["compile_init_s"] = time.perf_counter() - t0
    return state

  def _abstract_state(self) -> Any:
    """Shapes, dtypes and shardings of the train state, without computing it."""
    shapes = jax.eval_shape(self.algo.init, jax.random.key(self.config.run.seed))
    sharding = replicated(self.mesh)
    return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding),
                        shapes)

  def _policy_step(self, params: Any) -> Any:
    """The actors' jitted (params, obs, key) -> (action, extras, key), compiled here once.

    `params` may be abstract (ShapeDtypeStructs): compiling needs shapes only.
    """
    policy = self.algo.make_policy(0)

    def step(params, obs, key):
      key, sub = jax.random.split(key)
      action, extras = policy(params, obs, sub)
      return action, extras, key

    t0 = time.perf_counter()
    E, spec = self.config.env.batch_size, self.spec
    obs = jax.ShapeDtypeStruct((E,) + spec.obs_shape, spec.obs_dtype)
    key = jax.device_put(jax.random.key(0), self.actor_device)
    on_actor = jax.sharding.SingleDeviceSharding(self.actor_device)
    params = jax.tree.map(lambda p: jax.ShapeDtypeStruct(p.shape, p.dtype, sharding=on_actor),
                          params)
    compiled = jax.jit(step).lower(params, obs, key).compile()
    self.timings["compile_policy_s"] = time.perf_counter() - t0
    return compiled

  def run(self) -> RunResult:
    cfg = self.config
    # Start-up is most of a short run here: the initial state, the policy and the update compile
    # at the same time, each from abstract shapes (XLA compiles outside the GIL).
    abstract = self._abstract_state()
    startup = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="startup")
    state_future = startup.submit(self._init_state)
    policy_future = startup.submit(self._policy_step, self.algo.actor_params(abstract))
    startup.shutdown(wait=False)
    version = 0
    store = ParamStore()
    queue = RolloutQueue(cfg.rate.resolved_queue_capacity)
    controller = RateController(cfg.rate, version)
    actors: list[Actor] = []
    stats = EpisodeStats(cfg.run.return_window, cfg.run.stop_at_return,
                         lambda: sum(a.timers.env_steps for a in actors))
    learner_cls = Learner
    if self.algo.off_policy:
      from jaxrl_async.runtime.offpolicy import OffPolicyLearner as learner_cls
    learner = learner_cls(cfg, self.spec, self.algo, self.mesh, abstract, version, queue, store,
                          controller, self.stop, wall_s, state_future=state_future)
    threads = [_Supervised("learner", learner.run, self.stop)]
    threads[0].start()  # compiles the update, then waits for the initial state
    state = state_future.result()
    store.publish(self.algo.actor_params(state), version)
    policy_step = policy_future.result()
    for i in range(cfg.actor.num_actors):
      actors.append(Actor(i, cfg, self.spec, self.algo, policy_step, self.actor_device,
                          self.mesh, queue, store, controller, stats, self.stop,
                          pool_factory=self.pool_factory))
      threads.append(_Supervised(f"actor-{i}", actors[-1].run, self.stop))
      threads[-1].start()
    self.timings["train_start_wall_s"] = wall_s()
    writer = MetricsWriter(self.run_dir, quiet=self.quiet)
    monitor = _Monitor(cfg, actors, learner, controller, queue, stats, writer)
    try:
      reason = self._supervise(threads, learner, stats, monitor)
    except KeyboardInterrupt:
      reason = "interrupted"
    finally:
      self.stop.set()
      queue.close()
      controller.close()
      alive = _join(threads)
      monitor.log()
      writer.close()
    errors = [t.error for t in threads if t.error]
    if errors:
      raise ThreadFailed(errors[0])
    if alive:
      raise ThreadFailed(f"threads still running after shutdown: {alive}")
    summary = self._summary(reason, actors, learner, controller, stats, monitor)
    return RunResult(summary, learner.state, learner.version)

  def _supervise(self, threads, learner, stats, monitor) -> str:
    cfg = self.config.run
    next_log = time.time() + cfg.log_every_s
    t_start = time.time()
    while True:
      stats.solved.wait(0.02)
      if stats.solved.is_set():
        return "solved"
      if self._stop_reason:
        return self._stop_reason
      if self.stop.is_set() or not all(t.is_alive() for t in threads):
        if learner.finished.is_set():
          return "budget"
        return "error" if any(t.error for t in threads) else "stopped"
      if learner.finished.is_set():
        return "budget"
      if cfg.max_wall_s and time.time() - t_start >= cfg.max_wall_s:
        return "max_wall_s"
      if time.time() >= next_log:
        monitor.log()
        next_log += cfg.log_every_s

  def _summary(self, reason, actors, learner, controller, stats, monitor) -> dict[str, Any]:
    now = wall_s()
    t = learner.timers
    timings = dict(self.timings)
    timings["compile_update_s"] = t.compile_s
    timings["first_update_wall_s"] = t.first_update_wall_s
    summary = {
        "solved": stats.solved.is_set(),
        "solved_wall_s": stats.solved_wall_s,
        "solved_env_steps": stats.solved_env_steps,
        "final_return_mean": stats.return_mean(),
        "stop_reason": reason,
        "env_steps": sum(a.timers.env_steps for a in actors),
        "episodes": stats.episodes,
        "updates": t.updates,
        "version": learner.version,
        "wall_s": now,
        "max_policy_lag_seen": controller.max_lag_seen,
        "dropped_stale": controller.dropped_stale,
        "lag_hist": {str(k): v for k, v in sorted(controller.lag_hist.items())},
        "timings": timings,
        "config": self.config.to_flat(),
    }
    self.run_dir.mkdir(parents=True, exist_ok=True)
    (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    return summary


def _join(threads: list[threading.Thread]) -> list[str]:
  deadline = time.time() + _JOIN_TIMEOUT_S
  for t in threads:
    t.join(max(0.0, deadline - time.time()))
  return [t.name for t in threads if t.is_alive()]


class _Monitor:
  """Turns the components' counters into one metrics record per interval."""

  def __init__(self, cfg, actors, learner, controller, queue, stats, writer):
    self.cfg, self.actors, self.learner = cfg, actors, learner
    self.controller, self.queue, self.stats, self.writer = controller, queue, stats, writer
    self.production, self.consumption, self.sps = Ema(), Ema(), Ema(2.0)
    self._last = {"t": time.time(), "blocked": 0.0, "idle": 0.0}

  def record(self) -> dict[str, Any]:
    now = time.time()
    env_steps = sum(a.timers.env_steps for a in self.actors)
    delivered = sum(a.timers.rollouts for a in self.actors) * self.cfg.env_steps_per_rollout
    consumed = self.learner.timers.consumed_env_steps
    production = self.production.update(delivered, now)
    consumption = self.consumption.update(consumed, now)
    sps = self.sps.update(env_steps, now)
    dt = max(now - self._last["t"], 1e-9)
    blocked = sum(a.timers.permit_s + a.timers.put_s for a in self.actors)
    idle = self.learner.timers.idle_s
    lag_window = self.controller.take_lag_window()
    n_lag = sum(lag_window.values())
    record = {
        "env_steps": env_steps,
        "wall_s": wall_s(),
        "sps": sps or 0.0,
        "episodes": self.stats.episodes,
        "return_mean": self.stats.return_mean(),
        "length_mean": self.stats.length_mean(),
        "version": self.learner.version,
        "policy_lag_mean": sum(k * v for k, v in lag_window.items()) / n_lag if n_lag else 0.0,
        "policy_lag_max": max(lag_window) if lag_window else 0,
        "lag_hist": {str(k): v for k, v in sorted(lag_window.items())},
        "dropped_stale": self.controller.dropped_stale,
        "queue_depth": len(self.queue),
        "production_sps": production or 0.0,
        "consumption_sps": consumption or 0.0,
        "reuse_ratio": (consumption / production) if production and consumption else None,
        "actor_blocked_frac": (blocked - self._last["blocked"]) / dt / max(len(self.actors), 1),
        "learner_idle_frac": (idle - self._last["idle"]) / dt,
        "env_recv_s": sum(a.timers.env_recv_s for a in self.actors),
        "inference_s": sum(a.timers.inference_s for a in self.actors),
        "param_fetch_s": sum(a.timers.param_fetch_s for a in self.actors),
        "queue_put_s": self.queue.put_wait_s,
        "queue_get_s": self.queue.get_wait_s,
    }
    if self.learner.last_metrics is not None:
      losses = jax.device_get(self.learner.last_metrics)
      record.update({k: float(v) for k, v in losses.items() if math.isfinite(float(v))})
    self._last = {"t": now, "blocked": blocked, "idle": idle}
    return record

  def log(self) -> dict[str, Any]:
    record = self.record()
    self.writer.write(record)
    return record
