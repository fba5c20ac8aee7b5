"""The learner thread: takes the next rollouts from the queue, whichever actor made them, learns,
publishes.

The compiled step is `jit(shard_map(algo.update))` over the learner mesh, compiled ahead of time
(`lower().compile()`) when the thread starts, so compilation overlaps the actors' first rollouts.
The learner never reads a result back to the host on its critical path: params are published as
soon as the step is dispatched, and metrics stay on device until the metrics loop asks.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_async.algos.base import Algorithm, Rollout, concat_rollouts
from jaxrl_async.config import TrainConfig
from jaxrl_async.envs import EnvSpec
from jaxrl_async.runtime.pipeline.params import ParamStore
from jaxrl_async.runtime.pipeline.queue import QueueClosed, RolloutQueue
from jaxrl_async.runtime.pipeline.rate import RateController
from jaxrl_async.runtime.sharding import batch_sharding, data_parallel

_WAKE_S = 0.1


@dataclasses.dataclass
class LearnerTimers:
  idle_s: float = 0.0  # waiting for rollouts
  dispatch_s: float = 0.0  # calling the compiled step and publishing
  compile_s: float = 0.0
  updates: int = 0
  consumed_env_steps: int = 0  # counted with reuse (epochs)
  first_update_wall_s: float | None = None


def batch_shapes(config: TrainConfig, spec: EnvSpec, algo: Algorithm, mesh: Any
                 ) -> tuple[Rollout, ...]:
  """Abstract (shape, dtype, sharding) of the U rollouts one update takes."""
  T, E = config.actor.rollout_len, config.env.num_envs
  sharding = batch_sharding(mesh)
  s = lambda shape, dtype: jax.ShapeDtypeStruct(shape, np.dtype(dtype), sharding=sharding)
  one = Rollout(
      obs=s((T + 1, E) + spec.obs_shape, spec.obs_dtype),
      actions=s((T, E) + spec.action_shape, spec.action_dtype),
      rewards=s((T, E), np.float32), terminated=s((T, E), bool), truncated=s((T, E), bool),
      valid=s((T, E), bool),
      extras={k: s((T, E) + shape, dtype) for k, (shape, dtype) in algo.extras_spec.items()},
      behaviour_version=s((1, E), np.int32))
  return (one,) * config.rate.rollouts_per_update


class NonFiniteUpdates(RuntimeError):
  """Too many consecutive updates produced non-finite values."""


def skip_nonfinite(update: Any) -> Any:
  """Wraps `update(state, batch)`: if anything it produced is not finite (loss, gradients, and so
  params or optimiser state), the old state is kept, and `metrics["nonfinite"]` says so.

  The version still advances (its params equal the previous version's), so checking the flag
  never needs a host round trip on the learner's critical path.
  """

  def guarded(state, batch):
    new_state, metrics = update(state, batch)
    is_float = lambda x: jnp.issubdtype(x.dtype, jnp.floating)
    floats = [x for x in jax.tree.leaves((new_state, metrics)) if is_float(x)]
    # One check over one flat vector and one cond, rather than a check and a select per leaf:
    # the same answer in a third of the ops, which cuts the update's compile time.
    ok = jnp.isfinite(jnp.concatenate([x.ravel() for x in floats])).all()
    # Only float leaves roll back; counters (the version) and RNG keys move on.
    rolled_back = lambda: jax.tree.map(lambda new, old: old if is_float(new) else new,
                                       new_state, state)
    state = jax.lax.cond(ok, lambda: new_state, rolled_back)
    return state, dict(metrics, nonfinite=~ok)

  return guarded


def lower_update(config: TrainConfig, spec: EnvSpec, algo: Algorithm, mesh: Any,
                 state: Any) -> Any:
  """The data-parallel update, traced and lowered from `state`'s shapes."""
  update = skip_nonfinite(lambda s, rollouts: algo.update(s, concat_rollouts(rollouts)))
  return data_parallel(update, mesh).lower(state, batch_shapes(config, spec, algo, mesh))


def compile_update(config: TrainConfig, spec: EnvSpec, algo: Algorithm, mesh: Any,
                   state: Any, executables: Any = None) -> Any:
  """The update compiled ahead of time (or, with `executables`, loaded from
  runtime/executables.py's cache on a warm start)."""
  lower = lambda: lower_update(config, spec, algo, mesh, state)
  if executables is None:
    return lower().compile()
  return executables.compile("update", list(mesh.devices.flat), lower)


class Learner:
  """`run()` is the thread body; `state` and `version` are the learner's, read after join."""

  def __init__(self, config: TrainConfig, spec: EnvSpec, algo: Algorithm, mesh: Any,
               state: Any, version: int, queue: RolloutQueue, store: ParamStore,
               controller: RateController, stop: threading.Event, wall_s: Any,
               step_fn: Any = None, state_future: Any = None, executables: Any = None):
    self.config, self.spec, self.algo, self.mesh = config, spec, algo, mesh
    self.state, self.version = state, version
    self.queue, self.store, self.controller, self.stop = queue, store, controller, stop
    self.wall_s = wall_s
    self.step_fn = step_fn
    self.executables = executables
    # `state` may be abstract (shapes only) until `state_future` delivers the real one, so the
    # update compiles while the initial state is computed.
    self._state_future = state_future
    self.timers = LearnerTimers()
    self.last_metrics: Any = None
    self.compiled = threading.Event()
    # The budget is counted in updates, so a run's length does not depend on thread timing.
    self.max_updates = max(
        0, -(-config.run.total_env_steps // config.env_steps_per_update) - version)
    self.finished = threading.Event()
    self.after_update: Any = None  # the trainer's hook (checkpoints): f(version, state)
    self.nonfinite_skipped = 0
    self._nonfinite_run = 0
    self._pending_flag: Any = None

  def _compile(self) -> None:
    if self.step_fn is None:
      t0 = time.perf_counter()
      self.step_fn = compile_update(self.config, self.spec, self.algo, self.mesh, self.state,
                                    self.executables)
      self.timers.compile_s = time.perf_counter() - t0
    self.compiled.set()

  def _next_batch(self) -> tuple[tuple[Rollout, ...], list[int]] | None:
    """U admitted rollouts and their tickets, or None at shutdown. The controller drops stale
    ones."""
    batch: list[Rollout] = []
    tickets: list[int] = []
    t0 = time.perf_counter()
    while len(batch) < self.config.rate.rollouts_per_update:
      try:
        item = self.queue.get(_WAKE_S)
      except QueueClosed:
        return None
      if item is None:
        if self.stop.is_set():
          return None
        continue
      rollout, info = item
      if self.controller.admit(info.ticket, info.behaviour_version):
        batch.append(rollout)
        tickets.append(info.ticket)
    self.timers.idle_s += time.perf_counter() - t0
    return tuple(batch), tickets

  def _await_state(self) -> bool:
    while self._state_future is not None and not self.stop.is_set():
      try:
        self.state = self._state_future.result(timeout=_WAKE_S)
        self._state_future = None
      except concurrent.futures.TimeoutError:
        continue
    return self._state_future is None

  def run(self) -> None:
    self._compile()
    if not self._await_state():
      return
    reuse = self.algo.grad_steps_per_update // max(
        1, getattr(self.config.algo, "num_minibatches", 1))
    steps_per_update = self.config.env_steps_per_update
    while not self.stop.is_set():
      if self.timers.updates >= self.max_updates:
        self.finished.set()
        return
      taken = self._next_batch()
      if taken is None:
        return
      batch, tickets = taken
      t0 = time.perf_counter()
      self.state, self.last_metrics = self.step_fn(self.state, batch)
      self.version += 1
      self.store.publish(self.algo.actor_params(self.state), self.version)
      self.controller.published(self.version, tickets)
      self.timers.dispatch_s += time.perf_counter() - t0
      self.timers.updates += 1
      self.timers.consumed_env_steps += steps_per_update * max(reuse, 1)
      if self.timers.first_update_wall_s is None:
        self.timers.first_update_wall_s = self.wall_s()
      self._count_nonfinite(self.last_metrics["nonfinite"])
      if self.after_update is not None:
        self.after_update(self.version, self.state)

  def _count_nonfinite(self, flag: Any) -> None:
    """Reads the previous update's flag (finished by now, as the new update depends on it)."""
    previous, self._pending_flag = self._pending_flag, flag
    if previous is None:
      return
    if bool(previous):
      self.nonfinite_skipped += 1
      self._nonfinite_run += 1
      if self._nonfinite_run >= self.config.run.max_nonfinite_updates:
        raise NonFiniteUpdates(
            f"{self._nonfinite_run} consecutive updates had non-finite loss or gradients "
            f"(--max_nonfinite_updates={self.config.run.max_nonfinite_updates}); each was "
            "skipped, so the params and the last checkpoint are the last finite ones")
    else:
      self._nonfinite_run = 0
