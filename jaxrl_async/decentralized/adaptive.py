"""Node speeds measured online, and the shard allocation, weights and steps that follow them.

Nobody declares how fast a node is. Each node's activation intervals feed an exponentially
weighted mean (`SpeedMeter`, half-life in the node's own activations), its speed is the inverse.
When the measured speeds have moved from those in use by more than a hysteresis factor (a node
became slow, or recovered), the network is re-planned (`Adapter`):

* allocation: shards in proportion to speed (`problem.allocate_shards`), so every node passes
  over its rows in about the same time. Shards are contiguous runs in shard order, so a new
  allocation moves range boundaries in the pooled rows (`node.Pool`): a moved shard keeps its
  dual block and SAG table entries; only the nodes' summed SAG means (g_data) are recomputed
  from the table.
* weights: pull and push weights in proportion to speed (`graphs.Graph.with_speeds`).
* steps: every node's step follows its new rows and weights (`node.network_scalars`).

A re-plan keeps the push-pull invariant (held mass plus mass in transit equals the sum of the
local gradients) without disturbing a converged network (`migrate`). Weights stay row- /
column-stochastic and steps stay positive, so the fixed point is theta*.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxrl_async.decentralized import node as node_lib
from jaxrl_async.decentralized.graphs import Graph
from jaxrl_async.decentralized.problem import allocate_shards

MODES = ("uniform", "speed", "measured")  # allocation and weights: what speeds they follow


class SpeedMeter:
  """Per-node exponentially weighted mean of activation intervals.

  Args:
    n: nodes.
    halflife: in the node's own activations: an interval's weight halves after this many more
      (8: a node that slows down tenfold reads as at least 5x slower after 8 of its own slow
      activations).
  """

  def __init__(self, n: int, halflife: float = 8.0):
    if not halflife > 0:
      raise ValueError(f"halflife={halflife}: must be > 0")
    self.decay = 0.5 ** (1.0 / halflife)
    self.interval = np.full(n, np.nan)
    self.count = np.zeros(n, np.int64)

  def observe(self, node: np.ndarray, interval: np.ndarray) -> None:
    """Takes activation intervals [L] of nodes [L], in time order per node."""
    for i in np.unique(node):
      x = np.asarray(interval, np.float64)[node == i]
      m = x.size
      prev = x[0] if self.count[i] == 0 else self.interval[i]
      w = (1.0 - self.decay) * self.decay ** np.arange(m - 1, -1, -1)
      self.interval[i] = self.decay ** m * prev + float(w @ x)
      self.count[i] += m

  def speeds(self) -> np.ndarray | None:
    """[N] speeds relative to the fastest node (1 = fastest); None until every node has been
    measured."""
    if np.any(self.count == 0):
      return None
    v = 1.0 / self.interval
    return v / v.max()


@dataclasses.dataclass(frozen=True)
class Plan:
  """What the network's layout follows.

  Attributes:
    allocation, weights: one of MODES: uniform; speed (the declared `declared` speeds, fixed);
      measured (the `SpeedMeter`'s, re-planned during the run).
    declared: [N] declared relative speeds (1 / slowdown), for 'speed'.
    halflife: the meter's half-life in activations.
    hysteresis: re-plan when some node's measured speed relative to the others has moved by
      more than this factor since the last plan (1.25: jitter of +-10% never triggers it).
  """

  allocation: str = "measured"
  weights: str = "measured"
  declared: tuple[float, ...] = ()
  halflife: float = 8.0
  hysteresis: float = 1.25

  def __post_init__(self):
    for name in ("allocation", "weights"):
      if getattr(self, name) not in MODES:
        raise ValueError(f"--{name}={getattr(self, name)!r}: must be one of {', '.join(MODES)}")
    if not self.hysteresis > 1:
      raise ValueError(f"hysteresis={self.hysteresis}: must be > 1")

  @property
  def measures(self) -> bool:
    return "measured" in (self.allocation, self.weights)


class Adapter:
  """The network's layout (allocation, weights, steps) and its re-planning during a run.

  Args:
    rows: the pooled rows (`node.pool`).
    graph: the communication graph (its own weights are replaced by the plan's).
    rho, alpha, beta, sampling, seed, synchronous, pull_lag: as in `node.network_consts`.
    plan: what follows which speeds.
    held: [N] shards per node, fixed for the whole run (the plan's allocation is then unused);
      None: the plan's allocation.
  """

  def __init__(self, rows: node_lib.Pool, graph: Graph, rho: float, alpha: float, beta: float,
               plan: Plan, sampling: str = "uniform", seed: int = 0, synchronous: bool = False,
               pull_lag: float = 0.0, held: np.ndarray | None = None):
    self.rows, self.graph, self.plan = rows, graph, plan
    self.rho, self.alpha, self.beta = rho, alpha, beta
    self.sampling, self.seed, self.synchronous, self.pull_lag = (sampling, seed, synchronous,
                                                                 pull_lag)
    self.n, self.shards = graph.n, rows.bounds.size - 1
    self.meter = SpeedMeter(self.n, plan.halflife)
    self.measured = np.ones(self.n)  # the measured speeds the current layout follows
    self.alpha_scale, self.beta_scale = 1.0, 1.0  # step back-offs (`back_off_scales`)
    self._held = None if held is None else np.asarray(held, np.int64)

  def _speeds(self, mode: str) -> np.ndarray | None:
    if mode == "speed" and self.plan.declared:
      return np.asarray(self.plan.declared, np.float64)
    if mode == "measured":
      return self.measured
    return None

  def held(self) -> np.ndarray:
    """[N] shards per node under the current plan."""
    if self._held is not None:
      return self._held
    speeds = self._speeds(self.plan.allocation)
    return allocate_shards(self.shards, np.ones(self.n) if speeds is None else speeds)

  def consts(self) -> node_lib.NodeConst:
    """Pooled constants of the current layout (row fields [R, ...], the others [N])."""
    slots = self.graph.with_speeds(self._speeds(self.plan.weights)).slot_tables()
    consts = node_lib.pooled_consts(self.rows, self.held(), slots, self.rho, self.alpha,
                                    self.beta, self.sampling, self.seed, self.synchronous,
                                    self.pull_lag)
    return consts._replace(alpha=consts.alpha * self.alpha_scale,
                           beta=consts.beta * self.beta_scale)

  def observe(self, node: np.ndarray, interval: np.ndarray) -> bool:
    """Feeds activation intervals to the meter; True when the layout should be re-planned
    (then `measured` already holds the new speeds)."""
    if not self.plan.measures:
      return False
    self.meter.observe(node, interval)
    speeds = self.meter.speeds()
    if speeds is None:
      return False
    moved = speeds / self.measured
    if moved.max() / moved.min() <= self.plan.hysteresis:
      return False
    self.measured = speeds
    return True


def back_off_scales(backoffs: int) -> tuple[float, float]:
  """(alpha, beta) factors after `backoffs` back-offs: alpha halves every time, beta every
  second time. Why not both every time: a primal-dual iteration also needs the dual fast
  relative to the primal, and halving both keeps beta / alpha where it was; measured on 3 nodes
  at alpha = 400 (20x the default), halving both blew up again at every scale down to 1 / 128,
  while the primal alone is what the lag condition (step * M_i below a constant) limits."""
  return 0.5 ** backoffs, 0.5 ** (backoffs // 2)


def migrate(rows: node_lib.Pool, old: node_lib.NodeConst, new: node_lib.NodeConst,
            states: node_lib.NodeState) -> node_lib.NodeState:
  """Network states (numpy, pooled: table [R, 2], w and g_w [K, d]) carried from the layout
  `old` to `new` with the push-pull invariant kept.

  Moved shards take their SAG means with them: each node's g_data becomes the sum of its new
  shards' means (from the table). That moves gradient between nodes without changing the sum,
  so the trackers need nothing for it, and at the fixed point (every y_i = 0) a re-plan leaves
  them at 0. Adding each node's own gradient change to its tracker instead would also keep the
  invariant, but would kick every y_i by the size of a shard's gradient, undoing the
  convergence so far. The ridge terms B_i rho theta_i do change the sum, by sum_i dB_i rho
  theta_i; node i takes dB_i rho (theta_i - mean theta), which adds up to that (sum_i dB_i = 0)
  and is as small as the disagreement between nodes. Finally a node whose self-weight b_ii
  changes rescales y_i so that the mass it holds, b_ii y_i, is unchanged.
  """
  theta, y = np.asarray(states.theta), np.asarray(states.y)
  g_data = np.asarray(states.g_data)
  if not (np.array_equal(old.row0, new.row0) and np.array_equal(old.count, new.count)):
    per_shard = node_lib.shard_gradients(rows, np.asarray(states.table))
    owner = np.repeat(np.arange(new.count.size), _held(rows, new))
    g_data = np.zeros_like(g_data)
    np.add.at(g_data, owner, per_shard)
  d_rho = (np.asarray(new.rho) - np.asarray(old.rho))[:, None]
  held_mass = np.asarray(old.push_self)[:, None] * y + d_rho * (theta - theta.mean(axis=0))
  return states._replace(g_data=g_data, y=held_mass / np.asarray(new.push_self)[:, None])


def _held(rows: node_lib.Pool, consts: node_lib.NodeConst) -> np.ndarray:
  """[N] shards per node of pooled consts."""
  first = np.searchsorted(rows.bounds, consts.row0)
  last = np.searchsorted(rows.bounds, np.asarray(consts.row0) + np.asarray(consts.count))
  return last - first
