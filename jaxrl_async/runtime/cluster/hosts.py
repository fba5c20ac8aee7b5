"""Beyond one machine: JAX's multi-controller runtime, one process per host.

Joining: `initialize` calls `jax.distributed.initialize` from the flags (coordinator, process
count and id) or from the cluster environment JAX detects (SLURM, Open MPI, TPU VMs), with gloo
for CPU collectives, before anything touches a device. Every process then runs the same program:
its own actors, rollout queue and rate controller, and one global learner step
(runtime/cluster/lockstep.py).

Devices: `split_devices` divides a host's local devices into actor and learner devices, and
`host_layout` builds the host's local learner mesh (actors put rollouts there) and the global
learner mesh over every host's learner devices, process-major, so host p's envs are block p of
the global env axis. The single-process path uses `host_layout` too, so this module imports
nothing heavy.

Liveness: a collective that a dead peer never joins waits forever (gloo does not time out
quickly). JAX's coordination service notices a process that stopped sending heartbeats and then
aborts every other process from C++ (SIGABRT, a stack trace). `PeerWatchdog` gets there first
with a clear message and a distinct exit status: each process bumps a counter in the
coordinator's key-value store every second, and a process whose peer's counter stood still for
--peer_timeout_s (or that cannot reach the coordinator for as long) exits with status 75
naming the peer. JAX's own heartbeat timeout is set to twice that, as the backstop. The
watchdog's beats come from a Python thread, so a peer whose interpreter hangs is caught too.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import jax
from jax.sharding import Mesh

from jaxrl_async.config import ConfigError, DistributedConfig, TrainConfig
from jaxrl_async.runtime.sharding import learner_mesh

__all__ = ["EXIT_PEER_LOST", "ClusterError", "HostLayout", "PeerWatchdog", "check_cluster",
           "describe_failure", "exit_now", "host_layout", "initialize", "joined", "mark_done",
           "split_devices"]

EXIT_PEER_LOST = 75  # EX_TEMPFAIL: a peer died; the run can be restarted with --resume
_ALIVE, _DONE = "jaxrl_async/alive/", "jaxrl_async/done/"
_watchdog: PeerWatchdog | None = None
_exiting = threading.Lock()  # held by the one thread that ends the process (`exit_now`)


class ClusterError(RuntimeError):
  """This process could not join the cluster (coordinator unreachable, a peer missing)."""


def initialize(cfg: DistributedConfig) -> None:
  """Joins the cluster; must run before anything touches a device. Starts the peer watchdog."""
  global _watchdog
  # NOTE: gloo is the default CPU collective from jax 0.5 on, but not before, and without it
  # a CPU collective across processes fails at its first call.
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  explicit = not cfg.cluster_detection
  kwargs: dict[str, Any] = dict(
      coordinator_address=cfg.coordinator_address or None,
      num_processes=cfg.num_processes if explicit else None,
      process_id=cfg.process_id if explicit else None,
      local_device_ids=cfg.local_device_indices,
      initialization_timeout=cfg.init_timeout_s,
      heartbeat_timeout_seconds=int(max(2 * cfg.peer_timeout_s, cfg.peer_timeout_s + 10)))
  if cfg.cluster_detection and cfg.cluster_detection != "auto":
    kwargs["cluster_detection_method"] = cfg.cluster_detection
  where = cfg.coordinator_address or f"the coordinator ({cfg.cluster_detection} detection)"
  try:
    jax.distributed.initialize(**kwargs)
  except Exception as e:  # noqa: BLE001 - JAX raises several types; all mean "did not join"
    raise ClusterError(
        f"process {cfg.process_id if explicit else '?'}: could not join the cluster through "
        f"{where} within --init_timeout_s={cfg.init_timeout_s}: {type(e).__name__}: {e}") from e
  _watchdog = PeerWatchdog(_client(), jax.process_index(), jax.process_count(),
                           cfg.peer_timeout_s, cfg.coordinator_address or "auto-detected")
  _watchdog.start()


def _client() -> Any:
  # NOTE: the coordinator's key-value store has no public API; orbax reaches it the same way.
  from jax._src import distributed as jax_distributed

  return jax_distributed.global_state.client


def joined() -> bool:
  """Whether `initialize` joined this process to a cluster."""
  return _watchdog is not None


def mark_done() -> None:
  """This process finished normally: peers stop watching it, and it stops watching them."""
  if _watchdog is not None:
    _watchdog.finish()


def describe_failure(error: BaseException, cfg: DistributedConfig) -> str:
  """One line for the log of a process that failed in a multi-process run."""
  text = str(error).strip().splitlines()
  words = ("gloo", "nccl", "connection", "collective")
  # A thread's failure (ThreadFailed) carries its traceback: the line worth showing is the
  # error's, which comes last, not the header.
  about_peers = [ln.strip() for ln in text if any(w in ln.lower() for w in words)]
  line = about_peers[-1] if about_peers else (text[0] if text else "")
  first = f"{type(error).__name__}: {line}"[:400]
  cause = "this process failed"
  if about_peers:
    # A failed collective does not say which peer left it; the line names the candidates
    # (with two processes, the dead one), so the reader knows whose log to open. They come
    # from the watchdog, not from JAX: nothing here may fail on the way out.
    others = [str(p) for p in range(_watchdog.n) if p != _watchdog.me] if _watchdog else []
    who = ""
    if len(others) == 1:
      who = f" (process {others[0]})"
    elif others:
      who = f" (one of processes {', '.join(others[:32])}{', ...' if len(others) > 32 else ''})"
    cause = (f"a collective with the other processes failed, so a peer probably died{who}; "
             "see its log")
  return (f"{cause} ({first}). Exiting at once; the other processes stop within "
          f"--peer_timeout_s={cfg.peer_timeout_s:g}.")


def exit_now(status: int, message: str) -> NoReturn:
  """Prints `message` and exits at once, skipping JAX's shutdown barrier, which would wait for
  peers that are themselves waiting for this process in a collective."""
  # The watchdog and the main thread (after a failed collective) can both get here at once:
  # the first one's line and status stand, and the other waits here for the exit.
  _exiting.acquire()
  me = _watchdog.me if _watchdog is not None else jax.process_index()
  print(f"jaxrl_async: process {me}: {message}", file=sys.stderr, flush=True)
  sys.stdout.flush()
  os._exit(status)


class PeerWatchdog(threading.Thread):
  """Ends this process, with a message naming the peer, when a peer stops beating."""

  def __init__(self, client: Any, process_index: int, num_processes: int, timeout_s: float,
               coordinator: str, every_s: float = 1.0):
    super().__init__(name="peer-watchdog", daemon=True)
    self.client, self.me, self.n = client, process_index, num_processes
    self.timeout_s, self.coordinator, self.every_s = timeout_s, coordinator, every_s
    self._done = threading.Event()

  def finish(self) -> None:
    self._done.set()
    try:
      self.client.key_value_set(f"{_DONE}{self.me}", "1", allow_overwrite=True)
    except Exception:  # noqa: BLE001 - the coordinator may be gone already; nothing to tell
      pass

  def run(self) -> None:
    now = time.monotonic()
    last_beat: dict[int, tuple[str | None, float]] = {p: (None, now) for p in range(self.n)}
    last_contact = now
    while not self._done.wait(self.every_s):
      now = time.monotonic()
      try:
        self.client.key_value_increment(f"{_ALIVE}{self.me}", 1)
        beats = dict(self.client.key_value_dir_get(_ALIVE))
        done = dict(self.client.key_value_dir_get(_DONE))
        last_contact = now
      except Exception as e:  # noqa: BLE001 - any RPC failure counts as silence
        if self._done.is_set():
          return
        if now - last_contact > self.timeout_s:
          exit_now(EXIT_PEER_LOST,
                   f"lost the coordinator (process 0, {self.coordinator}) for "
                   f"{now - last_contact:.0f} s: {type(e).__name__}: {e}. Process 0 probably "
                   "died; see its log. Exiting instead of waiting in a collective; rerun with "
                   "--resume to continue from the last checkpoint.")
        continue
      for p in range(self.n):
        if p == self.me or f"{_DONE}{p}" in done:
          continue
        beat = beats.get(f"{_ALIVE}{p}")
        if beat != last_beat[p][0]:
          last_beat[p] = (beat, now)
        elif now - last_beat[p][1] > self.timeout_s and not self._done.is_set():
          exit_now(EXIT_PEER_LOST,
                   f"process {p} stopped responding: no heartbeat for "
                   f"{now - last_beat[p][1]:.0f} s (--peer_timeout_s={self.timeout_s:g}); it "
                   "died, hangs, or its host is unreachable; see its log. Exiting instead of "
                   "waiting in a collective; rerun with --resume to continue from the last "
                   "checkpoint.")


# -- devices ----------------------------------------------------------------------------------


def split_devices(local: Sequence[jax.Device], learner_devices: int,
                  actor_indices: Sequence[int] = ()) -> tuple[list[jax.Device], list[jax.Device]]:
  """(actor devices, learner devices) of one host, from its local devices sorted by id.

  Auto (no `actor_indices`): CPU, or no spare accelerator: actors use device 0, shared with the
  learner, which takes devices [0, n) (one GPU; CPU devices are all the same cores). With a
  spare accelerator: actors on device 0, learners on [1, n + 1) (Cleanba's layout: inference
  never queues behind a learner step). Explicit actor devices: learners take the first n
  devices not used by actors, or, if too few remain, the first n (shared).
  """
  n = learner_devices
  if n > len(local):
    raise ConfigError("learner_devices", n,
                      f"must be <= the {len(local)} local devices ({local[0].platform}) of each "
                      f"host; on CPU set XLA_FLAGS=--xla_force_host_platform_device_count={n}")
  bad = [i for i in actor_indices if i >= len(local)]
  if bad:
    raise ConfigError("actor_devices", ",".join(map(str, actor_indices)),
                      f"must index the {len(local)} local devices (0 .. {len(local) - 1})")
  if actor_indices:
    actors = [local[i] for i in actor_indices]
    rest = [d for d in local if d not in actors]
    return actors, (rest[:n] if len(rest) >= n else list(local[:n]))
  if local[0].platform != "cpu" and len(local) > n:
    return [local[0]], list(local[1:n + 1])
  return [local[0]], list(local[:n])


@dataclasses.dataclass(frozen=True)
class HostLayout:
  """This host's place in the run: its devices, its local mesh, and the global learner mesh."""

  process_index: int
  num_processes: int
  actor_devices: list[jax.Device]
  learner_devices: list[jax.Device]  # this host's
  local_mesh: Mesh  # this host's learner devices: actors put rollouts here
  learner_mesh: Mesh  # every host's learner devices, process-major: the update runs here
  actors_per_host: int

  def global_actor_index(self, local_index: int) -> int:
    """Actor indices are global, so env seeds never collide across hosts (see `env_seed`)."""
    return self.process_index * self.actors_per_host + local_index


