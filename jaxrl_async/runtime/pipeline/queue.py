"""A bounded FIFO of device-resident rollouts, with timeouts and a close that wakes everyone."""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from typing import Any


class QueueClosed(Exception):
  """Raised by put/get once the queue is closed (shutdown)."""


class QueueOverflow(RuntimeError):
  """A put beyond the bound: a rollout was made without a ticket."""


@dataclasses.dataclass
class RolloutInfo:
  """Host-side facts about a rollout; the arrays themselves are already on the learner devices."""

  actor_id: int
  ticket: int  # the rate controller's permit this rollout was made under
  behaviour_version: int
  env_steps: int
  produced_at: float


class RolloutQueue:
  """Bounded FIFO. Any consumer takes the oldest item, whichever actor made it.

  `get` takes a timeout and returns None when it expires, so the consumer can look at its
  shutdown flag; `close()` wakes it, and it then raises QueueClosed. `put` never waits (see
  there).
  """

  def __init__(self, capacity: int):
    if capacity < 1:
      raise ValueError(f"queue capacity must be >= 1, got {capacity}")
    self.capacity = capacity
    self._items: collections.deque = collections.deque()
    self._cond = threading.Condition()
    self._closed = False
    self.max_depth = 0
    self.get_wait_s = 0.0

  def put(self, item: Any) -> None:
    """Appends at once. The bound is an invariant, not a wait: every rollout holds a ticket
    until it is consumed, and the rate controller grants at most `max_in_flight` <= capacity
    tickets, so a full queue means a rollout without a ticket, which is a bug, not back-pressure.
    """
    with self._cond:
      if self._closed:
        raise QueueClosed
      if len(self._items) >= self.capacity:
        raise QueueOverflow(f"rollout queue full ({self.capacity}): more rollouts than tickets")
      self._items.append(item)
      self.max_depth = max(self.max_depth, len(self._items))
      self._cond.notify_all()

  def get(self, timeout: float) -> Any | None:
    t0 = time.perf_counter()
    with self._cond:
      ok = self._cond.wait_for(lambda: self._closed or self._items, timeout)
      self.get_wait_s += time.perf_counter() - t0
      if self._closed:
        raise QueueClosed
      if not ok:
        return None
      item = self._items.popleft()
      self._cond.notify_all()
      return item

  def close(self) -> None:
    with self._cond:
      self._closed = True
      self._items.clear()
      self._cond.notify_all()

  @property
  def closed(self) -> bool:
    return self._closed

  def __len__(self) -> int:
    return len(self._items)
