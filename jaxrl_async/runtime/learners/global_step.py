"""The global learner step of a multi-process run (cluster/lockstep.py says how the run agrees).

Each host's loop (loop.py) takes U rollouts from its own queue (they sit on its local learner
devices); this step stitches them into its part of the global batch (`sharding.globalize`, no
copy) and launches the global update over every host's learner devices, with this host's
agreement rows: [stop, checkpoint, env steps, episodes] as int32 per learner device. The update
returns the max of the first two and the sum of the counts over all hosts. Update v-1's answer
is read just after update v is launched, where the loop already waits for v-1 (its non-finite
flag), so agreement adds no host round trip; every process reads the same answer at the same
update, so all stop, or save, at the same version.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_async.algos.base import Rollout, concat_rollouts
from jaxrl_async.config import TrainConfig
from jaxrl_async.metrics import Ema
from jaxrl_async.runtime.learners.loop import Advance
from jaxrl_async.runtime.learners.on_policy import OnPolicyStep, batch_shapes, skip_nonfinite
from jaxrl_async.runtime.pipeline.rate import RateController
from jaxrl_async.runtime.sharding import (
  LEARNER_AXIS,
  batch_sharding,
  data_parallel,
  globalize,
  process_local,
)

# Why a run stops, by precedence: when hosts ask for different stops at the same update, the
# largest code names the run's reason (a solved run is reported as solved).
STOP_CODES = {"stopped": 1, "max_wall_s": 2, "terminated": 3, "interrupted": 4, "solved": 5}
_REASONS = {code: reason for reason, code in STOP_CODES.items()}
_STOP, _SAVE, _STEPS, _EPISODES = range(4)  # the columns of a host's row in the step
_MAX_PROCESSES = 1 << 16  # a stop's value is code * _MAX_PROCESSES + the asking process


def global_batch_shapes(config: TrainConfig, spec: Any, algo: Any, mesh: Any,
                        num_processes: int) -> tuple[Any, jax.ShapeDtypeStruct]:
  """Abstract (rollouts, agreement rows) of one global step: every host's envs side by side."""
  sharding = batch_sharding(mesh)
  widen = lambda s: jax.ShapeDtypeStruct((s.shape[0], s.shape[1] * num_processes) + s.shape[2:],
                                         s.dtype, sharding=sharding)
  rollouts = jax.tree.map(widen, batch_shapes(config, spec, algo, mesh))
  rows = jax.ShapeDtypeStruct((1, mesh.size, 4), np.int32, sharding=sharding)
  return rollouts, rows


def compile_global_update(config: TrainConfig, spec: Any, algo: Any, mesh: Any, state: Any,
                          num_processes: int) -> Any:
  """(state, (rollouts, rows)) -> (state, (metrics, agreed)): the one-process update (with
  non-finite skipping) plus the agreement: max of [stop, save], sum of [env steps, episodes]."""
  update = skip_nonfinite(lambda s, rollouts: algo.update(s, concat_rollouts(rollouts)))

  def step(state, batch):
    rollouts, rows = batch
    state, metrics = update(state, rollouts)
    row = rows[0, 0]
    agreed = jnp.concatenate([jax.lax.pmax(row[:_STEPS], LEARNER_AXIS),
                              jax.lax.psum(row[_STEPS:], LEARNER_AXIS)])
    return state, (metrics, agreed)

  shapes = global_batch_shapes(config, spec, algo, mesh, num_processes)
  return data_parallel(step, mesh).lower(state, shapes).compile()


