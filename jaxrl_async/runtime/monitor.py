"""Turns the components' counters into one metrics record per interval: rates, lag, waits."""

from __future__ import annotations

import math
import time
from typing import Any

import jax

from jaxrl_async.loggers import make_logger
from jaxrl_async.metrics import STEP_SPLIT, Ema, MetricsWriter, wall_s
from jaxrl_async.runtime.pipeline.balancer import Balancer, make_bounds


def actor_fractions(blocked_s: float, paused_s: float, dt: float, n: int) -> tuple[float, float]:
  """(blocked, paused) fractions of n actors over dt. Blocked is over the time they were not
  paused by --balance=auto: a paused actor waits on purpose, and counting it as unblocked
  would flatter the balancer (3 of 6 paused would halve the figure)."""
  total = dt * max(n, 1)
  paused = min(max(paused_s / total, 0.0), 1.0)
  return min(blocked_s / max(total - min(paused_s, total), 1e-9), 1.0), paused


class Monitor:
  """Turns the components' counters into one metrics record per interval."""

  def __init__(self, cfg, actors, learner, controller, queue, stats, writer,
               base_env_steps: int = 0, base_episodes: int = 0, balancer: Any = None):
    self.cfg, self.actors, self.learner = cfg, actors, learner
    self.controller, self.queue, self.stats, self.writer = controller, queue, stats, writer
    self.base_env_steps, self.base_episodes = base_env_steps, base_episodes  # from a resume
    self.production, self.consumption, self.sps = Ema(), Ema(), Ema(2.0)
    self._last = {"t": time.time(), "blocked": 0.0, "paused": 0.0, "idle": 0.0, "steps": 0}
    self.balancer = balancer  # balance=auto

  def env_steps(self) -> int:
    return self.base_env_steps + sum(a.timers.env_steps for a in self.actors)

  def record(self) -> dict[str, Any]:
    now = time.time()
    # One snapshot per thread's counters: the sums below combine fields of one moment.
    actors = [a.timers.snapshot() for a in self.actors]
    learner = self.learner.timers.snapshot()
    env_steps = self.base_env_steps + sum(a.env_steps for a in actors)
    delivered = sum(a.rollouts for a in actors) * self.cfg.env_steps_per_rollout
    consumed = learner.consumed_env_steps
    production = self.production.update(delivered, now)
    consumption = self.consumption.update(consumed, now)
    sps = self.sps.update(env_steps, now)
    dt = max(now - self._last["t"], 1e-9)
    blocked = sum(a.permit_s + a.put_s for a in actors)
    paused = sum(a.paused_s for a in actors)
    blocked_frac, paused_frac = actor_fractions(
        blocked - self._last["blocked"], paused - self._last["paused"], dt, len(self.actors))
    idle = learner.idle_s
    lag_window = self.controller.take_lag_window()
    n_lag = sum(lag_window.values())
    record = {
        "env_steps": env_steps,
        "wall_s": wall_s(),
        "sps": sps if sps is not None else (env_steps - self._last["steps"]) / dt,
        "episodes": self.base_episodes + self.stats.episodes,
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
        "actor_blocked_frac": blocked_frac,
        "actor_paused_frac": paused_frac,
        "learner_idle_frac": min(1.0, (idle - self._last["idle"]) / dt),
        "nonfinite_skipped": self.learner.nonfinite_skipped,
        # The actors' per-step path, cumulative seconds over all actor threads.
        **{name: sum(getattr(a, name) for a in actors) for name in STEP_SPLIT},
        "param_fetch_s": sum(a.param_fetch_s for a in actors),
        "permit_s": sum(a.permit_s for a in actors),
        "idle_env_steps": sum(a.idle_env_steps for a in actors),
        "parked_env_waits": sum(a.parked_env_waits for a in actors),
        # Placing rollouts on the learner devices and queueing them (a put never waits).
        "queue_put_s": sum(a.put_s for a in actors),
        "queue_get_s": self.queue.get_wait_s,
        # The learner waiting for rollouts while its last update still computed (busy).
        "learner_compute_wait_s": learner.compute_wait_s,
    }
    if self.learner.last_metrics is not None:
      losses = jax.device_get(self.learner.last_metrics)
      record.update({k: float(v) for k, v in losses.items()
                     if k != "nonfinite" and math.isfinite(float(v))})
    record.update(self.learner.extra_metrics())
    if self.balancer is not None:
      record.update(active_actors=self.balancer.gate.active,
                    in_flight_limit=self.controller.in_flight_limit)
      record["balance_decisions"] = self.balancer.take_unlogged()
      record["balance_windows"] = self.balancer.take_windows()
    self._last = {"t": now, "blocked": blocked, "paused": paused, "idle": idle,
                  "steps": env_steps}
    return record

  def log(self, final: dict[str, Any] | None = None) -> dict[str, Any]:
    """Writes one record; `final` adds what only the run's end knows (actor restarts)."""
    record = self.record() | (final or {})
    self.writer.write(record)
    return record


def make_monitor(parts: Any, quiet: bool, resume: bool, start: Any, actors: list[Any],
                 learner: Any, controller: Any, queue: Any, stats: Any, gate: Any
                 ) -> tuple[MetricsWriter, Monitor]:
  """The run's metrics writer (its logger on process 0 only: one TensorBoard or W&B run per
  run), and its monitor, with the balancer when --balance=auto gave a `gate`; counts go on
  from `start` (a resume's)."""
  cfg = parts.config
  is_chief = parts.cluster is None or jax.process_index() == 0
  logger = make_logger(cfg.run.logger if is_chief else "none", parts.run_dir, cfg.to_flat())
  writer = MetricsWriter(parts.run_dir, append=resume, quiet=quiet, logger=logger)
  balancer = None
  if gate is not None:
    limiter = getattr(learner.step, "limiter", None)  # the replay's
    bounds = make_bounds(cfg, parts.algo, parts.cluster is not None, limiter)
    balancer = Balancer(gate, learner, controller, bounds, cfg.rate.balance_every_s, actors,
                        limiter)
  return writer, Monitor(cfg, actors, learner, controller, queue, stats, writer,
                         start.env_steps, start.episodes, balancer)
