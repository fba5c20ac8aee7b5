"""How --balance=auto's controller (balance.py) judges a move: the evidence a verdict waits for,
and whether the move cost.

A move is judged by the windows after it against two lines: the windows of its stays at the
setting before it (a move may cost at most `rate_cost` of the throughput found there), and the
best throughput kept since the last replan (a move may not take the throughput out of
`rate_cost` of it). The second line keeps moves that each cost a little from adding up: fast
learner, this host, seed 0 of the balance grid at fe94a40, two rule moves of U with 3 actors,
each within 5% of the one before, ended at 0.90 of the best fixed setting (BUILD_NOTES).

Each side's throughput is `typical`: the median window's once there are three, for the 1-s
windows at a held setting dip. Over 12 auto runs of the fast regime (33-40 windows each from
50 s on, BUILD_NOTES), 1-9 windows per run fell under 0.9 of the run's median window, down to
0.77, and 0-3 rose over 1.1. A mean of two is pulled down by one such dip in about a fifth of
verdicts: on one seed, pauses to 2, 3 and 4 actors read losses of 10-17% and were undone, where
fixed runs of 3 actors made 1.04 of 6 in that hour. So a verdict that would undo a move waits
for `undo_windows` windows (3), whose median sets one dip aside."""

from __future__ import annotations

import collections
import dataclasses
import statistics
from collections.abc import Sequence

from jaxrl_async.runtime.pipeline.balance_window import Bounds, Setting, Window, pooled

TAKES_PRODUCTION = ("in_flight-", "finer", "active_actors-", "pause_waiting")
MUST_GAIN = ("active_actors+", "probe_u", "probe_regroup")  # off the rules' path
# A probe of fewer actors: kept on a tie (within half of `rate_cost`), for actors that make
# nothing the learner takes are spare: they only add threads, tickets held and lag. Held to a
# gain, 512,512 on this host kept 4-6 actors where fixed runs of 2-3 made 5-13% more: the
# probes read +1.7%, -1.6%, +2.3% and 0% (the learner idled 20-25% at the best fixed
# settings, so on either side of `target_idle`). By the throughput alone, as every probe:
# beside fewer threads the learner runs faster, so it idles more at the same throughput (a
# tie of -2% read idle 19% -> 26% and was undone as starved).
SPARE = ("probe_active",)
# The rules' moves of fewer hands for actors that wait on tickets while the learner idles (a
# pause to the actors the tickets employ, a regroup: half the hands, more tickets) may cost
# `rate_cost` only where they end the wait (`Bounds.waiting`), the balance they are made for;
# one after which the actors still wait must tie, as a spare: the actors paused only waited,
# so it freed no core the learner needs. Allowed 5% either way, pauses from 6 actors to 3
# (blocked 0.72 -> 0.43) and regroups from U = 1 with 3 to U = 2 with 1 each read within 5%
# and ended 8 seeds at 0.89-0.99 of the fixed 6 actors (fast learner, this host, 709768f,
# 0.931 over the 8: BUILD_NOTES); where such a move ends the wait, the fast pair was met at
# 0.96 of the best with blocked 0.15 (the host of b8133f2).
FOR_WAITING = ("pause_waiting", "regroup")
STAY_WINDOWS = 8  # the latest windows at a kept setting its throughput is read from
MEDIAN_FROM = 3  # windows from which a stretch's throughput is its median window's


@dataclasses.dataclass(frozen=True)
class Trial:
  kind: str  # the move: a lever and direction, or "finer" (U up, for lag)
  before: Setting
  window: Window  # the pooled windows that decided it
  stay: tuple[Window, ...] = ()  # the windows at `before` (`Kept.stay`), for its throughput


def typical(windows: Sequence[Window]) -> float:
  """A stretch's throughput: the median window's where there are `MEDIAN_FROM` or more (a dip
  in one window is set aside), else the pool's (whole updates over their time)."""
  if len(windows) >= MEDIAN_FROM:
    return statistics.median(w.throughput for w in windows)
  return pooled(list(windows)).throughput


def was(trial: Trial) -> float:
  """The throughput before the move: over its stay where one was kept."""
  return typical(trial.stay) if trial.stay else trial.window.throughput


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
  """Whether a first window after a move lost five times what a move may cost, and more than
  its grain: then it is a verdict on its own (a failed probe of half the actors costs half the
  throughput while it lasts). Five, not three: single windows dip to 0.77 of the median."""
  loss = max(5 * rate_cost, grain(trial, u_now, w))
  return w.throughput < (1 - loss) * was(trial)


def close_call(trial: Trial, after: Sequence[Window], bounds: Bounds) -> bool:
  """Whether the throughput since the move lies within `rate_cost` of its verdict's line (a
  4-s throughput moves by 3% (sd) at a fixed setting on this host, so a 2-window verdict
  near the line is a coin toss)."""
  c = bounds.rate_cost
  return abs(typical(after) / max(was(trial), 1e-9) - line(trial, after, bounds)) < c


