"""All device placement goes through here: the learner mesh, its axis name, the shardings.

Built on `jax.sharding.Mesh`, `NamedSharding` and `jax.shard_map` (what `pmap` and
`device_put_sharded` became), so no other module depends on how JAX spells it this year.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

LEARNER_AXIS = "learner"


def learner_mesh(devices: Sequence[jax.Device]) -> Mesh:
  """A 1-D mesh over the learner devices; the batch's env axis is split over it."""
  return Mesh(np.asarray(devices), (LEARNER_AXIS,))


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Time-major [T, B, ...] arrays split along the env axis B."""
  return NamedSharding(mesh, P(None, LEARNER_AXIS))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


# XLA's CPU client aliases a host array aligned to this many bytes instead of copying it.
_HOST_ALIGN = 64


def host_buffer(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
  """A zeroed host array aligned so that `put_batch` onto a CPU device is zero-copy.

  numpy aligns to 16 bytes only, and an unaligned array is copied into freshly mapped device
  memory, page fault by page fault (BUILD_NOTES.md, "Transfer"). Accelerators copy either way.
  """
  dtype = np.dtype(dtype)
  size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
  raw = np.zeros(size + _HOST_ALIGN, np.uint8)
  start = -raw.ctypes.data % _HOST_ALIGN
  return raw[start:start + size].view(dtype).reshape(shape)


PINNED_HOST = "pinned_host"


@functools.lru_cache(maxsize=64)
def _memory_kinds(devices: tuple[jax.Device, ...]) -> frozenset[str]:
  """The memory kinds every one of `devices` can address (empty if a device cannot say)."""
  kinds: frozenset[str] | None = None
  for d in devices:
    try:
      mine = frozenset(m.kind for m in d.addressable_memories())
    except Exception:  # a backend without memory spaces, or a device of another process
      return frozenset()
    kinds = mine if kinds is None else kinds & mine
  return kinds or frozenset()


def memory_kinds(mesh: Mesh) -> frozenset[str]:
  """The memory kinds ("device", "pinned_host", "unpinned_host", ...) all of `mesh` addresses."""
  return _memory_kinds(tuple(mesh.devices.flat))


def pinned_host_supported(mesh: Mesh) -> bool:
  """Whether `put_batch` stages through pinned host memory on `mesh` by default: every device
  has a `pinned_host` memory and none is a CPU. (The CPU backend reports a `pinned_host` memory
  too, but there both kinds are the same RAM and staging is only an extra host copy; a
  `host_buffer` array on one CPU device is even aliased, zero-copy.) Cached per tuple of
  devices (through `memory_kinds`)."""
  return (all(d.platform != "cpu" for d in mesh.devices.flat)
          and PINNED_HOST in memory_kinds(mesh))


def put_batch(tree: Any, mesh: Mesh, staged: bool | None = None) -> Any:
  """Places a host pytree of [T, B, ...] arrays on the learner devices, split along B.

  `staged=False`: one `jax.device_put` to the batch sharding (device memory). `staged=True`:
  first into the same sharding in `pinned_host` memory (page-locked host memory the device's
  DMA engine reads directly), then from there to device memory. `None` (the default, what
  actors use) stages iff `pinned_host_supported(mesh)`: automatically on accelerators, never on
  the CPU backend. Why: on an NVIDIA H200 host (issue 16) a direct `device_put` of a numpy
  array moved only 6-8 GB/s (a pageable source goes through the driver's staging buffers),
  while staging moved 24 GB/s for a 9 MiB Breakout rollout and 41-48 GB/s for
  64-256 MiB; a pinned copy in torch reached 54 GB/s, the link's pinned bandwidth.
  `tools/suites/transfer.py` measures both paths (`put_batch_direct`, `put_batch_staged`)
  against `pinned_copy`. `staged=True` on devices without a `pinned_host` memory is a
  ValueError. Leaves should be host arrays: a leaf already on a device would be staged too
  (copied to the host and back).

  NOTE: `jax.device_put` returns at once and copies in the background; callers must not write
  into the host buffers afterwards (actors allocate fresh buffers for every rollout).
  """
  sharding = batch_sharding(mesh)
  if staged is None:
    staged = pinned_host_supported(mesh)
  if not staged:
    return jax.device_put(tree, sharding)
  if PINNED_HOST not in memory_kinds(mesh):
    raise ValueError(
        f"put_batch(staged=True): the mesh's devices ({mesh.devices.flat[0].platform}) have no "
        f"{PINNED_HOST!r} memory (they address {sorted(memory_kinds(mesh))}); use staged=None "
        "or False")
  return jax.device_put(jax.device_put(tree, sharding.with_memory_kind(PINNED_HOST)), sharding)


def replicate(tree: Any, mesh: Mesh) -> Any:
  return jax.device_put(tree, replicated(mesh))


def data_parallel(fn: Callable[[Any, Any], tuple[Any, Any]], mesh: Mesh, *,
                  donate_state: bool = False) -> Callable[[Any, Any], tuple[Any, Any]]:
  """jit(shard_map(fn)): state replicated (P()), batch split along the env axis.

  `fn(state, local_batch)` must reduce across `LEARNER_AXIS` itself (psum/pmean), so its outputs
  are replicated.
  NOTE: check_vma=False because rlax's scans start from unvarying carries; replication of the
  outputs is instead checked by tests (`fingerprint`) on several devices.
  """
  sharded = jax.shard_map(fn, mesh=mesh, in_specs=(P(), P(None, LEARNER_AXIS)),
                          out_specs=(P(), P()), check_vma=False)
  return jax.jit(sharded, donate_argnums=(0,) if donate_state else ())


def fingerprint(tree: Any) -> list[str]:
  """One digest per device of every leaf's local copy; all equal iff replicas are identical."""
  digests: dict[Any, Any] = {}
  for leaf in jax.tree.leaves(tree):
    for shard in leaf.addressable_shards:
      h = digests.setdefault(shard.device, hashlib.sha256())
      h.update(np.asarray(shard.data).tobytes())
  return [h.hexdigest() for _, h in sorted(digests.items(), key=lambda kv: kv[0].id)]


def check_replicated(tree: Any) -> None:
  prints = fingerprint(tree)
  if len(set(prints)) > 1:
    raise AssertionError(f"replicated params differ across devices: {prints}")


# -- several processes (runtime/cluster/lockstep.py) ---------------------------------------
# A global mesh spans every process's learner devices; a process can only place data on its own.
# So actors put rollouts on their host's *local* learner mesh (put_batch, as in one process), and
# the learner stitches the hosts' parts into one global array, without copying.


def globalize(tree: Any, mesh: Mesh, num_processes: int) -> Any:
  """This process's [T, B_local, ...] arrays (split along B over its local learner devices) as
  its part of global [T, B_local * num_processes, ...] arrays split along B over `mesh`.

  Every process calls this with its own part; `mesh` must list process p's learner devices as
  block p, in the local mesh's order, so host p's envs are block p of the global env axis.
  """
  sharding = batch_sharding(mesh)

  def one(x):
    shape = (x.shape[0], x.shape[1] * num_processes) + tuple(x.shape[2:])
    return jax.make_array_from_single_device_arrays(
        shape, sharding, [s.data for s in x.addressable_shards])

  return jax.tree.map(one, tree)


def process_local(array: np.ndarray, mesh: Mesh, num_processes: int) -> jax.Array:
  """A small host array [1, n_local, ...] (one row per local learner device) as this process's
  part of a global [1, n_local * num_processes, ...] array split like a batch over `mesh`."""
  shape = (array.shape[0], array.shape[1] * num_processes) + tuple(array.shape[2:])
  return jax.make_array_from_process_local_data(batch_sharding(mesh), array, shape)


def local_replica(tree: Any, local_mesh: Mesh) -> Any:
  """Replicated global arrays as this process's copies, replicated on `local_mesh` (the local
  learner devices), without copying: what actors on this host may read."""
  sharding = replicated(local_mesh)
  devices = list(local_mesh.devices.flat)

  def one(x):
    by_device = {s.device: s.data for s in x.addressable_shards}
    return jax.make_array_from_single_device_arrays(x.shape, sharding,
                                                    [by_device[d] for d in devices])

  return jax.tree.map(one, tree)
