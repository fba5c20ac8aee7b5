"""Sizes from the host: how many actor threads, envs, EnvPool threads and rollouts per update a
run uses, chosen from the cores and devices present (`--layout=auto`), or kept as a preset gives
them (`--layout=preset`). Explicit flags always win.

Why a layout at all: the same preset ran at 0.31 of EnvPool's own speed on a 16-core GPU host,
because its sizes were tuned for a 2-core CPU (BUILD_NOTES.md, "Feeding the accelerator"). The
rules, each written down in `Layout.why`:
- a CPU host: the learner shares the cores with the actors, so the preset's sizes stand (they
  were tuned on 2 cores) with 2 actor threads for asynchronous training and 1 for synchronous
  (K = 0: the actors wait for every version anyway);
- an accelerator host: the learner is nearly free, so the envs are what to feed. Few Python
  actor threads (the GIL serialises their per-step work), each with one EnvPool in async mode
  of 2 x batch envs: EnvPool steps one batch while the actor computes the other's actions. Its
  threads split the cores. Synchronous (K = 0) presets keep their envs, which are their batch;
- several accelerators: every device learns (the env axis is split over them), actors spread
  their policy over them, envs rounded up to a multiple of the devices;
- rollouts per update, unless set: every actor beyond K + 1 would otherwise wait for a ticket
  while the learner idles (the cap admits (K + 1) x U rollouts in flight). U = N actors keeps
  each actor one rollout ahead of the learner (`python -m tools.ticket_sim`: actors blocked
  7-12% against 53-88% with U = 1, for N = 4-16, K = 1; BUILD_NOTES.md); an async-EnvPool actor
  counts twice, since it starts its next rollout while its last envs finish the current one.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

LAYOUTS = ("auto", "preset")
# The settings a layout may choose; any of them given as a flag wins.
SIZE_FIELDS = ("num_actors", "num_envs", "env_batch_size", "env_threads", "rollouts_per_update",
               "learner_devices")

# Accelerator hosts: envs per actor and cores per actor thread. EnvPool alone peaked at 64 envs
# with a batch of 32 on 16 cores (16.2k Breakout steps/s; 128 envs: 15.6k).
_ENVS_PER_ACTOR = 64
_CORES_PER_ACTOR = 8
_MAX_ACTORS = 8


@dataclasses.dataclass(frozen=True)
class Host:
  """What the layout looks at: usable cores and this process's devices."""

  cores: int
  platform: str  # cpu, gpu or tpu
  devices: int
  device_kind: str = ""

  @property
  def accelerated(self) -> bool:
    return self.platform != "cpu"


def detect_host() -> Host:
  """This process's host. Imports JAX: call it after `jax.distributed.initialize`."""
  import jax

  try:
    cores = len(os.sched_getaffinity(0))
  except AttributeError:  # not on Linux
    cores = os.cpu_count() or 1
  devices = jax.local_devices()
  platform = devices[0].platform
  return Host(cores, "gpu" if platform == "cuda" else platform, len(devices),
              getattr(devices[0], "device_kind", ""))


@dataclasses.dataclass(frozen=True)
class Layout:
  """The sizes chosen, what they were chosen from, and why; written into summary.json."""

  mode: str
  host: Host
  values: Mapping[str, Any]  # every SIZE_FIELDS entry, as the run uses it
  chosen: tuple[str, ...]  # the fields this layout set (the rest came from flags or the preset)
  why: tuple[str, ...]

  def to_json(self) -> dict[str, Any]:
    return {"mode": self.mode, "host": dataclasses.asdict(self.host), "values": dict(self.values),
            "chosen": list(self.chosen), "why": list(self.why)}


def rollouts_per_update(num_actors: int, max_policy_lag: int, free_running: bool,
                        async_envs: bool = False) -> int:
  """The static rule: U = S when the S rollouts the actors want in flight exceed the K + 1 that
  U = 1 admits, else 1. S = N, or 2N with async EnvPool, whose actors start their next rollout
  while the last envs finish the current one (else those that finished first park)."""
  slots = num_actors * (2 if async_envs else 1)
  if free_running or slots <= max_policy_lag + 1:
    return 1
  return slots


