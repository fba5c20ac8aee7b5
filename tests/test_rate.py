"""The rate controller and the rollout queue under random actor and learner delays (no JAX)."""

import random
import threading
import time

import pytest

from jaxrl_async.config import RateConfig
from jaxrl_async.runtime.pipeline.queue import QueueClosed, QueueOverflow, RolloutInfo, RolloutQueue
from jaxrl_async.runtime.pipeline.rate import RateController


def simulate(K: int, U: int, actors: int, updates: int, seed: int, async_overflow: bool = False):
  """Fake actors and a fake learner with random delays; returns (lags learned from, ctrl, q)."""
  cfg = RateConfig(max_policy_lag=K, rollouts_per_update=U)
  ctrl = RateController(cfg)
  queue = RolloutQueue(cfg.resolved_queue_capacity)
  published = [0]  # the ParamStore's version
  stop = threading.Event()
  lags: list[int] = []
  rng = random.Random(seed)
  delays = [rng.choice([0.0, 0.0005, 0.002, 0.005]) for _ in range(actors)]

  def actor(i):
    r = random.Random(seed * 100 + i)
    try:
      while not stop.is_set():
        ticket = ctrl.acquire(0.05)
        if ticket is None:
          continue
        version = published[0]
        if async_overflow and r.random() < 0.2:
          version = max(0, version - 1)  # some steps acted with the previous params
        time.sleep(delays[i] * r.random() * 2)
        queue.put(({"v": version}, RolloutInfo(i, ticket, version, 1, 0.0)))
    except QueueClosed:
      pass

  def learner():
    r = random.Random(seed)
    version = 0
    for _ in range(updates):
      tickets = []
      while len(tickets) < U:
        item = queue.get(1.0)
        assert item is not None, "learner starved: actors deadlocked"
        _, info = item
        if ctrl.admit(info.ticket, info.behaviour_version):
          lags.append(version - info.behaviour_version)
          tickets.append(info.ticket)
      time.sleep(r.choice([0.0, 0.001, 0.004]))
      version += 1
      published[0] = version
      ctrl.published(version, tickets)

  threads = [threading.Thread(target=actor, args=(i,), daemon=True) for i in range(actors)]
  for t in threads:
    t.start()
  learner()
  stop.set()
  queue.close()
  ctrl.close()
  for t in threads:
    t.join(2.0)
  assert not any(t.is_alive() for t in threads), "an actor stayed blocked after shutdown"
  return lags, ctrl, queue


@pytest.mark.parametrize("K", [0, 1, 3])
@pytest.mark.parametrize("U", [1, 2])
@pytest.mark.parametrize("seed", [0, 1])
def test_lag_cap_holds_and_throttling_avoids_drops(K, U, seed):
  lags, ctrl, queue = simulate(K, U, actors=4, updates=60, seed=seed)
  assert max(lags) <= K
  assert ctrl.max_lag_seen <= K
  assert ctrl.dropped_stale == 0  # throttling, not dropping, bounds the lag here
  assert queue.max_depth <= queue.capacity
  if K > 0:
    assert max(lags) >= 1  # actors really ran ahead


@pytest.mark.parametrize("K", [1, 3])
def test_stale_overflow_is_dropped_never_learned(K):
  lags, ctrl, _ = simulate(K, 1, actors=4, updates=80, seed=3, async_overflow=True)
  assert max(lags) <= K


def test_k0_is_synchronous():
  lags, ctrl, _ = simulate(0, 2, actors=3, updates=40, seed=5)
  assert set(lags) == {0}


def test_queue_bound_is_an_invariant_and_close_wakes_waiters():
  q = RolloutQueue(2)
  q.put(1)
  q.put(2)
  with pytest.raises(QueueOverflow, match="more rollouts than tickets"):
    q.put(3)  # full: a rollout without a ticket, never a wait
  assert len(q) == 2 and q.max_depth == 2
  assert q.get(0.01) == 1 and q.get(0.01) == 2 and q.get(0.01) is None
  q2 = RolloutQueue(1)
  got = []

  def blocked_get():
    try:
      q2.get(30.0)
    except QueueClosed:
      got.append("woken")

  t = threading.Thread(target=blocked_get)
  t.start()
  time.sleep(0.05)
  t0 = time.time()
  q2.close()
  t.join(2.0)
  assert got == ["woken"] and time.time() - t0 < 1.0


def test_acquire_wakes_on_close():
  ctrl = RateController(RateConfig(max_policy_lag=0))
  assert ctrl.acquire(0.01) is not None
  assert ctrl.acquire(0.01) is None  # K = 0, one in flight: the next waits for a version
  result = []
  t = threading.Thread(target=lambda: result.append(ctrl.acquire(30.0)))
  t.start()
  time.sleep(0.05)
  ctrl.close()
  t.join(2.0)
  assert result == [None]
