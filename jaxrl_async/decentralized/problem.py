"""The policy-evaluation problem: empirical MSPBE in primal-dual form, its optimum, random MDPs.

Node i holds M_i transitions (s_p, s'_p, r_ip) with features phi(s). With
  A_ip = phi_p psi_p^T,  psi_p = phi(s_p) - gamma phi(s'_p)  (phi(s') = 0 after termination),
  b_ip = r_ip phi_p,  C_ip = phi_p phi_p^T,
and A_i, b_i, C_i their means over node i's rows, the network solves (PAPERS.md part 2)
  min_theta max_{w_1..w_N} sum_i 1/M_i sum_p J_ip(theta, w_i),
  J_ip = w_i^T A_ip theta - b_ip^T w_i - 1/2 w_i^T C_ip w_i + rho/2 ||theta||^2,
whose primal is sum_i 1/2 ||A_i theta - b_i||^2_{C_i^+} + N rho/2 ||theta||^2, minimised by
  theta* = (sum_i A_i^T C_i^+ A_i + N rho I)^-1 sum_i A_i^T C_i^+ b_i.
C_i^+ is the pseudo-inverse: the dual's component in C_i's null space never moves, so that is
the saddle point the iteration reaches even when a node holds fewer than d independent rows.

Shards. theta* above depends on how the rows are split (each split weighs its rows with its own
C_i^+): measured on the random MDP with 3200 samples, 8 equal parts against 1 differ by 7.7% in
theta*, and a split that gives one node 45 rows instead of 400 by 11%. So the unit that carries
a dual is a *shard*, not a node: the rows are cut into K shards, each with its own dual w_s, the
objective is the sum over shards (K rho in the ridge), and a node holds one or more whole shards
(one dual block each, as the centralised reference already does). theta* is then a property of
the shards alone, and moving shards between nodes (`allocate_shards`: uniform, or in proportion
to each node's speed) leaves it unchanged. By default K = N and node i holds shard i, which is
the per-node formulation above.

Everything here is numpy float64; nothing imports JAX.
"""

from __future__ import annotations

import dataclasses

import numpy as np

SPLITS = ("parallel", "multi_agent")
ALLOCATIONS = ("uniform", "speed")


class ProblemError(ValueError):
  """Data that cannot make a problem (too few samples for the nodes, bad shapes)."""


