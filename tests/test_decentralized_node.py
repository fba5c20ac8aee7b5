"""The pure node update: timestamps, mass bookkeeping of one activation, jit == no jit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_async.decentralized import graphs
from jaxrl_async.decentralized import node as node_lib
from jaxrl_async.decentralized import problem as problem_lib


@pytest.fixture
def node2():
  """Node 0 of a 3-node exponential graph (2 in-neighbours), with a warm random state."""
  p = problem_lib.random_mdp(0, nodes=3, samples=60, features=5, states=10)
  g = graphs.exponential(3)
  consts = node_lib.network_consts(p, g, alpha=20.0, beta=160.0)
  const = node_lib.slice_const(consts, 0)
  state = node_lib.NodeState(*(np.asarray(x)[0] for x in node_lib.init_state(consts)))
  rng = np.random.default_rng(1)
  state = state._replace(theta=rng.normal(size=5), y=rng.normal(size=5),
                         theta_in=rng.normal(size=(2, 5)), sigma_in=rng.normal(size=(2, 5)),
                         stamp_in=np.array([5, 7]), clock=np.array(9))
  return const, state


def _inbox(stamp, theta, sigma):
  return node_lib.Inbox(np.asarray(theta, np.float64), np.asarray(sigma, np.float64),
                        np.asarray(stamp, np.int64))


def test_stale_message_never_overwrites_a_newer_copy(node2):
  const, state = node2
  with jax.enable_x64(True):
    stale = _inbox([4, 7], np.full((2, 5), 99.0), np.full((2, 5), 99.0))  # 4 < 5, 7 == 7
    new_state, _ = node_lib.node_update_jit(const, state, stale)
    np.testing.assert_array_equal(new_state.theta_in, state.theta_in)
    np.testing.assert_array_equal(new_state.sigma_in, state.sigma_in)
    np.testing.assert_array_equal(new_state.stamp_in, state.stamp_in)
    fresh = _inbox([6, -1], np.full((2, 5), 3.0), np.full((2, 5), 2.0))
    new_state, _ = node_lib.node_update_jit(const, state, fresh)
    np.testing.assert_array_equal(new_state.theta_in[0], 3.0)
    np.testing.assert_array_equal(new_state.theta_in[1], state.theta_in[1])
    assert new_state.stamp_in.tolist() == [6, 7]


def test_one_activation_conserves_mass_and_follows_the_pull_step(node2):
  const, state = node2
  inbox = _inbox([8, 9], np.ones((2, 5)), state.sigma_in + 0.25)
  with jax.enable_x64(True):
    new, out = jax.tree.map(np.asarray, node_lib.node_update_jit(const, state, inbox))
  g_old = node_lib.local_gradient(const, state)
  g_new = node_lib.local_gradient(const, new)
  received = 2 * 0.25 * np.ones(5)
  # held b_ii y + pushed this time == held before + received + gradient change
  pushed = np.asarray(out.sigma - state.sigma_out).sum(axis=0)
  lhs = const.push_self * np.asarray(new.y) + pushed
  rhs = const.push_self * state.y + received + (g_new - g_old)
  np.testing.assert_allclose(lhs, rhs, rtol=0, atol=1e-13)
  expected_theta = (const.pull_self * state.theta + const.pull_in @ np.ones((2, 5))
                    - const.alpha * state.y)
  np.testing.assert_allclose(np.asarray(new.theta), expected_theta, rtol=0, atol=1e-14)
  assert int(out.stamp) == int(new.clock) == 10


def test_jitted_and_plain_updates_agree(node2):
  const, state = node2
  inbox = _inbox([6, 8], np.ones((2, 5)), state.sigma_in + 0.5)
  with jax.enable_x64(True):
    a, _ = node_lib.node_update_jit(const, state, inbox)
    with jax.disable_jit():
      b, _ = node_lib.node_update(*jax.tree.map(jnp.asarray, (const, state, inbox)))
  for x, y in zip(a, b, strict=True):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-12, atol=1e-14)


def test_keys_do_not_follow_the_process_default_prng():
  """Node keys travel as raw data to other processes, so they are made and read with one fixed
  implementation: consts made where the default is rbg (the trainer's) run where it is not."""
  p = problem_lib.random_mdp(0, nodes=2, samples=40, features=5, states=10)
  before = jax.config.jax_default_prng_impl
  try:
    jax.config.update("jax_default_prng_impl", "rbg")
    consts = node_lib.network_consts(p, graphs.exponential(2), alpha=20.0, beta=160.0,
                                     sampling="uniform")
  finally:
    jax.config.update("jax_default_prng_impl", before)
  const = node_lib.slice_const(consts, 0)
  state = node_lib.NodeState(*(np.asarray(x)[0] for x in node_lib.init_state(consts)))
  inbox = _inbox([-1], np.zeros((1, 5)), np.zeros((1, 5)))
  with jax.enable_x64(True):
    new, _ = node_lib.node_update_jit(const, state, inbox)
  assert int(new.clock) == int(state.clock) + 1
