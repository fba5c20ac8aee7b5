"""--balance=auto in a run: measures windows, asks the controller (balance.py), moves the levers.

The levers live where they act: the actor gate (which actors may start a rollout), the rate
controller (U and the in-flight bound F, runtime/pipeline/rate.py), the learner step (the update
compiled for another U, in the background) and the replay's limiter (the SPI target). A window
lasts at least `balance_every_s` and until an update has finished in it (`holds_evidence`), so
each one holds evidence; the first starts at the learner's first update (while it compiles it
is neither idle nor learning). A move of U is applied only once its update is compiled and the
tickets of a larger U have drained, and the next window starts then.

A window's throughput, and the learner's rate per busy second, are timed between finished
updates (`LearnerLoop.consumption_mark`): at a held setting of a 512,512 learner at U = 6, 1-s
windows scattered 3.5-4.9% timed, 7.7-10% counted at the tick (BUILD_NOTES). Every window goes
to the metrics (`balance_windows`, `tools.run_summary --windows`) with the setting it was
measured at.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

from absl import logging

from jaxrl_async.runtime.pipeline.balance import BalanceController
from jaxrl_async.runtime.pipeline.balance_window import (
  Bounds,
  Setting,
  Window,
  between_marks,
  holds_evidence,
  learner_rate,
)


class ActorGate:
  """Which actors may start a rollout. A paused actor waits here (with a timeout) instead of
  asking for a permit, so it holds no ticket while paused."""

  def __init__(self, num_actors: int, active: int | None = None):
    self.num_actors = num_actors
    self._active = num_actors if active is None else active
    self._cond = threading.Condition()

  @property
  def active(self) -> int:
    return self._active

  def set_active(self, n: int) -> None:
    with self._cond:
      self._active = max(1, min(self.num_actors, n))
      self._cond.notify_all()

  def wait_active(self, index: int, timeout: float) -> bool:
    with self._cond:
      return self._cond.wait_for(lambda: index < self._active, timeout)


def u_choices(config: Any, algo: Any, multi_process: bool) -> tuple[int, ...]:
  """The U values --balance=auto may use: every U up to the actors' slots (N, or 2N with async
  EnvPool) that divides into the minibatches, or only the configured U where U must not move:
  replay (no U) and several processes (they would have to agree). Annealed schedules count env
  steps, not updates (algos/schedule.py), so they end with the run whatever U does."""
  u0 = config.rate.rollouts_per_update
  if algo.off_policy or multi_process or not config.rate.capped:
    return (u0,)
  slots = config.actor.num_actors * (2 if config.env.is_async else 1)
  per_device = config.env.num_envs // config.learner.learner_devices
  return tuple(u for u in range(1, max(u0, slots) + 1)
               if (per_device * u) % config.num_minibatches == 0 or u == u0)


def make_bounds(config: Any, algo: Any, multi_process: bool, limiter: Any = None) -> Bounds:
  rate = config.rate
  spi_range = None
  if limiter is not None:  # replay: SPI moves within --spi_tolerance, as far as the buffer allows
    tol = config.algo.spi_tolerance
    top = (2 * limiter.error_buffer - limiter.sample_chunk) / limiter.insert_chunk
    spi = limiter.samples_per_insert
    spi_range = (max(spi - tol, 0.5 * spi), min(spi + tol, top))
  return Bounds(
      num_actors=config.actor.num_actors,
      max_lag=rate.max_policy_lag if rate.capped else None,
      u_choices=u_choices(config, algo, multi_process),
      slots_per_actor=2 if config.env.is_async else 1,
      spi_range=spi_range, target_lag=rate.target_lag, target_idle=rate.target_idle,
      target_blocked=rate.target_blocked)


def queue_capacity(config: Any, bounds: Bounds | None) -> int:
  """The queue's bound: it must hold every ticket the largest U allows."""
  if bounds is None or bounds.max_lag is None:
    return config.rate.resolved_queue_capacity
  return max(config.rate.resolved_queue_capacity, max(bounds.cap(u) for u in bounds.u_choices))