def host_layout(config: TrainConfig) -> HostLayout:
  """Applies `split_devices` to every process's devices (they all use the same rule and the
  same flags, so each process computes the same global mesh without talking to the others)."""
  by_process: dict[int, list[jax.Device]] = {}
  for d in jax.devices():
    by_process.setdefault(d.process_index, []).append(d)
  me = jax.process_index()
  indices = config.distributed.actor_device_indices
  everyone: list[jax.Device] = []
  mine: tuple[list[jax.Device], list[jax.Device]] = ([], [])
  for p in sorted(by_process):
    split = split_devices(sorted(by_process[p], key=lambda d: d.id),
                          config.learner.learner_devices, indices)
    everyone += split[1]
    if p == me:
      mine = split
  return HostLayout(me, len(by_process), mine[0], mine[1], learner_mesh(mine[1]),
                    learner_mesh(everyone), config.actor.num_actors)


def check_cluster(config: TrainConfig, run_dir: Path | None = None) -> HostLayout:
  """What can be checked once the cluster is joined, before any thread starts (ConfigError)."""
  layout = host_layout(config)
  envs_total = layout.num_processes * config.actor.num_actors * config.env.num_envs
  if envs_total >= 2**24:
    raise ConfigError("num_envs", config.env.num_envs,
                      f"x --num_actors x {layout.num_processes} processes = {envs_total} envs; "
                      "env seeds are int32 ranges, so the run must have < 2**24 envs")
  if config.checkpoint.resume and run_dir is not None:
    from jaxrl_async.checkpoint import Checkpointer

    meta = Checkpointer(Path(run_dir)).read_meta()
    saved = (meta or {}).get("num_processes")
    if saved is not None and saved != layout.num_processes:
      raise ConfigError("num_processes", layout.num_processes,
                        f"differs from the checkpoint's {saved} processes; --resume needs the "
                        "same topology")
  return layout
