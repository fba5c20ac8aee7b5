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
