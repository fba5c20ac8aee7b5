"""The host-side rate controller: it decides *when* rollouts may be made and learned, never
touches an array.

Policy lag of a rollout = learner version when it is consumed - its behaviour version. The
learner consumes U rollouts per version. An actor asks for a permit (a ticket) before it starts a
rollout, and takes the newest params after it gets one. With a cap K, a permit is granted only
while every rollout in flight (started, not yet consumed) stays within K even if all the others,
the new one included, were consumed before it:

    version - oldest_in_flight_version + floor(in_flight / U) <= K

Consuming U rollouts raises the version by one and lowers in_flight by U, so the bound keeps
holding; hence throttling, not dropping, is what bounds the lag. `--balance=auto` may lower the
number of tickets (F, never below U) and change U while the run goes on (`configure`). The rule
above holds only if every version the learner publishes consumes U rollouts, so a new U takes
force where the learner starts a batch: a larger one when the learner next publishes (rollouts
granted under the smaller U are then learned sooner, not later; switching earlier let a batch
the learner had already found full under the old U count as a larger one, and a rollout reach
lag K + 1: measured, 1-17 drops in 5 s of random switches), a smaller one only once every
ticket is back (grants stop at the end of the batch being filled). What still arrives too stale
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
    self.rollouts_per_update = cfg.rollouts_per_update
    self.in_flight_limit = cfg.max_in_flight  # F: the balancer may lower it (not below U)
    self._next_u: int | None = None  # a U asked for, waiting for where it may take force
    self._cond = threading.Condition()
    self._closed = False
    self.version = version
    self._tickets: dict[int, int] = {}  # ticket -> version when granted
    self._next_ticket = 0
    # Measurements, read by the metrics loop (plain ints and floats: torn reads are harmless).
    self.actor_blocked_s = 0.0
    self.dropped_stale = 0
    self.dropped_lag_hist: collections.Counter[int] = collections.Counter()  # their lags
    self.admitted = 0
    self.lag_hist: collections.Counter[int] = collections.Counter()
    self.lag_hist_since_log: collections.Counter[int] = collections.Counter()
    self.max_lag_seen = 0

  @property
  def in_flight(self) -> int:
    return len(self._tickets)

  def _may_start(self) -> bool:
    n, u = len(self._tickets), self.rollouts_per_update
    if self._closed or n == 0:
      return True
    if self._next_u is not None and self._next_u < u and n % u == 0:
      return False  # draining for a smaller U: the batch being filled is complete
    if n >= max(self.in_flight_limit, u):
      return False
    if self.max_lag is None:
      return True
    oldest = min(self._tickets.values())
    return self.version - oldest + n // u <= self.max_lag

  def configure(self, rollouts_per_update: int, in_flight: int) -> None:
    """The balancer's levers: U (the learner must be able to take it already) and F."""
    if rollouts_per_update < 1:
      raise ValueError(f"rollouts_per_update must be >= 1, got {rollouts_per_update}")
    with self._cond:
      if self.max_lag is not None:
        in_flight = min(in_flight, (self.max_lag + 1) * rollouts_per_update)
      self.in_flight_limit = max(in_flight, 1)
      same = rollouts_per_update == self.rollouts_per_update
      self._next_u = None if same else rollouts_per_update
      self._switch(at_batch_start=False)
      self._cond.notify_all()

  @property
  def pending_rollouts_per_update(self) -> int | None:
    """A U asked for and not yet in force (the learner has not started a batch since, or, for
    a smaller one, tickets are still out)."""
    return self._next_u

  def _switch(self, at_batch_start: bool) -> None:
    """Puts a pending U in force: with no ticket out (nothing is in any batch), or a larger one
    where the learner starts a batch (it has just published)."""
    nxt = self._next_u
    if nxt is not None and (not self._tickets or (at_batch_start
                                                  and nxt > self.rollouts_per_update)):
      self.rollouts_per_update, self._next_u = nxt, None

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
        self.dropped_lag_hist[lag] += 1
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
      self._release_locked(tickets, at_batch_start=True)

  def release(self, ticket: int) -> None:
    """Gives back a ticket whose rollout will never arrive (actor stopped or failed)."""
    with self._cond:
      self._release_locked([ticket])

  def _release_locked(self, tickets: list[int], at_batch_start: bool = False) -> None:
    for t in tickets:
      self._tickets.pop(t, None)
    self._switch(at_batch_start)
    self._cond.notify_all()

  def close(self) -> None:
    with self._cond:
      self._closed = True
      self._cond.notify_all()

  def lag_counts(self) -> dict[int, int]:
    """Every admitted rollout's lag so far, copied under the lock (the learner thread adds to
    it; the balancer reads it from the supervising thread)."""
    with self._cond:
      return dict(self.lag_hist)

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
