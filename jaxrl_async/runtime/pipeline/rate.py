"""The host-side rate controller: it decides *when* rollouts may be made and learned, never
touches an array.

Policy lag of a rollout = learner version when it is consumed - its behaviour version. The
learner consumes U rollouts per version. An actor asks for a permit (a ticket) before it starts a
rollout, and takes the newest params after it gets one. With a cap K, a permit is granted only
while every rollout in flight (started, not yet consumed) stays within K even if all the others,
the new one included, were consumed before it:

    version - oldest_in_flight_version + floor(in_flight / U) <= K

Consuming U rollouts raises the version by one and lowers in_flight by U, so the bound keeps
holding; hence throttling, not dropping, is what bounds the lag. What still arrives too stale
(an async-mode rollout whose overflow steps used older params) is dropped at consumption and
counted in `dropped_stale`: no sample with lag > K is ever learned from. K = 0 makes actors wait
for each new version: exact synchronous training. Tickets are released only after the new params
are *published*, so an actor woken by a release always sees the version it is entitled to.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

from jaxrl_async.config import RateConfig


class RateController:

  def __init__(self, cfg: RateConfig, version: int = 0):
    self.max_lag = cfg.max_policy_lag if cfg.capped else None
    self.max_in_flight = cfg.max_in_flight
    self.rollouts_per_update = cfg.rollouts_per_update
    self._cond = threading.Condition()
    self._closed = False
    self.version = version
    self._tickets: dict[int, int] = {}  # ticket -> version when granted
    self._next_ticket = 0
    # Measurements, read by the metrics loop (plain ints and floats: torn reads are harmless).
    self.actor_blocked_s = 0.0
    self.dropped_stale = 0
    self.admitted = 0
    self.lag_hist: collections.Counter[int] = collections.Counter()
    self.lag_hist_since_log: collections.Counter[int] = collections.Counter()
    self.max_lag_seen = 0

  @property
  def in_flight(self) -> int:
    return len(self._tickets)

  def _may_start(self) -> bool:
    n = len(self._tickets)
    if self._closed or n == 0:
      return True
    if self.max_lag is None:
      return n < self.max_in_flight
    oldest = min(self._tickets.values())
    return self.version - oldest + n // self.rollouts_per_update <= self.max_lag

  def acquire(self, timeout: float) -> int | None:
    """An actor asks to start a rollout: a ticket, or None on timeout or shutdown."""
    t0 = time.perf_counter()
    with self._cond:
      ok = self._cond.wait_for(self._may_start, timeout)
      self.actor_blocked_s += time.perf_counter() - t0
      if self._closed or not ok:
        return None
      ticket = self._next_ticket
      self._next_ticket += 1
      self._tickets[ticket] = self.version
      return ticket

  def admit(self, ticket: int, behaviour_version: int) -> bool:
    """The learner is about to learn from a rollout; False means it is too stale: dropped."""
    with self._cond:
      lag = self.version - behaviour_version
      if self.max_lag is not None and lag > self.max_lag:
        self.dropped_stale += 1
        self._release_locked([ticket])
        return False
      self.admitted += 1
      self.lag_hist[lag] += 1
      self.lag_hist_since_log[lag] += 1
      self.max_lag_seen = max(self.max_lag_seen, lag)
      return True

  def published(self, version: int, tickets: list[int]) -> None:
    """The learner published `version` after learning from the rollouts of `tickets`."""
    with self._cond:
      self.version = version
      self._release_locked(tickets)

  def release(self, ticket: int) -> None:
    """Gives back a ticket whose rollout will never arrive (actor stopped or failed)."""
    with self._cond:
      self._release_locked([ticket])

  def _release_locked(self, tickets: list[int]) -> None:
    for t in tickets:
      self._tickets.pop(t, None)
    self._cond.notify_all()

  def close(self) -> None:
    with self._cond:
      self._closed = True
      self._cond.notify_all()

  def take_lag_window(self) -> dict[int, int]:
    """Lag counts since the last call (for the per-interval histogram in metrics)."""
    with self._cond:
      window = dict(self.lag_hist_since_log)
      self.lag_hist_since_log.clear()
    return window

  def state_dict(self) -> dict[str, Any]:
    return {"version": self.version, "dropped_stale": self.dropped_stale,
            "admitted": self.admitted, "max_lag_seen": self.max_lag_seen,
            "lag_hist": {str(k): v for k, v in self.lag_hist.items()}}
