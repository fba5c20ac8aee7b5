"""What a node knows: its constants (`NodeConst`), and how a problem and a graph become them.

`node.py` holds the update that reads these; this module holds the layouts and step rules that
build them: the padded per-node layout of the multi-process runtime (`network_consts`), the
simulator's pooled one (`Pool`, `pooled_consts`) and the centralised reference
(`centralized_const`). Everything here is numpy except the sampling keys' raw data.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import numpy as np

from jaxrl_async.decentralized.graphs import Graph
from jaxrl_async.decentralized.problem import Problem

Array = jax.Array
SAMPLINGS = ("cyclic", "uniform")
# Keys travel as raw data (between processes too), so their implementation is fixed here, not
# taken from JAX's process-wide default (the trainer sets rbg; a node process keeps threefry).
PRNG_IMPL = "threefry2x32"


def key_data(seed: int) -> np.ndarray:
  return np.asarray(jax.random.key_data(jax.random.key(seed, impl=PRNG_IMPL)))


class NodeConst(NamedTuple):
  """What a node knows and never changes. Shapes for one node; stacked ones add a leading [N].

  phi, psi: [M, d] rows (zero padding past `count`). r: [M]. block: [M] int dual block of each
  row. weight: [M] 1 / (rows of that block), 0 on padding. count: [] valid rows.
  pull_self: [] a_ii; pull_in: [D_in] a_is (0 on padding slots).
  push_self: [] b_ii; push_out: [D_out] b_oi (0 on padding slots).
  alpha, beta: [] step sizes. rho: [] ridge coefficient of the rows held (B * rho).
  uniform: [] bool, uniform sampling instead of cyclic. key: [2] uint32 sampling key.
  row0: [] int where this node's rows start in phi, psi, r, block, weight and the state's
    table: 0 for a node that owns its arrays; the simulator lets every node look into one
    flat [N * M, ...] array instead, so an event never copies a node's whole table.
  """

  phi: Array
  psi: Array
  r: Array
  block: Array
  weight: Array
  count: Array
  pull_self: Array
  pull_in: Array
  push_self: Array
  push_out: Array
  alpha: Array
  beta: Array
  rho: Array
  uniform: Array
  key: Array
  row0: Array


ROW_FIELDS = ("phi", "psi", "r", "block", "weight")
# Steps are per pass over a node's rows, over M_i + ROWS_0 rather than M_i: at small M_i the
# SAG lag stops being what limits the step and the per-row curvature takes over (measured:
# alpha, beta = 20, 160 diverge at M_i = 80 with 1 / M_i, converge with 1 / (M_i + 100)).
ROWS_0 = 100


def _sampling(sampling: str) -> bool:
  if sampling not in SAMPLINGS:
    raise ValueError(f"--sampling={sampling!r}: must be one of {', '.join(SAMPLINGS)}")
  return sampling == "uniform"


def network_consts(problem: Problem, graph: Graph, alpha: float, beta: float,
                   sampling: str = "uniform", seed: int = 0, synchronous: bool = False,
                   pull_lag: float = 0.0) -> NodeConst:
  """Stacked [N, ...] constants of the decentralised network (one dual block per shard held).

  `alpha` and `beta` are steps per pass over a node's rows: node i steps alpha / (M_i + ROWS_0)
  and beta / (M_i + ROWS_0) per activation. The SAG means lag the iterate by about M_i
  activations, and a primal-dual (rotating) iteration with that lag is stable only while
  step * M_i stays below a constant; so per-pass steps carry over between data sizes and node
  counts (measured: the best steps of one node scale as 1 / M from M = 400 to 1600).

  With K shards over N nodes (`Problem.shard`), node i holds B_i of them: its gradient is the
  sum of B_i shard means and its ridge B_i rho, so the network's summed gradient is K / N times
  that of one shard per node, and the primal step carries a factor N / K. Each dual block is
  stepped only when one of its rows is drawn and its table lags by its own rows, so the dual
  step is per pass over a shard, beta / (M_s + ROWS_0) with M_s = M_i / B_i; ROWS_0 is counted
  per shard in the primal too, alpha (N / K) / (M_i + ROWS_0 B_i), which keeps the dual's
  speed relative to the primal's at beta / alpha whatever B_i is. NOTE: with ROWS_0 counted
  once per node instead, that ratio falls to (M_i + ROWS_0) / (M_i + ROWS_0 B_i) of it; measured,
  one node holding 6 shards of 80 rows then diverged at alpha, beta = 20, 160 and 3 nodes
  holding 2 each stalled at 3e-5, while this rule converges in the same 184k events for any N.
  With K = N both are the per-node steps above. Steps differ from node to node, which
  push-pull allows: its fixed point does not depend on them.

  `synchronous`: every node's primal step uses the largest M_j instead of its own M_i. In
  rounds every node activates equally often, so the gradient mass it steps along lags by the
  slowest-refreshing table in the network, max_j M_j rounds; its own M_i is that lag only when
  nodes activate in proportion to their rows, as in the asynchronous network with a speed
  allocation. Measured: with the speed allocation (one 10x straggler holding 160 rows, others
  1760-1920) the own-rows step diverged in rounds. Equal rows: no difference.

  `pull_lag` L: node i's primal step is multiplied by 1 + (1 - a_ii) L. Why: the pull averages
  the node's own iterate with in-neighbours' copies that are behind; if every iterate drifts by
  v per activation and the copies are L activations behind, the pull takes back (1 - a_ii) L v
  and the drift settles at v / (1 + (1 - a_ii) L): the asynchronous network takes a smaller
  step than one node, which needs no such factor (a_ii = 1). In the simulated network a held
  copy is 1 + delay / compute_time = 1.2 of its sender's activations behind (measured), about
  0.7 behind the node's own iterate; the loss measured is larger (see BUILD_NOTES), and
  L = 1.5-2 restores the efficiency. Meant for nodes of equal speed: a slow in-neighbour's
  copy is further behind than L. 0 (the default) leaves the steps as they are.
  """
  if graph.n != problem.nodes:
    raise ValueError(f"graph has {graph.n} nodes but the problem {problem.nodes}")
  n = problem.nodes
  slots = graph.slot_tables()
  held = problem.shards_per_node()
  return NodeConst(
      phi=problem.phi, psi=problem.psi, r=problem.r, block=problem.local_block(),
      weight=problem.row_weight(), count=problem.count.copy(),
      **network_scalars(slots, problem.count, held, problem.shards, problem.rho, alpha, beta,
                        sampling, seed, synchronous, pull_lag),
      row0=np.zeros(n, np.int64))


def network_scalars(slots: dict[str, np.ndarray], count: np.ndarray, held: np.ndarray,
                    shards: int, rho: float, alpha: float, beta: float, sampling: str = "uniform",
                    seed: int = 0, synchronous: bool = False, pull_lag: float = 0.0
                    ) -> dict[str, np.ndarray]:
  """The per-node [N] fields of `network_consts` (weights, steps, ridge, sampling keys) for
  nodes holding `count` rows in `held` shards of `shards`; the step rules are documented there.
  Shared by the padded per-node layout and the simulator's pooled one (`pooled_consts`)."""
  n = count.shape[0]
  keys = np.stack([key_data(seed * 1_000_003 + i) for i in range(n)])
  lag_rows = np.full(n, count.max()) if synchronous else count
  pull_gain = 1.0 + (1.0 - slots["pull_self"]) * pull_lag
  return dict(
      pull_self=slots["pull_self"], pull_in=slots["pull_in"],
      push_self=slots["push_self"], push_out=slots["push_out"],
      alpha=alpha * pull_gain * (n / shards) / (lag_rows + ROWS_0 * held),
      beta=beta / (count / held + ROWS_0),
      rho=rho * held.astype(np.float64),
      uniform=np.full(n, _sampling(sampling)), key=keys.astype(np.uint32))


