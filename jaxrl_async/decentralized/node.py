"""One activation of one node: a pure function (const, state, inbox) -> (state, outbox).

The five steps of PAPERS.md part 2, for node i with in-neighbour slots s and out-slots o:

1. Pull: theta_i <- a_ii theta_i + sum_s a_is theta~_s - alpha y_i, where theta~_s is the newest
   copy received from slot s. Every message carries the sender's activation count as a
   timestamp, and a copy only replaces the held one when its stamp is larger, so a message
   that arrives after a newer one from the same sender never undoes it.
2. SAG/IAG: pick row p (cyclically or uniformly), compute fresh per-sample gradients at
   (theta_i, w_i) and move the running means by (fresh - table[p]) / M_i. For linear features
   every per-sample gradient is a fixed vector times a scalar (psi_p u_p and phi_p v_p with
   u_p = phi_p^T w, v_p = psi_p^T theta - r_p - phi_p^T w), so the table stores the two scalars
   [M, 2] instead of [M, 2d]; the ridge term rho theta is added exactly instead of tabled.
3. Dual ascent: w_i <- w_i + beta g_w.
4. Tracking: y_i <- b_ii y_i + (mass received since the last activation) + (g_new - g_old),
   with g = g_data + rho theta the node's current local average gradient.
5. Push: theta_i to every out-neighbour, and the shares b_oi y_i of the tracker just formed as
   mass; node i itself holds the share b_ii y_i, which step 4 of its next activation starts
   from. In the synchronous case this is exactly the push-pull (AB) recursion
   theta^{k+1} = A theta^k - alpha y^k, y^{k+1} = B y^k + g(theta^{k+1}) - g(theta^k).

NOTE: the push channel carries *running sums*: sigma_out[o] is everything node i has ever
pushed on out-link o, and the receiver keeps the last sigma it absorbed per in-slot, adding only
the difference. Mass is thus accumulated by the sender and never overwritten or lost: a dropped,
reordered or coalesced message is made good by the next one, and on a lossless FIFO link this is
the same arithmetic as adding each increment on arrival. The invariant the tests hold is
  sum_i b_ii y_i + sum_links (sigma_out - sigma_in) == sum_i g_i      (to float rounding),
held mass plus mass in transit, whatever the delays; it is what makes the limit exact.

The dual may hold several blocks (w [B, d]): a decentralised node has B = 1; the centralised
reference is one node holding all N nodes' rows with B = N (see `centralized_const`).
All arrays are float64 when the caller runs under `jax.enable_x64(True)`.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
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


class NodeState(NamedTuple):
  """theta, y, g_data: [d]. w, g_w: [B, d]. table: [M, 2] the (u, v) scalars of each row.
  theta_in, sigma_in: [D_in, d] newest copy and absorbed running sum per in-slot; stamp_in:
  [D_in] int their stamps. sigma_out: [D_out, d] running sums pushed. clock: [] activations.
  """

  theta: Array
  w: Array
  y: Array
  g_data: Array
  g_w: Array
  table: Array
  theta_in: Array
  sigma_in: Array
  stamp_in: Array
  sigma_out: Array
  clock: Array


class Inbox(NamedTuple):
  """The newest message per in-slot since the last activation. theta, sigma: [D_in, d];
  stamp: [D_in] int, -1 where nothing arrived (sigma is the sender's sigma_out for this link)."""

  theta: Array
  sigma: Array
  stamp: Array


class Outbox(NamedTuple):
  """theta: [d] for every out-neighbour; sigma: [D_out, d] running sum per out-slot;
  stamp: [] the sender's clock after this activation."""

  theta: Array
  sigma: Array
  stamp: Array


def node_update(const: NodeConst, state: NodeState, inbox: Inbox) -> tuple[NodeState, Outbox]:
  """One activation (PAPERS.md part 2, steps 1-5). Pure; jit it or call it inside a scan."""
  newer = inbox.stamp > state.stamp_in
  theta_in = jnp.where(newer[:, None], inbox.theta, state.theta_in)
  received = jnp.sum(jnp.where(newer[:, None], inbox.sigma - state.sigma_in, 0.0), axis=0)
  sigma_in = jnp.where(newer[:, None], inbox.sigma, state.sigma_in)
  stamp_in = jnp.where(newer, inbox.stamp, state.stamp_in)

  # 1. Pull, stepping along the tracker formed at the previous activation (AB's y^k).
  theta = const.pull_self * state.theta + const.pull_in @ theta_in - const.alpha * state.y

  # 2. SAG/IAG table step at (theta, w) of this activation.
  p_cyclic = state.clock % const.count
  key = jax.random.wrap_key_data(const.key, impl=PRNG_IMPL)
  p_uniform = jax.random.randint(jax.random.fold_in(key, state.clock), (), 0, const.count)
  q = const.row0 + jnp.where(const.uniform, p_uniform, p_cyclic)
  b = const.block[q]
  phi_q, psi_q, weight_q = const.phi[q], const.psi[q], const.weight[q]
  u = phi_q @ state.w[b]
  v = psi_q @ theta - const.r[q] - u
  g_data = state.g_data + weight_q * (u - state.table[q, 0]) * psi_q
  g_w = state.g_w.at[b].add(weight_q * (v - state.table[q, 1]) * phi_q)
  # NOTE: dynamic_update_slice rather than .at[q].set, whose bounds handling selects over
  # the whole table; the simulator calls this once per event.
  table = jax.lax.dynamic_update_index_in_dim(state.table, jnp.stack([u, v]), q, 0)

  # 3. Dual ascent on the block whose row was drawn.
  w = state.w.at[b].add(const.beta * g_w[b])

  # 4. Gradient tracking: the held share b_ii y, the mass absorbed, the gradient change.
  grad_change = (g_data + const.rho * theta) - (state.g_data + const.rho * state.theta)
  y = const.push_self * state.y + received + grad_change

  # 5. Push the other shares of the new tracker, accumulated per out-link.
  sigma_out = state.sigma_out + const.push_out[:, None] * y[None, :]
  clock = state.clock + 1
  new_state = NodeState(theta, w, y, g_data, g_w, table, theta_in, sigma_in, stamp_in,
                        sigma_out, clock)
  return new_state, Outbox(theta, sigma_out, clock)


node_update_jit = jax.jit(node_update)


def local_gradient(const: NodeConst, state: NodeState) -> Array:
  """[..., d] g_i = g_data + rho theta, the node's current local average gradient."""
  return state.g_data + const.rho[..., None] * state.theta


def init_state(const: NodeConst, theta0: np.ndarray | None = None) -> NodeState:
  """The state before any activation: theta = theta0 (0), w = 0, table and y at that point.

  Works on one node's const or on stacked consts (leading [N]); every node starts at the same
  theta0, so the held copies of in-neighbours' theta start equal to it, with stamp 0. The
  tracker starts at y = g(theta0) and its out-shares count as already pushed (in transit),
  as AB's first round B y^0 needs.
  """
  phi, psi = np.asarray(const.phi), np.asarray(const.psi)
  lead, d = phi.shape[:-2], phi.shape[-1]
  n_blocks = int(np.asarray(const.block).max()) + 1
  theta = np.broadcast_to(np.zeros(d) if theta0 is None else theta0, lead + (d,)).copy()
  u = np.zeros(phi.shape[:-1])
  v = np.einsum("...md,...d->...m", psi, theta) - np.asarray(const.r)
  weight = np.asarray(const.weight)
  onehot = np.asarray(const.block)[..., None] == np.arange(n_blocks)  # [..., M, B]
  g_w = np.einsum("...mb,...m,...md->...bd", onehot, weight * v, phi)
  g_data = np.zeros(lead + (d,))
  y = g_data + np.asarray(const.rho)[..., None] * theta
  d_in = np.shape(const.pull_in)[-1]
  return NodeState(
      theta=theta, w=np.zeros(lead + (n_blocks, d)), y=y, g_data=g_data, g_w=g_w,
      table=np.stack([u, v], axis=-1),
      theta_in=np.broadcast_to(theta[..., None, :], lead + (d_in, d)).copy(),
      sigma_in=np.zeros(lead + (d_in, d)), stamp_in=np.zeros(lead + (d_in,), np.int64),
      sigma_out=np.asarray(const.push_out)[..., None] * y[..., None, :],
      clock=np.zeros(lead, np.int64))


def pooled_init(consts: NodeConst, shards: int) -> NodeState:
  """The state before any activation for pooled consts (`pooled_consts`): theta = 0, the
  network's dual w [K, d] = 0, the pooled table [R, 2] and g_w [K, d] at that point, y = 0."""
  n, d = np.shape(consts.pull_in)[0], np.shape(consts.phi)[1]
  d_in, d_out = np.shape(consts.pull_in)[1], np.shape(consts.push_out)[1]
  v = -np.asarray(consts.r)  # psi theta - r - phi w at theta = 0, w = 0
  g_w = np.zeros((shards, d))
  np.add.at(g_w, np.asarray(consts.block), (np.asarray(consts.weight) * v)[:, None]
            * np.asarray(consts.phi))
  return NodeState(
      theta=np.zeros((n, d)), w=np.zeros((shards, d)), y=np.zeros((n, d)),
      g_data=np.zeros((n, d)), g_w=g_w, table=np.stack([np.zeros_like(v), v], axis=-1),
      theta_in=np.zeros((n, d_in, d)), sigma_in=np.zeros((n, d_in, d)),
      stamp_in=np.zeros((n, d_in), np.int64), sigma_out=np.zeros((n, d_out, d)),
      clock=np.zeros(n, np.int64))


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


def mass_balance(consts: NodeConst, states: NodeState, graph: Graph) -> tuple[np.ndarray,
                                                                             np.ndarray]:
  """(held + in transit, sum of local gradients), both [d], for stacked network states.

  Node i holds b_ii y_i. In transit on link j -> i is what j has pushed on it (sigma_out) minus
  what i has absorbed (sigma_in): messages in flight, dropped, or arrived but not yet read.
  """
  slots = graph.slot_tables()
  sigma_out, sigma_in = np.asarray(states.sigma_out), np.asarray(states.sigma_in)
  held = (np.asarray(consts.push_self)[:, None] * np.asarray(states.y)).sum(axis=0)
  transit = np.zeros_like(held)
  for i in range(graph.n):
    for s, j in enumerate(slots["in_nbr"][i]):
      if j >= 0:
        transit += sigma_out[j, slots["in_to_out_slot"][i, s]] - sigma_in[i, s]
  return held + transit, np.asarray(local_gradient(consts, states)).sum(axis=0)
