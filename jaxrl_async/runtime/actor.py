"""An actor thread: steps its own EnvPool with a jitted policy and emits rollouts.

Rollouts are assembled per env column: env e's transitions [kT, (k+1)T) form column e of
rollout k, and rollout k is emitted once every env has reached time (k+1)T. In sync EnvPool mode
(batch_size == num_envs) every recv advances all envs together; in async mode recv returns
whichever envs are ready, so an env that runs ahead writes into rollout k+1 while k is being
finished. No env is ever held back, so EnvPool never starves. A rollout's behaviour version is
the oldest params version that acted in it, which keeps the lag accounting conservative.

Each rollout needs a permit from the rate controller (taken when the previous one is emitted);
the actor then takes the newest published params.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

import jax
import numpy as np

from jaxrl_async import envs
from jaxrl_async.algos.base import Algorithm, Rollout
from jaxrl_async.config import TrainConfig
from jaxrl_async.metrics import EpisodeStats
from jaxrl_async.runtime.params import ParamStore
from jaxrl_async.runtime.queue import QueueClosed, RolloutInfo, RolloutQueue
from jaxrl_async.runtime.rate import RateController
from jaxrl_async.runtime.sharding import host_buffer, put_batch

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


def key_data_shape() -> tuple[int, ...]:
  """The shape of one key's raw data under the configured PRNG implementation (traced only)."""
  return jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0))).shape


def lower_policy_step(policy: Any, params: Any, spec: envs.EnvSpec, batch_size: int,
                      device: jax.Device) -> Any:
  """The actors' (params, obs, key data) -> (action, extras, key data), traced and lowered for
  `device` from shapes alone (`params` may be ShapeDtypeStructs).

  Keys travel as raw data so actors make theirs in numpy (`actor_key_data`).
  """

  def step(params, obs, key_data):
    key, sub = jax.random.split(jax.random.wrap_key_data(key_data))
    action, extras = policy(params, obs, sub)
    return action, extras, jax.random.key_data(key)

  on_actor = jax.sharding.SingleDeviceSharding(device)
  shaped = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=on_actor)
  params = jax.tree.map(lambda p: shaped(p.shape, p.dtype), params)
  obs = shaped((batch_size,) + spec.obs_shape, spec.obs_dtype)
  return jax.jit(step).lower(params, obs, shaped(key_data_shape(), np.uint32))


def compile_policy_step(policy: Any, params: Any, spec: envs.EnvSpec, batch_size: int,
                        device: jax.Device, executables: Any = None, name: str = "policy"
                        ) -> Any:
  """`lower_policy_step` compiled ahead of time (or, with `executables`, loaded from
  runtime/executables.py's cache under `name` on a warm start)."""
  lower = lambda: lower_policy_step(policy, params, spec, batch_size, device)
  return executables.compile(name, [device], lower) if executables else lower().compile()


def actor_key_data(seed: int, actor_index: int, salt: int, shape: tuple[int, ...]) -> np.ndarray:
  """The actor's initial PRNG key, as raw key data made in numpy.

  Eager `jax.random` calls compile one small program each (rbg's fold_in alone took 0.5 s on
  this CPU), on the path to the first rollout; the compiled policy step wraps the data itself.
  """
  size = int(np.prod(shape))
  return np.random.SeedSequence([seed, actor_index, salt]).generate_state(size).reshape(shape)


@dataclasses.dataclass
class ActorTimers:
  """Seconds spent in each wait of the actor loop; exported so imbalance is visible."""

  env_recv_s: float = 0.0
  inference_s: float = 0.0
  put_s: float = 0.0
  permit_s: float = 0.0
  paused_s: float = 0.0  # held back by the balancer (not counted as blocked)
  param_fetch_s: float = 0.0
  env_steps: int = 0
  rollouts: int = 0
  lost_rollouts: int = 0  # in flight when the actor failed and was restarted
  lost_env_steps: int = 0


