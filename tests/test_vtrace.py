"""V-trace targets with EnvPool's episode ends, against values worked out by hand."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_async.algos.impala import vtrace_returns

# One env, T = 3, V(obs_0..3) = 1, 2, 3, 4, rewards 1, gamma 0.9, on-policy (rho = 1), lambda 1.
VALUES = jnp.array([[1.0], [2.0], [3.0], [4.0]])
REWARDS = jnp.ones((3, 1))
RHO = jnp.ones((3, 1))
NO = jnp.zeros((3, 1), bool)


def at(t):
  return jnp.zeros((3, 1), bool).at[t, 0].set(True)


@pytest.mark.parametrize("jit", [False, True])
def test_no_episode_end_is_the_n_step_return(jit):
  # v_2 = 1 + 0.9 * 4 = 4.6; v_1 = 1 + 0.9 * 4.6 = 5.14; v_0 = 1 + 0.9 * 5.14 = 5.626
  fn = jax.jit(vtrace_returns, static_argnums=(5, 6)) if jit else vtrace_returns
  out = fn(VALUES, REWARDS, NO, NO, RHO, 0.9, 1.0)
  np.testing.assert_allclose(out.errors[:, 0] + VALUES[:-1, 0], [5.626, 5.14, 4.6], rtol=1e-6)


def test_truncation_bootstraps_from_the_final_obs_and_cuts_the_trace():
  # obs_2 ends the episode by time limit: v_1 = 1 + 0.9 * V(obs_2) = 3.7, v_0 = 1 + 0.9 * 3.7.
  out = vtrace_returns(VALUES, REWARDS, NO, at(1), RHO, 0.9, 1.0)
  np.testing.assert_allclose(out.errors[:2, 0] + VALUES[:2, 0], [4.33, 3.7], rtol=1e-6)


def test_termination_does_not_bootstrap():
  # obs_2 is terminal: v_1 = 1, v_0 = 1 + 0.9 * 1 = 1.9; the pg advantage at t=1 is 1 - V(obs_1).
  out = vtrace_returns(VALUES, REWARDS, at(1), NO, RHO, 0.9, 1.0)
  np.testing.assert_allclose(out.errors[:2, 0] + VALUES[:2, 0], [1.9, 1.0], rtol=1e-6)
  np.testing.assert_allclose(out.pg_advantage[1, 0], 1.0 - 2.0, rtol=1e-6)


def test_off_policy_ratio_is_clipped():
  # rho_2 = 3 is clipped to 1 at the last step; rho_1 = 0.5 scales the TD error at t=1:
  # v_2 = 3 + 1 * (1 + 3.6 - 3) = 4.6; v_1 = 2 + 0.5 * (1 + 2.7 - 2) + 0.9 * 0.5 * (4.6 - 3)
  #     = 2 + 0.85 + 0.72 = 3.57
  rho = jnp.array([[1.0], [0.5], [3.0]])
  out = vtrace_returns(VALUES, REWARDS, NO, NO, rho, 0.9, 1.0)
  np.testing.assert_allclose(out.errors[1:, 0] + VALUES[1:3, 0], [3.57, 4.6], rtol=1e-6)


def test_appo_clip_is_the_clipped_surrogate_on_the_vtrace_advantage():
  """--clip_eps > 0: the policy loss is -min(r A, clip(r, 1 -+ eps) A) with r = pi / mu and A the
  V-trace action-value estimate minus V, averaged over valid steps; worked out here from the
  network's outputs and `vtrace_returns`, with ratios far enough from 1 that the clip acts."""
  from jaxrl_async.algos.base import Rollout
  from jaxrl_async.algos.impala import impala_loss
  from jaxrl_async.config import TrainConfig
  from jaxrl_async.networks import ActorCritic

  config = TrainConfig.from_flat({"hidden_sizes": "8", "clip_eps": 0.2})
  cfg = config.algo
  net = ActorCritic(config.network, 2, discrete=True)
  rng = np.random.default_rng(0)
  T, B = 6, 3
  batch = Rollout(
      obs=jnp.asarray(rng.normal(size=(T + 1, B, 4)), jnp.float32),
      actions=jnp.asarray(rng.integers(0, 2, (T, B)), jnp.int32),
      rewards=jnp.asarray(rng.normal(size=(T, B)), jnp.float32),
      terminated=jnp.asarray(rng.random((T, B)) < 0.2), truncated=jnp.zeros((T, B), bool),
      valid=jnp.asarray(rng.random((T, B)) < 0.8),
      extras={"logp": jnp.asarray(np.log(rng.uniform(0.05, 0.95, (T, B))), jnp.float32)})
  params = net.init(jax.random.key(0), batch.obs[0])
  loss_fn = impala_loss(net, cfg, "i")
  loss = jax.vmap(lambda b: loss_fn(params, b)[1]["pg_loss"], axis_name="i")
  got = float(loss(jax.tree.map(lambda x: x[None], batch))[0])

  logits, values = net.apply(params, batch.obs)
  logp = jnp.take_along_axis(jax.nn.log_softmax(logits[:-1]), batch.actions[..., None], -1)[..., 0]
  rho = np.asarray(jnp.exp(logp - batch.extras["logp"]))
  out = vtrace_returns(values, batch.rewards, batch.terminated, batch.truncated, jnp.asarray(rho),
                       cfg.discount, cfg.vtrace_lambda, cfg.clip_rho, cfg.clip_pg_rho)
  adv = np.asarray(out.q_estimate - values[:-1])
  valid = np.asarray(batch.valid, np.float64)
  per_step = -np.minimum(rho * adv, np.clip(rho, 0.8, 1.2) * adv)
  assert ((rho < 0.8) | (rho > 1.2)).mean() > 0.5  # the clip acts on most steps
  np.testing.assert_allclose(got, (per_step * valid).sum() / valid.sum(), rtol=1e-5)
  unclipped = (-rho * adv * valid).sum() / valid.sum()
  assert abs(got - unclipped) > 1e-3
