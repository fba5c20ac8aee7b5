"""The newest published parameters and their version. Publishing never blocks the learner."""

from __future__ import annotations

import threading
import time
from typing import Any


class ParamStore:
  """Holds (params, version); `publish` replaces them, `latest` reads them, both O(1).

  The arrays may still be being computed when published (JAX dispatches asynchronously): an
  actor that reads them waits inside its own policy call, never the learner.
  """

  def __init__(self):
    self._lock = threading.Lock()
    self._params: Any = None
    self._version = -1
    self.fetch_s = 0.0
    self.fetches = 0

  def publish(self, params: Any, version: int) -> None:
    with self._lock:
      if version < self._version:
        raise ValueError(f"version went backwards: {version} < {self._version}")
      self._params, self._version = params, version

  def latest(self) -> tuple[Any, int]:
    t0 = time.perf_counter()
    with self._lock:
      params, version = self._params, self._version
    self.fetch_s += time.perf_counter() - t0
    self.fetches += 1
    return params, version

  @property
  def version(self) -> int:
    return self._version
