"""The moves --balance=auto's controller (balance.py) makes off its rules' path: the probes,
and the joint move of both levers (`regroup`), as pure proposals from the setting in force and
the bounds found (`Found`); the controller makes and judges them.

Where actors share cores with the learner, a larger U (fewer, larger updates) or fewer actors
(fewer runnable threads) can make more than every actor working: measured on this 2-core
machine (BUILD_NOTES). Each probe is judged by throughput alone and kept only if it gains."""

from __future__ import annotations

import dataclasses
import math

from jaxrl_async.runtime.pipeline.balance_bounds import Found
from jaxrl_async.runtime.pipeline.balance_window import Bounds, Setting, Window


@dataclasses.dataclass(frozen=True)
class Proposal:
  setting: Setting
  kind: str  # the trial's kind (balance_verdict.MUST_GAIN and SPARE hold the probes')
  reason: str


def employed(b: Bounds, s: Setting, w: Window) -> int:
  """The actors at work at once: as many as the tickets employ where F is a lever, else the
  working share of the window (`w`, measured at `s`)."""
  if b.moves_flight:
    return math.ceil(s.in_flight / b.slots_per_actor)
  return math.ceil(s.active_actors * (1 - w.actors_blocked) - 1e-9)


def fewer(found: Found, s: Setting, actors: float) -> int:
  """Actors for a pause, in one move (one a window took most of a short run): `actors`
  rounded up; one fewer at least, never under the floor."""
  n = math.ceil(actors - 1e-9)
  return max(found.actors_floor(s.rollouts_per_update), min(s.active_actors - 1, n))


def probe(b: Bounds, s: Setting, found: Found, why: str, keep_lag: bool) -> Proposal | None:
  """Production-bound with every actor working: a larger U, else half the actors (one at a
  time took four probes to halve 6; a probe undone bisects), else both at once. With
  `keep_lag` (a busy learner) F scales with U, so the lag of a full pipeline, (F - U) / U,
  stays; else F is U's cap."""
  if b.moves_flight:
    u = b.u_finer(s.rollouts_per_update)
    if (u is not None and u <= found.u_ceiling(s.active_actors)
        and not (keep_lag and s.rollouts_per_update in found.no_finer)):  # tried for lag
      top = b.cap(u)
      f = min(top, max(u, round(s.in_flight * u / s.rollouts_per_update))) if keep_lag else top
      return Proposal(Setting(u, f, s.active_actors, s.samples_per_insert), "probe_u",
                      f"{why}: probing U = {u} (F = {f})")
  if s.active_actors > found.actors_floor(s.rollouts_per_update):
    n = fewer(found, s, s.active_actors / 2)
    # Kept where they make as much, not only where they gain (balance_verdict.SPARE).
    return Proposal(dataclasses.replace(s, active_actors=n), "probe_active",
                    f"{why}: probing {n} actors")
  # Both at once, where the learner idles (busy, fewer hands starved the 512,512 learner
  # beside them in the plant, and a larger U is the lag rule's).
  return None if keep_lag else regroup(b, s, found, "probe_regroup", f"{why}: probing")


def regroup(b: Bounds, s: Setting, found: Found, kind: str, why: str) -> Proposal | None:
  """Half the hands (or fewer, where that pair is bounded), more tickets, in one move: where
  a larger U is bounded with these actors and fewer actors at this U, neither bound speaks
  of both at once (tiny learner, this host: U = 2 cost with 3 actors, 2 actors cost at
  U = 1, and 1 actor at U = 4 made the most of any setting: BUILD_NOTES)."""
  u = b.u_finer(s.rollouts_per_update) if b.moves_flight else None
  if u is None:
    return None
  open_n = [n for n in range(min(math.ceil(s.active_actors / 2), s.active_actors - 1),
                             found.actors_floor(u) - 1, -1) if found.may_regroup(u, n)]
  if not open_n:
    return None
  n, f = open_n[0], b.cap(u)
  return Proposal(Setting(u, f, n, s.samples_per_insert), kind,
                  f"{why} U = {u} (F = {f}) with {n} actors: half the hands, more tickets")
