"""The MSPBE problem: theta* is the saddle point, data splitting, bad sizes."""

import numpy as np
import pytest

from jaxrl_async.decentralized import problem as problem_lib


@pytest.mark.parametrize("split", ["parallel", "multi_agent"])
def test_theta_star_satisfies_the_optimality_conditions(split):
  p = problem_lib.random_mdp(3, nodes=4, samples=203, features=6, states=12, split=split)
  theta = p.theta_star()
  h, g = p.normal_equations()
  # Gradient of the primal sum vanishes (relative to its scale) ...
  assert np.linalg.norm(p.optimality_residual(theta)) < 1e-12 * np.linalg.norm(g)
  # ... and so does the saddle condition with the per-node dual optimum w_i = C_i^+ (A_i t - b_i).
  a, b, c = p.local_matrices()
  grad = p.nodes * p.rho * theta
  for a_i, b_i, c_i in zip(a, b, c, strict=True):
    w_i = np.linalg.pinv(c_i) @ (a_i @ theta - b_i)
    grad += a_i.T @ w_i
  assert np.linalg.norm(grad) < 1e-12 * np.linalg.norm(g)
  # Moving away increases the primal objective (strict convexity through rho).
  def primal(t):
    return sum(0.5 * (a_i @ t - b_i) @ np.linalg.pinv(c_i) @ (a_i @ t - b_i)
               for a_i, b_i, c_i in zip(a, b, c, strict=True)) + p.nodes * p.rho / 2 * t @ t
  step = np.random.default_rng(0).normal(size=theta.shape) * 1e-3
  assert primal(theta + step) > primal(theta) and primal(theta - step) > primal(theta)


def test_parallel_split_divides_the_rows_and_multi_agent_shares_them():
  p = problem_lib.random_mdp(0, nodes=3, samples=10, features=4, split="parallel")
  assert p.count.tolist() == [3, 4, 3] and p.count.sum() == 10
  assert (p.phi[0, 3:] == 0).all()  # padding rows are zero and never sampled
  q = problem_lib.random_mdp(0, nodes=3, samples=10, features=4, split="multi_agent")
  assert q.count.tolist() == [10, 10, 10]
  np.testing.assert_array_equal(q.phi[0], q.phi[2])
  assert not np.allclose(q.r[0], q.r[1])  # local rewards


def test_more_nodes_than_data_is_refused():
  with pytest.raises(problem_lib.ProblemError, match="--nodes=11: larger than the data"):
    problem_lib.random_mdp(0, nodes=11, samples=10)


def test_speed_allocation_sums_to_the_shards_and_gives_a_straggler_fewer():
  speeds = np.array([0.1] + [1.0] * 7)  # node 0 ten times slower
  count = problem_lib.allocate_shards(80, speeds)
  assert count.sum() == 80 and count.min() >= 1
  assert count[0] == 1 and count[1:].min() >= 11  # quotas 1.13 and 11.27
  assert np.abs(count - 80 * speeds / speeds.sum()).max() < 1.0  # largest remainders
  uniform = problem_lib.allocate_shards(10, np.ones(3))
  assert uniform.sum() == 10 and uniform.max() - uniform.min() <= 1
  # A very slow node still holds one shard: the counts stay a partition of the K shards.
  tiny = problem_lib.allocate_shards(8, np.array([0.01] + [1.0] * 7))
  assert tiny.tolist() == [1] * 8
  with pytest.raises(problem_lib.ProblemError, match="--shards=3: fewer shards than nodes"):
    problem_lib.allocate_shards(3, np.ones(4))


def test_moving_shards_between_nodes_leaves_theta_star_unchanged():
  kw = dict(samples=960, features=6, states=12, shards=12)
  uniform = problem_lib.random_mdp(2, nodes=4, **kw)
  speed = problem_lib.random_mdp(2, nodes=4, speeds=np.array([0.25, 1.0, 1.0, 1.0]), **kw)
  single = problem_lib.random_mdp(2, nodes=1, **kw)
  assert speed.count.sum() == uniform.count.sum() == 960
  assert speed.count[0] < uniform.count[0] and speed.shards_per_node()[0] == 1
  theta = uniform.theta_star()
  for other in (speed, single):
    np.testing.assert_allclose(other.theta_star(), theta, rtol=0,
                               atol=1e-12 * np.linalg.norm(theta))
  # Saddle point of the sharded problem: sum_s A_s^T C_s^+ (A_s t - b_s) + K rho t = 0.
  a, b, c = speed.shard_matrices()
  grad = speed.shards * speed.rho * theta
  for a_s, b_s, c_s in zip(a, b, c, strict=True):
    grad += a_s.T @ np.linalg.pinv(c_s) @ (a_s @ theta - b_s)
  assert np.linalg.norm(grad) < 1e-10 * np.linalg.norm(theta)
  # Why shards: moving *rows* between per-node duals changes the problem itself.
  per_node = problem_lib.random_mdp(2, nodes=4, samples=960, features=6, states=12)
  by_rows = problem_lib.split_rows(
      np.concatenate([per_node.phi[i, :n] for i, n in enumerate(per_node.count)]),
      np.concatenate([per_node.psi[i, :n] for i, n in enumerate(per_node.count)]),
      np.concatenate([per_node.r[i, :n] for i, n in enumerate(per_node.count)]),
      4, "parallel", per_node.rho, "by_rows", shards=12, speeds=np.array([0.25, 1, 1, 1]))
  np.testing.assert_allclose(by_rows.theta_star(), theta, rtol=0, atol=1e-12 * np.linalg.norm(
      theta))  # same rows, same shards, same theta*
  assert np.linalg.norm(per_node.theta_star() - theta) > 1e-3 * np.linalg.norm(theta)


def test_shards_default_to_one_per_node_and_are_never_split_across_nodes():
  p = problem_lib.random_mdp(0, nodes=3, samples=10, features=4)
  assert p.shards == 3 and p.shard_rows().tolist() == [3, 4, 3]
  assert (p.shard[0, 3:] == -1).all()
  bad = np.array([[0, 1], [1, 2]])  # shard 1 on both nodes
  with pytest.raises(problem_lib.ProblemError, match="on one node"):
    problem_lib.Problem(p.phi[:2, :2], p.psi[:2, :2], p.r[:2, :2], [2, 2], 0.01, shard=bad)
  with pytest.raises(problem_lib.ProblemError, match="cannot be resharded"):
    problem_lib.random_mdp(0, nodes=3, samples=10, features=4, split="multi_agent", shards=6)
