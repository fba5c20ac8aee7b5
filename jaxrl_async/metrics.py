"""Run statistics and their writers: episode returns, the JSONL log, the console progress line."""

from __future__ import annotations

import collections
import copy
import json
import math
import os
import threading
import time
from pathlib import Path
from typing import Any

# The actor's per-step path (runtime/pipeline/actor.py, ActorTimers), in the order a step takes it;
# metrics.jsonl carries each as cumulative seconds summed over the actor threads.
STEP_SPLIT = ("env_recv_s", "h2d_s", "inference_s", "d2h_s", "env_send_s", "write_s")


class Counters:
  """Counters one thread writes and other threads read (a dataclass's fields).

  The writer holds `lock` while it updates fields that are read together (a rollout's count
  with the time it took to queue it); a reader of more than one field takes `snapshot()`, a
  copy made under the lock, so the fields it combines come from one moment. A single field
  needs neither: the writer is the only one to change it, and one attribute load is atomic.
  """

  def __post_init__(self):
    self.lock = threading.Lock()  # not a field: asdict() and equality leave it out

  def snapshot(self):
    with self.lock:
      return copy.copy(self)


def process_start_time() -> float:
  """Wall-clock time the process started (Linux /proc), so `wall_s` includes imports."""
  try:
    ticks = os.sysconf("SC_CLK_TCK")
    start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
    age = time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / ticks
    return time.time() - age
  except (OSError, ValueError, IndexError, AttributeError):
    return _IMPORT_TIME


_IMPORT_TIME = time.time()
PROCESS_START = process_start_time()


def wall_s() -> float:
  return time.time() - PROCESS_START


class EpisodeStats:
  """Finished episodes from every actor; sets `solved` the moment the window mean hits target.

  Thread-safe: actors call `record`, the main thread reads.
  """

  def __init__(self, window: int, target: float, env_steps: Any):
    self._lock = threading.Lock()
    self._returns: collections.deque[float] = collections.deque(maxlen=window)
    self._lengths: collections.deque[int] = collections.deque(maxlen=window)
    self.window = window
    self.target = target
    self.episodes = 0
    self.solved = threading.Event()
    self.solved_wall_s: float | None = None
    self.solved_env_steps: int | None = None
    self._env_steps = env_steps  # callable returning the current env-step count

  def record(self, returns: Any, lengths: Any) -> None:
    if len(returns) == 0:
      return
    with self._lock:
      self._returns.extend(float(r) for r in returns)
      self._lengths.extend(int(n) for n in lengths)
      self.episodes += len(returns)
      if (not self.solved.is_set() and not math.isnan(self.target)
          and len(self._returns) == self.window
          and sum(self._returns) / self.window >= self.target):
        self.solved_wall_s = wall_s()
        self.solved_env_steps = int(self._env_steps())
        self.solved.set()

  def return_mean(self) -> float | None:
    with self._lock:
      return sum(self._returns) / len(self._returns) if self._returns else None

  def length_mean(self) -> float | None:
    with self._lock:
      return sum(self._lengths) / len(self._lengths) if self._lengths else None


class Ema:
  """Exponential moving average of a rate, from (count, time) samples."""

  def __init__(self, halflife_s: float = 5.0):
    self.halflife_s = halflife_s
    self.value: float | None = None
    self._last: tuple[float, float] | None = None

  def update(self, count: float, now: float) -> float | None:
    if self._last is not None and now > self._last[1]:
      rate = (count - self._last[0]) / (now - self._last[1])
      w = 0.5 ** ((now - self._last[1]) / self.halflife_s)
      self.value = rate if self.value is None else w * self.value + (1 - w) * rate
    self._last = (count, now)
    return self.value


class MetricsWriter:
  """Appends one JSON object per line to RUN_DIR/metrics.jsonl and prints a progress line."""

  def __init__(self, run_dir: Path, append: bool = False, quiet: bool = False,
               logger: Any = None):
    run_dir.mkdir(parents=True, exist_ok=True)
    self.path = run_dir / "metrics.jsonl"
    self._file = self.path.open("a" if append else "w")
    self.quiet = quiet
    self.logger = logger  # loggers.make_logger(...): TensorBoard or wandb, besides the JSONL

  def write(self, record: dict[str, Any]) -> None:
    self._file.write(json.dumps(record, default=_jsonable) + "\n")
    self._file.flush()
    if self.logger is not None:
      self.logger.write(record, int(record.get("env_steps", 0)))
    if not self.quiet:
      print(progress_line(record), flush=True)

  def close(self) -> None:
    self._file.close()
    if self.logger is not None:
      self.logger.close()


def _jsonable(x: Any) -> Any:
  try:
    return float(x)
  except (TypeError, ValueError):
    return str(x)


def progress_line(r: dict[str, Any]) -> str:
  ret = r.get("return_mean")
  ret_s = "   n/a" if ret is None else f"{ret:6.1f}"
  return (f"[{r['wall_s']:6.1f}s] steps {r['env_steps']:>9,} sps {r['sps']:>7,.0f} "
          f"ret {ret_s} ep {r['episodes']:>5} v {r['version']:>5} "
          f"lag {r['policy_lag_mean']:.2f}/{r['policy_lag_max']} q {r['queue_depth']} "
          f"blocked {100 * r['actor_blocked_frac']:4.1f}% "
          f"idle {100 * r['learner_idle_frac']:4.1f}% "
          f"drop {r['dropped_stale']}")
