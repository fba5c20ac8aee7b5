"""--balance=auto's decisions: a pure controller over measured windows (no threads, no clock).

TianJi keeps convergence under relaxed dependencies by balancing sample production against
consumption. The plant it steers: `active` actors make rollouts at `actor_rate` each while not
blocked; the learner takes U rollouts per update at `learner_rate` rollouts per busy second; the
rate controller grants at most F tickets (rollouts started, not yet learned from), with
U <= F <= (K + 1) U, so the lag cap K holds whatever the controller asks. Each window it gets the
measurements (`Window`) and may move one lever (`Setting`), then lets `settle` windows pass so
that the next measurements show the move's effect.

learner idle over `target_idle` (production is short):
  - actors wait on tickets over `target_blocked`: F rises to (K + 1) U; at (K + 1) U, U rises to
    the smallest value whose (K + 1) U covers every active actor's slots, or, if it covers them
    already, doubles (the learner waits for rollouts started only once new params exist: more
    in flight per version hides that wait, at no more lag); where U may not rise and the actors
    wait more than twice their target, actors pause down to as many as the tickets employ at
    once, in one move (the tickets, not the hands, are short: the others only wait; a spare
    must then earn its wait as a resume); where a larger U and a pause are each bounded here,
    both at once: half the actors with the next U (`regroup`); each may cost `rate_cost`
    only where it ends the wait, else it must tie (the actors paused only waited:
    balance_verdict.FOR_WAITING), and a pause to more than the tickets employ that cost is the
    last at its U (the waiting spares hide the hand-over);
  - actors do not wait: a paused actor resumes; for replay the SPI target rises;
  - none is paused (actors that wait do so short of the pause's margin): probe a larger U, then
    half the actors (a probe undone leaves the steps between open), then both at once, each
    judged by throughput alone and kept only if it gains, or for half the actors if they make
    as much (those spared only added threads and lag: balance_verdict.SPARE; balance_probes.py:
    where actors and learner share cores, fewer threads and fewer, larger updates can make
    more, measured on this 2-core machine);
  - otherwise every lever is at its limit: production-bound (said once).
learner busy (consumption is short):
  - mean lag over `target_lag`: F falls by one, down to a floor; at the floor U doubles with F
    at 2F - 1, which halves the lag step (the lag of a full pipeline is (F - U) / U versions);
  - actors mostly blocked with the learner fully fed: actors pause down to what makes what it
    takes, and a spare; for replay, actors blocked over `target_blocked`: the SPI target falls;
  - otherwise the operating point, unless the probes find more (a larger U, half the actors),
    at the same lag.

Every move is an experiment judged by the first `judge_windows` windows after it settles,
pooled (one window at +-5% is too little evidence on a shared host), or twice as many where the
verdict lies within `rate_cost` of its line, or `undo_windows` where it would undo the move,
read at their median window as the stay before it is (1-s windows dip: balance_verdict.py);
every decision reads the last `judge_windows` at the setting in force. A move that cost more
than `rate_cost` of the throughput (rollouts learned per second), that took it out of
`rate_cost` of the best kept since the last replan (so small costs do not add up:
balance_verdict.py), or that took production away and added more than `idle_cost` of learner
idle, is undone into a bound for its lever (a floor or ceiling of F, U, the active actors; each
holds for the other lever's value it was found with: balance_bounds.py); a resume or probe that
gained nothing is undone too (a probe of fewer actors only if it lost). So each experiment is
made once (without bounds the lag and idle rules would alternate), and where actors share the
learner's cores and a larger U costs throughput, the judge finds it and actors pause instead.
Bounds are forgotten when the learner's rate at a held setting (read over enough busy time to
time an update by) moves by more than `replan` from what it was there before (a second job on
the device: balance_rates.py); a move under which the learner's rate moved that much, past
what the move itself explains, is undone unjudged (`_unjudged`).
A kept move is judged once more when its setting's stays hold `STAY_WINDOWS` windows
(`Kept.due`): a verdict's first windows can read a tie that the stay does not.
Throughput is read between finished updates where the windows are timed (`Window.timed`), so
no count's rounding enters a verdict. A first window after a move that lost five times
`rate_cost`, and more than its grain, is a verdict on its own. Decisions carry their reasons.
"""

from __future__ import annotations

import collections
import dataclasses

