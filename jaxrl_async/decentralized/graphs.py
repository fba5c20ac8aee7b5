"""Directed communication graphs and their push-pull weights.

Convention: `adj[i, j]` is True when there is an edge j -> i, i.e. j is an in-neighbour of i.
Along an edge j -> i travel both of the algorithm's channels: i *pulls* j's parameters, and j
*pushes* a share of its gradient tracker to i. Hence

* the pull matrix `A` is row-stochastic: row i averages i and its in-neighbours;
* the push matrix `B` is column-stochastic: column j splits j's mass between j and its
  out-neighbours.

Both have positive diagonals, and both are irreducible exactly when the graph is strongly
connected, which every constructor here checks (`GraphError` otherwise).

Weights are uniform over a node's neighbours and itself, or, given relative node speeds
(`Graph.with_speeds`), in proportion to the speed of the node they refer to: i pulls j's copy
with weight ~ v_j (a slow node's copy is old by the time it is read, and a slow node itself
mostly adopts its neighbours' fresher average), and j pushes to i a share ~ v_i of its tracker
(mass pushed to a slow node waits unread until it next activates, and a slow node keeps little
of its own). Any such weights are still row- / column-stochastic with positive diagonals, so
the fixed point, theta*, and the mass invariant are unchanged.
"""

from __future__ import annotations

import dataclasses

import numpy as np

TOPOLOGIES = ("ring", "exponential", "random", "custom")


class GraphError(ValueError):
  """A graph the algorithm cannot run on (not strongly connected, bad size or degree)."""


