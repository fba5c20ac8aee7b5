"""`--lag_weighting`: each rollout's loss terms count w(lag) times. The actor stamps each
rollout's behaviour version, and the compiled update weighs it by its lag at that update; at
lag 0 the update is the unweighted one, bit for bit; a rollout of weight 0 contributes nothing;
bad values exit 2 with one line."""

import functools
import math
import os
import subprocess
import sys
import threading
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_async import envs
from jaxrl_async.algos import make_algorithm
from jaxrl_async.algos.base import Rollout, concat_rollouts, lag_weight
from jaxrl_async.algos.impala import impala_loss
from jaxrl_async.config import ConfigError
from jaxrl_async.networks import ActorCritic
from jaxrl_async.runtime.learners.loop import LearnerLoop
from jaxrl_async.runtime.learners.on_policy import OnPolicyStep, skip_nonfinite
from jaxrl_async.runtime.pipeline.queue import RolloutInfo, RolloutQueue
from jaxrl_async.runtime.pipeline.rate import RateController
from jaxrl_async.runtime.sharding import (
  LEARNER_AXIS,
  data_parallel,
  learner_mesh,
  put_batch,
  replicate,
)
from tests.conftest import random_batch, small_config

ROOT = Path(__file__).resolve().parent.parent
T, B = 8, 8
# Two rollouts per update, so one of them can be weighted against the other.
IMPALA = dict(num_envs=B, rollout_len=T, rollouts_per_update=2, max_policy_lag=4)
APPO = dict(IMPALA, clip_eps=0.2)  # IMPALA with the clipped surrogate on V-trace advantages
PPO = dict(IMPALA, algo="ppo", num_epochs=2, num_minibatches=2)
ALGOS = pytest.mark.parametrize("algo", [IMPALA, APPO, PPO], ids=["impala", "appo", "ppo"])


def random_rollout(seed: int, behaviour_version: int = 0) -> Rollout:
  return random_batch(T, B, np.random.default_rng(seed), behaviour_version)


def with_weight(rollout: Rollout, w: float) -> Rollout:
  return rollout.replace(weights=np.full((1, B), w, np.float32))


@functools.cache
def _compiled(config):
  spec = envs.env_spec(config.env)
  algo = make_algorithm(config, spec, LEARNER_AXIS)
  mesh = learner_mesh(jax.devices()[:1])
  state = replicate(jax.jit(algo.init)(jax.random.key(0)), mesh)
  # The learner's update, jitted rather than compiled ahead of time: batches with explicit
  # weights (a pytree of another structure than the learner's) trace their own program.
  step = data_parallel(skip_nonfinite(lambda s, rs: algo.update(s, concat_rollouts(rs))), mesh)
  return step, state, mesh


def update(config, rollouts, version: int = 0) -> tuple[list[np.ndarray], dict]:
  """New params (leaves) and metrics after one compiled learner update from a fixed init whose
  version counter reads `version`."""
  step, state, mesh = _compiled(config)
  state = state.replace(version=jax.device_put(np.int32(version), state.version.sharding))
  new, metrics = step(state, tuple(put_batch(r, mesh) for r in rollouts))
  return jax.tree.leaves(jax.device_get(new.params)), jax.device_get(metrics)


def assert_same(a, b):
  for x, y in zip(a, b, strict=True):
    np.testing.assert_array_equal(x, y)


def test_lag_weight_schemes():
  w = lambda lags, scheme, tau=2.0: np.asarray(lag_weight(np.asarray(lags), scheme, tau))
  np.testing.assert_array_equal(w([0, 5], "off"), [1.0, 1.0])
  np.testing.assert_array_equal(w([0, 1, 3], "inverse"), [1.0, 0.5, 0.25])
  np.testing.assert_allclose(w([0, 4], "exp"), [1.0, math.exp(-2.0)], rtol=1e-6)


def make_learner(config, version: int) -> LearnerLoop:
  step = OnPolicyStep(None, config.rate.rollouts_per_update, 100, 0)
  return LearnerLoop(step, RolloutQueue(8), RateController(config.rate, version),
                     lambda state, v: None, threading.Event(), lambda: 0.0, 3, None, version)


def test_the_learner_passes_rollouts_on_as_the_actors_stamped_them():
  config = small_config(**IMPALA, lag_weighting="inverse")
  learner = make_learner(config, version=3)
  mesh = learner_mesh(jax.devices()[:1])
  for i, v in enumerate([3, 1]):
    learner.queue.put((put_batch(random_rollout(i, v), mesh), RolloutInfo(0, i, v, T * B, 0.0)))
  while not learner.step.ready():
    assert learner._take()
  batch, tickets = learner.step.take_batch()
  assert tickets == (0, 1)
  assert all(r.weights is None for r in batch)  # weights are the compiled update's business
  np.testing.assert_array_equal(np.asarray(batch[1].behaviour_version), np.ones((1, B)))


@ALGOS
def test_the_update_weighs_each_rollout_by_its_lag(algo):
  config = small_config(**algo, lag_weighting="inverse")
  a, b = random_rollout(0, behaviour_version=3), random_rollout(1, behaviour_version=1)
  at_3, _ = update(config, (a, b), version=3)  # lags 0 and 2: weights 1 and 1/3
  explicit, _ = update(config, (with_weight(a, 1.0), with_weight(b, 1 / 3)), version=3)
  for x, y in zip(at_3, explicit, strict=True):
    np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-8)
  at_1, _ = update(config, (a, b), version=1)  # "lags" of -2 and 0: a different update
  assert not np.allclose(at_3[0], at_1[0])


