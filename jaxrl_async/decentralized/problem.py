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

Everything here is numpy float64; nothing imports JAX.
"""

from __future__ import annotations

import dataclasses

import numpy as np

SPLITS = ("parallel", "multi_agent")


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
    rho: the ridge coefficient of each node's term.
    name: a description for logs.
  """

  phi: np.ndarray
  psi: np.ndarray
  r: np.ndarray
  count: np.ndarray
  rho: float
  name: str = "problem"

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

  @property
  def nodes(self) -> int:
    return self.phi.shape[0]

  @property
  def dim(self) -> int:
    return self.phi.shape[2]

  @property
  def rows(self) -> int:
    return self.phi.shape[1]

  def mask(self) -> np.ndarray:
    """[N, M] 1.0 on valid rows."""
    return (np.arange(self.rows)[None, :] < self.count[:, None]).astype(np.float64)

  def local_matrices(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-node means A_i [N, d, d], b_i [N, d], C_i [N, d, d]."""
    wgt = self.mask() / self.count[:, None]
    a = np.einsum("nm,nmk,nml->nkl", wgt, self.phi, self.psi)
    b = np.einsum("nm,nmk,nm->nk", wgt, self.phi, self.r)
    c = np.einsum("nm,nmk,nml->nkl", wgt, self.phi, self.phi)
    return a, b, c

  def normal_equations(self) -> tuple[np.ndarray, np.ndarray]:
    """H = sum_i A_i^T C_i^+ A_i + N rho I and g = sum_i A_i^T C_i^+ b_i."""
    a, b, c = self.local_matrices()
    h = self.nodes * self.rho * np.eye(self.dim)
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


def split_rows(phi: np.ndarray, psi: np.ndarray, r: np.ndarray, nodes: int, split: str,
               rho: float, name: str, local_r: np.ndarray | None = None) -> Problem:
  """Spread M pooled transitions over nodes.

  Args:
    phi, psi: [M, d] pooled rows. r: [M] pooled rewards.
    nodes: N.
    split: 'parallel' gives node i its own contiguous share of the rows (sizes differ by at
      most one; needs M >= N); 'multi_agent' gives every node all rows, with rewards
      `local_r` [N, M] (the local rewards of a multi-agent system on shared states).
    rho, name: as in `Problem`.
  """
  m = phi.shape[0]
  if split == "parallel":
    if nodes > m:
      raise ProblemError(f"--nodes={nodes}: larger than the data ({m} samples); each node "
                         "needs at least one transition, so use --nodes <= --samples")
    bounds = np.linspace(0, m, nodes + 1).round().astype(int)
    rows = int(np.diff(bounds).max())
    out = [np.zeros((nodes, rows) + x.shape[1:]) for x in (phi, psi, r)]
    for i in range(nodes):
      lo, hi = bounds[i], bounds[i + 1]
      for dst, src in zip(out, (phi, psi, r), strict=True):
        dst[i, :hi - lo] = src[lo:hi]
    return Problem(out[0], out[1], out[2], np.diff(bounds), rho, name)
  if split == "multi_agent":
    local_r = np.broadcast_to(r, (nodes, m)) if local_r is None else local_r
    return Problem(np.broadcast_to(phi, (nodes,) + phi.shape).copy(),
                   np.broadcast_to(psi, (nodes,) + psi.shape).copy(),
                   np.asarray(local_r, np.float64), np.full(nodes, m), rho, name)
  raise ProblemError(f"--split={split!r}: must be one of {', '.join(SPLITS)}")


def random_mdp(seed: int, nodes: int, samples: int, features: int = 20, states: int = 50,
               gamma: float = 0.9, rho: float = 0.01, split: str = "parallel") -> Problem:
  """A random MDP under a fixed policy, sampled on-policy.

  Unit-norm Gaussian features phi(s) in R^features; the policy's transition matrix has
  Dirichlet(0.3) rows; states are drawn from its stationary distribution and s' ~ P(s, .).
  'parallel': one reward function, the `samples` transitions split across nodes.
  'multi_agent': `samples` shared transitions, node i's own reward R_i(s) ~ U(0, 1).
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
  name = f"random_mdp(S={states}, d={features}, M={samples}, {split}, seed={seed})"
  return split_rows(phi, psi, rewards[0, s], nodes, split, rho, name,
                    local_r=rewards[:, s] if split == "multi_agent" else None)
