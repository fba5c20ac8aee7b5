"""A bounded FIFO of device-resident rollouts, with timeouts and a close that wakes everyone."""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from typing import Any


class QueueClosed(Exception):
  """Raised by put/get once the queue is closed (shutdown)."""


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

  Every blocking call takes a timeout and returns (None / False) when it expires, so callers
  can look at their shutdown flag; `close()` wakes all waiters, which then raise QueueClosed.
  """

  def __init__(self, capacity: int):
    if capacity < 1:
      raise ValueError(f"queue capacity must be >= 1, got {capacity}")
    self.capacity = capacity
    self._items: collections.deque = collections.deque()
    self._cond = threading.Condition()
    self._closed = False
    self.max_depth = 0
    self.put_wait_s = 0.0
    self.get_wait_s = 0.0

  def put(self, item: Any, timeout: float) -> bool:
    t0 = time.perf_counter()
    with self._cond:
      ok = self._cond.wait_for(lambda: self._closed or len(self._items) < self.capacity, timeout)
      self.put_wait_s += time.perf_counter() - t0
      if self._closed:
        raise QueueClosed
      if not ok:
        return False
      self._items.append(item)
      self.max_depth = max(self.max_depth, len(self._items))
      self._cond.notify_all()
      return True

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
