"""The multi-process runtime: one global learner step fed by every host's rollouts, agreed stops
and checkpoints, params published locally on each host, and run-wide counters.

Each host runs its own actors, rollout queue and rate controller. Its learner takes U rollouts
from its own queue (they sit on its local learner devices), stitches them into its part of the
global batch (`sharding.globalize`, no copy) and launches the global step: jit(shard_map) over
every host's learner devices, gradients summed across all of them. The step is the same
function as in one process, so versions, params and optimiser state stay identical everywhere.

Lockstep. Every process must launch the global step the same number of times: a collective
that one process never joins waits for ever. Budgets in updates are the same everywhere, but the
other reasons to stop (solved, a signal, --max_wall_s) and the checkpoint timer are per host. So
they ride in the step itself: each host adds a small int32 row per learner device,
[stop, checkpoint, env steps, episodes], and the step returns the max of the first two and the
sum of the counts over all hosts. The learner reads update v-1's answer just after launching
update v, where it already waits for v-1 (its non-finite flag), so agreement adds no host round
trip; every process reads the same answer at the same update, so all stop, or save, at the same
version. A stop takes effect one update after it is asked for.

Failures are not agreed: a process that fails exits at once (`distributed.exit_now`), and its
peers' watchdogs end them (runtime/cluster/hosts.py).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from jaxrl_async.algos.base import concat_rollouts
from jaxrl_async.checkpoint import Checkpointer
from jaxrl_async.config import TrainConfig
from jaxrl_async.metrics import Ema
from jaxrl_async.runtime.cluster.hosts import HostLayout
from jaxrl_async.runtime.learners.on_policy import Learner, batch_shapes, skip_nonfinite
from jaxrl_async.runtime.pipeline.params import ParamStore
from jaxrl_async.runtime.sharding import (
  LEARNER_AXIS,
  batch_sharding,
  data_parallel,
  globalize,
  local_replica,
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


class MultiHostLearner(Learner):
  """The learner loop of runtime/learners/on_policy.py, stepping the global update in lockstep."""

  def __init__(self, *args: Any, cluster: Cluster, **kwargs: Any):
    super().__init__(*args, **kwargs)
    self.cluster = cluster
    # --total_env_steps counts every host's actors.
    per_update = self.config.env_steps_per_update * cluster.num_processes
    self.max_updates = max(0, -(-self.config.run.total_env_steps // per_update) - self.version)
    self._compiled: Any = None
    self._pending: Any = None  # the last launched update's agreement, not yet read
    self._save_version: int | None = None
    self._last_agreed_save: int | None = None
    self._sent = {"env_steps": 0, "episodes": 0}
    self.agreed_stop: dict[str, Any] | None = None
    self.global_sps = Ema(2.0)

  def _compile(self) -> None:
    t0 = time.perf_counter()
    self._compiled = compile_global_update(self.config, self.spec, self.algo, self.mesh,
                                           self.state, self.cluster.num_processes)
    self.timers.compile_s = time.perf_counter() - t0
    self.step_fn = self._global_step
    self.compiled.set()

  def _rows(self) -> jax.Array:
    """This host's agreement rows: its stop and save wishes, and its counts since the last."""
    n = len(self.cluster.layout.learner_devices)
    rows = np.zeros((1, n, 4), np.int32)
    reason = self.cluster.local_stop
    if reason is not None:
      code = STOP_CODES.get(reason, STOP_CODES["stopped"])
      rows[0, :, _STOP] = code * _MAX_PROCESSES + self.cluster.process_index
    rows[0, :, _SAVE] = self.cluster.checkpointer_wants_save()
    counts = self.cluster.local_counts()
    # Only the first device carries the counts, so the sum over devices counts each host once.
    rows[0, 0, _STEPS] = counts["env_steps"] - self._sent["env_steps"]
    rows[0, 0, _EPISODES] = counts["episodes"] - self._sent["episodes"]
    self._sent = counts
    return process_local(rows, self.mesh, self.cluster.num_processes)

  def _global_step(self, state: Any, batch: Any) -> tuple[Any, Any]:
    rows = self._rows()
    state, (metrics, agreed) = self._compiled(
        state, (globalize(batch, self.mesh, self.cluster.num_processes), rows))
    previous, self._pending = self._pending, agreed
    self._save_version = None
    if previous is not None:
      self._absorb(np.asarray(previous))
    return state, metrics

  def _absorb(self, agreed: np.ndarray) -> None:
    """Acts on the agreement of the update before the one just launched; every process reads
    the same values here, at the same update."""
    self.cluster.global_counts["env_steps"] += int(agreed[_STEPS])
    self.cluster.global_counts["episodes"] += int(agreed[_EPISODES])
    # The update being launched now is saved, unless the last one was: its rows were built
    # before that save reset the timers.
    if agreed[_SAVE] and self._last_agreed_save != self.version:
      self._save_version = self._last_agreed_save = self.version + 1
    if agreed[_STOP] and self.agreed_stop is None:
      code, asker = divmod(int(agreed[_STOP]), _MAX_PROCESSES)
      self.agreed_stop = {"reason": _REASONS.get(code, "stopped"), "process": asker,
                          "version": self.version + 1, "wall_s": self.wall_s()}
      # The update being launched is the last one, on every process.
      self.max_updates = min(self.max_updates, self.timers.updates + 1)

  def save_agreed(self, version: int) -> bool:
    return self._save_version == version

  def drain(self) -> None:
    """Counts the last update's agreement (after the loop: nothing waits on it any more)."""
    if self._pending is not None:
      agreed, self._pending = np.asarray(self._pending), None
      self.cluster.global_counts["env_steps"] += int(agreed[_STEPS])
      self.cluster.global_counts["episodes"] += int(agreed[_EPISODES])

  def extra_metrics(self) -> dict[str, Any]:
    """Each host logs its own metrics; process 0 adds the run-wide counts and SPS."""
    out: dict[str, Any] = {"process_index": self.cluster.process_index}
    if self.cluster.process_index == 0:
      steps = self.cluster.global_counts["env_steps"]
      sps = self.global_sps.update(steps, time.time())
      out.update(global_env_steps=steps, global_episodes=self.cluster.global_counts["episodes"],
                 global_sps=sps if sps is not None else 0.0)
    return out


