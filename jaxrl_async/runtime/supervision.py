"""Threads that report their failures, restart when allowed, and always let shutdown finish."""

from __future__ import annotations

import threading
import time
import traceback
from typing import Any

from absl import logging

JOIN_TIMEOUT_S = 10.0
# A thread in a call nothing can wake (an XLA compile, EnvPool's construction) gets this long at
# shutdown, then is left to end on its own: it is a daemon, and it sees the stop when it returns.
STUCK_JOIN_S = 0.5


class ThreadFailed(RuntimeError):
  """A component thread raised; the message carries its traceback."""


class Supervised(threading.Thread):
  """A daemon thread running `target()`. An exception is logged with its traceback; the target
  is restarted up to `restarts` times (unless shutdown began), then the error is kept for the
  main thread and the stop event is set."""

  def __init__(self, name: str, target: Any, stop: threading.Event, restarts: int = 0,
               on_restart: Any = None):
    super().__init__(name=name, daemon=True)
    self._target_fn, self._stop_event = target, stop
    self.restarts_left, self._on_restart = restarts, on_restart
    self.restarts = 0
    self.error: str | None = None

  def run(self) -> None:
    while True:
      try:
        self._target_fn()
        return
      except BaseException:  # noqa: BLE001 - everything is reported to the main thread
        trace = traceback.format_exc()
        if self.restarts_left > 0 and not self._stop_event.is_set():
          self.restarts_left -= 1
          self.restarts += 1
          logging.warning("%s failed; restarting (%d restarts left):\n%s", self.name,
                          self.restarts_left, trace)
          if self._on_restart is not None:
            self._on_restart()
          continue
        self.error = f"{self.name} failed:\n{trace}"
        self._stop_event.set()
        return


def join_all(threads: list[threading.Thread], timeout_s: float = JOIN_TIMEOUT_S,
             stuck: frozenset[str] | set[str] = frozenset()) -> list[str]:
  """Joins within one shared deadline; returns the names of threads still alive. Threads named
  in `stuck` are joined last, within STUCK_JOIN_S of their own."""
  threads = [t for t in threads if t.ident is not None]  # started
  deadline = time.time() + timeout_s
  for t in threads:
    if t.name not in stuck:
      t.join(max(0.0, deadline - time.time()))
  deadline = min(deadline, time.time() + STUCK_JOIN_S)
  for t in threads:
    if t.name in stuck:
      t.join(max(0.0, deadline - time.time()))
  return [t.name for t in threads if t.is_alive()]


def stop_phase(learner: Any, actors: list[Any], start_version: int) -> str:
  """Where a run was when it stopped (summary.json's `stop_phase`): "compilation" (the initial
  state or its restore, the policies, the update), "env_construction", "first_rollout" (no
  update yet this session) or "training"."""
  if not actors:
    return "compilation"
  if not all(a.pool_ready for a in actors):
    return "env_construction"
  if not learner.compiled.is_set():
    return "compilation"
  if learner.version == start_version:
    return "first_rollout"
  return "training"


def uninterruptible(learner: Any, actors: list[Any]) -> set[str]:
  """Threads in a call nothing can wake: the learner's compile, an env pool's construction."""
  names = {f"actor-{a.index}" for a in actors if not a.pool_ready}
  if not learner.compiled.is_set():
    names.add("learner")
  return names
