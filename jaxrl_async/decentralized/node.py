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

# The constants and their builders live in node_consts; re-exported so `node` stays the one
# import for callers.
from jaxrl_async.decentralized.node_consts import (
  PRNG_IMPL,
  ROW_FIELDS,
  ROWS_0,
  SAMPLINGS,
  NodeConst,
  Pool,
  centralized_const,
  key_data,
  network_consts,
  network_scalars,
  pool,
  pooled_consts,
  shard_gradients,
  slice_const,
)

Array = jax.Array
__all__ = ["PRNG_IMPL", "ROWS_0", "ROW_FIELDS", "SAMPLINGS", "Inbox", "NodeConst", "NodeState",
           "Outbox", "Pool", "centralized_const", "init_state", "key_data", "local_gradient",
           "mass_balance", "network_consts", "network_scalars", "node_update", "node_update_jit",
           "pool", "pooled_consts", "pooled_init", "shard_gradients", "slice_const"]


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