class Pool(NamedTuple):
  """Every row of the network once, in shard order: node i's shards are a contiguous run, so
  its rows are a contiguous range and moving shards between nodes moves range boundaries only
  (no row, table entry or dual block is copied). phi, psi: [R, d]; r: [R]; shard: [R] global
  shard id (the row's dual block in a [K, d] dual); weight: [R] 1 / rows of its shard;
  bounds: [K + 1] where each shard's rows start."""

  phi: np.ndarray
  psi: np.ndarray
  r: np.ndarray
  shard: np.ndarray
  weight: np.ndarray
  bounds: np.ndarray


def pool(problem: Problem) -> Pool:
  """The problem's rows pooled in node order, which is shard order (shards are allocated to
  nodes as contiguous runs, `problem.split_rows`)."""
  valid = problem.mask().astype(bool)
  shard = problem.shard[valid]
  if np.any(np.diff(shard) < 0):
    raise ValueError("pooled rows must be in shard order (contiguous runs per node)")
  bounds = np.searchsorted(shard, np.arange(problem.shards + 1), side="left")
  return Pool(problem.phi[valid], problem.psi[valid], problem.r[valid], shard,
              problem.row_weight()[valid], bounds)


def pooled_consts(rows: Pool, held: np.ndarray, slots: dict[str, np.ndarray], rho: float,
                  alpha: float, beta: float, sampling: str = "uniform", seed: int = 0,
                  synchronous: bool = False, pull_lag: float = 0.0) -> NodeConst:
  """`network_consts` over pooled rows: node i holds shards [first_i, first_i + held_i) (first
  the running sum of `held`), i.e. rows [row0_i, row0_i + count_i) of the pool, and indexes the
  network's [K, d] dual with global shard ids. Row fields are [R, ...], the others [N]."""
  first = np.concatenate([[0], np.cumsum(held)])
  row0 = rows.bounds[first[:-1]]
  count = rows.bounds[first[1:]] - row0
  if np.any(count < 1) or first[-1] != rows.bounds.size - 1:
    raise ValueError(f"an allocation of {rows.bounds.size - 1} shards must give every node "
                     f"at least one, got {held.tolist()}")
  return NodeConst(phi=rows.phi, psi=rows.psi, r=rows.r, block=rows.shard, weight=rows.weight,
                   count=count,
                   **network_scalars(slots, count, held, rows.bounds.size - 1, rho, alpha, beta,
                                     sampling, seed, synchronous, pull_lag),
                   row0=row0.astype(np.int64))


