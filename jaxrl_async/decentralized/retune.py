"""The process runtime's re-planning: measured speeds, step back-off, and shards moved.

A node's speed is its activations per wall second, read by the coordinator from the clocks the
nodes report, over the last `window_s` seconds. Not from each activation's interval: with more
processes than cores a node is descheduled for tens of milliseconds at a time, and a mean over
64 activations (45 ms) read that as speed (measured: 90 re-plans in 195 s with no straggler on
this 2-core machine, the allocation swinging between [16, 4, 4] and [4, 4, 16]); over seconds
the scheduler is fair and only a truly slower node reads slower. The coordinator's `Retuner`
keeps the network's layout in an
`adaptive.Adapter`, the same one the simulator re-plans with, so both runtimes follow measured
speeds by the same rules:

* weights and steps only (the allocation holds): every node gets its new pull/push weights and
  steps between two activations, no pause (`processes._retune` keeps its held mass);
* a new allocation: shards move. A node holds only its own rows, duals and SAG table, so the
  coordinator asks every node for its state at an activation boundary (a hand-over), carries
  the network's states over to the new layout with `adaptive.migrate` (the push-pull invariant
  kept, a converged network left converged), and hands each node its new rows and state
  (`slice_node`). The network pauses for that round trip, at most once per `min_gap_s`: a
  control-plane step, not a barrier per activation. Messages in flight meanwhile wait in the
  nodes' sockets; the push channel's running sums make them count once whatever the order.

Node i's slice of the pooled layout is rows [row0_i, row0_i + count_i) and dual blocks
[first_i, first_i + held_i) (its shards are a contiguous run, `node.Pool`), with its rows'
blocks renumbered from 0: exactly the padded per-node layout without the padding.
"""

from __future__ import annotations

import collections
import math

import numpy as np

from jaxrl_async.decentralized import node as node_lib
from jaxrl_async.decentralized.adaptive import Adapter, back_off_scales

_PER_NODE = ("theta", "y", "g_data", "theta_in", "sigma_in", "stamp_in", "sigma_out", "clock")
_CONST_SCALARS = ("count", "pull_self", "pull_in", "push_self", "push_out", "alpha", "beta",
                  "rho", "uniform", "key")
RETUNE_FIELDS = ("pull_self", "pull_in", "push_self", "push_out", "alpha", "beta")


def _first_shards(consts: node_lib.NodeConst, rows: node_lib.Pool) -> tuple[np.ndarray,
                                                                              np.ndarray]:
  """([N] first shard, [N] shards held) of each node under pooled `consts`."""
  first = np.searchsorted(rows.bounds, np.asarray(consts.row0))
  last = np.searchsorted(rows.bounds, np.asarray(consts.row0) + np.asarray(consts.count))
  return first, last - first


def slice_node(rows: node_lib.Pool, consts: node_lib.NodeConst, states: node_lib.NodeState,
               i: int) -> tuple[node_lib.NodeConst, node_lib.NodeState]:
  """Node i's own constants and state (numpy) from the pooled layout and network states."""
  first, held = _first_shards(consts, rows)
  r0, c = int(np.asarray(consts.row0)[i]), int(np.asarray(consts.count)[i])
  b0, b1 = int(first[i]), int(first[i] + held[i])
  rows_of = lambda x: np.asarray(x)[r0:r0 + c]
  const = node_lib.NodeConst(
      phi=rows_of(consts.phi), psi=rows_of(consts.psi), r=rows_of(consts.r),
      block=rows_of(consts.block) - b0, weight=rows_of(consts.weight),
      **{k: np.asarray(getattr(consts, k))[i] for k in _CONST_SCALARS},
      row0=np.asarray(0, np.int64))
  state = node_lib.NodeState(
      **{k: np.asarray(getattr(states, k))[i] for k in _PER_NODE},
      w=np.asarray(states.w)[b0:b1], g_w=np.asarray(states.g_w)[b0:b1],
      table=np.asarray(states.table)[r0:r0 + c])
  return const, state


def join_states(states: list[dict[str, np.ndarray]]) -> node_lib.NodeState:
  """The network's pooled state from every node's own (in node order, which is shard order)."""
  return node_lib.NodeState(
      **{k: np.stack([s[k] for s in states]) for k in _PER_NODE},
      **{k: np.concatenate([s[k] for s in states]) for k in ("w", "g_w", "table")})


