"""The on-policy learner step: U admitted rollouts make one update (IMPALA, PPO, A2C).

The compiled update is `jit(shard_map(algo.update))` over the learner mesh, compiled ahead of
time (`lower().compile()`) when the learner thread starts (loop.py), so compilation overlaps the
actors' first rollouts.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_async.algos.base import Algorithm, Rollout, concat_rollouts
from jaxrl_async.config import TrainConfig
from jaxrl_async.envs import EnvSpec
from jaxrl_async.runtime.learners.loop import Advance
from jaxrl_async.runtime.pipeline.rate import RateController
from jaxrl_async.runtime.sharding import batch_sharding, data_parallel


def batch_shapes(config: TrainConfig, spec: EnvSpec, algo: Algorithm, mesh: Any,
                 rollouts_per_update: int | None = None) -> tuple[Rollout, ...]:
  """Abstract (shape, dtype, sharding) of the U rollouts one update takes (U: the config's
  unless given)."""
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
  return (one,) * (rollouts_per_update or config.rate.rollouts_per_update)


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
                 state: Any, rollouts_per_update: int | None = None) -> Any:
  """The data-parallel update, traced and lowered from `state`'s shapes."""
  update = skip_nonfinite(lambda s, rollouts: algo.update(s, concat_rollouts(rollouts)))
  shapes = batch_shapes(config, spec, algo, mesh, rollouts_per_update)
  return data_parallel(update, mesh).lower(state, shapes)


def compile_update(config: TrainConfig, spec: EnvSpec, algo: Algorithm, mesh: Any,
                   state: Any, executables: Any = None,
                   rollouts_per_update: int | None = None) -> Any:
  """The update compiled ahead of time (or, with `executables`, loaded from
  runtime/executables.py's cache on a warm start), for U rollouts (the config's unless given:
  --balance=auto compiles others while the run goes on)."""
  lower = lambda: lower_update(config, spec, algo, mesh, state, rollouts_per_update)
  if executables is None:
    return lower().compile()
  u = rollouts_per_update or config.rate.rollouts_per_update
  name = "update" if u == config.rate.rollouts_per_update else f"update-u{u}"
  return executables.compile(name, list(mesh.devices.flat), lower)


class OnPolicyStep:
  """U admitted rollouts (any actors') -> one update: the LearnerStep of IMPALA, PPO, A2C.

  `compile_fn(abstract_state, rollouts_per_update=U)` gives the compiled
  `(state, rollouts) -> (state, metrics)` (`compile_update`). U is `rollouts_per_update`, or,
  with `current_u` (the rate controller's, which --balance=auto moves), whatever that says when
  a batch is filled; `compile_for(u)` compiles another U in the background, and the balancer
  moves U there only once it is compiled. The budget is counted in rollouts: `target_version`
  updates of the configured U, less the rollouts learned before this session (so a run's length
  does not depend on thread timing, nor on the U's it used): `learned_before()` gives those of a
  resumed run (its checkpoint's `rollouts_learned`), None (or no callable) counting the version
  it starts at as updates of the configured U. Each rollout learned consumes
  `consumed_per_rollout` env steps (with reuse).
  """

  def __init__(self, compile_fn: Any, rollouts_per_update: int, target_version: int,
               consumed_per_rollout: int, current_u: Any = None,
               learned_before: Callable[[], int | None] | None = None):
    self.compile_fn, self.rollouts_per_update = compile_fn, rollouts_per_update
    self.target_version, self.consumed_per_rollout = target_version, consumed_per_rollout
    self.current_u = current_u or (lambda: rollouts_per_update)
    self.learned_before = learned_before or (lambda: None)
    self._before = 0  # rollouts learned before this session (`prepare`)
    self.fns: dict[int, Any] = {}
    self._abstract: Any = None
    self._compiling: dict[int, concurrent.futures.Future] = {}
    self._pool: concurrent.futures.ThreadPoolExecutor | None = None
    self._rollouts: list[Rollout] = []
    self._tickets: list[int] = []
    self.learned = 0  # rollouts learned from this session
    self.updates_by_u: dict[int, int] = {}  # updates made with each U (--balance=auto moves it)
    self._budget = 0

  @property
  def fn(self) -> Any:
    return self.fns.get(self.rollouts_per_update)

  def compile(self, abstract_state: Any) -> None:
    self._abstract = abstract_state
    self.fns[self.rollouts_per_update] = self.compile_fn(abstract_state)

  def compile_for(self, u: int) -> bool:
    """Whether U = u is compiled; if not, its compilation is started (in the background)."""
    if u in self.fns:
      return True
    if self._abstract is None:
      return False  # the first compile has not begun
    if u not in self._compiling:
      if self._pool is None:
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="compile-u")
      self._compiling[u] = self._pool.submit(self._compile_u, u)
    future = self._compiling[u]
    if future.done():
      future.result()  # raises a failed compilation here, in the balancer's thread
    return u in self.fns

  def _compile_u(self, u: int) -> None:
    self.fns[u] = self.compile_fn(self._abstract, rollouts_per_update=u)

  def prepare(self, state: Any, version: int, stop: Any) -> bool:
    before = self.learned_before()
    self._before = version * self.rollouts_per_update if before is None else before
    self._budget = max(self.target_version * self.rollouts_per_update - self._before, 0)
    return True

  def wants(self) -> bool:
    return len(self._rollouts) < self.current_u()

  def add(self, rollout: Rollout, ticket: int) -> None:
    self._rollouts.append(rollout)
    self._tickets.append(ticket)

  def ready(self) -> bool:
    return len(self._rollouts) >= self.current_u()

  def take_batch(self) -> tuple[tuple[Rollout, ...], tuple[int, ...]]:
    batch, tickets = tuple(self._rollouts), tuple(self._tickets)
    self._rollouts, self._tickets = [], []
    return batch, tickets

  def call(self, state: Any, version: int) -> Advance:
    batch, tickets = self.take_batch()
    state, metrics = self.fns[len(batch)](state, batch)
    self.learned += len(batch)
    self.updates_by_u[len(batch)] = self.updates_by_u.get(len(batch), 0) + 1
    return Advance(state, metrics, 1, tickets, self.consumed_per_rollout * len(batch))

  def save_agreed(self, version: int) -> bool:
    return False

  def done(self, version: int) -> bool:
    return self.learned >= self._budget

  def extra_metrics(self, idle_s: float) -> dict[str, Any]:
    return {"rollouts_per_update": self.current_u(),
            "updates_by_rollouts_per_update": {str(u): n for u, n in
                                               sorted(self.updates_by_u.items())}}

  def snapshot(self) -> None:
    return None

  def counters(self) -> dict[str, Any]:
    return {"rollouts_learned": self._before + self.learned}

  def close(self, controller: RateController) -> None:
    for ticket in self._tickets:
      controller.release(ticket)
    self._rollouts, self._tickets = [], []
    if self._pool is not None:
      self._pool.shutdown(wait=False, cancel_futures=True)
