"""What --balance=auto's controller (balance.py) reads and moves: the levers (`Setting`), one
control window's measurements (`Window`, pooled over several), the run's fixed `Bounds`, and a
`Decision` with its reason."""

from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class Setting:
  """The levers. `in_flight` is F; `samples_per_insert` is None for on-policy learners."""

  rollouts_per_update: int
  in_flight: int
  active_actors: int
  samples_per_insert: float | None = None


UPDATES_PER_WINDOW = 2  # a counted window holds at least this many updates' worth of rollouts


def holds_evidence(consumed: int, rollouts_per_update: int, learned: int) -> bool:
  """Whether a window may close: rollouts were learned from in it and, timed between finished
  updates (`learned` > 0), one update finished in it; counted, two updates' worth were learned
  (a count read at the tick is off by up to one update). Two updates made a slow learner's
  windows 10-15 s long (U = 12 at 0.5 s a rollout in the plant), and a timed window has no
  rounding to pool away."""
  return consumed > 0 and (learned > 0 or consumed >= UPDATES_PER_WINDOW * rollouts_per_update)


Mark = tuple[float, int, float]  # a completion mark: (time, rollouts admitted, learner idle s)


def between_marks(now: Mark | None, last: Mark | None) -> tuple[int, float, float]:
  """(rollouts learned, seconds, learner busy seconds) between the finished updates of two
  completion marks (`LearnerLoop.consumption_mark`); zeros where either is missing. The idle
  seconds a mark carries are those at its update's dispatch, which are those at its finish (a
  computing update is busy time), so the busy seconds between two finishes follow."""
  if now is None or last is None:
    return 0, 0.0, 0.0
  seconds, learned, idle_s = (a - b for a, b in zip(now, last, strict=True))
  learned, seconds = max(int(learned), 0), max(seconds, 0.0)
  return learned, seconds, max(seconds - idle_s, 0.0) if learned else 0.0


def learner_rate(learned: int, busy_s: float, consumed: int, seconds: float,
                 idle: float) -> float:
  """Rollouts learned per busy learner second: whole updates over their busy seconds where
  timed, else the count over the window's busy share."""
  if learned > 0 and busy_s > 0:
    return learned / busy_s
  return consumed / max(seconds * (1 - idle), 1e-9)


@dataclasses.dataclass(frozen=True)
class Window:
  """One control window's measurements (fractions of its wall time, rates per second)."""

  learner_idle: float  # the learner waited for data with nothing to compute
  actors_blocked: float  # the active actors waited on tickets (or the learner's inserts)
  actor_rate: float  # rollouts per active actor per second not blocked
  learner_rate: float  # rollouts learned per busy learner second (timed as `learned` is)
  consumed: int  # rollouts learned from in the window
  lag_mean: float | None  # over those rollouts; None when none was learned
  lag_max: int | None = None
  seconds: float = 1.0
  # Rollouts learned from the last update finished before the window to the last finished in
  # it, and the seconds between the two: whole updates over their own time, so the throughput
  # carries no count's rounding. 0 where no update finished (or a plant does not time them).
  learned: int = 0
  learned_s: float = 0.0
  learned_busy_s: float = 0.0  # the learner's busy seconds of those (0 where not timed)

  @property
  def timed(self) -> bool:
    return self.learned > 0 and self.learned_s > 0

  @property
  def throughput(self) -> float:
    """Rollouts learned per second: between finished updates where timed, else the count."""
    if self.timed:
      return self.learned / self.learned_s
    return self.consumed / max(self.seconds, 1e-9)


def pooled(windows: list[Window]) -> Window:
  """Several windows as one: fractions weighted by seconds, lag by rollouts learned, the
  learner's rate over its busy seconds between finished updates where every window has them."""
  if len(windows) == 1:
    return windows[0]
  secs = sum(w.seconds for w in windows)
  consumed = sum(w.consumed for w in windows)
  lags = [w.lag_max for w in windows if w.lag_max is not None]
  timed = all(w.timed for w in windows)  # else the pooled throughput is the counts'
  busy_timed = timed and all(w.learned_busy_s > 0 for w in windows)
  if busy_timed:
    rate = sum(w.learned for w in windows) / sum(w.learned_busy_s for w in windows)
  else:
    rate = consumed / max(sum(w.seconds * (1 - w.learner_idle) for w in windows), 1e-9)
  return Window(
      learner_idle=sum(w.learner_idle * w.seconds for w in windows) / secs,
      actors_blocked=sum(w.actors_blocked * w.seconds for w in windows) / secs,
      actor_rate=sum(w.actor_rate * w.seconds for w in windows) / secs,
      learner_rate=rate, consumed=consumed,
      lag_mean=sum(w.lag_mean * w.consumed for w in windows) / consumed,
      lag_max=max(lags) if lags else None, seconds=secs,
      learned=sum(w.learned for w in windows) if timed else 0,
      learned_s=sum(w.learned_s for w in windows) if timed else 0.0,
      learned_busy_s=sum(w.learned_busy_s for w in windows) if busy_timed else 0.0)