class LocalParamStore(ParamStore):
  """Publishes this host's replica of the global params: actors here never read across hosts."""

  def __init__(self, local_mesh: Any):
    super().__init__()
    self.local_mesh = local_mesh

  def publish(self, params: Any, version: int) -> None:
    super().publish(local_replica(params, self.local_mesh), version)


class AgreedCheckpointer(Checkpointer):
  """Orbax checkpoints of a multi-process run, saved by every process at the same versions.

  Orbax's multi-process save is collective (each process writes its shards, process 0 the
  metadata, with barriers between), so a version is saved only where all processes agree: by
  --checkpoint_every_updates (the same everywhere) or when any host's timer asks, through the
  step. A failed process saves nothing: its peers could not join.
  """

  def __init__(self, *args: Any, cluster: Cluster, **kwargs: Any):
    super().__init__(*args, **kwargs)
    self.cluster = cluster

  def wants_save(self) -> bool:
    return bool(self.every_s and time.time() - self._last_save_t >= self.every_s)

  def due(self, version: int) -> bool:
    if version == self._last_save_version:
      return False
    by_updates = bool(self.every_updates and version % self.every_updates == 0)
    learner = self.cluster.learner
    return by_updates or (learner is not None and learner.save_agreed(version))

  def save(self, version: int, state: Any, meta: dict[str, Any]) -> None:
    if meta.get("failed"):
      logging.warning("process %d failed: no final checkpoint (a multi-process save needs "
                      "every process)", self.cluster.process_index)
      return
    meta = dict(meta, num_processes=self.cluster.num_processes,
                global_counters=dict(self.cluster.global_counts))
    super().save(version, state, meta)

  def restore(self, abstract_state: Any, version: int | None = None
              ) -> tuple[Any, dict[str, Any]] | None:
    restored = super().restore(abstract_state, version)
    if restored is not None:
      self.cluster.global_counts.update(restored[1].get("global_counters", {}))
    return restored


class Cluster:
  """This process's part of a multi-process run; the trainer builds its components here."""

  def __init__(self, config: TrainConfig, layout: HostLayout):
    self.config, self.layout = config, layout
    self.process_index, self.num_processes = layout.process_index, layout.num_processes
    self.learner: MultiHostLearner | None = None
    self.checkpointer: AgreedCheckpointer | None = None
    self.local_stop: str | None = None  # why this host wants to stop (solved, a signal...)
    self.global_counts = {"env_steps": 0, "episodes": 0}
    self._counts: Any = None

  def host_dir(self, run_dir: Path) -> Path:
    """Where this host's metrics and summary go: the run folder for process 0 (its files are
    the run's, with the global counts), run_dir/process_<p> for the others."""
    return run_dir if self.process_index == 0 else run_dir / f"process_{self.process_index}"

  def param_store(self) -> LocalParamStore:
    return LocalParamStore(self.layout.local_mesh)

  def make_checkpointer(self, run_dir: Path, keep: int, every_s: float, every_updates: int
                        ) -> AgreedCheckpointer:
    self.checkpointer = AgreedCheckpointer(run_dir, keep, every_s, every_updates, cluster=self)
    return self.checkpointer

  def make_learner(self, *args: Any, **kwargs: Any) -> MultiHostLearner:
    self.learner = MultiHostLearner(*args, cluster=self, **kwargs)
    return self.learner

  def attach(self, monitor: Any, stats: Any) -> None:
    """Where this host's env-step and episode counts come from (both start at this session)."""
    base = monitor.base_env_steps
    self._counts = lambda: {"env_steps": monitor.env_steps() - base, "episodes": stats.episodes}

  def local_counts(self) -> dict[str, int]:
    return self._counts() if self._counts is not None else {"env_steps": 0, "episodes": 0}

  def checkpointer_wants_save(self) -> bool:
    return self.checkpointer is not None and self.checkpointer.wants_save()

  def request_stop(self, reason: str) -> None:
    """This host wants to stop; the run stops when the step has carried it to every host."""
    if self.local_stop is None:
      self.local_stop = reason
      logging.info("process %d asks to stop: %s", self.process_index, reason)

  def stop_reason(self) -> str:
    learner = self.learner
    return learner.agreed_stop["reason"] if learner and learner.agreed_stop else "budget"

  def summary(self) -> dict[str, Any]:
    learner = self.learner
    if learner is not None:
      learner.drain()
    return {
        "process_index": self.process_index,
        "num_processes": self.num_processes,
        "global_env_steps": self.global_counts["env_steps"],
        "global_episodes": self.global_counts["episodes"],
        "agreed_stop": learner.agreed_stop if learner else None,
        "learner_devices_global": self.layout.learner_mesh.size,
    }
