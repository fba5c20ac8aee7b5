"""The cost of one actor policy step on this machine's first device, four ways.

`numpy_in`: the compiled step takes the numpy obs itself (what actors do on a CPU device);
`put_then_call`: an explicit `jax.device_put` first (what actors do on an accelerator, to time
host -> device apart); each with and without `block_until_ready` before the one packed copy to
the host. Median microseconds per step over --steps steps, CartPole-sized unless --env_id.

  python -m tools.policy_step_cost [--env_id=CartPole-v1] [--batch=16] [--steps=5000]
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import numpy as np

from jaxrl_async import envs
from jaxrl_async.algos import make_algorithm
from jaxrl_async.config import TrainConfig
from jaxrl_async.runtime.pipeline.policy_step import (
  PolicyOutputs,
  actor_key_data,
  compile_policy_step,
  key_data_shape,
)
from jaxrl_async.runtime.sharding import LEARNER_AXIS


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--env_id", default="CartPole-v1")
  parser.add_argument("--batch", type=int, default=16)
  parser.add_argument("--steps", type=int, default=5000)
  args = parser.parse_args()
  extra = {"network": "nature_cnn"} if envs.is_atari(args.env_id) else {}
  cfg = TrainConfig.from_flat(dict(env_id=args.env_id, num_envs=args.batch, **extra))
  spec = envs.env_spec(cfg.env)
  algo = make_algorithm(cfg, spec, LEARNER_AXIS)
  device = jax.devices()[0]
  params = jax.device_put(algo.actor_params(jax.jit(algo.init)(jax.random.key(0))), device)
  step = compile_policy_step(algo.make_policy(0), params, spec, args.batch, device)
  outputs = PolicyOutputs(spec.action_shape, spec.action_dtype, algo.extras_spec)
  key = [jax.device_put(actor_key_data(0, 0, 0, key_data_shape()), device)]
  obs = np.zeros((args.batch,) + spec.obs_shape, spec.obs_dtype)

  def run(put: bool, block: bool) -> None:
    x = jax.device_put(obs, device) if put else obs
    packed, key[0] = step(params, x, key[0])
    if block:
      packed.block_until_ready()
    outputs.unpack(np.asarray(packed))

  ways = {"numpy_in": (False, False), "numpy_in+block": (False, True),
          "put_then_call": (True, False), "put_then_call+block": (True, True)}
  times: dict[str, list[float]] = {w: [] for w in ways}
  for _ in range(3):  # interleaved rounds, so drifting load falls on every way alike
    for name, (put, block) in ways.items():
      for _ in range(100):
        run(put, block)
      t0 = time.perf_counter()
      for _ in range(args.steps):
        run(put, block)
      times[name].append((time.perf_counter() - t0) / args.steps * 1e6)
  print(f"{device.platform} {args.env_id} batch {args.batch}: median us per policy step")
  for name, values in times.items():
    print(f"  {name:22s} {statistics.median(values):8.1f}")


if __name__ == "__main__":
  main()
