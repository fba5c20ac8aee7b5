"""Graphs and weights of the push-pull network: construction, stochasticity, refusal."""

import numpy as np
import pytest

from jaxrl_async.decentralized import graphs


@pytest.mark.parametrize("n", [1, 2, 5, 8, 13])
def test_ring_and_exponential_are_strongly_connected_with_expected_degrees(n):
  ring = graphs.directed_ring(n)
  assert graphs.is_strongly_connected(ring.adj)
  assert ring.adj.sum() == (n if n > 1 else 0)
  expo = graphs.exponential(n)
  hops = [2**m for m in range(8) if 2**m < n]
  assert (expo.adj.sum(axis=0) == len(hops)).all()  # every node's out-degree
  for j in range(n):
    assert sorted(expo.out_neighbours(j)) == sorted({(j + h) % n for h in hops})


@pytest.mark.parametrize("seed", range(5))
def test_random_digraph_has_exact_out_degree_and_is_strongly_connected(seed):
  g = graphs.random_strongly_connected(9, 3, seed)
  assert (g.adj.sum(axis=0) == 3).all()
  assert graphs.is_strongly_connected(g.adj)
  assert not np.diag(g.adj).any()


@pytest.mark.parametrize("make", [lambda: graphs.directed_ring(6), lambda: graphs.exponential(7),
                                  lambda: graphs.random_strongly_connected(8, 2, 3),
                                  lambda: graphs.exponential(7).with_speeds([0.1] + [1.0] * 6)])
def test_pull_is_row_stochastic_and_push_column_stochastic_with_positive_diagonals(make):
  g = make()
  a, b = g.pull_matrix(), g.push_matrix()
  np.testing.assert_allclose(a.sum(axis=1), 1.0, rtol=0, atol=1e-15)
  np.testing.assert_allclose(b.sum(axis=0), 1.0, rtol=0, atol=1e-15)
  assert (np.diag(a) > 0).all() and (np.diag(b) > 0).all()
  # Weights live exactly on the edges (plus self): a_ij > 0 iff j -> i; b_ij > 0 iff j -> i.
  off = ~np.eye(g.n, dtype=bool)
  assert ((a > 0) & off).sum() == g.adj.sum() == ((b > 0) & off).sum()
  assert ((a > 0)[off] == g.adj[off]).all() and ((b > 0)[off] == g.adj[off]).all()


def test_slot_tables_agree_with_the_weights():
  g = graphs.random_strongly_connected(7, 3, 1)
  t = g.slot_tables()
  a, b = g.pull_matrix(), g.push_matrix()
  for i in range(g.n):
    for s, j in enumerate(t["in_nbr"][i]):
      if j < 0:
        assert t["pull_in"][i, s] == 0
        continue
      assert t["pull_in"][i, s] == a[i, j]
      o = t["in_to_out_slot"][i, s]
      assert t["out_nbr"][j, o] == i and t["push_out"][j, o] == b[i, j]


def test_not_strongly_connected_is_refused_with_a_message():
  with pytest.raises(graphs.GraphError, match="not strongly connected.*cannot reach"):
    graphs.from_edges(3, [(0, 1), (1, 2)])  # a path: 2 cannot get back to 0
  with pytest.raises(graphs.GraphError, match="not strongly connected"):
    graphs.from_edges(4, [(0, 1), (1, 0), (2, 3), (3, 2)])  # two islands
  with pytest.raises(graphs.GraphError, match="--edges"):
    graphs.make("custom", 3, edges="0-1,1-x")
  with pytest.raises(graphs.GraphError, match="--out_degree"):
    graphs.random_strongly_connected(4, 4, 0)
  assert graphs.is_strongly_connected(graphs.from_edges(3, [(0, 1), (1, 2), (2, 0)]).adj)


def test_speed_weights_trust_a_slow_node_less_and_send_it_less_mass():
  plain = graphs.exponential(8)
  g = plain.with_speeds([0.1] + [1.0] * 7)
  a, b, a0, b0 = g.pull_matrix(), g.push_matrix(), plain.pull_matrix(), plain.push_matrix()
  for i in plain.out_neighbours(0):  # nodes that pull node 0's (stale) copy
    assert a[i, 0] < a0[i, 0] / 5
  assert a[0, 0] < a0[0, 0] / 5  # the slow node mostly adopts its neighbours' average
  for j in plain.in_neighbours(0):  # nodes that push tracker mass to node 0
    assert b[0, j] < b0[0, j] / 5
  assert b[0, 0] < b0[0, 0] / 5  # and it keeps little of its own
  # Equal speeds are the uniform weights; the slot tables carry the speed weights.
  flat = plain.with_speeds([3.0] * 8)
  np.testing.assert_allclose(flat.pull_matrix(), a0, rtol=1e-15)
  np.testing.assert_allclose(flat.push_matrix(), b0, rtol=1e-15)
  assert graphs.make("exponential", 8, speeds=tuple(g.speeds)).slot_tables()["push_self"][0] \
      == b[0, 0]
  with pytest.raises(graphs.GraphError, match="speeds must be 8 numbers > 0"):
    plain.with_speeds([0.0] + [1.0] * 7)