@dataclasses.dataclass(frozen=True)
class Bounds:
  """What the controller may do and what it steers to, fixed for a run."""

  num_actors: int
  max_lag: int | None  # K; None when free running (no cap: F and U are not moved)
  u_choices: tuple[int, ...]  # the U values allowed (compilable, dividing the minibatches)
  slots_per_actor: int = 1  # rollouts an actor wants in flight (2 with async EnvPool)
  spi_range: tuple[float, float] | None = None  # replay: the SPI target's band
  spi_steps: int = 4  # moves from the centre of the band to an edge
  target_lag: float = 0.5
  target_idle: float = 0.2
  target_blocked: float = 0.15
  settle: int = 1
  judge_windows: int = 2  # windows pooled at a setting before it is judged or acted on
  undo_windows: int = 3  # windows a verdict that undoes a move reads (balance_verdict.typical)
  idle_cost: float = 0.05  # learner idle a move may add before it is undone
  rate_cost: float = 0.05  # throughput a move may cost before it is undone
  replan: float = 0.5

  def __post_init__(self):
    if self.judge_windows < 1:
      raise ValueError(f"judge_windows must be >= 1, got {self.judge_windows}")
    if self.undo_windows < 1:
      raise ValueError(f"undo_windows must be >= 1, got {self.undo_windows}")
    if not self.u_choices or min(self.u_choices) < 1:
      raise ValueError(f"u_choices must be positive, got {self.u_choices}")
    if self.max_lag is not None and self.target_lag > self.max_lag:
      raise ValueError(f"target_lag {self.target_lag} is above the cap K = {self.max_lag}")

  def waiting(self, blocked: float) -> bool:
    """Whether actors blocked `blocked` of the time wait by far (more than twice their target,
    and a third of the time), not at the margin: what the rules' pauses and regroups are for."""
    return blocked > max(2 * self.target_blocked, 0.3)

  def cap(self, u: int) -> int:
    """The most tickets U allows under K."""
    return (self.max_lag + 1) * u if self.max_lag is not None else u

  @property
  def moves_flight(self) -> bool:
    return self.max_lag is not None

  def u_covering(self, slots: int) -> int:
    """The smallest allowed U whose (K + 1) U covers `slots` (else the largest)."""
    for u in sorted(self.u_choices):
      if self.cap(u) >= slots:
        return u
    return max(self.u_choices)

  def u_finer(self, u: int) -> int | None:
    """2U if allowed, the largest allowed where 2U is beyond it, else the next allowed above
    U; None above the largest. Not U + 1 below the top: a step of a quarter rarely reads the
    gain a probe must make, and (K + 1) U tickets that do not divide among the actors waste
    some (512,512, this host, choices 1-6: U = 5 after 4 was undone on 2 of 4 seeds, which
    then held U = 4; the seeds that went 3 -> 6 ended at the best fixed setting's U)."""
    above = sorted(c for c in self.u_choices if c > u)
    if not above:
      return None
    double = min(2 * u, above[-1])
    return double if double in above else above[0]

  def spi_step(self, spi: float | None, direction: int) -> float | None:
    """The SPI target one step up (+1) or down (-1) within its band; None at an edge (or
    without replay)."""
    if self.spi_range is None or spi is None:
      return None
    lo, hi = self.spi_range
    new = min(max(spi + direction * (hi - lo) / (2 * self.spi_steps), lo), hi)
    return new if not math.isclose(new, spi) else None


@dataclasses.dataclass(frozen=True)
class Decision:
  setting: Setting
  lever: str  # a lever and direction (in_flight+, active_actors-, ...), undo, or hold
  reason: str
  window: Window
