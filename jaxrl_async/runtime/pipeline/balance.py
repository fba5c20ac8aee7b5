"""--balance=auto: adapts the production side to the learner, inside the hard lag cap.

Every `balance_every_s` the balancer looks at the last window: the learner's idle fraction
(waiting for rollouts) and the mean policy lag learned from. Idle learner -> one more actor may
produce; lag above target while the learner is busy -> one fewer. If a pause for lag leaves the
learner idle, it is undone and the balancer does not pause for lag below that count again
(a floor): the lag target is not worth a starved learner, and without the floor the two rules
alternate every step (measured: BUILD_NOTES.md, issue 5). Before pausing, the balancer checks
production against consumption: the active actors' rate while not blocked (rollouts per
actor-second) times one actor fewer must still cover what the learner takes per busy second;
if not, the pause would only starve the learner, so it holds (the pause it then undid left the
learner idle ~6% of the run in the balance suite). The cap K is enforced by the rate
controller regardless; the balancer only moves the operating point below it, where staleness
costs less. Each decision is logged with its reason and kept for metrics.jsonl.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

from absl import logging


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


@dataclasses.dataclass
class Decision:
  wall_s: float
  active: int
  reason: str


class Balancer:
  """Reads the learner's idle time and the controller's lag histogram; moves the gate."""

  def __init__(self, gate: ActorGate, learner: Any, controller: Any, target_lag: float,
               target_idle: float, every_s: float, actors: list[Any] | None = None):
    self.gate, self.learner, self.controller = gate, learner, controller
    self.actors = actors or []  # their timers give the production capacity (none: unchecked)
    self._last_actor = self._actor_counts()
    self._held = False  # a hold for capacity was logged (once: it repeats every window)
    self._capacity = (0.0, 0.0)  # last window: rollouts/s per unblocked actor, learner's take
    self.target_lag, self.target_idle, self.every_s = target_lag, target_idle, every_s
    self.decisions: list[Decision] = []
    self._unlogged: list[Decision] = []
    self._last_t = time.time()
    self._last_idle = 0.0
    self._last_hist: dict[int, int] = {}
    self.floor = 1  # the lag rule never pauses below this many active actors
    self._paused_for_lag = False  # the last decision paused an actor for lag

  def _actor_counts(self) -> list[tuple[int, float]]:
    """(rollouts delivered, seconds blocked or paused) per actor, cumulative."""
    snaps = [a.timers.snapshot() for a in self.actors]
    return [(t.rollouts, t.permit_s + t.put_s + t.paused_s) for t in snaps]

  def _window(self) -> tuple[float, float | None, bool]:
    """The last window's learner idle fraction, mean lag learned from, and whether one actor
    fewer could still feed the learner."""
    now = time.time()
    idle = self.learner.timers.idle_s
    hist = dict(self.controller.lag_hist)
    counts = self._actor_counts()
    dt = max(now - self._last_t, 1e-9)
    idle_frac = (idle - self._last_idle) / dt
    delta = {k: v - self._last_hist.get(k, 0) for k, v in hist.items()}
    n = sum(delta.values())
    lag_mean = sum(k * v for k, v in delta.items()) / n if n else None
    feeds = True
    active = list(zip(counts, self._last_actor, strict=True))[:self.gate.active]
    if active:
      made = sum(max(c[0] - last[0], 0) for c, last in active)
      free = sum(max(dt - (c[1] - last[1]), 0.0) for c, last in active)
      per_actor = made / free if free > 0 else float("inf")  # rollouts per unblocked second
      takes = n / max(dt * (1.0 - idle_frac), 1e-9)  # rollouts per busy learner second
      feeds = (self.gate.active - 1) * per_actor >= takes
      self._capacity = (per_actor, takes)
    self._last_t, self._last_idle, self._last_hist = now, idle, hist
    self._last_actor = counts
    return idle_frac, lag_mean, feeds

  def step(self, wall_s: float) -> Decision | None:
    """One control step; call every `every_s` seconds. Returns the decision, if any."""
    idle_frac, lag_mean, feeds = self._window()
    if lag_mean is None:
      return None  # nothing was learned in the window: no evidence either way
    active = self.gate.active
    # Production is throttled for lag only while the learner is the bottleneck: pausing an
    # actor while the learner idles would cut consumption as well (the lag sweep measured that:
    # BUILD_NOTES.md, "Balance of production and consumption"); the cap K bounds the lag then.
    busy = idle_frac < self.target_idle
    per_actor, takes = self._capacity
    pause = lag_mean > self.target_lag and busy and active > self.floor  # for lag
    if pause and not feeds:
      if self._held:
        return None
      # Kept as a decision (once: it would repeat every window), so the run's record says why
      # the lag stayed above target.
      reason = (f"mean lag {lag_mean:.2f} > target {self.target_lag:.2f}, but {active - 1} "
                f"actors make {(active - 1) * per_actor:.1f} rollouts/s and the learner takes "
                f"{takes:.1f}: holding {active}")
      self._held = True
      return self._decide(wall_s, active, reason)
    if pause:  # and the other actors can feed the learner
      reason = (f"mean lag {lag_mean:.2f} > target {self.target_lag:.2f} with the learner busy "
                f"(idle {100 * idle_frac:.0f}% < {100 * self.target_idle:.0f}%)")
      if self.actors:
        reason += (f" and {active - 1} actors make {(active - 1) * per_actor:.1f} rollouts/s "
                   f">= the {takes:.1f} it takes")
      reason += ": one actor fewer"
      active -= 1
      paused_for_lag = True
    elif not busy and active < self.gate.num_actors:
      reason = (f"learner idle {100 * idle_frac:.0f}% >= {100 * self.target_idle:.0f}%: "
                f"one actor more")
      active += 1
      if self._paused_for_lag:
        self.floor = active
        reason += f"; the pause for lag starved it: not below {active} for lag again"
      paused_for_lag = False
    else:
      return None
    self._paused_for_lag = paused_for_lag
    return self._decide(wall_s, active, reason)

  def _decide(self, wall_s: float, active: int, reason: str) -> Decision:
    self.gate.set_active(active)
    decision = Decision(wall_s, active, reason)
    self.decisions.append(decision)
    self._unlogged.append(decision)
    logging.info("balance: %s (active actors %d)", reason, active)
    return decision

  def take_unlogged(self) -> list[dict[str, Any]]:
    out, self._unlogged = [dataclasses.asdict(d) for d in self._unlogged], []
    return out
