"""The real multi-process runtime (ZeroMQ, one OS process per node) reaches theta*."""

import numpy as np

from jaxrl_async.decentralized import graphs
from jaxrl_async.decentralized import problem as problem_lib
from jaxrl_async.decentralized.processes import run_processes


def test_two_processes_reach_theta_star_within_1e_6():
  p = problem_lib.random_mdp(1, nodes=2, samples=160, features=6, states=15)
  result = run_processes(p, graphs.exponential(2), 20.0, 160.0, tol=1e-6, max_wall_s=90.0)
  assert result.stopped == "tol", result.stopped
  # The final states (collected after the stop) are at least as close as the last reports.
  assert result.final_rel_error < 1e-6
  theta_star = p.theta_star()
  np.testing.assert_allclose(result.theta, np.broadcast_to(theta_star, result.theta.shape),
                             rtol=0, atol=1e-6 * np.linalg.norm(theta_star))
  assert all(c > 0 for c in result.extra["clocks"])  # both nodes did work
