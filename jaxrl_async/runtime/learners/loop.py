"""The learner thread: one loop around a step (on_policy.py, replay_step.py, global_step.py).

The loop owns what every learner does the same way: compile the step while the initial state
is computed, take admitted rollouts from the queue (whichever actor made them), call the step
when it is ready, publish params and release tickets, count non-finite updates, time its waits
and run the checkpoint hook. A step owns what differs: how rollouts become updates (U rollouts
per update, or a replay between them), its budget, its compiled functions, and what it adds to
metrics and checkpoints.

The learner never reads a result back to the host on its critical path: params are published as
soon as a step is dispatched, and metrics stay on device until the monitor asks.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import queue as queue_lib
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from jaxrl_async.algos.base import Rollout
from jaxrl_async.metrics import Counters
from jaxrl_async.runtime.pipeline.balance_window import Mark
from jaxrl_async.runtime.pipeline.queue import QueueClosed, RolloutQueue
from jaxrl_async.runtime.pipeline.rate import RateController

_WAKE_S = 0.1
_CLOSED = object()


@dataclasses.dataclass
class LearnerTimers(Counters):
  """The learner thread writes them; the monitor, the balancer and the summary read
  `snapshot()`s."""

  idle_s: float = 0.0  # waiting for rollouts with nothing to compute (the last update done)
  compute_wait_s: float = 0.0  # waiting for rollouts while the last update still computes
  dispatch_s: float = 0.0  # calling the compiled step and publishing
  compile_s: float = 0.0
  updates: int = 0  # versions the params moved in this session
  consumed_env_steps: int = 0  # counted with reuse (epochs, replay samples)
  first_update_wall_s: float | None = None


class Completions:
  """When the dispatched updates finished, timed by a thread that blocks on each in turn (no
  polling, nothing read back on the learner's path): dispatch returns at once, so the learner
  waiting for rollouts while its update still computes is busy, not idle.

  Each update carries a mark, the rollouts admitted and the learner's idle seconds when it was
  dispatched; `last()` pairs the newest finished update's mark with its time. Consumption read
  between two such events counts whole updates over the time they took, where a count read at a
  clock tick is off by up to one update's rollouts (at U = 6 and 32 rollouts/s, up to 19% of a
  1-s window). The idle seconds at dispatch are those at its finish too (an update that
  computes is busy time), so two marks also give the busy seconds between them."""

  def __init__(self):
    self._flags: queue_lib.SimpleQueue = queue_lib.SimpleQueue()
    self._lock = threading.Lock()
    self._pending = 0
    self._done_at: float | None = None  # when the newest finished
    self._last: Mark | None = None  # (when, *its mark): the newest finished
    self._closed = threading.Event()
    self._thread = threading.Thread(target=self._run, name="learner-completions", daemon=True)
    self._thread.start()

  def add(self, flag: Any, mark: tuple[int, float] = (0, 0.0)) -> None:
    with self._lock:
      self._pending += 1
    self._flags.put((flag, mark))

  def last(self) -> Mark | None:
    """(perf_counter time, *mark) of the newest finished update; None before the first."""
    with self._lock:
      return self._last

  def busy(self, t0: float, t1: float) -> float:
    """The seconds of [t0, t1] an update still computed."""
    with self._lock:
      if self._pending:
        return t1 - t0
      return min(max(self._done_at - t0, 0.0), t1 - t0) if self._done_at is not None else 0.0

  def close(self) -> None:
    self._closed.set()
    self._thread.join(timeout=_WAKE_S * 10)

  def _run(self) -> None:
    while not (self._closed.is_set() and self._flags.empty()):
      try:
        flag, mark = self._flags.get(timeout=_WAKE_S)
      except queue_lib.Empty:
        continue
      getattr(flag, "block_until_ready", lambda: None)()  # an update always finishes
      with self._lock:
        self._pending -= 1
        self._done_at = time.perf_counter()
        self._last = (self._done_at, *mark)


class Advance(NamedTuple):
  """What one call of a step did."""

  state: Any
  metrics: Any  # the update's metrics on device; None for a call that did not update (insert)
  versions: int  # how far the params' version moved (0 for an insert)
  tickets: tuple[int, ...]  # tickets this call is done with
  consumed_env_steps: int


class LearnerStep(Protocol):
  """What the loop needs from a learner variant."""

  def compile(self, abstract_state: Any) -> None:
    """Compiles against the state's shapes (before the state itself exists)."""

  def prepare(self, state: Any, version: int, stop: threading.Event) -> bool:
    """Once the state is there (a replay's restore, a budget counted from it); False if the run
    stopped meanwhile."""

  def wants(self) -> bool:
    """Whether to take another rollout now."""

  def add(self, rollout: Rollout, ticket: int) -> None: ...

  def ready(self) -> bool:
    """Whether `call` has work now."""

  def call(self, state: Any, version: int) -> Advance: ...

  def done(self, version: int) -> bool:
    """The budget is spent."""

  def extra_metrics(self, idle_s: float) -> dict[str, Any]:
    """Host values only (reading them never touches the device); `idle_s` is the loop's."""

  def snapshot(self) -> tuple[Any, dict[str, Any]] | None:
    """(arrays, host counters) a checkpoint saves beside the state, or None. Called in the
    learner thread (the checkpoint hook) or after it ended, so the two agree."""

  def counters(self) -> dict[str, Any]:
    """Host counters a checkpoint's meta records with the run's (a resume hands them back
    through the step's constructor), called where `snapshot` is."""

  def save_agreed(self, version: int) -> bool:
    """Whether every process agreed to checkpoint at `version` (several processes; one
    process's own timer and update count decide alone, so there it is always False)."""

  def close(self, controller: RateController) -> None:
    """Releases what the step still holds (tickets of rollouts it never used)."""