class GlobalStep:
  """The LearnerStep of a multi-process run: OnPolicyStep's batching, the global update.

  `cluster` gives this host's wishes (`local_stop`, `checkpointer_wants_save()`) and keeps the
  run-wide counts; `local_counts()` is this host's {env_steps, episodes} this session.
  """

  def __init__(self, compile_fn: Any, rollouts_per_update: int, target_version: int,
               consumed_per_rollout: int, mesh: Any, cluster: Any,
               local_counts: Callable[[], dict[str, int]], wall_s: Callable[[], float]):
    self.batcher = OnPolicyStep(compile_fn, rollouts_per_update, target_version,
                                consumed_per_rollout)
    self.mesh, self.cluster, self.local_counts, self.wall_s = mesh, cluster, local_counts, wall_s
    self.target_version = target_version
    self._pending: Any = None  # the last launched update's agreement, not yet read
    self._save_version: int | None = None
    self._last_agreed_save: int | None = None
    self._sent = {"env_steps": 0, "episodes": 0}
    self.agreed_stop: dict[str, Any] | None = None
    self.global_sps = Ema(2.0)

  # -- what the loop asks: batching is OnPolicyStep's -----------------------------------------

  def compile(self, abstract_state: Any) -> None:
    self.batcher.compile(abstract_state)

  def prepare(self, state: Any, version: int, stop: Any) -> bool:
    return True

  def wants(self) -> bool:
    return self.batcher.wants()

  def add(self, rollout: Rollout, ticket: int) -> None:
    self.batcher.add(rollout, ticket)

  def ready(self) -> bool:
    return self.batcher.ready()

  def done(self, version: int) -> bool:
    return version >= self.target_version

  def snapshot(self) -> None:
    return None

  def counters(self) -> dict[str, Any]:
    return {}  # U never moves over several processes: the version counts the budget

  def close(self, controller: RateController) -> None:
    self.batcher.close(controller)

  def call(self, state: Any, version: int) -> Advance:
    batch, tickets = self.batcher.take_batch()
    n = self.cluster.num_processes
    state, (metrics, agreed) = self.batcher.fn(
        state, (globalize(batch, self.mesh, n), self._rows()))
    previous, self._pending = self._pending, agreed
    self._save_version = None
    if previous is not None:
      self._absorb(np.asarray(previous), version)
    return Advance(state, metrics, 1, tickets, self.batcher.consumed_per_rollout * len(batch))

  # -- the agreement --------------------------------------------------------------------------

  def _rows(self) -> jax.Array:
    """This host's agreement rows: its stop and save wishes, and its counts since the last."""
    n = len(self.cluster.layout.learner_devices)
    rows = np.zeros((1, n, 4), np.int32)
    reason = self.cluster.local_stop
    if reason is not None:
      code = STOP_CODES.get(reason, STOP_CODES["stopped"])
      rows[0, :, _STOP] = code * _MAX_PROCESSES + self.cluster.process_index
    rows[0, :, _SAVE] = self.cluster.checkpointer_wants_save()
    counts = self.local_counts()
    # Only the first device carries the counts, so the sum over devices counts each host once.
    rows[0, 0, _STEPS] = counts["env_steps"] - self._sent["env_steps"]
    rows[0, 0, _EPISODES] = counts["episodes"] - self._sent["episodes"]
    self._sent = counts
    return process_local(rows, self.mesh, self.cluster.num_processes)

  def _absorb(self, agreed: np.ndarray, version: int) -> None:
    """Acts on the agreement of the update before the one being launched (`version` + 1);
    every process reads the same values here, at the same update."""
    self.cluster.global_counts["env_steps"] += int(agreed[_STEPS])
    self.cluster.global_counts["episodes"] += int(agreed[_EPISODES])
    # The update being launched now is saved, unless the last one was: its rows were built
    # before that save reset the timers.
    if agreed[_SAVE] and self._last_agreed_save != version:
      self._save_version = self._last_agreed_save = version + 1
    if agreed[_STOP] and self.agreed_stop is None:
      code, asker = divmod(int(agreed[_STOP]), _MAX_PROCESSES)
      self.agreed_stop = {"reason": _REASONS.get(code, "stopped"), "process": asker,
                          "version": version + 1, "wall_s": self.wall_s()}
      # The update being launched is the last one, on every process.
      self.target_version = min(self.target_version, version + 1)

  def save_agreed(self, version: int) -> bool:
    return self._save_version == version

  def drain(self) -> None:
    """Counts the last update's agreement (after the loop: nothing waits on it any more)."""
    if self._pending is not None:
      agreed, self._pending = np.asarray(self._pending), None
      self.cluster.global_counts["env_steps"] += int(agreed[_STEPS])
      self.cluster.global_counts["episodes"] += int(agreed[_EPISODES])

  def extra_metrics(self, idle_s: float) -> dict[str, Any]:
    """Each host logs its own metrics; process 0 adds the run-wide counts and SPS."""
    out: dict[str, Any] = {"process_index": self.cluster.process_index}
    if self.cluster.process_index == 0:
      steps = self.cluster.global_counts["env_steps"]
      sps = self.global_sps.update(steps, time.time())
      out.update(global_env_steps=steps, global_episodes=self.cluster.global_counts["episodes"],
                 global_sps=sps if sps is not None else 0.0)
    return out