class _Segment:
  """Host buffers for one rollout; fresh ones each time, since device_put copies asynchronously
  (or, on a CPU device, aliases them: `host_buffer`), so they are never written after the put."""

  def __init__(self, T: int, E: int, spec: envs.EnvSpec, extras_spec: dict[str, Any]):
    self.obs = host_buffer((T + 1, E) + spec.obs_shape, spec.obs_dtype)
    self.actions = host_buffer((T, E) + spec.action_shape, spec.action_dtype)
    self.rewards = host_buffer((T, E), np.float32)
    self.terminated = host_buffer((T, E), bool)
    self.truncated = host_buffer((T, E), bool)
    self.valid = host_buffer((T, E), bool)
    self.extras = {k: host_buffer((T, E) + shape, dtype)
                   for k, (shape, dtype) in extras_spec.items()}
    self.version: int | None = None

  def rollout(self) -> Rollout:
    return Rollout(self.obs, self.actions, self.rewards, self.terminated, self.truncated,
                   self.valid, self.extras)


class Actor:
  """One actor thread. `run()` is the thread body; it returns when `stop` is set."""

  def __init__(self, index: int, config: TrainConfig, spec: envs.EnvSpec, algo: Algorithm,
               policy_step: Any, device: jax.Device, mesh: Any, queue: RolloutQueue,
               store: ParamStore, controller: RateController, stats: EpisodeStats,
               stop: threading.Event, global_index: int | None = None,
               pool_factory: Any = envs.make_pool, start_version: int = 0,
               gate: Any = None):
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
    self.timers = ActorTimers()
    self.T, self.E = config.actor.rollout_len, config.env.num_envs
    self._atari = envs.is_atari(spec.env_id)
    self._ticket: int | None = None

  # -- blocking steps, each with a timeout and a look at the stop flag ----------------------

  def _acquire_permit(self) -> bool:
    if self.gate is not None:
      t0 = time.perf_counter()
      while not self.gate.wait_active(self.index, _WAKE_S):
        if self.stop.is_set():
          return False
      self.timers.paused_s += time.perf_counter() - t0
    t0 = time.perf_counter()
    while not self.stop.is_set():
      self._ticket = self.controller.acquire(_WAKE_S)
      if self._ticket is not None:
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

  def _emit(self, seg: _Segment) -> bool:
    t0 = time.perf_counter()
    batch = put_batch(seg.rollout(), self.mesh)
    info = RolloutInfo(self.global_index, self._ticket, int(seg.version), self.T * self.E,
                       time.time())
    while not self.stop.is_set():
      if self.queue.put((batch, info), _WAKE_S):
        self._ticket = None  # the permit now travels with the rollout
        self.timers.put_s += time.perf_counter() - t0
        self.timers.rollouts += 1
        self._steps_since_emit = 0
        return True
    return False

  # -- the loop ----------------------------------------------------------------------------

  def on_restart(self) -> None:
    """Called by the supervisor after a failure: what was in flight is lost, and counted."""
    self.timers.lost_rollouts += 1
    self.timers.lost_env_steps += self._steps_since_emit
    self._steps_since_emit = 0
    self.incarnation += 1

  def _salt(self) -> int:
    return self.start_version + 1_000_003 * self.incarnation

  def run(self) -> None:
    env_id = self.config.env.env_id
    try:
      pool = self.pool_factory(self.config.env, env_seed(self.config.run.seed, self.global_index,
                                                        self.E, self._salt()))
    except Exception as e:
      raise RuntimeError(f"EnvPool could not make {env_id} for actor {self.index}: {e}") from e
    try:
      self._loop(pool)
    except QueueClosed:
      pass  # shutdown
    except Exception as e:
      if type(e).__module__.startswith("envpool") or "envpool" in repr(e).lower():
        raise RuntimeError(f"EnvPool {env_id} failed in actor {self.index}: {e}") from e
      raise
    finally:
      if self._ticket is not None:
        self.controller.release(self._ticket)
        self._ticket = None
      pool.close()

  def _loop(self, pool: Any) -> None:
    T, E = self.T, self.E
    new_segment = lambda: _Segment(T, E, self.spec, self.algo.extras_spec)
    segments: dict[int, _Segment] = {}
    counts = np.zeros(E, np.int64)  # recvs so far per env = the next obs time index
    tracker = envs.EpisodeTracker(E)
    key = jax.device_put(actor_key_data(self.config.run.seed, self.global_index, self._salt(),
                                        key_data_shape()), self.device)
    next_emit = 0
    if not self._acquire_permit():
      return
    params, version = self._fetch_params()
    pool.async_reset()

    while not self.stop.is_set():
      t0 = time.perf_counter()
      obs, reward, terminated, truncated, info = pool.recv()
      t1 = time.perf_counter()
      self.timers.env_recv_s += t1 - t0
      obs = obs.astype(self.spec.obs_dtype, copy=False)
      ids = np.asarray(info["env_id"])
      self.timers.env_steps += len(ids)
      self._steps_since_emit += len(ids)
      n = counts[ids]
      counts[ids] += 1

      step_end = terminated | truncated
      true_end = (info["terminated"].astype(bool) | truncated) if self._atari else step_end
      raw_reward = info["reward"] if self._atari else reward
      ret, length, obs_ends = tracker.update(ids, raw_reward, step_end, true_end)
      self.stats.record(ret, length)

      _write_observation(segments, new_segment, T, n, ids, obs, reward, terminated, truncated)

      # Emit every segment that all envs have finished; each next one needs a permit.
      while counts.min() > (next_emit + 1) * T:
        if not self._emit(segments.pop(next_emit)):
          return
        next_emit += 1
        if not self._acquire_permit():
          return
        params, version = self._fetch_params()

      t2 = time.perf_counter()
      action, extras, key = self.policy_step(params, obs, key)
      action = np.asarray(action)
      extras = {k: np.asarray(v) for k, v in extras.items()}
      self.timers.inference_s += time.perf_counter() - t2
      _write_action(segments, T, n, ids, action, ~obs_ends, extras, version)
      pool.send(action, ids)