class NonFiniteUpdates(RuntimeError):
  """Too many consecutive updates produced non-finite values."""


class LearnerLoop:
  """`run()` is the thread body; `state` and `version` are the learner's, read after join.

  `state` may be abstract (shapes only) until `state_future` delivers the real one, so the step
  compiles while the initial state is computed or restored. `after_update(version, state)` runs
  in this thread after each update (the trainer's checkpoint hook).
  """

  def __init__(self, step: LearnerStep, queue: RolloutQueue, controller: RateController,
               publish: Callable[[Any, int], None], stop: threading.Event,
               wall_s: Callable[[], float], max_nonfinite_updates: int, state: Any,
               version: int, state_future: Any = None, after_update: Any = None):
    self.step, self.queue, self.controller = step, queue, controller
    self.publish, self.stop, self.wall_s = publish, stop, wall_s
    self.max_nonfinite_updates = max_nonfinite_updates
    self.state, self.version = state, version
    self._state_future = state_future
    self.after_update = after_update
    self.timers = LearnerTimers()
    self.last_metrics: Any = None
    self.compiled = threading.Event()
    self.finished = threading.Event()  # the budget is spent
    self.nonfinite_skipped = 0
    self._nonfinite_run = 0
    self._pending_flag: Any = None
    self._completions: Completions | None = None

  def extra_metrics(self) -> dict[str, Any]:
    return self.step.extra_metrics(self.timers.idle_s)

  def consumption_mark(self) -> Mark | None:
    """(perf_counter time, rollouts admitted by then, idle seconds by then) at the newest
    finished update."""
    completions = self._completions
    return completions.last() if completions is not None else None

  def run(self) -> None:
    t0 = time.perf_counter()
    self.step.compile(self.state)
    self.timers.compile_s = time.perf_counter() - t0
    self.compiled.set()
    if not self._await_state() or not self.step.prepare(self.state, self.version, self.stop):
      return
    self._completions = Completions()
    try:
      while not self.stop.is_set():
        if self.step.done(self.version):
          self.finished.set()
          return
        if self.step.wants() and not self._take():
          return
        if self.step.ready():
          self._advance()
    finally:
      self._completions.close()
      self.step.close(self.controller)

  def _await_state(self) -> bool:
    while self._state_future is not None and not self.stop.is_set():
      try:
        self.state = self._state_future.result(timeout=_WAKE_S)
        self._state_future = None
      except concurrent.futures.TimeoutError:
        continue
    return self._state_future is None

  def _take(self) -> bool:
    """Hands the step the next admitted rollout, if one comes; False at shutdown. Never sits on
    the queue while the step has work; a wait with nothing to do is the learner's idle time."""
    ready = self.step.ready()
    try:
      item = self.queue.get(0.0) if ready else self._wait()
    except QueueClosed:
      return False
    if item is not None:
      rollout, info = item
      # The controller drops a rollout that arrives too stale (counted there).
      if self.controller.admit(info.ticket, info.behaviour_version):
        self.step.add(rollout, info.ticket)
    return True

  def _wait(self) -> Any:
    """The queue's next item, its wait split into the last update's compute and idle."""
    t0 = time.perf_counter()
    item = self.queue.get(_WAKE_S)
    t1 = time.perf_counter()
    busy = self._completions.busy(t0, t1) if self._completions is not None else 0.0
    self.timers.compute_wait_s += busy
    self.timers.idle_s += t1 - t0 - busy
    return item

  def _advance(self) -> None:
    t0 = time.perf_counter()
    out = self.step.call(self.state, self.version)
    self.state = out.state
    if out.versions:
      self.version += out.versions
      self.last_metrics = out.metrics
      self.publish(self.state, self.version)
    self.controller.published(self.version, list(out.tickets))
    if not out.versions:
      return
    with self.timers.lock:
      self.timers.dispatch_s += time.perf_counter() - t0
      self.timers.updates += out.versions
      self.timers.consumed_env_steps += out.consumed_env_steps
      if self.timers.first_update_wall_s is None:
        self.timers.first_update_wall_s = self.wall_s()
    self._completions.add(out.metrics["nonfinite"], (self.controller.admitted, self.timers.idle_s))
    self._count_nonfinite(out.metrics["nonfinite"])
    if self.after_update is not None:
      self.after_update(self.version, self.state)

  def _count_nonfinite(self, flag: Any) -> None:
    """Reads the previous update's flag (finished by now, as the new update depends on it)."""
    previous, self._pending_flag = self._pending_flag, flag
    if previous is None:
      return
    if bool(previous):
      self.nonfinite_skipped += 1
      self._nonfinite_run += 1
      if self._nonfinite_run >= self.max_nonfinite_updates:
        raise NonFiniteUpdates(
            f"{self._nonfinite_run} consecutive updates had non-finite loss or gradients "
            f"(--max_nonfinite_updates={self.max_nonfinite_updates}); each was skipped, so the "
            "params and the last checkpoint are the last finite ones")
    else:
      self._nonfinite_run = 0