@ALGOS
@pytest.mark.parametrize("scheme", ["inverse", "exp"])
def test_all_lags_zero_equals_the_unweighted_update_exactly(algo, scheme):
  weighted = small_config(**algo, lag_weighting=scheme)
  batch = (random_rollout(0, behaviour_version=2), random_rollout(1, behaviour_version=2))
  p1, m1 = update(weighted, batch, version=2)
  p0, m0 = update(small_config(**algo), batch, version=2)
  assert_same(p1, p0)
  assert m1["pg_loss"] == m0["pg_loss"] and m1["value_loss"] == m0["value_loss"]


@ALGOS
def test_a_rollout_of_weight_zero_contributes_nothing(algo):
  config = small_config(**algo, lag_weighting="inverse")
  a, b = random_rollout(0), random_rollout(1)
  # Only B's valid count is kept: the loss divides by the batch's valid count (absolute
  # weights, see the next test).
  other_b = random_rollout(2).replace(valid=b.valid)
  p_ab, _ = update(config, (with_weight(a, 1.0), with_weight(b, 0.0)))
  p_a_other, _ = update(config, (with_weight(a, 1.0), with_weight(other_b, 0.0)))
  # Exactly: what the zero-weighted rollout holds changes nothing (advantage statistics too).
  assert_same(p_ab, p_a_other)
  p_both, _ = update(config, (with_weight(a, 1.0), with_weight(b, 1.0)))
  assert not np.allclose(p_ab[0], p_both[0])  # and weight 1 does count


def test_weight_zero_gradient_is_the_other_rollouts_gradient_scaled_by_their_share():
  """The loss is divided by the valid count of the whole batch (weights are absolute, not
  renormalised), so [A, B] with B weighted 0 has A's gradient times A's share of the valid
  steps. Where the gradient norm is clipped, as it is early in training, that share cancels
  and the update is A's alone."""
  config = small_config(**IMPALA, lag_weighting="inverse", normalize_advantages=True)
  net = ActorCritic(config.network, 2, discrete=True)
  a, b = random_rollout(0), random_rollout(1)
  params = net.init(jax.random.key(0), jnp.zeros((1, 4)))
  both = jax.tree.map(lambda x, y: np.concatenate([x, y], axis=1),
                      with_weight(a, 1.0), with_weight(b, 0.0))

  def grad(batch):
    f = lambda p, x: impala_loss(net, config.algo, "i")(p, x)[0]
    g = jax.vmap(jax.grad(f), in_axes=(None, 0), axis_name="i")(
        params, jax.tree.map(lambda x: jnp.asarray(x)[None], batch))
    return jax.tree.leaves(jax.tree.map(lambda x: x[0], g))

  share = a.valid.sum() / (a.valid.sum() + b.valid.sum())
  for g_both, g_a in zip(grad(both), grad(a), strict=True):
    np.testing.assert_allclose(g_both, share * g_a, rtol=2e-5, atol=1e-7)
  # The update: [A, B (weight 0)] against A alone (one rollout per update). Large rewards make
  # both gradients exceed --max_grad_norm, so clipping removes the share; without clipping,
  # Adam's eps (1e-5) would still see it in tiny gradient entries.
  a, b = (r.replace(rewards=100 * r.rewards) for r in (a, b))
  p_ab, m_ab = update(config, (with_weight(a, 1.0), with_weight(b, 0.0)))
  p_a, m_a = update(small_config(**{**IMPALA, "rollouts_per_update": 1},
                                 normalize_advantages=True), (a,))
  max_norm = config.algo.max_grad_norm
  assert m_ab["grad_norm"] > max_norm and m_a["grad_norm"] > max_norm
  np.testing.assert_allclose(m_ab["grad_norm"], share * m_a["grad_norm"], rtol=1e-5)
  for x, y in zip(p_ab, p_a, strict=True):
    np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-7)


def test_config_refuses_bad_values_and_dqn():
  for values, flag in [({"lag_weighting": "linear"}, "lag_weighting"),
                       ({"lag_weighting": "exp", "lag_weighting_tau": 0.0}, "lag_weighting_tau"),
                       ({"algo": "dqn", "lag_weighting": "inverse"}, "lag_weighting")]:
    with pytest.raises(ConfigError) as e:
      small_config(**values)
    assert e.value.flag == flag


@pytest.mark.parametrize("args", [["--lag_weighting=linear"],
                                  ["--preset=cartpole_dqn", "--lag_weighting=inverse"]])
def test_bad_flag_exits_2_with_one_line(args, tmp_path):
  r = subprocess.run([sys.executable, "-m", "experiments.train", *args,
                      f"--run_dir={tmp_path}"], cwd=ROOT, capture_output=True, text=True,
                     timeout=120, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert r.returncode == 2, r.stderr[-2000:]
  lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
  assert len(lines) == 1 and "--lag_weighting" in lines[0], r.stderr
  assert not (tmp_path / "metrics.jsonl").exists()