class Retuner:
  """The coordinator's side of measured speeds and step back-off.

  When the nodes' measured speeds have moved by more than `hysteresis` since the layout in
  force was set (at most once per `min_gap_s`), the adapter takes them: new weights and steps,
  and, where the allocation follows them, new shards per node (`moves_shards` in the event).
  When the worst error grows above `growth` times its lowest (or stops being finite), the steps
  are made smaller (`adaptive.back_off_scales`, at most `max_backoffs` times; the nodes cannot
  go back, they carry on from where they are), and the lowest is reset, so one blow-up is not
  counted twice in a row. Each change is an event in `events`.
  """

  def __init__(self, adapter: Adapter, max_backoffs: int, hysteresis: float = 1.5,
               growth: float = 10.0, min_gap_s: float = 2.0, window_s: float = 2.0):
    self.adapter, self.backoffs_left = adapter, max_backoffs
    self.hysteresis, self.growth, self.min_gap_s = hysteresis, growth, min_gap_s
    self.window_s = window_s
    self.clocks = [collections.deque() for _ in range(adapter.n)]  # (elapsed, activations)
    self.backoffs, self.best, self.last_s = 0, math.inf, -math.inf
    self.events: list[dict] = []
    self.in_force = adapter.consts()  # the pooled layout the nodes run

  def node(self, i: int, states: node_lib.NodeState) -> tuple[node_lib.NodeConst,
                                                              node_lib.NodeState]:
    return slice_node(self.adapter.rows, self.in_force, states, i)

  def take_layout(self) -> tuple[node_lib.NodeConst, node_lib.NodeConst]:
    """(the layout in force, the adapter's new one), which is in force from now on."""
    old, self.in_force = self.in_force, self.adapter.consts()
    return old, self.in_force

  def fields(self) -> list[dict[str, np.ndarray]]:
    """Every node's weights and steps in the layout in force."""
    return [{k: np.asarray(getattr(self.in_force, k))[i] for k in RETUNE_FIELDS}
            for i in range(self.adapter.n)]

  def speeds(self) -> np.ndarray | None:
    """[N] activations per second over the window, relative to the fastest; None until every
    node has been watched for half the window."""
    rates = []
    for seen in self.clocks:
      if len(seen) < 2 or seen[-1][0] - seen[0][0] < self.window_s / 2:
        return None
      rates.append((seen[-1][1] - seen[0][1]) / (seen[-1][0] - seen[0][0]))
    rates = np.asarray(rates, np.float64)
    return rates / rates.max() if rates.min() > 0 else None

  def observe(self, i: int, clock: int, worst: float | None, elapsed: float) -> dict | None:
    """Takes node i's activation count at `elapsed` and the network's worst error (None until
    every node has reported); an event when the nodes must be retuned, else None."""
    seen = self.clocks[i]
    seen.append((elapsed, int(clock)))
    while seen[-1][0] - seen[0][0] > self.window_s:
      seen.popleft()
    if worst is None:
      return None
    if self.backoffs_left and not (math.isfinite(worst) and worst <= self.growth * self.best):
      self.backoffs_left -= 1
      self.backoffs += 1
      self.best = worst if math.isfinite(worst) else math.inf
      alpha_scale, beta_scale = back_off_scales(self.backoffs)
      self.adapter.alpha_scale, self.adapter.beta_scale = alpha_scale, beta_scale
      return self._event("step_backoff", elapsed, worst_rel_error=worst,
                         alpha_scale=alpha_scale, beta_scale=beta_scale)
    self.best = min(self.best, worst)
    if not self.adapter.plan.measures or elapsed - self.last_s < self.min_gap_s:
      return None
    speeds = self.speeds()
    if speeds is None:
      return None
    moved = speeds / self.adapter.measured
    if moved.max() / moved.min() <= self.hysteresis:
      return None
    held = self.adapter.held()
    self.adapter.measured = speeds
    info = {"speeds": [round(float(v), 4) for v in speeds]}
    if not np.array_equal(held, self.adapter.held()):
      info |= {"moves_shards": True, "shards_per_node": self.adapter.held().tolist()}
    return self._event("replan", elapsed, **info)

  def _event(self, why: str, elapsed: float, **info) -> dict:
    self.last_s = elapsed
    event = {"event": why, "time": elapsed, **info}
    self.events.append(event)
    return event