class Balancer:
  """`step(wall_s)` every `every_s` seconds from the supervising thread."""

  def __init__(self, gate: ActorGate, learner: Any, controller: Any, bounds: Bounds,
               every_s: float, actors: list[Any], limiter: Any = None):
    self.gate, self.learner, self.rate, self.actors = gate, learner, controller, actors
    self.limiter, self.every_s = limiter, every_s
    start = Setting(controller.rollouts_per_update, controller.in_flight_limit, gate.active,
                    limiter.samples_per_insert if limiter is not None else None)
    self.control = BalanceController(bounds, start)
    self.decisions: list[dict[str, Any]] = []
    self._unlogged: list[dict[str, Any]] = []
    self._windows: list[dict[str, Any]] = []  # every window measured, for the metrics
    self._pending: Setting | None = None  # a U waiting for its compile or a drain
    self._mark = self._counts()

  def _counts(self) -> dict[str, Any]:
    actors = [a.timers.snapshot() for a in self.actors]
    return {"t": time.time(), "idle": self.learner.timers.snapshot().idle_s,
            "hist": self.rate.lag_counts(),
            "made": [t.rollouts for t in actors],
            "blocked": [t.permit_s + t.put_s for t in actors],
            "paused": [t.paused_s for t in actors],
            "done": self.learner.consumption_mark()}

  def _window(self, now: dict[str, Any]) -> Window | None:
    """The measurements since the mark, or None while they hold too little evidence."""
    last, dt = self._mark, max(now["t"] - self._mark["t"], 1e-9)
    delta = {k: v - last["hist"].get(k, 0) for k, v in now["hist"].items()}
    consumed = sum(delta.values())
    # The supervisor calls every `every_s`, so dt lands on it give or take the scheduler's
    # jitter: a strict bound made every other window two calls long (measured: 1.0 or 2.0 s).
    short = dt < 0.8 * self.every_s
    learned, learned_s, busy_s = between_marks(now["done"], last["done"])
    if short or not holds_evidence(consumed, self.rate.rollouts_per_update, learned):
      return None
    idle = min(max((now["idle"] - last["idle"]) / dt, 0.0), 1.0)
    active = range(min(self.gate.active, len(self.actors)))
    made = sum(now["made"][i] - last["made"][i] for i in active)
    blocked = sum(now["blocked"][i] - last["blocked"][i] for i in active)
    paused = sum(now["paused"][i] - last["paused"][i] for i in active)
    working = max(len(active) * dt - blocked - paused, 1e-9)
    lags = [k for k, v in delta.items() if v > 0]
    return Window(
        learner_idle=idle, actors_blocked=min(blocked / max(len(active) * dt, 1e-9), 1.0),
        actor_rate=made / working,
        learner_rate=learner_rate(learned, busy_s, consumed, dt, idle), consumed=consumed,
        lag_mean=sum(k * v for k, v in delta.items()) / consumed,
        lag_max=max(lags) if lags else None, seconds=dt, learned=learned, learned_s=learned_s,
        learned_busy_s=busy_s)

  def step(self, wall_s: float) -> dict[str, Any] | None:
    """One control step: the decision made (as recorded), if any."""
    if self._pending is not None and not self._apply_u(self._pending):
      return None
    if self.learner.timers.snapshot().first_update_wall_s is None:
      self._mark = self._counts()  # compiling: a learner that cannot learn yet is not busy
      return None
    now = self._counts()
    window = self._window(now)
    if window is None:
      return None
    self._mark = now
    self._windows.append({"wall_s": round(wall_s, 3), **dataclasses.asdict(self.setting),
                          **_rounded(window)})
    decision = self.control.step(window)
    if decision is None:
      return None
    record = {"wall_s": wall_s, "lever": decision.lever, "reason": decision.reason,
              **dataclasses.asdict(decision.setting),
              "window": _rounded(decision.window)}  # the pooled evidence
    self.decisions.append(record)
    self._unlogged.append(record)
    logging.info("balance: %s", decision.reason)
    self._apply(decision.setting)
    return record

  def _apply(self, setting: Setting) -> None:
    self.gate.set_active(setting.active_actors)
    if setting.samples_per_insert is not None and self.limiter is not None:
      self.limiter.set_samples_per_insert(setting.samples_per_insert)
    if setting.rollouts_per_update != self.rate.rollouts_per_update:
      self._pending = setting
      self._apply_u(setting)
    else:
      self.rate.configure(setting.rollouts_per_update, setting.in_flight)

  def _apply_u(self, setting: Setting) -> bool:
    """Moves U once the learner can take it; True once it is in force."""
    u = setting.rollouts_per_update
    if self.rate.rollouts_per_update != u:
      if not self.learner.step.compile_for(u):
        return False
      if self.rate.pending_rollouts_per_update != u:
        self.rate.configure(u, setting.in_flight)
      if self.rate.rollouts_per_update != u:
        return False  # a smaller U waits for the tickets of the larger one
    self._pending = None
    self._mark = self._counts()  # the next window measures the new U only
    return True

  @property
  def setting(self) -> Setting:
    return self.control.setting

  def take_unlogged(self) -> list[dict[str, Any]]:
    out, self._unlogged = self._unlogged, []
    return out

  def take_windows(self) -> list[dict[str, Any]]:
    """The windows measured since the last call, each with the setting it was measured at."""
    out, self._windows = self._windows, []
    return out


def _rounded(window: Window) -> dict[str, Any]:
  return {k: round(v, 4) if isinstance(v, float) else v
          for k, v in dataclasses.asdict(window).items()}
