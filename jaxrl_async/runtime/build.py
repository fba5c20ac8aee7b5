"""`build(config) -> Components`: everything a run is made of that can exist before a thread
starts, each piece given what it depends on when it is made.

The trainer starts, supervises and stops what is built here; evaluation (experiments/evaluate.py)
and the benchmark suites build the same way and take the pieces they need, so a run, its
evaluation and its measurement cannot be wired differently.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jaxrl_async import envs
from jaxrl_async.algos import make_algorithm
from jaxrl_async.algos.base import Algorithm
from jaxrl_async.checkpoint import Checkpointer
from jaxrl_async.config import TrainConfig
from jaxrl_async.runtime.cluster.hosts import HostLayout
from jaxrl_async.runtime.executables import ExecutableCache
from jaxrl_async.runtime.sharding import LEARNER_AXIS, learner_mesh, replicated
from jaxrl_async.runtime.validation import check_devices, validate


@dataclasses.dataclass(frozen=True)
class Components:
  """A run's parts before it starts.

  config, spec: the validated config and its env's spec. hosts: this host's devices and meshes
  (one process: its first device acts, its first --learner_devices learn). cluster: this
  process's part of a multi-process run (runtime/cluster/lockstep.py), or None. algo: the
  algorithm, its `update` run under the learner axis. checkpointer: None when checkpoints are
  off. checkpoint_dir: the run's folder (checkpoints are the run's); run_dir: this host's
  (metrics and summary). layout: jaxrl_async/layout.py's choice, for summary.json.
  """

  config: TrainConfig
  spec: envs.EnvSpec
  hosts: HostLayout
  cluster: Any
  algo: Algorithm
  executables: ExecutableCache
  checkpointer: Checkpointer | None
  checkpoint_dir: Path
  run_dir: Path
  layout: dict[str, Any] | None = None

  @property
  def mesh(self) -> Any:
    """The learner mesh the update runs over (every host's learner devices)."""
    return self.hosts.learner_mesh

  @property
  def actor_device(self) -> jax.Device:
    return self.hosts.actor_devices[0]


def single_host_layout(config: TrainConfig) -> HostLayout:
  """One process: its first learner device also runs the actors' policy steps."""
  devices = check_devices(config)
  mesh = learner_mesh(devices)
  return HostLayout(0, 1, [devices[0]], devices, mesh, mesh, config.actor.num_actors)


def build(config: TrainConfig, spec: envs.EnvSpec | None = None, run_dir: Path | None = None,
          layout: dict[str, Any] | None = None) -> Components:
  """Validates `config` (ConfigError before anything starts) and builds its parts."""
  checkpoint_dir = Path(run_dir or config.run.run_dir or "runs/default")
  spec = spec or validate(config, checkpoint_dir)
  cluster = None
  if config.distributed.enabled or config.distributed.actor_devices:
    from jaxrl_async.runtime.cluster.hosts import host_layout

    hosts = host_layout(config)
    if config.distributed.enabled:
      from jaxrl_async.runtime.cluster.lockstep import Cluster

      cluster = Cluster(config, hosts)
  else:
    hosts = single_host_layout(config)
  algo = make_algorithm(config, spec, LEARNER_AXIS)
  ck = config.checkpoint
  checkpointer = None
  if ck.enabled:
    make = cluster.make_checkpointer if cluster is not None else Checkpointer
    checkpointer = make(checkpoint_dir, ck.keep_checkpoints, ck.checkpoint_every_s,
                        ck.checkpoint_every_updates)
  # Checkpoints are the run's; metrics and summary this host's.
  host_dir = cluster.host_dir(checkpoint_dir) if cluster is not None else checkpoint_dir
  return Components(config, spec, hosts, cluster, algo, ExecutableCache.for_config(config),
                    checkpointer, checkpoint_dir, host_dir, layout)


def trace_init(parts: Components, timings: dict[str, float] | None = None) -> Any:
  """The initial state's program, traced once: its `out_info` is the abstract state (shapes,
  dtypes, shardings), and the same trace is compiled for the real one (a second trace, by
  eval_shape, cost 0.1-0.15 s of start-up here)."""
  t0 = time.perf_counter()
  # The key is made inside the compiled init: an eager `jax.random.key` compiles on its own.
  # NOTE: computed straight onto the mesh: a mesh spanning several processes cannot be
  # device_put to from one process's device.
  def init_from_seed(seed: Any) -> Any:
    return parts.algo.init(jax.random.key(seed))

  init = jax.jit(init_from_seed, out_shardings=replicated(parts.mesh))
  traced = init.trace(np.int32(parts.config.run.seed))
  if timings is not None:
    timings["trace_init_s"] = time.perf_counter() - t0
  return traced


def abstract_state(parts: Components) -> Any:
  """Shapes, dtypes and shardings of the train state, without computing it (what a checkpoint
  restores into)."""
  return trace_init(parts).out_info