from jaxrl_async.runtime.pipeline import balance_probes as probes
from jaxrl_async.runtime.pipeline.balance_bounds import Found
from jaxrl_async.runtime.pipeline.balance_rates import RateWatch
from jaxrl_async.runtime.pipeline.balance_verdict import (
  Kept,
  Trial,
  clearly_worse,
  close_call,
  starved,
  typical,
  verdict,
  was,
)
from jaxrl_async.runtime.pipeline.balance_window import Bounds, Decision, Setting, Window, pooled


class BalanceController:
  """`step(window)` -> a Decision (the new setting and why), or None (nothing to move)."""

  def __init__(self, bounds: Bounds, setting: Setting):
    self.bounds = bounds
    self.setting = setting
    self.decisions: list[Decision] = []
    self._settling = 0
    self._trial: Trial | None = None
    self.found = Found(bounds.num_actors, max(bounds.u_choices))  # the levers' bounds
    self._watch = RateWatch(bounds.replan)  # the learner's rate, for a changed plant
    self._held: set[str] = set()  # holds already said (they would repeat every window)
    self._pool: collections.deque = collections.deque(
        maxlen=max(2 * bounds.judge_windows, bounds.undo_windows))
    self._kept = Kept()  # the throughput of each setting kept, for the band a move must hold

  def step(self, w: Window) -> Decision | None:
    if self._settling > 0:
      self._settling -= 1
      return None
    if w.consumed == 0 or w.lag_mean is None:
      return None  # nothing was learned: no evidence about consumption
    replan = self._replan(w)
    self._pool.append(w)
    self._kept.add(w)
    if replan is not None:
      return replan
    jw, trial, after = self.bounds.judge_windows, self._trial, list(self._pool)
    worse = trial is not None and clearly_worse(
        trial, self.setting.rollouts_per_update, w, self.bounds.rate_cost)
    if len(after) < jw and not worse:
      return None  # one window at +-5% is too little evidence on a shared host
    if trial is not None and not worse and self._more_evidence(trial, after):
      return None
    w = pooled(after if trial is not None else after[-jw:])
    self._trial = None
    if trial is not None:
      undo = self._unjudged(trial, w) or self._judge(trial, after)
      if undo is not None:
        return undo
      self._kept.reached(self.setting, trial)
    self._kept.keep(self.setting)  # judged and kept, or never moved from
    again = self._kept.due(self.setting)  # and once more over its stays
    if again is not None:
      undo = self._judge(again, list(self._kept.stay(self.setting)), again=True)
      if undo is not None:
        return undo
    if w.learner_idle > self.bounds.target_idle:
      return self._produce_more(w)
    return self._consume_faster(w)

  def _more_evidence(self, trial: Trial, after: list[Window]) -> bool:
    """Whether a verdict waits for another window: one within `rate_cost` of its line waits
    for twice the evidence, and one that would undo the move for `undo_windows` (their median
    sets a dip aside: balance_verdict.py)."""
    if len(after) >= self._pool.maxlen:
      return False
    if close_call(trial, after, self.bounds):
      return True
    return len(after) < self.bounds.undo_windows and verdict(
        trial, after, self.bounds, self._kept.best(but=self.setting)) is not None

  def _judge(self, trial: Trial, after: list[Window], again: bool = False) -> Decision | None:
    """Undoes the last move if it cost throughput (or gained nothing, for a resume or a
    probe; `balance_verdict.verdict`), and keeps what it learned as a bound; `again`: a kept
    move judged once more over its stays (`Kept.due`)."""
    s, w, found = self.setting, pooled(after), self.found
    why = verdict(trial, after, self.bounds, self._kept.best(but=s))
    if trial.kind in ("probe_active", "regroup", "probe_regroup") and why is None:
      found.ceiling_active = s.active_actors  # chosen on purpose: not resumed while it holds
    if trial.kind == "in_flight-" and why is None:
      # Kept for lag: the idle rule does not raise it again (with the learner's idle and the
      # lag both at their targets, the two rules took F 5 -> 6 -> 5 every 5 s for 50 s).
      found.ceiling_flight[s.rollouts_per_update] = s.in_flight
    if why is None:
      return None
    back, u = trial.before, s.rollouts_per_update
    if trial.kind == "in_flight-":
      found.floor_flight[u] = back.in_flight
      bound = f"F stays >= {back.in_flight} at U = {u}"
    elif trial.kind == "finer":
      found.no_finer.add(back.rollouts_per_update)
      bound = f"U stays {back.rollouts_per_update} for lag"
    elif trial.kind in ("rollouts_per_update+", "probe_u"):
      found.ceiling_u[back.active_actors] = back.rollouts_per_update
      bound = f"U stays <= {back.rollouts_per_update} with {back.active_actors} actors"
    elif trial.kind in ("active_actors-", "pause_waiting", "probe_active"):
      # A jump's untried steps stay open, unless the throughput fell with the actors (half
      # the hands made about half as much: the hands are the production, none is spare), or
      # a pause of waiting actors kept more than the tickets employ and still cost: the
      # waiting spares hide the hand-over at each new version, so fewer of them cost too
      # (this host, fast learner: 3 of 6 actors made 0.91-0.96 of 6 over whole runs).
      share = s.active_actors / back.active_actors
      with_hands = trial.kind == "probe_active" and typical(after) <= (1 + share) / 2 * was(trial)
      spares = trial.kind == "pause_waiting" and s.active_actors > probes.employed(
          self.bounds, back, trial.window)
      found.floor_active[u] = back.active_actors if with_hands or spares else s.active_actors + 1
      if with_hands or spares or starved(trial, w, self.bounds.idle_cost):
        found.hands[u] = max(found.hands.get(u, 0), back.active_actors)
      bound = f"actors stay >= {found.floor_active[u]} at U = {u}"
    elif trial.kind == "active_actors+":
      found.ceiling_active = back.active_actors
      bound = f"actors stay <= {back.active_actors}"
    elif trial.kind in ("regroup", "probe_regroup"):
      found.no_regroup.add((u, s.active_actors))
      bound = f"not U = {u} with {s.active_actors} actors again"
    else:
      bound = "not again at this point"
    over = f", judged again over its {len(after)} windows" if again else ""
    return self._move(back, "undo", w, f"{why}{over}: undone; {bound}", judged=False)

  def _produce_more(self, w: Window) -> Decision | None:
    b, s = self.bounds, self.setting
    idle = f"learner idle {100 * w.learner_idle:.0f}% > {100 * b.target_idle:.0f}%"
    blocked = w.actors_blocked > b.target_blocked
    why_blocked = f"actors blocked {100 * w.actors_blocked:.0f}% > {100 * b.target_blocked:.0f}%"
    top = self.found.ceiling_flight.get(s.rollouts_per_update, b.cap(s.rollouts_per_update))
    if blocked and b.moves_flight and s.in_flight < top:
      f = top
      return self._move(dataclasses.replace(s, in_flight=f), "in_flight+", w,
                        f"{idle}, {why_blocked}: F up to "
                        + (f"(K + 1) U = {f}" if f == b.cap(s.rollouts_per_update) else
                           f"{f}, where it was kept for lag"))
    if blocked and b.moves_flight:
      slots = s.active_actors * b.slots_per_actor
      u = self.bounds.u_covering(slots)
      why = f"(K + 1) U = {b.cap(u)} tickets cover {s.active_actors} actors' {slots} slots"
      if u <= s.rollouts_per_update:  # they do already: the wait is the pipeline's latency
        u = self.bounds.u_finer(s.rollouts_per_update) or u
        why = "more rollouts in flight per version cover the wait for new params"
      if s.rollouts_per_update < u <= self.found.u_ceiling(s.active_actors):
        return self._move(Setting(u, b.cap(u), s.active_actors, s.samples_per_insert),
                          "rollouts_per_update+", w,
                          f"{idle}, {why_blocked} with F at (K + 1) U: U up to {u}: {why}")
    # Fewer hands only where waiting dominates (tickets short by far, not at the margin): as
    # many as the tickets employ at once (the others only wait; whether a spare that hides the
    # hand-over is worth its wait, the resume after this finds out); uncapped, the working
    # share and a spare.
    waiting = b.waiting(w.actors_blocked)
    if waiting and s.active_actors > self.found.actors_floor(s.rollouts_per_update):
      employ = probes.employed(b, s, w)
      if b.moves_flight:
        n = self._fewer(employ)
        why = f"{s.in_flight} tickets employ {employ} actors" + (
            f"; {n}, as fewer cost before" if n > employ else "")
      else:
        n = self._fewer(employ + 1)
        why = f"{n} actors (the working share and one spare)"
      return self._move(dataclasses.replace(s, active_actors=n), "pause_waiting", w,
                        f"{idle}, {why_blocked} with U at its limit {s.rollouts_per_update}: "
                        f"the tickets are short, not the hands: {why}")
    # Both bounded here (a larger U cost with these actors, a pause cost at this U): both at
    # once, which neither bound speaks of.
    regroup = probes.regroup(b, s, self.found, "regroup", f"{idle}, {why_blocked} with U and "
                             "the actors each at their bound: regroup to") if waiting else None
    if regroup is not None:
      return self._propose(regroup, w)
    if not blocked and s.active_actors < min(b.num_actors, self.found.ceiling_active):
      return self._move(dataclasses.replace(s, active_actors=s.active_actors + 1),
                        "active_actors+", w, f"{idle}, every active actor working: one more")
    spi = self._spi(+1)
    if spi is not None:
      return self._move(dataclasses.replace(s, samples_per_insert=spi), "samples_per_insert+",
                        w, f"{idle}: the learner samples more per insert, SPI target {spi:.2f}")
    # Actors that wait, but not by far (no pause above), still leave the probes: fewer actors
    # wait no less for the tickets, and where they share the learner's cores they may make more
    # (measured: 512,512 learner, F held below (K + 1) U for lag, 6 actors 24% blocked, 3 make
    # more), which the judge decides.
    probe = self._probe(w, f"{idle}, {why_blocked}" if blocked else f"{idle}, every actor working")
    if probe is not None:
      return probe
    return self._hold("production", w, f"{idle} with every lever at its limit "
                      f"({'actors wait on tickets' if blocked else 'every actor working'}): "
                      "production-bound")

  def _consume_faster(self, w: Window) -> Decision | None:
    b, s = self.bounds, self.setting
    busy = f"learner busy (idle {100 * w.learner_idle:.0f}% <= {100 * b.target_idle:.0f}%)"
    u = s.rollouts_per_update
    if b.moves_flight and w.lag_mean > b.target_lag:
      lag = f"mean lag {w.lag_mean:.2f} > target {b.target_lag:.2f}"
      floor = max(self.found.floor_flight.get(u, u), u)
      if s.in_flight > floor:
        return self._move(dataclasses.replace(s, in_flight=s.in_flight - 1), "in_flight-", w,
                          f"{lag}, {busy}: F down to {s.in_flight - 1}")
      finer = self.bounds.u_finer(u)
      if (finer is not None and finer <= self.found.u_ceiling(s.active_actors) and s.in_flight > u
          and u not in self.found.no_finer):
        f = min(2 * s.in_flight - 1, b.cap(finer))
        return self._move(Setting(finer, f, s.active_actors, s.samples_per_insert), "finer", w,
                          f"{lag}, {busy}, F at its floor {s.in_flight}: U up to {finer} with "
                          f"F = {f}, a finer lag step ({1 / finer:.2f} versions)")
      return self._probe(w, busy, keep_lag=True) or self._hold(
          "lag", w, f"{lag}, but F is at its floor {s.in_flight} for U = {u}: less lag would "
          "idle the learner")
    # A pause frees nothing a blocked actor holds, and one actor fewer adds latency (the next
    # batch is made by fewer hands once new params exist); so only with the actors mostly
    # waiting and the learner fully fed (idle under a quarter of its target).
    if (w.actors_blocked > max(2 * b.target_blocked, 0.5) and w.learner_idle < b.target_idle / 4
        and s.active_actors > self.found.actors_floor(u)):
      need = w.learner_rate * (1 + b.idle_cost)
      n = self._fewer(need / max(w.actor_rate, 1e-9) + 1)  # and a spare
      if n * w.actor_rate >= need:
        return self._move(dataclasses.replace(s, active_actors=n), "active_actors-", w,
                          f"{busy}, actors blocked {100 * w.actors_blocked:.0f}%: {n} actors "
                          f"make {n * w.actor_rate:.1f} rollouts/s >= the "
                          f"{w.learner_rate:.1f} it takes")
    if w.actors_blocked > b.target_blocked:
      spi = self._spi(-1)
      if spi is not None:
        return self._move(dataclasses.replace(s, samples_per_insert=spi),
                          "samples_per_insert-", w, f"{busy}, actors blocked "
                          f"{100 * w.actors_blocked:.0f}%: SPI target down to {spi:.2f}")
    # The operating point, unless fewer, larger updates or fewer threads beside the learner
    # (sharing its cores) make more: probed as production-bound, at the same lag.
    return self._probe(w, busy, keep_lag=True)

  def _probe(self, w: Window, why: str, keep_lag: bool = False) -> Decision | None:
    return self._propose(probes.probe(self.bounds, self.setting, self.found, why, keep_lag), w)

  def _propose(self, p: probes.Proposal | None, w: Window) -> Decision | None:
    return None if p is None else self._move(p.setting, p.kind, w, p.reason)

  def _fewer(self, actors: float) -> int:
    return probes.fewer(self.found, self.setting, actors)

  def _spi(self, direction: int) -> float | None:
    return self.bounds.spi_step(self.setting.samples_per_insert, direction)

  def _replan(self, w: Window) -> Decision | None:
    """Forgets the bounds (the old plant's point) when the learner's rate at a held setting
    moved (`RateWatch`); said as a decision that keeps the setting."""
    s = self.setting
    moved = self._watch.moved(w, (s.rollouts_per_update, s.active_actors))
    if moved is None:
      return None
    self._forget()
    decision = Decision(s, "replan", f"the learner's rate at U = {s.rollouts_per_update} with "
                        f"{s.active_actors} actors moved from {moved[0]:.1f} to {moved[1]:.1f} "
                        "rollouts per busy second: the bounds found so far are forgotten", w)
    self.decisions.append(decision)
    return decision

  def _unjudged(self, trial: Trial, w: Window) -> Decision | None:
    """A move under which the learner's own rate moved by more than `replan` is not judged:
    the plant changed (in the simulated plant, a probe of 3 actors made while a slow learner
    recovered read as a 75% gain and was kept). It is undone, and the bounds are forgotten.
    Not for a move of U or of the SPI target, which move that rate themselves (tiny learner,
    this host: 692 rollouts per busy second at U = 1, 1683 at U = 3). A move of the actors
    moves it too where they share the learner's cores, by up to their share: with one thread
    an actor and one for the learner, sharing alike, N actors in place of n make the learner
    up to (n + 1) / (N + 1) as fast (this host: 1 actor in place of 2 made it 54-56% faster,
    3/2 by that count, and two such probes were undone unjudged, which forgot every bound and
    restarted the walk); a move beyond that share and `replan` is the plant's."""
    b, s = trial.before, self.setting
    share = (b.active_actors + 1) / (s.active_actors + 1)
    if (b.rollouts_per_update != s.rollouts_per_update
        or b.samples_per_insert != s.samples_per_insert
        or not self._watch.differs(trial.window, w, explained=share)):
      return None
    self._forget()
    return self._move(trial.before, "undo", w, f"the learner's rate moved from "
                      f"{trial.window.learner_rate:.1f} to {w.learner_rate:.1f} rollouts per "
                      f"busy second under {trial.kind}: the plant changed, so it is undone "
                      "unjudged and the bounds are forgotten", judged=False)

  def _forget(self) -> None:
    self._watch.forget()
    self._kept.forget()
    self.found.forget()

  def _move(self, setting: Setting, kind: str, w: Window, reason: str,
            judged: bool = True) -> Decision:
    b = self.bounds
    if b.max_lag is not None:  # the cap holds whatever the rules above computed
      assert setting.rollouts_per_update <= setting.in_flight <= b.cap(
          setting.rollouts_per_update), setting
    assert 1 <= setting.active_actors <= b.num_actors, setting
    if judged:
      self._trial = Trial(kind, self.setting, w, self._kept.stay(self.setting))
    lever = {"finer": "rollouts_per_update+", "probe_u": "rollouts_per_update+",
             "probe_active": "active_actors-", "pause_waiting": "active_actors-",
             "probe_regroup": "regroup"}.get(kind, kind)
    self.setting = setting
    self._settling = b.settle
    self._held.clear()
    self._watch.moved_setting()  # the learner's rate at the new setting is read afresh
    self._pool.clear()
    self._kept.moved()
    decision = Decision(setting, lever, reason, w)
    self.decisions.append(decision)
    return decision

  def _hold(self, kind: str, w: Window, reason: str) -> Decision | None:
    """Kept as a decision once (not every window), so the record says why a target is unmet."""
    if kind in self._held:
      return None
    self._held.add(kind)
    decision = Decision(self.setting, "hold", reason, w)
    self.decisions.append(decision)
    return decision