@dataclasses.dataclass(frozen=True)
class Graph:
  """A directed graph over nodes 0..n-1 with its pull/push weights and per-node slot tables.

  Attributes:
    adj: [n, n] bool, `adj[i, j]` means edge j -> i. No self-loops (self-weights are implicit).
    name: a short description for logs.
    speeds: () for uniform weights, or [n] relative node speeds the weights follow.
  """

  adj: np.ndarray
  name: str = "custom"
  speeds: tuple[float, ...] = ()

  def __post_init__(self):
    adj = np.asarray(self.adj, dtype=bool)
    if adj.ndim != 2 or adj.shape[0] != adj.shape[1] or adj.shape[0] < 1:
      raise GraphError(f"adjacency must be a non-empty square matrix, got shape {adj.shape}")
    adj = adj.copy()
    np.fill_diagonal(adj, False)
    adj.setflags(write=False)
    object.__setattr__(self, "adj", adj)
    speeds = tuple(float(v) for v in self.speeds)
    if speeds and (len(speeds) != adj.shape[0] or not all(0 < v < np.inf for v in speeds)):
      raise GraphError(f"speeds must be {adj.shape[0]} numbers > 0, got {speeds}")
    object.__setattr__(self, "speeds", speeds)
    unreachable = _unreachable_from_all(adj)
    if unreachable:
      raise GraphError(f"graph {self.name!r} with {self.n} nodes is not strongly connected: "
                       f"{unreachable}; the push-pull method needs every node to reach every "
                       "other along directed edges")

  @property
  def n(self) -> int:
    return self.adj.shape[0]

  def in_neighbours(self, i: int) -> list[int]:
    return [int(j) for j in np.flatnonzero(self.adj[i])]

  def out_neighbours(self, j: int) -> list[int]:
    return [int(i) for i in np.flatnonzero(self.adj[:, j])]

  @property
  def max_in_degree(self) -> int:
    return int(self.adj.sum(axis=1).max())

  @property
  def max_out_degree(self) -> int:
    return int(self.adj.sum(axis=0).max())

  def with_speeds(self, speeds: tuple[float, ...] | np.ndarray | None) -> Graph:
    """The same graph with weights that follow relative node speeds (None: uniform)."""
    return dataclasses.replace(self, speeds=() if speeds is None else tuple(speeds))

  def _speeds(self) -> np.ndarray:
    return np.asarray(self.speeds) if self.speeds else np.ones(self.n)

  def pull_matrix(self) -> np.ndarray:
    """[n, n] row-stochastic A: a_ij ~ v_j on i's in-neighbours and i (uniform: all v = 1)."""
    a = (self.adj.astype(np.float64) + np.eye(self.n)) * self._speeds()[None, :]
    return a / a.sum(axis=1, keepdims=True)

  def push_matrix(self) -> np.ndarray:
    """[n, n] column-stochastic B: b_ij ~ v_i on j's out-neighbours and j (uniform: v = 1)."""
    b = (self.adj.astype(np.float64) + np.eye(self.n)) * self._speeds()[:, None]
    return b / b.sum(axis=0, keepdims=True)

  def slot_tables(self) -> dict[str, np.ndarray]:
    """Padded per-node neighbour tables, the form the fixed-shape node update needs.

    Returns a dict of:
      in_nbr: [n, D_in] int, in-neighbour j of i in slot s (-1 = padding).
      out_nbr: [n, D_out] int, out-neighbour of j in slot o (-1 = padding).
      in_to_out_slot: [n, D_in] int, the slot o under which in-neighbour in_nbr[i, s] lists i
        among its out-neighbours (so i reads sender's share `sigma[o]`; 0 for padding).
      pull_in: [n, D_in] weights a_ij of the slots (0 for padding); pull_self: [n] a_ii.
      push_out: [n, D_out] weights b_ij of j's out-slots (0 for padding); push_self: [n] b_jj.
    """
    n, d_in, d_out = self.n, max(self.max_in_degree, 1), max(self.max_out_degree, 1)
    a, b = self.pull_matrix(), self.push_matrix()
    in_nbr = -np.ones((n, d_in), np.int64)
    out_nbr = -np.ones((n, d_out), np.int64)
    pull_in = np.zeros((n, d_in))
    push_out = np.zeros((n, d_out))
    for i in range(n):
      for s, j in enumerate(self.in_neighbours(i)):
        in_nbr[i, s], pull_in[i, s] = j, a[i, j]
      for o, j in enumerate(self.out_neighbours(i)):
        out_nbr[i, o], push_out[i, o] = j, b[j, i]
    in_to_out_slot = np.zeros((n, d_in), np.int64)
    for i in range(n):
      for s in range(d_in):
        j = in_nbr[i, s]
        if j >= 0:
          in_to_out_slot[i, s] = int(np.flatnonzero(out_nbr[j] == i)[0])
    return dict(in_nbr=in_nbr, out_nbr=out_nbr, in_to_out_slot=in_to_out_slot,
                pull_in=pull_in, pull_self=np.diag(a).copy(),
                push_out=push_out, push_self=np.diag(b).copy())


def _reachable(adj_out: np.ndarray, start: int) -> np.ndarray:
  """Nodes reachable from `start` where adj_out[u, v] means edge u -> v."""
  seen = np.zeros(adj_out.shape[0], bool)
  seen[start] = True
  frontier = [start]
  while frontier:
    nxt = np.flatnonzero(adj_out[frontier].any(axis=0) & ~seen)
    seen[nxt] = True
    frontier = list(nxt)
  return seen


def _unreachable_from_all(adj: np.ndarray) -> str:
  """'' if strongly connected, else a sentence naming what node 0 cannot reach or be reached by."""
  out_edges = adj.T  # out_edges[u, v]: edge u -> v
  fwd, bwd = _reachable(out_edges, 0), _reachable(adj, 0)
  if fwd.all() and bwd.all():
    return ""
  parts = []
  if not fwd.all():
    parts.append(f"node 0 cannot reach nodes {np.flatnonzero(~fwd).tolist()}")
  if not bwd.all():
    parts.append(f"nodes {np.flatnonzero(~bwd).tolist()} cannot reach node 0")
  return "; ".join(parts)


