"""The actors' policy step: compiled ahead of time for one device, keys made in numpy, outputs
packed so that one copy per step brings them to the host."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from jaxrl_async import envs


def key_data_shape() -> tuple[int, ...]:
  """The shape of one key's raw data under the configured PRNG implementation (traced only)."""
  return jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0))).shape


class PolicyOutputs:
  """The policy's action and extras travel device -> host as one packed [B, D] uint32 array:
  one copy per step instead of one per output (each copy from an accelerator costs a round trip
  of its own). Every output is 4 bytes wide (int32 / float32 actions, float32 extras), so
  packing is a bitcast, exact for every value."""

  def __init__(self, action_shape: tuple[int, ...], action_dtype: Any,
               extras_spec: dict[str, Any]):
    fields = [("action", tuple(action_shape), np.dtype(action_dtype))]
    fields += [(k, tuple(shape), np.dtype(dtype)) for k, (shape, dtype) in sorted(
        extras_spec.items())]
    self.fields, offset = [], 0
    for name, shape, dtype in fields:
      if dtype.itemsize != 4:
        raise TypeError(f"policy output {name!r} is {dtype}; packing takes 4-byte dtypes")
      width = int(np.prod(shape, dtype=np.int64))
      self.fields.append((name, shape, dtype, offset, width))
      offset += width
    self.width = offset

  def pack(self, action: Any, extras: dict[str, Any]) -> Any:  # traced
    import jax.numpy as jnp

    parts = [action] + [extras[name] for name, *_ in self.fields[1:]]
    return jnp.concatenate([jax.lax.bitcast_convert_type(x.reshape(x.shape[0], -1), jnp.uint32)
                            for x in parts], axis=1)

  def unpack(self, packed: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    out = {}
    for name, shape, dtype, offset, width in self.fields:
      out[name] = packed[:, offset:offset + width].view(dtype).reshape((len(packed),) + shape)
    # EnvPool's send takes a contiguous action array; the packed column is a strided view.
    return np.ascontiguousarray(out.pop("action")), out


def lower_policy_step(policy: Any, params: Any, spec: envs.EnvSpec, batch_size: int,
                      device: jax.Device) -> Any:
  """The actors' (params, obs, key data) -> (packed outputs, key data), traced and lowered for
  `device` from shapes alone (`params` may be ShapeDtypeStructs); `PolicyOutputs` built from
  the algorithm's `extras_spec` unpacks the outputs (extras in name order).

  Keys travel as raw data so actors make theirs in numpy (`actor_key_data`).
  """

  def step(params, obs, key_data):
    key, sub = jax.random.split(jax.random.wrap_key_data(key_data))
    action, extras = policy(params, obs, sub)
    per_env = lambda x: (tuple(x.shape[1:]), x.dtype)
    outputs = PolicyOutputs(*per_env(action), {k: per_env(v) for k, v in extras.items()})
    return outputs.pack(action, extras), jax.random.key_data(key)

  on_actor = jax.sharding.SingleDeviceSharding(device)
  shaped = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=on_actor)
  params = jax.tree.map(lambda p: shaped(p.shape, p.dtype), params)
  obs = shaped((batch_size,) + spec.obs_shape, spec.obs_dtype)
  return jax.jit(step).lower(params, obs, shaped(key_data_shape(), np.uint32))


def compile_policy_step(policy: Any, params: Any, spec: envs.EnvSpec, batch_size: int,
                        device: jax.Device, executables: Any = None, name: str = "policy"
                        ) -> Any:
  """`lower_policy_step` compiled ahead of time (or, with `executables`, loaded from
  runtime/executables.py's cache under `name` on a warm start)."""
  lower = lambda: lower_policy_step(policy, params, spec, batch_size, device)
  return executables.compile(name, [device], lower) if executables else lower().compile()


def actor_key_data(seed: int, actor_index: int, salt: int, shape: tuple[int, ...]) -> np.ndarray:
  """The actor's initial PRNG key, as raw key data made in numpy.

  Eager `jax.random` calls compile one small program each (rbg's fold_in alone took 0.5 s on
  this CPU), on the path to the first rollout; the compiled policy step wraps the data itself.
  """
  size = int(np.prod(shape))
  return np.random.SeedSequence([seed, actor_index, salt]).generate_state(size).reshape(shape)
