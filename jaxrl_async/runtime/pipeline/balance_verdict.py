"""How --balance=auto's controller (balance.py) judges a move: the evidence a verdict waits for,
and whether the move cost.

A move is judged by the windows after it, pooled, against two lines: the windows just before it
(a move may cost at most `rate_cost` of the throughput it found), and the best throughput kept
since the last replan (a move may not take the throughput out of `rate_cost` of it). The second
line is what keeps moves that each cost a little from adding up: fast learner, this host, seed 0
of the balance grid at fe94a40, two rule moves of U with 3 actors, each within 5% of the one
before, ended at 0.90 of the best fixed setting (BUILD_NOTES)."""

from __future__ import annotations

import collections
import dataclasses

from jaxrl_async.runtime.pipeline.balance_window import Bounds, Setting, Window, pooled

TAKES_PRODUCTION = ("in_flight-", "finer", "active_actors-")
MUST_GAIN = ("active_actors+", "probe_u", "probe_active")  # off the rules' path
STAY_WINDOWS = 8  # the latest windows at a kept setting its throughput is read from


@dataclasses.dataclass(frozen=True)
class Trial:
  kind: str  # the move: a lever and direction, or "finer" (U up, for lag)
  before: Setting
  window: Window  # the pooled windows before it


def grain(trial: Trial, u_now: int, w: Window) -> float:
  """How far the ratio of the throughputs after and before a move can be off by counting
  alone: a count read at a clock tick is off by up to one update (U rollouts). At 512,512 on
  this host U = 3 learns 20 rollouts a second, so a 1-s window is +-15% by this alone; one
  that read 15% short undid a U whose fixed run was 9% faster. A window timed between
  finished updates (`Window.timed`) has no such rounding."""
  def one(u: int, window: Window) -> float:
    return 0.0 if window.timed else u / max(window.consumed, 1)
  return one(trial.before.rollouts_per_update, trial.window) + one(u_now, w)


def clearly_worse(trial: Trial, u_now: int, w: Window, rate_cost: float) -> bool:
  """Whether a first window after a move lost three times what a move may cost, and more than
  its grain: then it is a verdict on its own (a failed probe of half the actors costs half the
  throughput while it lasts)."""
  loss = max(3 * rate_cost, grain(trial, u_now, w))
  return w.throughput < (1 - loss) * trial.window.throughput


def close_call(trial: Trial, w: Window, rate_cost: float) -> bool:
  """Whether the throughput since the move lies within `rate_cost` of its verdict's line (a
  4-s throughput moves by 3% (sd) at a fixed setting on this host, so a 2-window verdict
  near the line is a coin toss)."""
  line = 1 + rate_cost / 2 if trial.kind in MUST_GAIN else 1 - rate_cost
  return abs(w.throughput / max(trial.window.throughput, 1e-9) - line) < rate_cost


def verdict(trial: Trial, w: Window, bounds: Bounds,
            best: tuple[Setting, Window] | None) -> str | None:
  """Why the move is undone, or None where it is kept."""
  before, c = trial.window, bounds.rate_cost
  if trial.kind in MUST_GAIN:
    # Off the rules' path (a resume, a probe), the status quo wins unless the move gains.
    cost = w.throughput < (1 + c / 2) * before.throughput
  else:
    cost = w.throughput < (1 - c) * before.throughput
    if trial.kind in TAKES_PRODUCTION and w.throughput <= before.throughput:
      cost = cost or w.learner_idle > max(before.learner_idle, 0.0) + bounds.idle_cost
  if cost:
    return (f"throughput {w.throughput:.1f} rollouts/s (was {before.throughput:.1f}), learner "
            f"idle {100 * w.learner_idle:.0f}% (was {100 * before.learner_idle:.0f}%) after "
            f"{trial.kind}")
  if best is None:
    return None
  at, kept = best
  line = (1 - c) * kept.throughput
  if before.throughput >= line > w.throughput:  # out of the band (not where it was out already)
    return (f"throughput {w.throughput:.1f} rollouts/s after {trial.kind} (was "
            f"{before.throughput:.1f}), under {100 * (1 - c):.0f}% of the best kept since the "
            f"last replan, {kept.throughput:.1f} at U = {at.rollouts_per_update}, F = "
            f"{at.in_flight}, {at.active_actors} actors")
  return None


class Kept:
  """The throughput of every setting kept since the last replan (judged and not undone, or
  never moved from), read over its latest windows there (up to `STAY_WINDOWS`: more than a
  verdict's two, so the best of a few settings is less a best of their noise)."""

  def __init__(self):
    self._stay: collections.deque = collections.deque(maxlen=STAY_WINDOWS)
    self._kept: dict[Setting, Window] = {}

  def add(self, w: Window) -> None:
    self._stay.append(w)

  def keep(self, setting: Setting) -> None:
    if self._stay:
      self._kept[setting] = pooled(list(self._stay))

  def best(self, but: Setting) -> tuple[Setting, Window] | None:
    """The kept setting of the most throughput, other than `but` (the one being judged)."""
    others = [(s, w) for s, w in self._kept.items() if s != but]
    return max(others, key=lambda sw: sw[1].throughput) if others else None

  def moved(self) -> None:
    self._stay.clear()

  def forget(self) -> None:
    self._stay.clear()
    self._kept.clear()