def is_strongly_connected(adj: np.ndarray) -> bool:
  adj = np.asarray(adj, bool)
  return not _unreachable_from_all(adj)


def from_edges(n: int, edges: list[tuple[int, int]], name: str = "custom") -> Graph:
  """A graph from (src, dst) pairs; raises `GraphError` if not strongly connected."""
  adj = np.zeros((n, n), bool)
  for src, dst in edges:
    if not (0 <= src < n and 0 <= dst < n):
      raise GraphError(f"edge ({src}, {dst}) names a node outside 0..{n - 1}")
    adj[dst, src] = True
  return Graph(adj, name)


def directed_ring(n: int) -> Graph:
  """i -> i+1 (mod n): the sparsest strongly connected digraph; diameter n-1."""
  _check_n(n)
  return from_edges(n, [(i, (i + 1) % n) for i in range(n) if n > 1], f"ring({n})")


def exponential(n: int) -> Graph:
  """i -> i + 2^m (mod n) for 2^m < n: out-degree ceil(log2 n), diameter ceil(log2 n)."""
  _check_n(n)
  hops = [2**m for m in range(max(n - 1, 1).bit_length()) if 2**m < n]
  return from_edges(n, [(i, (i + h) % n) for i in range(n) for h in hops], f"exponential({n})")


def random_strongly_connected(n: int, out_degree: int, seed: int) -> Graph:
  """Every node has exactly `out_degree` out-neighbours, on top of a random Hamiltonian cycle.

  The cycle (a random permutation) guarantees strong connectivity, so no rejection sampling
  is needed; the remaining out_degree - 1 out-neighbours of each node are uniform over the rest.
  """
  _check_n(n)
  if n > 1 and not 1 <= out_degree <= n - 1:
    raise GraphError(f"--out_degree={out_degree}: must be in [1, {n - 1}] for {n} nodes")
  rng = np.random.default_rng(seed)
  perm = rng.permutation(n)
  edges = [(int(perm[m]), int(perm[(m + 1) % n])) for m in range(n) if n > 1]
  succ = {u: v for u, v in edges}
  for u in range(n if n > 1 else 0):
    others = [v for v in range(n) if v not in (u, succ[u])]
    extra = rng.choice(others, size=out_degree - 1, replace=False) if out_degree > 1 else []
    edges += [(u, int(v)) for v in extra]
  return from_edges(n, edges, f"random({n}, out_degree={out_degree}, seed={seed})")


def parse_edges(text: str) -> list[tuple[int, int]]:
  """'0-1,1-2,2-0' -> [(0, 1), (1, 2), (2, 0)] (src-dst pairs)."""
  try:
    return [(int(a), int(b)) for a, b in (e.split("-") for e in text.replace(" ", "").split(",")
                                          if e)]
  except ValueError:
    raise GraphError(f"--edges={text!r}: must be comma-separated src-dst pairs, e.g. "
                     "'0-1,1-2,2-0'") from None


def make(topology: str, n: int, out_degree: int = 2, seed: int = 0, edges: str = "",
         speeds: tuple[float, ...] | None = None) -> Graph:
  """The named topology: one of `TOPOLOGIES` ('custom' takes `edges`, see `parse_edges`);
  weights follow `speeds` when given (see `Graph.with_speeds`)."""
  if topology == "custom":
    graph = from_edges(n, parse_edges(edges), f"--edges={edges}")
  elif topology == "ring":
    graph = directed_ring(n)
  elif topology == "exponential":
    graph = exponential(n)
  elif topology == "random":
    graph = random_strongly_connected(n, out_degree, seed)
  else:
    raise GraphError(f"--topology={topology!r}: must be one of {', '.join(TOPOLOGIES)}")
  return graph.with_speeds(speeds)


def _check_n(n: int) -> None:
  if not isinstance(n, int | np.integer) or n < 1:
    raise GraphError(f"--nodes={n!r}: must be an integer >= 1")
