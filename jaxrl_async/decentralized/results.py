"""What a run leaves behind (`RunResult`), and the records a simulated run builds it from.

Shared by both runtimes: the simulator (`simulator.run`, through `Recorder`) and the process
runtime (`coordinator.run_processes`) return the same `RunResult`, made from the same records:
an error curve of (k, time, worst) and snapshots of (k, time, every node's error, consensus).
Numpy only.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from jaxrl_async.decentralized.problem import relative_errors
from jaxrl_async.decentralized.schedule import Chunk

Curve = list[tuple[int, float, float]]  # (k, time, worst relative error)
Snaps = list[tuple[int, float, np.ndarray, float]]  # (k, time, [N] errors, consensus)


class DivergenceError(RuntimeError):
  """The iterates blew up: the step sizes are too large for this problem and network."""


@dataclasses.dataclass
class RunResult:
  """What a run leaves behind.

  Attributes:
    k, time, worst: [R] the error curve: events so far, virtual time (or wall seconds for the
      process runtime), worst node's relative error; every `record_every` events and per chunk.
    node_k, node_time: [S] the snapshots (once per chunk and at the end); node_err: [S, N]
      every node's relative error there; consensus: [S] max_i ||theta_i - mean|| / ||theta*||.
    theta: [N, d] final iterates. theta_star: [d].
    crossings: {tol: (k, time)} the event at which the worst error first fell below tol.
    updates, elapsed: totals at the end (events, virtual time). wall_s: host seconds spent.
    stopped: why the run ended ('tol', 'max_updates', 'max_time', 'wall').
  """

  k: np.ndarray
  time: np.ndarray
  worst: np.ndarray
  node_k: np.ndarray
  node_time: np.ndarray
  node_err: np.ndarray
  consensus: np.ndarray
  theta: np.ndarray
  theta_star: np.ndarray
  crossings: dict[float, tuple[int, float]]
  updates: int
  elapsed: float
  wall_s: float
  stopped: str
  extra: dict[str, Any] = dataclasses.field(default_factory=dict)

  @property
  def final_rel_error(self) -> float:
    return float(self.node_err[-1].max())

  @property
  def consensus_error(self) -> float:
    return float(self.consensus[-1])

  def time_to(self, tol: float) -> float | None:
    hit = self.crossings.get(tol)
    return None if hit is None else hit[1]

  def updates_to(self, tol: float) -> int | None:
    hit = self.crossings.get(tol)
    return None if hit is None else hit[0]


  @classmethod
  def from_records(cls, curve: Curve, snaps: Snaps, **rest: Any) -> RunResult:
    """The curve and snapshot fields from their records; `rest` gives the other fields."""
    return cls(
        k=np.array([c[0] for c in curve]), time=np.array([c[1] for c in curve]),
        worst=np.array([c[2] for c in curve]),
        node_k=np.array([s[0] for s in snaps]), node_time=np.array([s[1] for s in snaps]),
        node_err=np.stack([s[2] for s in snaps]), consensus=np.array([s[3] for s in snaps]),
        **rest)


def fit_rate(k: np.ndarray, err: np.ndarray, hi: float = 1e-2, lo: float = 1e-12) -> float:
  """c in err ~ C c^k, least squares on log(err) over the records with lo < err < hi.

  Restricting to that band drops the transient before the linear regime and the float64
  rounding floor after it. NaN when fewer than 3 records fall in the band.
  """
  k, err = np.asarray(k, np.float64), np.asarray(err, np.float64)
  band = (err < hi) & (err > lo) & np.isfinite(err)
  if band.sum() < 3:
    return math.nan
  slope = np.polyfit(k[band], np.log(err[band]), 1)[0]
  return float(np.exp(slope))


def consensus(theta: np.ndarray, theta_star: np.ndarray) -> float:
  """max_i ||theta_i - mean|| / ||theta*|| over the rows of theta [N, d]."""
  return float(np.max(np.linalg.norm(theta - theta.mean(0), axis=1))
               / np.linalg.norm(theta_star))


class Recorder:
  """A simulated run's records as it goes: the curve, a snapshot per chunk, the crossings.

  Each snapshot and (with `on_record`) each record goes out as it is made, so a long run can be
  watched; `result` assembles the `RunResult` at the end. Times are virtual; `t0` (host
  seconds) only feeds the wall-clock fields.
  """

  def __init__(self, theta_star: np.ndarray,
               on_record: Callable[[dict[str, Any]], None] | None = None):
    self.t0 = time.perf_counter()
    self.theta_star, self.on_record = theta_star, on_record
    self.curve: Curve = []
    self.snaps: Snaps = []
    self.crossings: dict[float, tuple[int, float]] = {}

  def snapshot(self, k: int, clock: float, theta: np.ndarray) -> None:
    errs = relative_errors(theta, self.theta_star)
    cons = consensus(theta, self.theta_star)
    self.snaps.append((k, clock, errs, cons))
    self.curve.append((k, clock, float(errs.max())))
    if self.on_record is not None:
      self.on_record({"k": k, "time": clock, "worst_rel_error": float(errs.max()),
                      "consensus_error": cons, "wall_s": time.perf_counter() - self.t0})

  def add_chunk(self, chunk: Chunk, worst: np.ndarray, wanted: list[float],
                record_every: int) -> None:
    """The first crossing of each `wanted` tolerance in this chunk, exact to the event, and
    (with `record_every`) its curve records; call before the chunk's snapshot."""
    # Events come in read order and compute times differ, so completions are not monotone: an
    # event's time is the latest completion so far.
    clock_at = np.maximum.accumulate(np.maximum(chunk.done, self.snaps[-1][1]))
    for t in wanted:
      hit = np.flatnonzero(worst < t)
      if t not in self.crossings and hit.size:
        self.crossings[t] = (int(chunk.k[hit[0]]) + 1, float(clock_at[hit[0]]))
    if record_every:
      pos = np.flatnonzero((chunk.k + 1) % record_every == 0)
      self.curve += [(int(chunk.k[p]) + 1, float(clock_at[p]), float(worst[p])) for p in pos]

  def result(self, theta: np.ndarray, updates: int, elapsed: float, stopped: str,
             extra: dict[str, Any]) -> RunResult:
    self.curve.sort()
    return RunResult.from_records(
        self.curve, self.snaps, theta=theta, theta_star=self.theta_star,
        crossings=self.crossings, updates=updates, elapsed=elapsed,
        wall_s=time.perf_counter() - self.t0, stopped=stopped, extra=extra)
