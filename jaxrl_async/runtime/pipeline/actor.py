"""An actor thread: steps its own EnvPool with a jitted policy and emits rollouts.

Rollouts are assembled per env column: env e's recorded transitions [kT, (k+1)T) form column e
of rollout k, and rollout k is emitted once every env has reached time (k+1)T. In sync EnvPool
mode (batch_size == num_envs) every recv advances all envs together; in async mode recv returns
whichever envs are ready, so while the actor computes one batch's actions EnvPool steps the
others (the overlap of stepping and inference), and an env that runs ahead acts in rollout k+1
while k is being finished.

Zero drops by construction: rollout k+1 needs its own permit (a ticket) from the rate
controller, asked for when its *first* step is due, and the newest params are taken right after
it is granted, so no step of a rollout is ever acted with params older than its ticket allows
(its lag at consumption stays within K). An env that reaches a rollout whose ticket is not
granted yet is parked (its action is not sent). EnvPool's async recv waits for a whole batch, so
parking stops where it would leave fewer than batch_size envs stepping. Once every rollout of
the actor is emitted it simply waits for the ticket (nothing of its own is unfinished, so the
wait cannot hold up the learner); while one is unfinished it steps just enough parked envs with
the params it has and records those steps in no rollout (`idle_env_steps`, counted; they are
few unless the cap is tight). A
stale rollout would still be dropped at consumption and counted (`dropped_stale`): a safety
net that stays at zero.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

import jax
import numpy as np

from jaxrl_async import envs
from jaxrl_async.algos.base import Algorithm
from jaxrl_async.config import TrainConfig
from jaxrl_async.metrics import Counters, EpisodeStats
from jaxrl_async.runtime.pipeline.params import ParamStore
from jaxrl_async.runtime.pipeline.policy_step import PolicyOutputs, actor_key_data, key_data_shape
from jaxrl_async.runtime.pipeline.queue import QueueClosed, RolloutInfo, RolloutQueue
from jaxrl_async.runtime.pipeline.rate import RateController
from jaxrl_async.runtime.pipeline.rollout_buffer import (
  EnvState,
  RolloutSegment,
  write_action,
  write_observation,
)
from jaxrl_async.runtime.sharding import put_batch

_WAKE_S = 0.1  # every blocking wait wakes this often to look at the stop flag
# NOTE: two threads device_put-ting the same replicated array at once raced inside JAX's
# resharding slow path (seen once in CI: "safe_zip() argument 1 has length 4 but argument 0 has
# length 8"); the copy is cheap and once per rollout, so actors take turns.
_PARAM_PUT_LOCK = threading.Lock()


def env_seed(seed: int, actor_index: int, num_envs: int, salt: int = 0) -> int:
  """EnvPool seeds env i of this pool with `env_seed + i` (an int32). Within a run the ranges
  never overlap across actors, hosts included (`actor_index` is global), for < 2**24 envs; the
  base mixes the run seed with `salt` (resume version, restart count) so sessions differ."""
  base = int(np.random.SeedSequence([seed, salt]).generate_state(1)[0]) % (2**31 - 2**24)
  return base + actor_index * num_envs


@dataclasses.dataclass
class ActorTimers(Counters):
  """Seconds spent in each wait of the actor loop; exported so imbalance is visible. The actor
  thread writes them; the monitor, the balancer and the summary read `snapshot()`s."""

  # The per-step path: recv, host -> device, policy, device -> host, send, and the Python
  # bookkeeping between them (writes into the rollout buffers, parking).
  env_recv_s: float = 0.0
  h2d_s: float = 0.0
  inference_s: float = 0.0
  d2h_s: float = 0.0
  env_send_s: float = 0.0
  write_s: float = 0.0
  put_s: float = 0.0  # placing finished rollouts on the learner devices and queueing them
  permit_s: float = 0.0
  paused_s: float = 0.0  # held back by the balancer (not counted as blocked)
  param_fetch_s: float = 0.0
  env_steps: int = 0
  rollouts: int = 0
  lost_rollouts: int = 0  # in flight when the actor failed and was restarted
  lost_env_steps: int = 0
  idle_env_steps: int = 0  # taken while parked envs waited for a ticket, recorded in no rollout
  parked_env_waits: int = 0  # times an env was parked at a rollout boundary


class Actor:
  """One actor thread. `run()` is the thread body; it returns when `stop` is set."""

  def __init__(self, index: int, config: TrainConfig, spec: envs.EnvSpec, algo: Algorithm,
               policy_step: Any, device: jax.Device, mesh: Any, queue: RolloutQueue,
               store: ParamStore, controller: RateController, stats: EpisodeStats,
               stop: threading.Event, global_index: int | None = None,
               pool_factory: Any = envs.make_pool, start_version: int = 0,
               gate: Any = None, timers: ActorTimers | None = None):
    self.index, self.config, self.spec, self.algo = index, config, spec, algo
    self.policy_step, self.device, self.mesh = policy_step, device, mesh
    self.queue, self.store, self.controller, self.stats, self.stop = (
        queue, store, controller, stats, stop)
    self.global_index = index if global_index is None else global_index
    self.pool_factory = pool_factory  # tests pass an EnvPool-shaped fake
    # A resumed run must not replay the episodes and action noise of the first session, and a
    # restarted actor not those of its failed run: both are folded into the seeds.
    self.start_version = start_version
    self.gate = gate  # balance=auto: whether this actor may start a rollout now
    self.incarnation = 0
    self._steps_since_emit = 0
    # Given by the trainer, which counts env steps from them before the actors exist.
    self.timers = timers if timers is not None else ActorTimers()
    self.T, self.E, self.B = config.actor.rollout_len, config.env.num_envs, config.env.batch_size
    self._atari = envs.is_atari(spec.env_id)
    self._outputs = PolicyOutputs(spec.action_shape, spec.action_dtype, algo.extras_spec)
    self._tickets: dict[int, int] = {}  # rollout index -> its ticket, until it is emitted
    self._open_at_exit = 0
    self.pool_ready = False  # its env pool exists (read by the trainer at a stop)
    # NOTE: on a CPU device an explicit device_put before the call cost 70 us a step here
    # (`python -m tools.policy_step_cost`: 150 against 78 us per CartPole step); the compiled
    # call takes the numpy array itself, so there the copy is inside `inference_s`.
    self._explicit_h2d = device.platform != "cpu"

  # -- tickets and params ---------------------------------------------------------------------

  def _try_ticket(self, k: int) -> bool:
    """Rollout k's ticket if the balancer and the controller grant it now (no wait)."""
    if self.gate is not None and not self.gate.wait_active(self.index, 0):
      return False
    ticket = self.controller.acquire(0)
    if ticket is None:
      return False
    self._tickets[k] = ticket
    return True

  def _wait_ticket(self, k: int) -> bool:
    """Rollout k's ticket, waiting (with a look at the stop flag every _WAKE_S); only called
    when no rollout of this actor is unfinished, so the learner never waits on this wait."""
    if self.gate is not None:
      t0 = time.perf_counter()
      while not self.gate.wait_active(self.index, _WAKE_S):
        # Counted as it goes: an actor paused for the rest of the run is paused in every
        # metrics interval, not only when (if ever) it resumes.
        now = time.perf_counter()
        self.timers.paused_s, t0 = self.timers.paused_s + now - t0, now
        if self.stop.is_set():
          return False
      self.timers.paused_s += time.perf_counter() - t0
    t0 = time.perf_counter()
    while not self.stop.is_set():
      ticket = self.controller.acquire(_WAKE_S)
      if ticket is not None:
        self._tickets[k] = ticket
        self.timers.permit_s += time.perf_counter() - t0
        return True
    return False

  def _fetch_params(self) -> tuple[Any, int]:
    t0 = time.perf_counter()
    params, version = self.store.latest()
    # NOTE: the published params are replicated on the learner mesh; the policy runs on this
    # actor's device alone, so take (a copy of) the local replica once per rollout.
    with _PARAM_PUT_LOCK:
      params = jax.device_put(params, self.device)
    self.timers.param_fetch_s += time.perf_counter() - t0
    return params, version

  def _emit(self, seg: RolloutSegment, k: int) -> None:
    t0 = time.perf_counter()
    batch = put_batch(seg.rollout(), self.mesh)
    info = RolloutInfo(self.global_index, self._tickets[k], int(seg.version), self.T * self.E,
                       time.time())
    self.queue.put((batch, info))
    del self._tickets[k]  # the permit now travels with the rollout
    with self.timers.lock:
      self.timers.put_s += time.perf_counter() - t0
      self.timers.rollouts += 1
    self._steps_since_emit = 0

  # -- the policy -----------------------------------------------------------------------------

  def _infer(self, params: Any, obs: np.ndarray, key: Any) -> tuple[np.ndarray, dict, Any]:
    """Actions for `obs` [m, ...], m <= batch_size (padded to the compiled batch)."""
    m = len(obs)
    if m < self.B:
      obs = np.concatenate([obs, np.repeat(obs[:1], self.B - m, axis=0)])
    t0 = time.perf_counter()
    if self._explicit_h2d:
      obs = jax.device_put(obs, self.device)
    t1 = time.perf_counter()
    packed, key = self.policy_step(params, obs, key)
    packed.block_until_ready()
    t2 = time.perf_counter()
    action, extras = self._outputs.unpack(np.asarray(packed))  # the step's one copy to host
    t3 = time.perf_counter()
    with self.timers.lock:
      self.timers.h2d_s += t1 - t0
      self.timers.inference_s += t2 - t1
      self.timers.d2h_s += t3 - t2
    if m < self.B:
      action, extras = action[:m], {k: v[:m] for k, v in extras.items()}
    return action, extras, key

  def _infer_rows(self, params: Any, obs: np.ndarray, key: Any) -> tuple[np.ndarray, dict, Any]:
    """`_infer` over any number of rows, a batch at a time (parked envs join a batch)."""
    if len(obs) == 0:  # every env of this batch parked
      return (*self._outputs.unpack(np.zeros((0, self._outputs.width), np.uint32)), key)
    parts = []
    for i in range(0, len(obs), self.B):
      action, extras, key = self._infer(params, obs[i:i + self.B], key)
      parts.append((action, extras))
    if len(parts) == 1:
      return parts[0][0], parts[0][1], key
    action = np.concatenate([a for a, _ in parts])
    extras = {k: np.concatenate([e[k] for _, e in parts]) for k in parts[0][1]}
    return action, extras, key

  # -- the loop ----------------------------------------------------------------------------

  def on_restart(self) -> None:
    """Called by the supervisor after a failure: what was in flight is lost, and counted."""
    with self.timers.lock:
      self.timers.lost_rollouts += max(1, self._open_at_exit)
      self.timers.lost_env_steps += self._steps_since_emit
    self._steps_since_emit = 0
    self.incarnation += 1

  def _salt(self) -> int:
    return self.start_version + 1_000_003 * self.incarnation

  def run(self) -> None:
    env_id = self.config.env.env_id
    self.pool_ready = False
    try:
      pool = self.pool_factory(self.config.env, env_seed(self.config.run.seed, self.global_index,
                                                        self.E, self._salt()))
    except Exception as e:
      raise RuntimeError(f"EnvPool could not make {env_id} for actor {self.index}: {e}") from e
    # Construction is one C call that nothing can wake: until it returns, a shutdown leaves
    # this thread to finish on its own (the trainer abandons it, and it then sees the stop).
    self.pool_ready = True
    try:
      self._loop(pool)
    except QueueClosed:
      pass  # shutdown
    except Exception as e:
      if type(e).__module__.startswith("envpool") or "envpool" in repr(e).lower():
        raise RuntimeError(f"EnvPool {env_id} failed in actor {self.index}: {e}") from e
      raise
    finally:
      self._open_at_exit = len(self._tickets)
      for ticket in self._tickets.values():
        self.controller.release(ticket)
      self._tickets.clear()
      pool.close()

  def _loop(self, pool: Any) -> None:
    T, timers = self.T, self.timers
    new_segment = lambda: RolloutSegment(T, self.E, self.spec, self.algo.extras_spec)
    segments: dict[int, RolloutSegment] = {}
    tracker = envs.EpisodeTracker(self.E)
    st = EnvState(self.E, self.spec)
    key = jax.device_put(actor_key_data(self.config.run.seed, self.global_index, self._salt(),
                                        key_data_shape()), self.device)
    if not self._wait_ticket(0):
      return
    params, version = self._fetch_params()
    pool.async_reset()

    while not self.stop.is_set():
      t0 = time.perf_counter()
      obs, reward, terminated, truncated, info = pool.recv()
      t1 = time.perf_counter()
      waited_before = timers.put_s + timers.permit_s + timers.paused_s + timers.param_fetch_s
      obs = obs.astype(self.spec.obs_dtype, copy=False)
      ids = np.asarray(info["env_id"])
      st.in_pool -= len(ids)
      self._steps_since_emit += len(ids)
      n, recorded, returned = st.received(ids)
      with timers.lock:
        timers.env_recv_s += t1 - t0
        timers.env_steps += len(ids)
        timers.idle_env_steps += returned

      step_end = terminated | truncated
      true_end = (info["terminated"].astype(bool) | truncated) if self._atari else step_end
      raw_reward = info["reward"] if self._atari else reward
      ret, length, obs_ends = tracker.update(ids, raw_reward, step_end, true_end)
      self.stats.record(ret, length)
      write_observation(segments, new_segment, T, n, ids, obs, reward, terminated, truncated,
                         recorded)

      # Emit every rollout that all envs have finished.
      while st.counts.min() > (st.next_emit + 1) * T:
        self._emit(segments.pop(st.next_emit), st.next_emit)
        st.next_emit += 1

      if not st.n_parked and n.max() < (st.open_upto + 1) * T:
        # The common case: every env of the batch acts in a rollout that has its ticket.
        t2 = time.perf_counter()
        action, extras, key = self._infer(params, obs, key)
        t3 = time.perf_counter()
        write_action(segments, T, n, ids, action, ~obs_ends, extras, version)
        send_ids = ids
      else:
        # Some env reached a rollout without a ticket, or parked envs wait for one.
        decision = self._at_boundary(st, ids, n, obs, obs_ends)
        if decision is None:
          return
        act, released, stepped_idle, fetched = decision
        if fetched is not None:
          params, version = fetched
        t2 = time.perf_counter()
        extra = released if released is not None else stepped_idle
        send_ids = np.concatenate([ids[act], extra])
        action, extras, key = self._infer_rows(
            params, np.concatenate([obs[act], st.held_obs[extra]]), key)
        t3 = time.perf_counter()
        rec = len(send_ids) if released is not None else int(act.sum())
        if rec:
          rec_n = np.concatenate([n[act], st.counts[extra] - 1])[:rec]
          rec_valid = np.concatenate([~obs_ends[act], st.held_valid[extra]])[:rec]
          write_action(segments, T, rec_n, send_ids[:rec], action[:rec], rec_valid,
                        {k: v[:rec] for k, v in extras.items()}, version)
      # Bookkeeping only: the waits in between (queue put, tickets, params) have their own.
      waited = timers.put_s + timers.permit_s + timers.paused_s + timers.param_fetch_s
      t4 = time.perf_counter()
      timers.write_s += (t2 - t1) - (waited - waited_before) + (t4 - t3)
      if len(send_ids):
        pool.send(action, send_ids)
        st.in_pool += len(send_ids)
      timers.env_send_s += time.perf_counter() - t4

  def _at_boundary(self, st: EnvState, ids: np.ndarray, n: np.ndarray, obs: np.ndarray,
                   obs_ends: np.ndarray) -> tuple | None:
    """Decides, at a rollout boundary, which envs act: (act [b] over the batch, released parked
    envs or None, envs stepped off the record or None, newly fetched (params, version) or
    None); None at shutdown."""
    need = n >= (st.open_upto + 1) * self.T
    act, released, stepped_idle, fetched = ~need, None, None, None
    if self._try_ticket(st.open_upto + 1):
      st.open_upto += 1
      fetched = self._fetch_params()
      act[:] = True
      return act, st.release_parked(), None, fetched
    st.park(ids[need], obs[need], ~obs_ends[need])
    self.timers.parked_env_waits += int(need.sum())
    if st.next_emit > st.open_upto:  # nothing of ours is unfinished: the wait holds up no one
      if not self._wait_ticket(st.open_upto + 1):
        return None
      st.open_upto += 1
      return act, st.release_parked(), None, self._fetch_params()
    stepping = st.in_pool + int(act.sum())
    if stepping < self.B:  # recv would wait forever: step a few parked envs off the record
      stepped_idle = st.step_idle(self.B - stepping)
    else:
      stepped_idle = np.zeros(0, np.int64)
    return act, released, stepped_idle, fetched


