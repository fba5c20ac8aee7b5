"""Annealed schedules count the env steps learned from (algos/schedule.py): the same env steps
give the same learning rate whatever the rollouts per update (U), which --balance=auto moves, and
at the configured U the count is optax's own count of gradient steps."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxrl_async import envs
from jaxrl_async.algos import make_algorithm
from jaxrl_async.algos.base import concat_rollouts
from jaxrl_async.algos.schedule import (
  EnvStepClock,
  Progress,
  make_scheduled_adam,
  progress_init,
)
from jaxrl_async.runtime.learners.on_policy import skip_nonfinite
from jaxrl_async.runtime.sharding import (
  LEARNER_AXIS,
  data_parallel,
  learner_mesh,
  put_batch,
  replicate,
)
from tests.conftest import random_batch, small_config


def on_devices(fn, devices: int):
  """`fn` run as on each of `devices` learner devices (vmap over a named axis, which gives
  `axis_size`), each device's result the same: device 0's is returned."""
  return lambda *args: jax.tree.map(
      lambda x: x[0], jax.vmap(lambda _: fn(*args), axis_name="i")(jnp.arange(devices)))


@pytest.mark.parametrize("devices", [1, 2])
def test_at_the_configured_batch_the_count_is_optaxs_count_of_gradient_steps(devices):
  clock = EnvStepClock(grad_steps=4, columns=8, axis_name="i")
  local = 8 // devices  # this device's columns of a configured batch
  count_at = on_devices(lambda p, k: clock.count_at(p, k, local), devices)
  advance = on_devices(lambda p: clock.advance(p, local), devices)
  progress = progress_init()
  for u in range(5):
    assert [int(count_at(progress, k)) for k in range(4)] == [4 * u + k for k in range(4)]
    progress = advance(progress)
    assert (int(progress.count), int(progress.rem)) == (4 * (u + 1), 0)


def test_other_batches_count_their_env_steps_with_the_fraction_carried_exactly():
  clock = EnvStepClock(grad_steps=2, columns=6, axis_name="i")  # U = 3 of 2 envs
  count_at = on_devices(clock.count_at, 1)
  advance = on_devices(clock.advance, 1)
  progress = progress_init()
  # U = 1: each gradient step is a third of the configured one's env steps.
  assert [int(count_at(progress, k, 2)) for k in range(2)] == [0, 0]
  for expected in [(0, 4), (1, 2), (2, 0)]:
    progress = advance(progress, 2)
    assert (int(progress.count), int(progress.rem)) == expected
  # Three updates at U = 1 made what one at U = 3 makes; one at U = 6 makes twice that.
  assert [int(count_at(progress, k, 12)) for k in range(2)] == [2, 4]
  progress = advance(progress, 12)
  assert (int(progress.count), int(progress.rem)) == (6, 0)


def test_the_rate_applied_after_the_optimiser_is_bit_for_bit_optaxs_schedule():
  """What makes runs at the configured U bit-identical to the update-counting schedules:
  Adam at rate 1 then times lr(count) equals Adam with the schedule inside (tools/params_digest.py
  checks the same over whole runs)."""
  schedule = optax.linear_schedule(3e-3, 0.0, 20)
  theirs = optax.flatten(optax.chain(optax.clip_by_global_norm(0.5),
                                     optax.adam(schedule, eps=1e-5)))
  # What the algorithms run: 20 updates of one gradient step, each of 4 env columns.
  ours = make_scheduled_adam(3e-3, True, 0.5, num_updates=20, grad_steps=1,
                             columns_per_update=4, axis_name="i")
  step = on_devices(lambda g, o, p, progress: ours.step(g, o, p, progress, 0, 4), 1)
  rng = np.random.default_rng(0)
  params = {"w": jnp.asarray(rng.normal(size=(5, 3)), jnp.float32), "b": jnp.zeros(3)}
  a, b = (params, theirs.init(params)), (params, ours.init(params))
  progress = progress_init()
  for count in range(25):  # past the end too, where the rate stays 0
    grads = jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape), x.dtype), params)
    updates, state = theirs.update(grads, a[1], a[0])
    a = (optax.apply_updates(a[0], updates), state)
    new_params, state, lr = step(grads, b[1], b[0], progress)
    b = (new_params, state)
    assert float(lr) == float(schedule(count))
    progress = Progress(progress.count + 1, progress.rem)
    for x, y in zip(jax.tree.leaves(a[0]), jax.tree.leaves(b[0]), strict=True):
      np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


T, E = 8, 4
ALGOS = {"impala": dict(num_epochs=2, num_minibatches=2), "ppo": dict(algo="ppo"),
         "a2c": dict(algo="a2c")}


@functools.cache
def _learner(name: str):
  # Configured U = 2 and a budget of four such updates; learning_rate 1e-2 for round numbers.
  config = small_config(num_envs=E, rollout_len=T, rollouts_per_update=2,
                        total_env_steps=4 * 2 * E * T, anneal_lr=True, learning_rate=1e-2,
                        **ALGOS[name], **({"anneal_clip": True} if name == "ppo" else {}))
  algo = make_algorithm(config, envs.env_spec(config.env), LEARNER_AXIS)
  mesh = learner_mesh(jax.devices()[:1])
  state = replicate(jax.jit(algo.init)(jax.random.key(0)), mesh)
  step = data_parallel(skip_nonfinite(lambda s, rs: algo.update(s, concat_rollouts(rs))), mesh)
  return config, algo, step, state, mesh


@pytest.mark.parametrize("name", list(ALGOS))
def test_the_learning_rate_anneals_over_env_steps_whatever_the_rollouts_per_update(name):
  config, algo, step, state, mesh = _learner(name)
  grad_steps = algo.grad_steps_per_update
  rng = np.random.default_rng(0)
  batch = lambda u: tuple(put_batch(random_batch(T, E, rng), mesh) for _ in range(u))
  lr = lambda count: 1e-2 * (1.0 - count / (4 * grad_steps))
  # U = 4, 1, 1 and 2: 2 + 0.5 + 0.5 + 1 configured updates, the budget's 4.
  counts_before = [0, 2 * grad_steps, 2 * grad_steps + grad_steps // 2, 3 * grad_steps]
  for u, before in zip([4, 1, 1, 2], counts_before, strict=True):
    assert int(state.progress.count) == before
    state, metrics = step(state, batch(u))
    last = before + (grad_steps - 1) * u // 2  # the count at the update's last gradient step
    np.testing.assert_allclose(float(metrics["learning_rate"]), lr(last), rtol=1e-6)
    if name == "ppo":  # the clip reads the whole configured updates learned before this one
      np.testing.assert_allclose(float(metrics["clip_eps"]), 0.2 * (1 - (before // grad_steps)
                                                                    / 4), rtol=1e-6)
  assert int(state.version) == 4
  assert (int(state.progress.count), int(state.progress.rem)) == (4 * grad_steps, 0)
  # The budget is spent, so the rate is 0 from here on, as at the end of a run at U = 2.
  state, metrics = step(state, batch(2))
  assert float(metrics["learning_rate"]) == 0.0
