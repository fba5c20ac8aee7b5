"""Reverb's SampleToInsertRatio rate limiter, host-side, counted in transitions.

The limiter holds the reuse ratio (samples per insert, SPI): sampled transitions per inserted
transition. Until `min_size_to_sample` transitions are in, sampling is blocked and inserts are
free (the warm-up). From then on, with I and S the transitions inserted and sampled since the
warm-up ended, it keeps

    -error_buffer <= SPI * I - S <= error_buffer

by refusing an insert that would leave the learner too far behind (SPI * I - S above the
buffer) and a sample that would put it too far ahead (below it), as Reverb's limiter does.
The measured ratio S / I is then within error_buffer / I of SPI: inside a tolerance `tol`
once I >= error_buffer / tol.

Inserts and samples come in chunks (a rollout's T x E transitions, a batch). For one of the
two always to be allowed, the buffer must cover a chunk of each:
2 error_buffer >= SPI * insert_chunk + sample_chunk (`min_error_buffer`); otherwise the
constructor raises.

No arrays here, only counts. Thread-safe. `await_insert` / `await_sample` block with a timeout
(and wake on `close`) and measure the time they blocked; a single-threaded learner uses the
non-blocking `can_insert` / `can_sample` instead and measures its own waits.
"""

from __future__ import annotations

import threading
import time
from typing import Any


def min_error_buffer(samples_per_insert: float, insert_chunk: int, sample_chunk: int) -> float:
  """The smallest error buffer with which an insert or a sample is always allowed."""
  return 0.5 * (samples_per_insert * insert_chunk + sample_chunk)


