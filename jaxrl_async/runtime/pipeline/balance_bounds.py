"""The bounds --balance=auto's controller (balance.py) has found for its levers since the last
replan: where a move was undone (it cost), and where one was kept on purpose (not to be undone
by another rule). Without them the lag and idle rules would alternate, each undoing the other.

A bound on one lever holds for the value of the other lever it was found with, for what one
lever does turns with the other: with the tiny learner on this host, U = 3 made 34% less than
U = 1 with 6 actors and 5-7% more with 2; and a pause from 3 actors to 2 cost 6-11% at U = 1
(two tickets: the third actor hides the hand-over at each new version) where 1 actor at U = 4
made the most of any setting (BUILD_NOTES). So U's ceiling is kept per number of actors, the
actors' floor per U, a joint move (`regroup`: half the hands, twice the tickets) per the
setting it went to, and the hands a pause found to be the production per U (they bound the
regroups to that U and above)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class Found:
  num_actors: int
  max_u: int
  floor_flight: dict[int, int] = dataclasses.field(default_factory=dict)  # U -> F that fed
  ceiling_flight: dict[int, int] = dataclasses.field(default_factory=dict)  # U -> F kept for lag
  no_finer: set[int] = dataclasses.field(default_factory=set)  # U values a finer U starved
  floor_active: dict[int, int] = dataclasses.field(default_factory=dict)  # U -> fewest actors
  ceiling_active: int = 0  # the most actors a resume may reach (0: all of them)
  ceiling_u: dict[int, int] = dataclasses.field(default_factory=dict)  # actors -> largest U
  no_regroup: set[tuple[int, int]] = dataclasses.field(default_factory=set)  # (U, actors)
  # U -> the actors a pause found to be the production there (fewer lost about their share of
  # the throughput, or starved the learner): a regroup, which halves the hands too, goes to no
  # fewer at that U or a larger one (more rollouts per update need no fewer hands).
  hands: dict[int, int] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    self.ceiling_active = self.ceiling_active or self.num_actors

  def actors_floor(self, u: int) -> int:
    """The fewest actors a pause may leave at U."""
    return self.floor_active.get(u, 1)

  def u_ceiling(self, actors: int) -> int:
    """The largest U to try with `actors` active."""
    return self.ceiling_u.get(actors, self.max_u)

  def may_regroup(self, u: int, actors: int) -> bool:
    """Whether (U, actors), a regroup's target, is open: no bound found rules it out (the
    actors' floor at U the caller counts down to)."""
    return ((u, actors) not in self.no_regroup and u <= self.u_ceiling(actors)
            and all(actors >= n for v, n in self.hands.items() if v <= u))

  def forget(self) -> None:
    """A replan: every bound was the old plant's."""
    fresh = Found(self.num_actors, self.max_u)
    for field in dataclasses.fields(self):
      setattr(self, field.name, getattr(fresh, field.name))