def line(trial: Trial, after: Sequence[Window], bounds: Bounds) -> float:
  """The share of the throughput before a move that keeps it: a gain off the rules' path, a
  tie for a spare (or a move for waiting actors after which they still wait), else at most
  `rate_cost` lost."""
  c = bounds.rate_cost
  if trial.kind in MUST_GAIN:
    return 1 + c / 2
  if trial.kind in SPARE:
    return 1 - c / 2
  still = trial.kind in FOR_WAITING and bounds.waiting(pooled(list(after)).actors_blocked)
  return 1 - c / 2 if still else 1 - c


def starved(trial: Trial, w: Window, idle_cost: float) -> bool:
  """Whether the learner idled more than `idle_cost` more after the move than before it."""
  return w.learner_idle > max(trial.window.learner_idle, 0.0) + idle_cost


def verdict(trial: Trial, after: Sequence[Window], bounds: Bounds,
            best: tuple[Setting, tuple[Window, ...]] | None) -> str | None:
  """Why the move is undone, or None where it is kept."""
  now, before, c = typical(after), was(trial), bounds.rate_cost
  w, idle_before = pooled(list(after)), trial.window.learner_idle
  cost = now < line(trial, after, bounds) * before
  if trial.kind in TAKES_PRODUCTION and now <= before:
    cost = cost or starved(trial, w, bounds.idle_cost)
  if cost:
    return (f"throughput {now:.1f} rollouts/s (was {before:.1f}), learner idle "
            f"{100 * w.learner_idle:.0f}% (was {100 * idle_before:.0f}%) after {trial.kind}")
  if best is None:
    return None
  at, kept = best
  band = (1 - c) * typical(kept)
  if before >= band > now:  # out of the band (not where it was out already)
    return (f"throughput {now:.1f} rollouts/s after {trial.kind} (was {before:.1f}), under "
            f"{100 * (1 - c):.0f}% of the best kept since the last replan, "
            f"{typical(kept):.1f} at U = {at.rollouts_per_update}, F = {at.in_flight}, "
            f"{at.active_actors} actors")
  return None


class Kept:
  """The windows of every setting kept since the last replan (judged and not undone, or never
  moved from): its latest, up to `STAY_WINDOWS`, over all its stays (more than a verdict's
  two, so the best of a few settings is less a best of their noise). Over all its stays, not
  its latest alone: a setting returned to by an undo stays 3 windows before the next move,
  and one such stay's dip became the line for the moves after it (fast learner, this host:
  U = 1 with 6 actors made 145 and 144 rollouts/s in two stays and 138 in a third; two moves
  that each cost 3% of the one before ended at 0.91 of it)."""

  def __init__(self):
    self._stay: collections.deque = collections.deque(maxlen=STAY_WINDOWS)
    self._kept: dict[Setting, tuple[Window, ...]] = {}
    self._earlier: tuple[Window, ...] | None = None  # the kept setting's earlier stays
    self._reached: dict[Setting, Trial] = {}  # the kept move to each setting, till judged again

  def reached(self, setting: Setting, trial: Trial) -> None:
    self._reached[setting] = trial

  def due(self, setting: Setting) -> Trial | None:
    """The kept move that reached `setting`, once its stays hold `STAY_WINDOWS` windows: to be
    judged again over them, against the stays before it as they are now. A verdict reads its
    first 2-4 windows, and a tie there can be a loss over the stay (512,512, this host: a
    probe 2 -> 1 actors read 35.3-36.5 rollouts/s against 36.3 for its first 8 windows and
    33.2-34.9 from 11 s on; fast learner: a pause 6 -> 3 kept on its first windows made 0.97
    of 6 over its stays)."""
    if setting not in self._reached or len(self._kept.get(setting, ())) < STAY_WINDOWS:
      return None
    trial = self._reached.pop(setting)
    return dataclasses.replace(trial, stay=self._kept.get(trial.before, trial.stay))

  def add(self, w: Window) -> None:
    self._stay.append(w)

  def stay(self, setting: Setting) -> tuple[Window, ...]:
    """The windows of `setting`, in force since it settled: over its stays where it is kept."""
    kept = self._kept.get(setting) if self._earlier is not None else None
    return kept if kept is not None else tuple(self._stay)

  def keep(self, setting: Setting) -> None:
    if not self._stay:
      return
    if self._earlier is None:  # this stay's first keep
      self._earlier = self._kept.get(setting, ())
    self._kept[setting] = (self._earlier + tuple(self._stay))[-STAY_WINDOWS:]

  def best(self, but: Setting) -> tuple[Setting, tuple[Window, ...]] | None:
    """The kept setting of the most throughput, other than `but` (the one being judged)."""
    others = [(s, ws) for s, ws in self._kept.items() if s != but]
    return max(others, key=lambda sw: typical(sw[1])) if others else None

  def moved(self) -> None:
    self._stay.clear()
    self._earlier = None

  def forget(self) -> None:
    self.moved()
    self._kept.clear()
    self._reached.clear()