@dataclasses.dataclass(frozen=True)
class Problem:
  """Per-node transition data, padded to a common row count.

  Attributes:
    phi: [N, M, d] features phi(s_p) of node i's rows (zero rows past count[i]).
    psi: [N, M, d] phi(s_p) - gamma phi(s'_p).
    r: [N, M] local rewards.
    count: [N] number of valid rows per node, each >= 1.
    rho: the ridge coefficient of each shard's term.
    name: a description for logs.
    shard: [N, M] int, the shard (dual block) of every row, numbered 0..K-1 over the network
      and contiguous within a node; -1 on padding. None: shard i = node i's rows.
  """

  phi: np.ndarray
  psi: np.ndarray
  r: np.ndarray
  count: np.ndarray
  rho: float
  name: str = "problem"
  shard: np.ndarray | None = None

  def __post_init__(self):
    n, m, d = np.shape(self.phi)
    if np.shape(self.psi) != (n, m, d) or np.shape(self.r) != (n, m):
      raise ProblemError(f"inconsistent shapes phi {np.shape(self.phi)}, psi "
                         f"{np.shape(self.psi)}, r {np.shape(self.r)}")
    count = np.asarray(self.count, np.int64)
    if count.shape != (n,) or count.min() < 1 or count.max() > m:
      raise ProblemError(f"count must give 1..{m} valid rows for each of {n} nodes, got {count}")
    if not self.rho > 0:
      raise ProblemError(f"--rho={self.rho}: must be > 0 (it makes theta* unique)")
    for name in ("phi", "psi", "r"):
      object.__setattr__(self, name, np.asarray(getattr(self, name), np.float64))
    object.__setattr__(self, "count", count)
    valid = np.arange(m)[None, :] < count[:, None]
    shard = (np.broadcast_to(np.arange(n)[:, None], (n, m)) if self.shard is None
             else np.asarray(self.shard, np.int64))
    if shard.shape != (n, m):
      raise ProblemError(f"shard must be [{n}, {m}], got {shard.shape}")
    shard = np.where(valid, shard, -1)
    ids = np.unique(shard[valid])
    if ids[0] != 0 or ids[-1] != ids.size - 1:
      raise ProblemError(f"shards must be numbered 0..K-1 without gaps, got {ids.tolist()}")
    owner = np.broadcast_to(np.arange(n)[:, None], (n, m))[valid]
    if np.unique(np.stack([shard[valid], owner]), axis=1).shape[1] != ids.size:
      # a shard's dual lives on one node, so a shard is never split across nodes
      raise ProblemError("a shard's rows must all be on one node")
    object.__setattr__(self, "shard", shard)

  @property
  def nodes(self) -> int:
    return self.phi.shape[0]

  @property
  def dim(self) -> int:
    return self.phi.shape[2]

  @property
  def rows(self) -> int:
    return self.phi.shape[1]

  @property
  def shards(self) -> int:
    """K, the number of shards (dual blocks) over the whole network."""
    return int(self.shard.max()) + 1

  def mask(self) -> np.ndarray:
    """[N, M] 1.0 on valid rows."""
    return (np.arange(self.rows)[None, :] < self.count[:, None]).astype(np.float64)

  def shard_rows(self) -> np.ndarray:
    """[K] valid rows of each shard."""
    return np.bincount(self.shard[self.shard >= 0], minlength=self.shards)

  def shards_per_node(self) -> np.ndarray:
    """[N] how many shards each node holds."""
    return np.array([np.unique(s[s >= 0]).size for s in self.shard])

  def local_block(self) -> np.ndarray:
    """[N, M] each row's shard numbered within its node (0..B_i-1; 0 on padding)."""
    first = np.array([s[s >= 0].min() for s in self.shard])
    return np.where(self.shard >= 0, self.shard - first[:, None], 0)

  def row_weight(self) -> np.ndarray:
    """[N, M] 1 / (rows of the row's shard), 0 on padding: each shard's term is a mean."""
    per_shard = self.shard_rows().astype(np.float64)
    return np.where(self.shard >= 0, 1.0 / per_shard[np.maximum(self.shard, 0)], 0.0)

  def local_matrices(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-node means A_i [N, d, d], b_i [N, d], C_i [N, d, d]."""
    wgt = self.mask() / self.count[:, None]
    a = np.einsum("nm,nmk,nml->nkl", wgt, self.phi, self.psi)
    b = np.einsum("nm,nmk,nm->nk", wgt, self.phi, self.r)
    c = np.einsum("nm,nmk,nml->nkl", wgt, self.phi, self.phi)
    return a, b, c

  def shard_matrices(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-shard means A_s [K, d, d], b_s [K, d], C_s [K, d, d] (= per node when K = N)."""
    onehot = (self.shard[..., None] == np.arange(self.shards)) * self.row_weight()[..., None]
    a = np.einsum("nms,nmk,nml->skl", onehot, self.phi, self.psi)
    b = np.einsum("nms,nmk,nm->sk", onehot, self.phi, self.r)
    c = np.einsum("nms,nmk,nml->skl", onehot, self.phi, self.phi)
    return a, b, c

  def normal_equations(self) -> tuple[np.ndarray, np.ndarray]:
    """H = sum_s A_s^T C_s^+ A_s + K rho I and g = sum_s A_s^T C_s^+ b_s over the K shards."""
    a, b, c = self.shard_matrices()
    h = self.shards * self.rho * np.eye(self.dim)
    g = np.zeros(self.dim)
    for a_i, b_i, c_i in zip(a, b, c, strict=True):
      c_pinv = np.linalg.pinv(c_i, rcond=1e-12, hermitian=True)
      h += a_i.T @ c_pinv @ a_i
      g += a_i.T @ c_pinv @ b_i
    return h, g

  def theta_star(self) -> np.ndarray:
    """[d] the closed-form optimum of the network's MSPBE."""
    h, g = self.normal_equations()
    return np.linalg.solve(h, g)

  def optimality_residual(self, theta: np.ndarray) -> np.ndarray:
    """[d] gradient of the primal sum at theta; zero exactly at theta*."""
    h, g = self.normal_equations()
    return h @ theta - g


def relative_errors(theta: np.ndarray, theta_star: np.ndarray) -> np.ndarray:
  """[N] ||theta_i - theta*|| / ||theta*|| for theta [N, d]."""
  return np.linalg.norm(theta - theta_star, axis=-1) / np.linalg.norm(theta_star)


def allocate_shards(shards: int, speeds: np.ndarray) -> np.ndarray:
  """[N] how many of `shards` shards each node holds: in proportion to `speeds`, at least one.

  `speeds` [N] are relative speeds (1 / slowdown). All equal: counts differ by at most one, as
  the uniform split of rows does. Otherwise largest remainders round the quotas K s_i / sum(s)
  to integers that sum to K. With shards of equal size a node then passes over its rows in
  about the same time as every other node, whatever its speed.
  """
  speeds = np.asarray(speeds, np.float64)
  n = speeds.size
  if not (np.all(np.isfinite(speeds)) and np.all(speeds > 0)):
    raise ProblemError(f"node speeds must be > 0, got {speeds.tolist()}")
  if shards < n:
    raise ProblemError(f"--shards={shards}: fewer shards than nodes ({n}); every node needs "
                       "at least one")
  if np.all(speeds == speeds[0]):
    return np.diff(np.linspace(0, shards, n + 1).round().astype(int))
  quota = shards * speeds / speeds.sum()
  count = np.maximum(1, np.floor(quota)).astype(int)
  while count.sum() < shards:
    count[np.argmax(quota - count)] += 1
  while count.sum() > shards:  # only when the floor of 1 pushed slow nodes above their quota
    count[np.argmax(np.where(count > 1, count - quota, -np.inf))] -= 1
  return count


def split_rows(phi: np.ndarray, psi: np.ndarray, r: np.ndarray, nodes: int, split: str,
               rho: float, name: str, local_r: np.ndarray | None = None, shards: int = 0,
               speeds: np.ndarray | None = None) -> Problem:
  """Spread M pooled transitions over nodes.

  Args:
    phi, psi: [M, d] pooled rows. r: [M] pooled rewards.
    nodes: N.
    split: 'parallel' cuts the rows into `shards` contiguous shards of equal size (within one
      row; needs M >= K) and gives node i a contiguous run of them, `allocate_shards(K,
      speeds)` many; 'multi_agent' gives every node all rows, with rewards `local_r` [N, M]
      (the local rewards of a multi-agent system on shared states), one shard per node.
    rho, name: as in `Problem`.
    shards: K for 'parallel'; 0 means N (node i holds shard i: the uniform per-node split).
    speeds: [N] relative node speeds for the allocation; None: uniform.
  """
  m = phi.shape[0]
  if split not in SPLITS:
    raise ProblemError(f"--split={split!r}: must be one of {', '.join(SPLITS)}")
  if split == "parallel":
    if nodes > m:
      raise ProblemError(f"--nodes={nodes}: larger than the data ({m} samples); each node "
                         "needs at least one transition, so use --nodes <= --samples")
    k = shards or nodes
    if k > m:
      raise ProblemError(f"--shards={k}: larger than the data ({m} samples); each shard needs "
                         "at least one transition")
    speeds = np.ones(nodes) if speeds is None else np.asarray(speeds, np.float64)
    if speeds.shape != (nodes,):
      raise ProblemError(f"speeds must have one entry per node ({nodes}), got {speeds.shape}")
    shard_bounds = np.linspace(0, m, k + 1).round().astype(int)
    first = np.concatenate([[0], np.cumsum(allocate_shards(k, speeds))])
    bounds = shard_bounds[first]
    row_shard = np.searchsorted(shard_bounds, np.arange(m), side="right") - 1
    rows = int(np.diff(bounds).max())
    out = [np.zeros((nodes, rows) + x.shape[1:]) for x in (phi, psi, r)]
    shard = -np.ones((nodes, rows), np.int64)
    for i in range(nodes):
      lo, hi = bounds[i], bounds[i + 1]
      for dst, src in zip(out, (phi, psi, r), strict=True):
        dst[i, :hi - lo] = src[lo:hi]
      shard[i, :hi - lo] = row_shard[lo:hi]
    return Problem(out[0], out[1], out[2], np.diff(bounds), rho, name, shard)
  if shards not in (0, nodes) or speeds is not None:
    raise ProblemError(f"--split={split}: every node holds its own rewards, so its data cannot "
                       "be resharded or moved: use --shards=0 and --allocation=uniform")
  local_r = np.broadcast_to(r, (nodes, m)) if local_r is None else local_r
  return Problem(np.broadcast_to(phi, (nodes,) + phi.shape).copy(),
                 np.broadcast_to(psi, (nodes,) + psi.shape).copy(),
                 np.asarray(local_r, np.float64), np.full(nodes, m), rho, name)


def random_mdp(seed: int, nodes: int, samples: int, features: int = 20, states: int = 50,
               gamma: float = 0.9, rho: float = 0.01, split: str = "parallel", shards: int = 0,
               speeds: np.ndarray | None = None) -> Problem:
  """A random MDP under a fixed policy, sampled on-policy.

  Unit-norm Gaussian features phi(s) in R^features; the policy's transition matrix has
  Dirichlet(0.3) rows; states are drawn from its stationary distribution and s' ~ P(s, .).
  'parallel': one reward function, the `samples` transitions split across nodes.
  'multi_agent': `samples` shared transitions, node i's own reward R_i(s) ~ U(0, 1).
  `shards`, `speeds`: as in `split_rows`; the data drawn depends on the seed only.
  """
  rng = np.random.default_rng(seed)
  phi_s = rng.normal(size=(states, features))
  phi_s /= np.linalg.norm(phi_s, axis=1, keepdims=True)
  p = rng.dirichlet(np.full(states, 0.3), size=states)
  evals, evecs = np.linalg.eig(p.T)
  mu = np.abs(np.real(evecs[:, np.argmin(np.abs(evals - 1.0))]))
  mu /= mu.sum()
  s = rng.choice(states, size=samples, p=mu)
  s_next = (p[s].cumsum(axis=1) < rng.uniform(size=(samples, 1))).sum(axis=1)
  s_next = np.minimum(s_next, states - 1)  # guards the cumulative sum's last rounding
  rewards = rng.uniform(size=(nodes if split == "multi_agent" else 1, states))
  phi, psi = phi_s[s], phi_s[s] - gamma * phi_s[s_next]
  sharded = f", K={shards}" if shards not in (0, nodes) else ""
  name = f"random_mdp(S={states}, d={features}, M={samples}, {split}{sharded}, seed={seed})"
  return split_rows(phi, psi, rewards[0, s], nodes, split, rho, name,
                    local_r=rewards[:, s] if split == "multi_agent" else None, shards=shards,
                    speeds=speeds)
