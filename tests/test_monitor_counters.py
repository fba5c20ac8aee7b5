"""Counters written by one thread and read by others: a snapshot combines fields of one moment."""

import threading

from jaxrl_async.runtime.learners.loop import LearnerTimers
from jaxrl_async.runtime.pipeline.actor import ActorTimers


def test_a_snapshot_never_sees_half_of_an_update():
  """The writer moves two fields together under the lock (a rollout and its queueing time, as
  the actor's emit does); every snapshot taken meanwhile has them in step."""
  timers, stop = ActorTimers(), threading.Event()

  def write():
    while not stop.is_set():
      with timers.lock:
        timers.rollouts += 1
        for _ in range(50):  # widen the window between the two writes
          pass
        timers.put_s += 1.0

  writer = threading.Thread(target=write)
  writer.start()
  try:
    snaps = [timers.snapshot() for _ in range(20_000)]
  finally:
    stop.set()
    writer.join()
  assert snaps[-1].rollouts > 0
  assert all(s.put_s == float(s.rollouts) for s in snaps)


def test_a_snapshot_is_a_copy_and_leaves_the_lock_out_of_the_fields():
  import dataclasses

  t = LearnerTimers(idle_s=1.0)
  s = t.snapshot()
  t.idle_s += 1.0
  assert s.idle_s == 1.0 and t.idle_s == 2.0
  assert "lock" not in dataclasses.asdict(t) and s.lock is t.lock


def test_blocked_is_over_the_actors_time_not_paused():
  """3 of 6 actors paused for 2 s, the other 3 blocked 1.5 s of their 6: 25%, not 12.5%."""
  from jaxrl_async.runtime.monitor import actor_fractions

  blocked, paused = actor_fractions(1.5, 6.0, 2.0, 6)
  assert paused == 0.5 and blocked == 0.25
  assert actor_fractions(1.5, 0.0, 2.0, 6) == (0.125, 0.0)
  assert actor_fractions(0.0, 12.0, 2.0, 6) == (0.0, 1.0)  # all paused: nothing blocked


def test_a_paused_actor_counts_its_pause_while_it_lasts():
  """Paused by the balancer for the rest of the run, an actor's pause shows in every metrics
  interval (it was counted only on resuming, so a pause that never ended never showed)."""
  import time
  from types import SimpleNamespace

  from jaxrl_async.runtime.pipeline.actor import Actor
  from jaxrl_async.runtime.pipeline.balancer import ActorGate

  me = SimpleNamespace(gate=ActorGate(2, active=1), index=1, stop=threading.Event(),
                       timers=ActorTimers())
  waiter = threading.Thread(target=Actor._wait_ticket, args=(me, 0))
  waiter.start()
  try:
    time.sleep(0.45)
    assert me.timers.paused_s >= 0.3  # still paused, and counted
  finally:
    me.stop.set()
    waiter.join(timeout=5)
  assert not waiter.is_alive()


class _Computing:
  """An update's flag as JAX returns it: not ready until the (asynchronous) update is done."""

  def __init__(self, seconds):
    import time
    self.done_at = time.perf_counter() + seconds

  def block_until_ready(self):
    import time
    time.sleep(max(0.0, self.done_at - time.perf_counter()))

  def __bool__(self):
    return False


def test_the_learner_is_idle_only_once_its_last_update_finished():
  """Dispatch returns at once; the learner waiting for rollouts while its update still computes
  is busy (compute_wait_s), not idle: otherwise a learner-bound run reads as starved."""
  import time

  from jaxrl_async.config import RateConfig
  from jaxrl_async.runtime.learners.loop import LearnerLoop
  from jaxrl_async.runtime.learners.on_policy import OnPolicyStep
  from jaxrl_async.runtime.pipeline.queue import RolloutInfo, RolloutQueue
  from jaxrl_async.runtime.pipeline.rate import RateController

  rate = RateController(RateConfig(max_policy_lag=1, rollouts_per_update=1))
  queue, stop = RolloutQueue(8), threading.Event()

  def update(state, batch):
    return state, {"nonfinite": _Computing(0.4)}

  step = OnPolicyStep(lambda abstract, rollouts_per_update=None: update, 1, 10**9, 1,
                      current_u=lambda: 1)
  step.fns = {1: update}
  loop = LearnerLoop(step, queue, rate, lambda state, v: None, stop, lambda: 0.0, 10, None, 0)
  thread = threading.Thread(target=loop.run)
  thread.start()
  try:
    queue.put((None, RolloutInfo(0, rate.acquire(1.0), 0, 1, 0.0)))
    time.sleep(0.2)  # the update "computes" until 0.4 s; a rollout arriving now is taken
    queue.put((None, RolloutInfo(0, rate.acquire(1.0), 0, 1, 0.0)))
    deadline = time.time() + 5
    while loop.version < 2 and time.time() < deadline:
      time.sleep(0.01)
    assert loop.version == 2  # the second was taken while the first still computed
    while loop.consumption_mark() is None and time.time() < deadline:
      time.sleep(0.01)
    first = loop.consumption_mark()  # the first update finished, 1 rollout admitted by then
    assert first is not None and first[1] == 1, first
    time.sleep(1.0)  # the second computes 0.4 s, then nothing comes: idle
  finally:
    stop.set()
    queue.close()
    rate.close()
    thread.join(5)
  t = loop.timers.snapshot()
  # The balancer's timed throughput: rollouts admitted by each finished update, and when.
  last = loop.consumption_mark()
  assert last[1] == 2 and 0.1 <= last[0] - first[0] <= 0.5, (first, last)  # 0.4 s and 0.6 s
  # No idle between the two finishes (the second was taken while the first computed), so the
  # seconds between them are all busy: the balancer's learner rate per busy second.
  assert 0.0 <= last[2] - first[2] < 0.05, (first, last)
  assert 0.45 <= t.compute_wait_s <= 0.9, t
  assert 0.5 <= t.idle_s <= 1.1, t
