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