def _write_observation(segments, new_segment, T, n, ids, obs, reward, terminated, truncated):
  """Stores obs n of envs `ids`, and the results of their transition n - 1 (EnvPool returns
  those with obs n). Obs n is also the bootstrap obs of the previous segment when n % T == 0."""
  has_prev = n >= 1
  for k, sel in _by_segment(n[has_prev] - 1, T):
    rows, cols = (n[has_prev][sel] - 1) % T, ids[has_prev][sel]
    seg = segments[k]
    seg.rewards[rows, cols] = reward[has_prev][sel]
    seg.terminated[rows, cols] = terminated[has_prev][sel]
    seg.truncated[rows, cols] = truncated[has_prev][sel]
  for k, sel in _by_segment(n, T):
    seg = segments[k] if k in segments else segments.setdefault(k, new_segment())
    rows, cols = n[sel] % T, ids[sel]
    seg.obs[rows, cols] = obs[sel]
    boundary = (rows == 0) & (k > 0)
    if boundary.any():
      segments[k - 1].obs[T, cols[boundary]] = obs[sel][boundary]


def _write_action(segments, T, n, ids, action, valid, extras, version):
  for k, sel in _by_segment(n, T):
    seg, rows, cols = segments[k], n[sel] % T, ids[sel]
    seg.actions[rows, cols] = action[sel]
    seg.valid[rows, cols] = valid[sel]
    for name, value in extras.items():
      seg.extras[name][rows, cols] = value[sel]
    seg.version = version if seg.version is None else min(seg.version, version)


def _by_segment(times: np.ndarray, T: int):
  """Yields (segment k, boolean selector) for the distinct segments `times` fall in."""
  if len(times) == 0:
    return
  ks = times // T
  first = ks[0]
  if ks[-1] == first and (ks == first).all():  # the common case, and always so in sync mode
    yield int(first), slice(None)
    return
  for k in np.unique(ks):
    yield int(k), ks == k
