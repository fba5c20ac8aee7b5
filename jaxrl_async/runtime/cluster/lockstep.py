"""The multi-process runtime: agreed stops and checkpoints, params published locally on each
host, and run-wide counters; the global step itself is learners/global_step.py.

Each host runs its own actors, rollout queue and rate controller. Its learner takes U rollouts
from its own queue and launches the global step: jit(shard_map) over every host's learner
devices, gradients summed across all of them. The step is the same function as in one process,
so versions, params and optimiser state stay identical everywhere.

Lockstep. Every process must launch the global step the same number of times: a collective
that one process never joins waits for ever. Budgets in updates are the same everywhere, but the
other reasons to stop (solved, a signal, --max_wall_s) and the checkpoint timer are per host. So
they ride in the step itself: each host adds a small int32 row per learner device,
[stop, checkpoint, env steps, episodes], and the step returns the max of the first two and the
sum of the counts over all hosts. The learner reads update v-1's answer just after launching
update v, where it already waits for v-1 (its non-finite flag), so agreement adds no host round
trip; every process reads the same answer at the same update, so all stop, or save, at the same
version. A stop takes effect one update after it is asked for.

Failures are not agreed: a process that fails exits at once (`hosts.exit_now`), and its
peers' watchdogs end them (runtime/cluster/hosts.py).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from absl import logging

from jaxrl_async.checkpoint import Checkpointer
from jaxrl_async.config import TrainConfig
from jaxrl_async.runtime.cluster.hosts import HostLayout
from jaxrl_async.runtime.pipeline.params import ParamStore
from jaxrl_async.runtime.sharding import local_replica


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

  def due(self, version: int, agreed: bool = False) -> bool:
    """Never by this host's timer alone: its wish rides in the step, and comes back `agreed`."""
    if version == self._last_save_version:
      return False
    return bool(self.every_updates and version % self.every_updates == 0) or agreed

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
    self.checkpointer: AgreedCheckpointer | None = None
    self.local_stop: str | None = None  # why this host wants to stop (solved, a signal...)
    self.global_counts = {"env_steps": 0, "episodes": 0}

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

  def checkpointer_wants_save(self) -> bool:
    return self.checkpointer is not None and self.checkpointer.wants_save()

  def request_stop(self, reason: str) -> None:
    """This host wants to stop; the run stops when the step has carried it to every host."""
    if self.local_stop is None:
      self.local_stop = reason
      logging.info("process %d asks to stop: %s", self.process_index, reason)

  @staticmethod
  def stop_reason(step: Any) -> str:
    """Why the run ended, as the global step (learners/global_step.py) agreed it."""
    return step.agreed_stop["reason"] if step.agreed_stop else "budget"

  def summary(self, step: Any) -> dict[str, Any]:
    """This host's part of summary.json; `step` is the run's global step, done by now."""
    step.drain()
    return {
        "process_index": self.process_index,
        "num_processes": self.num_processes,
        "global_env_steps": self.global_counts["env_steps"],
        "global_episodes": self.global_counts["episodes"],
        "agreed_stop": step.agreed_stop,
        "learner_devices_global": self.layout.learner_mesh.size,
    }
