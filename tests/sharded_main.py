"""Run in a subprocess with 4 forced CPU devices (see test_sharded.py): the sharded learner step
equals the single-device step on the same batch, replicas stay identical, and a run trains."""

import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import numpy as np  # noqa: E402

from jaxrl_async import envs  # noqa: E402
from jaxrl_async.algos import make_algorithm  # noqa: E402
from jaxrl_async.runtime.learners.on_policy import compile_update  # noqa: E402
from jaxrl_async.runtime.sharding import (  # noqa: E402
  LEARNER_AXIS,
  check_replicated,
  learner_mesh,
  put_batch,
  replicate,
)
from jaxrl_async.runtime.trainer import Trainer  # noqa: E402
from tests.conftest import random_batch, small_config  # noqa: E402


def one_update(config, devices, batch_host):
  spec = envs.env_spec(config.env)
  algo = make_algorithm(config, spec, LEARNER_AXIS)
  mesh = learner_mesh(devices)
  state = replicate(jax.jit(algo.init)(jax.random.key(0)), mesh)
  # At version 4, so the batch's behaviour versions 0..4 are lags 4..0.
  state = state.replace(version=jax.device_put(np.int32(4), state.version.sharding))
  step = compile_update(config, spec, algo, mesh, state)
  new_state, metrics = step(state, (put_batch(batch_host, mesh),))
  return new_state, metrics


def main(run_dir):
  assert jax.device_count() == 4, jax.devices()
  T, B = 8, 8
  # Behaviour versions (so lags and lag weights) differ per env column, so each device's shard
  # must carry its own columns'.
  batch = random_batch(T, B, np.random.default_rng(0)).replace(
      behaviour_version=np.random.default_rng(1).integers(0, 5, (1, B)).astype(np.int32))
  for extra in ({}, {"normalize_advantages": True},
                {"normalize_advantages": True, "lag_weighting": "inverse"}):
    config = small_config(num_envs=B, rollout_len=T, learner_devices=4, **extra)
    single, m1 = one_update(config, jax.devices()[:1], batch)
    sharded, m4 = one_update(config, jax.devices(), batch)
    check_replicated(sharded.params)
    for a, b in zip(jax.tree.leaves(jax.device_get(single.params)),
                    jax.tree.leaves(jax.device_get(sharded.params)), strict=True):
      np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(float(m1["value_loss"]), float(m4["value_loss"]), rtol=1e-5)
    assert not np.allclose(jax.tree.leaves(single.params)[0],
                           jax.tree.leaves(jax.jit(make_algorithm(
                               config, envs.env_spec(config.env), LEARNER_AXIS).init)(
                                   jax.random.key(0)).params)[0])  # the update did something
  config = small_config(num_envs=16, rollout_len=16, learner_devices=4, num_actors=2,
                        total_env_steps=20_000, hidden_sizes="64,64")
  result = Trainer.from_config(config, envs.env_spec(config.env), run_dir=run_dir, quiet=True).run()
  check_replicated(result.state.params)
  assert result.summary["updates"] > 50, result.summary
  print("SHARDED_OK", result.summary["final_return_mean"])


if __name__ == "__main__":
  main(sys.argv[1])