class SampleToInsertRatio:

  def __init__(self, samples_per_insert: float, min_size_to_sample: int, error_buffer: float,
               insert_chunk: int, sample_chunk: int):
    if samples_per_insert <= 0:
      raise ValueError(f"samples_per_insert must be > 0, got {samples_per_insert}")
    if min_size_to_sample < 1:
      raise ValueError(f"min_size_to_sample must be >= 1, got {min_size_to_sample}")
    need = min_error_buffer(samples_per_insert, insert_chunk, sample_chunk)
    if error_buffer < need:
      raise ValueError(
          f"error_buffer {error_buffer:g} must be >= {need:g} = (samples_per_insert x "
          f"insert_chunk + sample_chunk) / 2, or inserts and samples could both be refused")
    self.samples_per_insert = float(samples_per_insert)
    self.min_size_to_sample = int(min_size_to_sample)
    self.error_buffer = float(error_buffer)
    self.insert_chunk, self.sample_chunk = int(insert_chunk), int(sample_chunk)
    self._cond = threading.Condition()
    self._closed = False
    self.inserted = 0  # every transition inserted, warm-up included
    self.sampled = 0
    self.warm_inserted: int | None = None  # `inserted` when the warm-up ended
    self._ref: tuple[int, int, float] | None = None  # inserted, sampled, error at an SPI change
    # Time callers of await_insert / await_sample spent blocked.
    self.insert_blocked_s = 0.0
    self.sample_blocked_s = 0.0

  # -- the rule ----------------------------------------------------------------------------

  def _diff(self) -> float:
    """SPI * I - S since the warm-up: > 0 means the learner is behind. After a change of SPI
    (`set_samples_per_insert`) the new ratio counts from the change, on top of the error then."""
    assert self.warm_inserted is not None
    ref_inserted = self.warm_inserted if self._ref is None else self._ref[0]
    ref_sampled, credit = (0, 0.0) if self._ref is None else self._ref[1:]
    return (credit + self.samples_per_insert * (self.inserted - ref_inserted)
            - (self.sampled - ref_sampled))

  def set_samples_per_insert(self, samples_per_insert: float) -> None:
    """A new target ratio (--balance=auto, within --spi_tolerance), continuing the error so far:
    neither side gets a burst from the change. The error buffer must still cover a chunk of
    each (see the module's docstring)."""
    need = min_error_buffer(samples_per_insert, self.insert_chunk, self.sample_chunk)
    if samples_per_insert <= 0 or self.error_buffer < need:
      raise ValueError(f"samples_per_insert {samples_per_insert:g} needs an error buffer >= "
                       f"{need:g} (it is {self.error_buffer:g}) and must be > 0")
    with self._cond:
      if self.warm_inserted is not None:
        self._ref = (self.inserted, self.sampled, self._diff())
      self.samples_per_insert = float(samples_per_insert)
      self._cond.notify_all()

  def _insert_ok(self, n: int) -> bool:
    if self.warm_inserted is None:
      return True
    return self._diff() + self.samples_per_insert * n <= self.error_buffer

  def _sample_ok(self, n: int) -> bool:
    if self.warm_inserted is None:
      return False
    return self._diff() - n >= -self.error_buffer

  def can_insert(self, n: int | None = None) -> bool:
    with self._cond:
      return self._insert_ok(self.insert_chunk if n is None else n)

  def can_sample(self, n: int | None = None) -> bool:
    with self._cond:
      return self._sample_ok(self.sample_chunk if n is None else n)

  # -- recording ---------------------------------------------------------------------------

  def record_insert(self, n: int | None = None) -> None:
    with self._cond:
      self.inserted += self.insert_chunk if n is None else n
      if self.warm_inserted is None and self.inserted >= self.min_size_to_sample:
        self.warm_inserted = self.inserted
      self._cond.notify_all()

  def record_sample(self, n: int | None = None) -> None:
    with self._cond:
      self.sampled += self.sample_chunk if n is None else n
      self._cond.notify_all()

  # -- blocking waits, for callers in threads of their own -----------------------------------

  def await_insert(self, timeout: float, n: int | None = None) -> bool:
    """Waits until an insert of n is allowed; False on timeout or close."""
    n = self.insert_chunk if n is None else n
    t0 = time.perf_counter()
    with self._cond:
      ok = self._cond.wait_for(lambda: self._closed or self._insert_ok(n), timeout)
      self.insert_blocked_s += time.perf_counter() - t0
      return ok and not self._closed

  def await_sample(self, timeout: float, n: int | None = None) -> bool:
    """Waits until a sample of n is allowed; False on timeout or close."""
    n = self.sample_chunk if n is None else n
    t0 = time.perf_counter()
    with self._cond:
      ok = self._cond.wait_for(lambda: self._closed or self._sample_ok(n), timeout)
      self.sample_blocked_s += time.perf_counter() - t0
      return ok and not self._closed

  def close(self) -> None:
    with self._cond:
      self._closed = True
      self._cond.notify_all()

  # -- measurements ------------------------------------------------------------------------

  def ratio(self) -> float | None:
    """Sampled per inserted transition since the warm-up ended (None before any insert)."""
    with self._cond:
      if self.warm_inserted is None or self.inserted == self.warm_inserted:
        return None
      return self.sampled / (self.inserted - self.warm_inserted)

  def state_dict(self) -> dict[str, Any]:
    with self._cond:
      return {"inserted": self.inserted, "sampled": self.sampled,
              "warm_inserted": self.warm_inserted, "samples_per_insert": self.samples_per_insert,
              "ref": None if self._ref is None else list(self._ref)}

  def load_state_dict(self, state: dict[str, Any]) -> None:
    """Continues from `state_dict()`'s counters (a resumed run with its replay restored): the
    warm-up stays over and the ratio's error is carried over, so neither side gets a burst."""
    with self._cond:
      self.inserted, self.sampled = int(state["inserted"]), int(state["sampled"])
      warm = state["warm_inserted"]
      self.warm_inserted = None if warm is None else int(warm)
      ref = state.get("ref")  # absent in checkpoints from before SPI could move
      self._ref = None if ref is None else (int(ref[0]), int(ref[1]), float(ref[2]))
      self._cond.notify_all()
