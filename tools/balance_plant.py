"""A simulated plant for --balance=auto: actors, a learner and the real rate controller, in
virtual time, steered by the real BalanceController.

N actors each make a rollout in `actor_s` seconds (+-jitter/2) while they hold a ticket; the
learner takes U queued rollouts per update, which takes `update_s + rollout_s * U` seconds
(`rollout_s` may change at given times: a second job on the device, a bigger network). Every
`window_s` the controller gets the window's measurements, as the run's balancer measures them,
and its setting is applied: the active actors, F and U on the rate controller (a larger U after
`compile_s`, a smaller one when the tickets have drained, as in a run). No threads, no clock:
the numbers are the rules', not a machine's.

  python -m tools.balance_plant [--actors=6] [--lag=1] [--actor_s=1] [--rollout_s=0.02]
  python -m tools.balance_plant --seeds 0-5   # the test plants, seed by seed
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import itertools
import random
import statistics
from typing import Any

from jaxrl_async.config import RateConfig
from jaxrl_async.runtime.pipeline.balance import BalanceController
from jaxrl_async.runtime.pipeline.balance_window import (
  Bounds,
  Mark,
  Setting,
  Window,
  between_marks,
  holds_evidence,
  learner_rate,
)
from jaxrl_async.runtime.pipeline.rate import RateController


@dataclasses.dataclass
class Plant:
  actors: int = 6
  max_lag: int = 1
  rollouts_per_update: int = 1
  actor_s: float = 1.0
  update_s: float = 0.01
  rollout_s: float = 0.02
  jitter: float = 0.3
  compile_s: float = 1.0
  changes: tuple[tuple[float, float], ...] = ()  # (time, new rollout_s)
  seed: int = 0


class _Sim:
  """The event loop: actors, the learner and the windows, around the real RateController."""

  def __init__(self, plant: Plant, control: BalanceController, window_s: float, auto: bool):
    p = self.plant = plant
    self.control, self.window_s, self.auto = control, window_s, auto
    self.rng = random.Random(plant.seed)
    self.rate = RateController(RateConfig(max_policy_lag=p.max_lag,
                                          rollouts_per_update=p.rollouts_per_update))
    self.rate.configure(p.rollouts_per_update, control.setting.in_flight)
    self.active = control.setting.active_actors
    self.events: list[tuple] = []
    self.seq = itertools.count()
    self.queue: list[tuple[int, int]] = []
    self.waiting: dict[int, tuple[float, str]] = {}  # actor -> since when, blocked or paused
    self.counts = {"blocked": 0.0, "paused": 0.0, "made": 0, "idle": 0.0, "lags": []}
    self.busy, self.free_since, self.params_at = False, 0.0, 0.0
    self.rollout_s = p.rollout_s
    self.compiled = {p.rollouts_per_update}
    self.pending: list[Setting] = []
    self.records: list[dict[str, Any]] = []
    self.moves: list[tuple[float, Any]] = []
    self.max_lag = 0
    self.done: Mark | None = None
    self.last = dict(self.counts, lags=0, t=0.0, done=None)

  def push(self, t: float, kind: str, *data: Any) -> None:
    heapq.heappush(self.events, (t, next(self.seq), kind) + data)

  def start(self, i: int, now: float) -> bool:
    ticket = self.rate.acquire(0) if i < self.active else None
    if ticket is None:
      return False
    # The params of a version published at dispatch exist once that update has run.
    length = self.plant.actor_s * (1.0 + self.plant.jitter * (self.rng.random() - 0.5))
    self.push(max(now, self.params_at) + length, "made", i, ticket, self.rate.version)
    return True

  def start_or_wait(self, i: int, now: float) -> None:
    if not self.start(i, now):
      self.waiting[i] = (now, "blocked" if i < self.active else "paused")

  def wake(self, now: float) -> None:
    """Waiting actors try again; each wait is counted as blocked (active) or paused."""
    for i in sorted(self.waiting):
      since, kind = self.waiting.pop(i)
      self.counts[kind] += now - since
      self.start_or_wait(i, now)

  def learn(self, now: float) -> None:
    u = self.rate.rollouts_per_update
    if self.busy or len(self.queue) < u:
      return
    self.counts["idle"] += now - self.free_since
    batch, self.queue[:u] = self.queue[:u], []
    for ticket, version in batch:
      if self.rate.admit(ticket, version):
        self.counts["lags"].append(self.rate.version - version)
        self.max_lag = max(self.max_lag, self.rate.version - version)
    # As the learner loop does: the new version is published and the batch's tickets released
    # when the update is dispatched; the learner is busy until it has run.
    self.busy = True
    self.params_at = now + self.plant.update_s + self.rollout_s * u
    self.rate.published(self.rate.version + 1, [t for t, _ in batch])
    self.push(self.params_at, "learned", len(self.counts["lags"]), self.counts["idle"])

  def apply(self, setting: Setting, now: float) -> None:
    self.active = setting.active_actors
    if setting.rollouts_per_update not in self.compiled:
      self.pending.append(setting)
      self.push(now + self.plant.compile_s, "compiled", setting.rollouts_per_update)
      return
    self.rate.configure(setting.rollouts_per_update, setting.in_flight)

  def window(self, now: float) -> None:
    self.push(now + self.window_s, "window")
    c, last = self.counts, self.last
    # As the run's balancer: rollouts learned, and the learner's busy seconds, between the
    # finished updates around the window.
    learned, learned_s, busy_s = between_marks(self.done, last["done"])
    if not holds_evidence(len(c["lags"]) - last["lags"], self.rate.rollouts_per_update, learned):
      return
    idle_now = c["idle"] + (0.0 if self.busy else now - self.free_since)
    blocked_now = c["blocked"] + sum(now - since for since, kind in self.waiting.values()
                                     if kind == "blocked")
    lags, dt = c["lags"][last["lags"]:], now - last["t"]
    idle, blocked, n = (idle_now - last["idle"]) / dt, blocked_now - last["blocked"], self.active
    w = Window(learner_idle=idle, actors_blocked=blocked / (n * dt),
               actor_rate=(c["made"] - last["made"]) / max(n * dt - blocked, 1e-9),
               learner_rate=learner_rate(learned, busy_s, len(lags), dt, idle),
               consumed=len(lags), lag_mean=sum(lags) / len(lags), lag_max=max(lags), seconds=dt,
               learned=learned, learned_s=learned_s, learned_busy_s=busy_s)
    self.records.append({"t": now, "sps": len(lags) / dt, **dataclasses.asdict(w),
                         "setting": dataclasses.asdict(self.control.setting),
                         "in_force": (self.rate.rollouts_per_update, self.rate.in_flight_limit,
                                      self.active)})
    self.last = dict(c, lags=len(c["lags"]), t=now, idle=idle_now, blocked=blocked_now,
                     done=self.done)
    if self.auto and not self.pending and self.rate.pending_rollouts_per_update is None:
      decision = self.control.step(w)
      if decision is not None and decision.lever != "hold":
        self.moves.append((now, decision))
        self.apply(decision.setting, now)

  def run(self, horizon: float) -> None:
    for i in range(self.plant.actors):
      self.start_or_wait(i, 0.0)
    for t, new in self.plant.changes:
      self.push(t, "change", new)
    self.push(self.window_s, "window")
    while self.events:
      now, _, kind, *data = heapq.heappop(self.events)
      if now > horizon:
        break
      if kind == "made":
        self.queue.append((data[1], data[2]))
        self.counts["made"] += 1
        self.start_or_wait(data[0], now)
      elif kind == "learned":
        self.busy, self.free_since = False, now
        self.done = (now, data[0], data[1])  # as the run's learner loop marks one finished
      elif kind == "change":
        self.rollout_s = data[0]
      elif kind == "compiled":
        self.compiled.add(data[0])
        for setting in [s for s in self.pending if s.rollouts_per_update == data[0]]:
          self.pending.remove(setting)
          self.rate.configure(setting.rollouts_per_update, setting.in_flight)
      elif kind == "window":
        self.window(now)
      self.wake(now)
      self.learn(now)


def simulate(plant: Plant, horizon: float, window_s: float = 2.0, auto: bool = True,
             in_flight: int | None = None, active: int | None = None,
             u_choices: tuple[int, ...] | None = None, **targets: Any) -> dict[str, Any]:
  """Runs the plant; with `auto` the controller steers it from the given setting. Returns the
  per-window records, the decisions (and the moves among them, with their times), the largest
  lag learned and the rollouts dropped."""
  p, u0 = plant, plant.rollouts_per_update
  bounds = Bounds(p.actors, p.max_lag, u_choices or tuple(range(1, 2 * p.actors + 1)), **targets)
  control = BalanceController(bounds, Setting(u0, in_flight or bounds.cap(u0), active or p.actors))
  sim = _Sim(plant, control, window_s, auto)
  sim.run(horizon)
  return {"records": sim.records, "decisions": control.decisions, "moves": sim.moves,
          "max_lag": sim.max_lag, "dropped": sim.rate.dropped_stale, "setting": control.setting}


def phase(out: dict[str, Any], t0: float, t1: float) -> dict[str, Any]:
  """Over the windows in [t0, t1): rollouts learned per second, the mean idle, blocked and
  lag, and the settings in force."""
  rows = [r for r in out["records"] if t0 <= r["t"] < t1]
  mean = lambda k: statistics.mean(r[k] for r in rows if r[k] is not None)
  # Rollouts over seconds (a mean of the windows' rates would weigh a short window as a long
  # one: the windows last until an update finishes in them, so a large U's are longer).
  sps = sum(r["consumed"] for r in rows) / sum(r["seconds"] for r in rows)
  return {"sps": sps, "idle": mean("learner_idle"), "blocked": mean("actors_blocked"),
          "lag": mean("lag_mean"), "settings": {r["in_force"] for r in rows}}


def moves(out: dict[str, Any], t0: float, t1: float = float("inf")) -> list[Any]:
  return [d for t, d in out["moves"] if t0 <= t < t1]


def best_fixed(plant: Plant, us: tuple[int, ...], horizon: float, window_s: float) -> float:
  """The best throughput of a fixed U over the last three quarters of the horizon."""
  return max(phase(simulate(dataclasses.replace(plant, rollouts_per_update=u), horizon,
                            window_s, auto=False), horizon / 4, horizon)["sps"] for u in us)


# The three plants tests/test_balance_plant.py holds the controller to.
FAST = Plant(actors=6, max_lag=1, actor_s=1.0, rollout_s=0.02)
LEARNER_BOUND = Plant(actors=2, max_lag=1, actor_s=0.2, rollout_s=1.0)
SLOWS_AND_RECOVERS = dataclasses.replace(FAST, changes=((150.0, 0.5), (300.0, 0.02)))


def seed_rows(seeds: list[int]) -> list[str]:
  """A line per plant and seed: what auto ends at, against the best fixed U where one is."""
  rows = []
  best = best_fixed(FAST, (1, 2, 3, 6, 12), 200, 2.0)
  best_lb = best_fixed(LEARNER_BOUND, (1, 2, 4), 600, 10.0)
  for seed in seeds:
    out = simulate(dataclasses.replace(FAST, seed=seed), 200)
    a = phase(out, 70, 200)
    rows.append(f"fast     seed {seed}: {len(moves(out, 0))} moves, last at "
                f"{max(t for t, _ in out['moves']):.0f} s; after 70 s {a['sps'] / best:.3f} of the "
                f"best fixed U, blocked {a['blocked']:.2f}, idle {a['idle']:.2f}, settings "
                f"{sorted(a['settings'])}, max lag {out['max_lag']}, dropped {out['dropped']}")
    out = simulate(dataclasses.replace(LEARNER_BOUND, seed=seed), 600, 10.0)
    a = phase(out, 300, 600)
    rows.append(f"learner  seed {seed}: {len(moves(out, 0))} moves, {len(moves(out, 300))} after "
                f"300 s; after 300 s {a['sps'] / best_lb:.3f} of the best fixed U, lag "
                f"{a['lag']:.2f}, max lag {out['max_lag']}, dropped {out['dropped']}")
    out = simulate(dataclasses.replace(SLOWS_AND_RECOVERS, seed=seed), 450)
    fast, slow, again = phase(out, 100, 150), phase(out, 250, 300), phase(out, 400, 450)
    rows.append(f"slowdown seed {seed}: blocked {fast['blocked']:.2f} before, "
                f"{again['blocked']:.2f} after; slow phase {slow['sps']:.2f} rollouts/s (lag "
                f"{slow['lag']:.2f}); after / before {again['sps'] / fast['sps']:.3f}; "
                f"{len(moves(out, 400))} moves after 400 s")
  return rows


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--actors", type=int, default=6)
  parser.add_argument("--lag", type=int, default=1)
  parser.add_argument("--actor_s", type=float, default=1.0)
  parser.add_argument("--rollout_s", type=float, default=0.02)
  parser.add_argument("--horizon", type=float, default=200.0)
  parser.add_argument("--window_s", type=float, default=2.0)
  parser.add_argument("--seeds", default="", help="e.g. 0-5: the test plants over these seeds "
                      "instead, a line per plant and seed")
  args = parser.parse_args()
  if args.seeds:
    lo, _, hi = args.seeds.partition("-")
    print("\n".join(seed_rows(list(range(int(lo), int(hi or lo) + 1)))))
    return
  plant = Plant(actors=args.actors, max_lag=args.lag, actor_s=args.actor_s,
                rollout_s=args.rollout_s)
  out = simulate(plant, args.horizon, args.window_s)
  for d in out["decisions"]:
    print(f"{d.window.consumed:5d} rollouts | {d.lever:22s} | {d.reason}")
  r = out["records"][-1]
  print(f"end: {out['setting']} sps {r['sps']:.2f} idle {r['learner_idle']:.2f} blocked "
        f"{r['actors_blocked']:.2f} max lag {out['max_lag']} dropped {out['dropped']}")


if __name__ == "__main__":
  main()