def choose(mode: str, values: Mapping[str, Any], explicit: set[str] | frozenset[str],
           host: Host) -> tuple[dict[str, Any], Layout]:
  """`values` (preset and flags merged) with the layout's sizes filled in, and the Layout.

  `explicit` names the settings given as flags: those are never changed.
  """
  from jaxrl_async.config import ConfigError, RateConfig

  if mode not in LAYOUTS:
    raise ConfigError("layout", mode, f"must be one of {', '.join(LAYOUTS)}")
  get = lambda name, default: values.get(name, default)
  free = bool(get("free_running", RateConfig.free_running))
  lag = int(get("max_policy_lag", RateConfig.max_policy_lag))
  sync = not free and lag == 0
  out = dict(values)
  why: list[str] = []
  proposal: dict[str, Any] = {}
  if mode == "auto":
    proposal, why = _auto(host, values, sync)
  else:
    why.append("layout=preset: the preset's sizes (and the config defaults) as they are")
  chosen = []
  for name, value in proposal.items():
    if name in explicit:
      why.append(f"{name}={values[name]} given as a flag (the layout chose {value})")
    else:
      out[name] = value
      chosen.append(name)
  envs = int(out.get("num_envs", _default("num_envs")))
  if "env_batch_size" in chosen and "num_envs" in explicit and out["env_batch_size"] > envs // 2:
    out["env_batch_size"] = envs // 2 if envs >= 2 else 0  # async halves of the given envs
    why.append(f"env_batch_size={out['env_batch_size']}: half of the --num_envs={envs} given")
  if "rollouts_per_update" not in explicit and "rollouts_per_update" not in values:
    n = int(out.get("num_actors", _default("num_actors")))
    batch = int(out.get("env_batch_size", 0))
    async_envs = 0 < batch < envs
    u = out["rollouts_per_update"] = rollouts_per_update(n, lag, free, async_envs)
    chosen.append("rollouts_per_update")
    if u > 1:
      each = " (async EnvPool: 2 rollouts each)" if async_envs else ""
      why.append(f"rollouts_per_update={u}: {n} actors{each} want more rollouts in flight than "
                 f"the K + 1 = {lag + 1} that one per update admits")
  sizes = {name: out.get(name, _default(name)) for name in SIZE_FIELDS}
  return out, Layout(mode, host, sizes, tuple(chosen), tuple(why))


def _default(name: str) -> Any:
  """A setting's config default (what a run gets that neither a flag nor the preset sets)."""
  from jaxrl_async.config import TrainConfig

  return TrainConfig.flag_fields()[name].default


def _auto(host: Host, values: Mapping[str, Any], sync: bool) -> tuple[dict[str, Any], list[str]]:
  envs = int(values.get("num_envs", _default("num_envs")))
  if not host.accelerated:
    actors = 1 if sync else 2
    return {"num_actors": actors}, [
        f"CPU host ({host.cores} cores): the learner shares the cores, so the preset's envs stand; "
        f"{actors} actor thread{'s' if actors > 1 else ''} "
        f"({'synchronous: K = 0' if sync else 'asynchronous'})"]
  if sync:
    threads = max(1, min(host.cores, envs))
    return {"num_actors": 1, "env_threads": threads}, [
        f"{host.platform} host, synchronous (K = 0): one actor keeps the preset's {envs} envs "
        f"(its batch per update), with {threads} EnvPool threads"]
  devices = host.devices
  actors = max(1, min(_MAX_ACTORS, host.cores // _CORES_PER_ACTOR))
  per_actor = -(-_ENVS_PER_ACTOR // (2 * devices)) * 2 * devices  # even split over devices
  threads = max(1, host.cores // actors)
  why = [f"{host.platform} host ({host.devices} x {host.device_kind or 'device'}, {host.cores} "
         f"cores): {actors} actor threads x {per_actor} envs in async EnvPool mode (batch "
         f"{per_actor // 2}: one batch steps while the other's actions are computed), "
         f"{threads} EnvPool threads each"]
  out = {"num_actors": actors, "num_envs": per_actor, "env_batch_size": per_actor // 2,
         "env_threads": threads}
  if devices > 1:
    out["learner_devices"] = devices
    why.append(f"{devices} devices: all learn (the env axis split over them); the actors' policy "
               "runs on device 0 beside the learner's shard")
  return out, why
