"""How long actors wait for tickets under the lag cap, by simulation with the real controller.

N actors each make rollouts of random length (mean 1, +-jitter/2), each under a ticket from
`runtime.rate.RateController`; one learner takes U queued rollouts per update, each update
taking `--learner_s`. Virtual time, no threads: the numbers are the rule's, not the machine's.
Prints, per (N, K, U): actors' blocked fraction, learner idle fraction, the largest lag.

  python -m tools.ticket_sim [--learner_s=0.02] [--jitter=0.3] [--horizon=2000]
"""

from __future__ import annotations

import argparse
import heapq
import math
import random

from jaxrl_async.config import RateConfig
from jaxrl_async.layout import rollouts_per_update
from jaxrl_async.runtime.pipeline.rate import RateController


def simulate(n: int, k: int, u: int, learner_s: float = 0.02, jitter: float = 0.3,
             horizon: float = 2000.0, seed: int = 0, overlap: float = 0.0) -> dict[str, float]:
  """`overlap`: the share of a rollout during which its actor already wants the next one (async
  EnvPool: the first envs cross the boundary while the last finish); 0 is sync EnvPool."""
  rng = random.Random(seed)
  c = RateController(RateConfig(max_policy_lag=k, rollouts_per_update=u))
  events: list[tuple] = []
  queue: list[tuple[int, int]] = []
  blocked, waiting = [0.0] * n, {}
  busy, max_lag, t, learner_free = 0.0, 0, 0.0, True

  def start(i: int, now: float) -> bool:
    ticket = c.acquire(0)
    if ticket is None:
      return False
    length = 1.0 + jitter * (rng.random() - 0.5)
    heapq.heappush(events, (now + length, "made", i, ticket, c.version))
    heapq.heappush(events, (now + length * (1 - overlap), "want", i, None, None))
    return True

  for i in range(n):
    if not start(i, 0.0):
      waiting[i] = 0.0
  while events and t < horizon:
    t, kind, i, ticket, version = heapq.heappop(events)
    if kind == "made":
      queue.append((ticket, version))
    elif kind == "want":
      if not start(i, t):
        waiting[i] = t
    else:  # "learned": ticket holds the update's tickets
      c.published(c.version + 1, ticket)
      learner_free, busy = True, busy + learner_s
    if learner_free and len(queue) >= u:
      batch, queue[:u] = queue[:u], []
      for tk, v in batch:
        max_lag = max(max_lag, c.version - v)
        c.admit(tk, v)
      learner_free = False
      heapq.heappush(events, (t + learner_s, "learned", -1, [tk for tk, _ in batch], 0))
    for j in list(waiting):
      if start(j, t):
        blocked[j] += t - waiting.pop(j)
  return {"actor_blocked": sum(blocked) / n / t, "learner_idle": 1 - busy / t,
          "max_lag": max_lag, "dropped": c.dropped_stale}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--learner_s", type=float, default=0.02)
  parser.add_argument("--jitter", type=float, default=0.3)
  parser.add_argument("--horizon", type=float, default=2000.0)
  parser.add_argument("--overlap", type=float, default=0.3,
                      help="async actors: share of a rollout that overlaps the next one")
  args = parser.parse_args()
  print("| EnvPool | N | K | U | rule | actors blocked | learner idle | max lag |")
  print("|---|---|---|---|---|---|---|---|")
  for mode, overlap in (("sync", 0.0), ("async", args.overlap)):
    for n, k in [(1, 0), (1, 1), (2, 1), (4, 1), (8, 1), (16, 1), (4, 0), (8, 2)]:
      rule = rollouts_per_update(n, k, False, overlap > 0)
      for u in sorted({1, math.ceil(n / (k + 1)), n, rule}):
        r = simulate(n, k, u, args.learner_s, args.jitter, args.horizon, overlap=overlap)
        print(f"| {mode} | {n} | {k} | {u} | {'yes' if u == rule else ''} | "
              f"{r['actor_blocked']:.2f} | {r['learner_idle']:.2f} | {r['max_lag']} |")


if __name__ == "__main__":
  main()