def shard_gradients(rows: Pool, table: np.ndarray) -> np.ndarray:
  """[K, d] each shard's SAG mean of the primal data gradient, sum_p weight_p u_p psi_p, from
  the pooled table [R, 2]: what a node's g_data holds for each of its shards."""
  per_row = (rows.weight * table[:, 0])[:, None] * rows.psi
  out = np.zeros((rows.bounds.size - 1, rows.psi.shape[1]))
  np.add.at(out, rows.shard, per_row)
  return out


def centralized_const(problem: Problem, alpha: float, beta: float, sampling: str = "uniform",
                      seed: int = 0) -> NodeConst:
  """Stacked [1, ...] constants of one node holding every shard's rows, one dual block each.

  It minimises the same objective as the network, so it reaches the same theta*. One event
  does the work of one node activation: one row, one dual step on that row's block, and a
  primal step of alpha_i / N along the average node gradient, since the network's average moves
  by about alpha_i times that per N activations (one such step per node). Its tracker is the
  sum of the K shards' gradients, K times their average: hence alpha_i / (N K), with
  alpha_i = alpha / (M + ROWS_0 K / N) a node's per-activation step (`network_consts`, M the
  mean rows per node); each shard's dual step is beta / (M_s + ROWS_0), as on a node (M_s the
  mean shard size). Both reduce to alpha / (K (M_all + ROWS_0 K)) and beta / (M_s + ROWS_0):
  the reference does not depend on how many nodes the shards are spread over.
  """
  n, k = problem.nodes, problem.shards
  valid = problem.mask().astype(bool)
  rows = lambda x: x[valid][None]
  pass_rows = float(problem.count.mean() + ROWS_0 * k / n)
  shard_rows = float(problem.shard_rows().mean()) + ROWS_0
  key = key_data(seed)[None].astype(np.uint32)
  one = lambda x: np.array([x], np.float64)
  return NodeConst(
      phi=rows(problem.phi), psi=rows(problem.psi), r=rows(problem.r),
      block=rows(problem.shard), weight=rows(problem.row_weight()),
      count=np.array([valid.sum()]),
      pull_self=one(1.0), pull_in=np.zeros((1, 1)), push_self=one(1.0), push_out=np.zeros((1, 1)),
      alpha=one(alpha / pass_rows / (n * k)), beta=one(beta / shard_rows),
      rho=one(k * problem.rho),
      uniform=np.array([_sampling(sampling)]), key=key, row0=np.zeros(1, np.int64))


def slice_const(stacked: NodeConst, i: int) -> NodeConst:
  """Node i's constants from stacked ones (numpy)."""
  return NodeConst(*(np.asarray(x)[i] for x in stacked))
