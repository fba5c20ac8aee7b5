"""A device-resident replay: a ring buffer of rollout columns, sharded over the learner mesh.

The buffer stores *columns*: one env's T consecutive transitions from one rollout, time-major
like the rollouts themselves (`[L, C, ...]`, L = T, or T + 1 for observations), so an
observation is stored once however many transitions look at it. Its column axis C is split
over the learner devices exactly as a rollout's env axis is (`sharding.batch_sharding`), so an
insert is local on every device: the actor already placed env e's column on the device that
owns it, and the learner never moves rollout data between devices. Every device therefore
holds the same number of columns, and sampling uniformly within each device's shard is uniform
over the whole replay (stratified by device).

`insert` and `sample_indices` are pure and run under `shard_map` (see `sharded`), inside the
learner's jitted steps; what a sampled index means (e.g. an n-step transition) is the
algorithm's business, through the gather function its extension provides.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_async.runtime.sharding import batch_sharding, replicated
from jaxrl_async.types import Array, PRNGKey


@flax.struct.dataclass
class Replay:
  """The ring buffer. `data` leaves are [L, C, ...], C split over the learner devices; the
  counters are per device and equal on every device (each insert gives each device as many
  columns), so they are replicated."""

  data: Any
  pos: Array  # [] int32: the next local column to write
  filled: Array  # [] int32: local columns holding data (<= local capacity)
  key: PRNGKey  # sampling key; each device folds in its index


def specs(mesh: Any) -> Replay:
  """The shard_map/placement specs of a Replay: data split along columns, counters replicated."""
  split, rep = batch_sharding(mesh).spec, replicated(mesh).spec
  return Replay(data=split, pos=rep, filled=rep, key=rep)


def num_columns(capacity: int, steps: int, columns_per_insert: int) -> int:
  """Columns holding at least `capacity` transitions, rounded up to whole inserts (so an
  insert never straddles the ring's end on any device)."""
  columns = -(-capacity // steps)
  return -(-columns // columns_per_insert) * columns_per_insert


def _zeros_fn(example: Any, columns: int, mesh: Any, seed: int) -> Callable[[], Replay]:
  """jit(() -> zeroed Replay), placed on `mesh`; shared by `init` and `abstract`."""
  devices = mesh.devices.size
  if columns % devices:
    raise ValueError(f"replay columns {columns} must divide over {devices} learner devices")

  def zeros() -> Replay:
    data = jax.tree.map(
        lambda x: jnp.zeros((x.shape[0], columns) + tuple(x.shape[2:]), x.dtype), example)
    return Replay(data, jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32),
                  jax.random.key(seed))

  out = jax.tree.map(lambda spec: jax.sharding.NamedSharding(mesh, spec), specs(mesh))
  return jax.jit(zeros, out_shardings=out)


def init(example: Any, columns: int, mesh: Any, seed: int) -> Replay:
  """A zeroed replay of `columns` columns shaped like `example` ([L, E, ...] leaves, arrays or
  ShapeDtypeStructs), placed on `mesh` without a host copy."""
  return _zeros_fn(example, columns, mesh, seed)()


def abstract(example: Any, columns: int, mesh: Any, seed: int) -> Replay:
  """What `init` would return as ShapeDtypeStructs with their shardings, allocating nothing:
  enough to compile against, or to restore a checkpointed replay into."""
  zeros = _zeros_fn(example, columns, mesh, seed)
  out = zeros.lower().out_info
  return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=s.sharding), out)


def insert(replay: Replay, columns: Any) -> Replay:
  """Writes this device's [L, e, ...] columns at `pos`, overwriting the oldest when full.

  Runs under shard_map: `replay.data` is the local shard [L, C_local, ...].
  """
  capacity = jax.tree.leaves(replay.data)[0].shape[1]
  e = jax.tree.leaves(columns)[0].shape[1]
  if e > capacity:
    raise ValueError(f"an insert of {e} columns does not fit a local capacity of {capacity}")
  idx = (replay.pos + jnp.arange(e)) % capacity
  data = jax.tree.map(lambda buf, x: buf.at[:, idx].set(x.astype(buf.dtype)), replay.data, columns)
  return replay.replace(data=data, pos=(replay.pos + e) % capacity,
                        filled=jnp.minimum(replay.filled + e, capacity))


def sample_indices(replay: Replay, n: int, steps: int, axis_name: str
                   ) -> tuple[Array, Array, PRNGKey]:
  """n uniform (t, c) indices into this device's filled columns, and the next replicated key.

  Runs under shard_map. Returns t [n] in [0, steps), c [n] in [0, filled), and the key to
  store back (the same on every device, so the replicas stay identical).
  """
  key, sub = jax.random.split(replay.key)
  sub = jax.random.fold_in(sub, jax.lax.axis_index(axis_name))
  t_key, c_key = jax.random.split(sub)
  t = jax.random.randint(t_key, (n,), 0, steps)
  c = jax.random.randint(c_key, (n,), 0, jnp.maximum(replay.filled, 1))
  return t, c, key


def size(replay: Replay, steps: int, devices: int) -> int:
  """Transitions held, all devices together (reads a device scalar: off the hot path)."""
  return int(replay.filled) * steps * devices


def sharded(fn: Callable[..., Any], mesh: Any, in_specs: Any, out_specs: Any,
            donate_argnums: tuple[int, ...] = ()) -> Callable[..., Any]:
  """jit(shard_map(fn)) with explicit specs (sharding.data_parallel's, for a sharded output).

  NOTE: check_vma=False for the reason sharding.data_parallel gives; replication of the
  replicated outputs is checked by the sharded tests.
  """
  mapped = jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)
  return jax.jit(mapped, donate_argnums=donate_argnums)


def host_columns(replay: Replay) -> Any:
  """The whole buffer on the host, [L, C, ...] in global column order (tests and debugging)."""
  return jax.tree.map(np.asarray, jax.device_get(replay.data))
