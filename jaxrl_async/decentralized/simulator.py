"""The event-driven simulated network: replays a schedule through the node update.

`schedule.py` draws the events (who activates when, which message each reads); here their
values are computed in that order by `node.node_update`, the same function the multi-process
runtime jits. A chunk of L events is one `lax.scan` (one compile per problem shape): event k of
node i gathers its inbox from a ring buffer of the last H outboxes (H bounds how many events a
message can be in flight, so no message is overwritten before it is read), runs the update,
and writes its outbox to slot k mod H. The worst node's relative error after every event comes
back, so crossings of a tolerance are exact to one event.

Deterministic: same problem, graph, timing and seed give bit-identical runs.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_async.decentralized import adaptive
from jaxrl_async.decentralized import node as node_lib
from jaxrl_async.decentralized.graphs import Graph
from jaxrl_async.decentralized.problem import Problem, relative_errors

# Re-exported: callers import the run's result types from here.
from jaxrl_async.decentralized.results import DivergenceError, Recorder, RunResult, fit_rate
from jaxrl_async.decentralized.schedule import (
  AsyncSchedule,
  CentralSchedule,
  Chunk,
  SyncSchedule,
  Timing,
)

__all__ = ["MODES", "POOLED_STATE", "Carry", "DivergenceError", "Ring", "RunResult",
           "Simulation", "build", "fit_rate", "run"]

MODES = ("async", "sync", "centralized")


class Ring(NamedTuple):
  """The last H outboxes. theta: [H, d]; sigma: [H, D_out, d]; stamp: [H]."""

  theta: jax.Array
  sigma: jax.Array
  stamp: jax.Array


class Carry(NamedTuple):
  states: node_lib.NodeState  # stacked [N, ...]
  ring: Ring
  last_err: jax.Array  # [N] each node's relative error after its latest activation


def _take(tree: Any, i: jax.Array, skip: tuple[str, ...]) -> Any:
  """Node i's slice of every field of a stacked NamedTuple except those in `skip`."""
  return tree._replace(**{f: jax.lax.dynamic_index_in_dim(getattr(tree, f), i, keepdims=False)
                          for f in tree._fields if f not in skip})


def _put(tree: Any, new: Any, i: jax.Array, skip: tuple[str, ...]) -> Any:
  """`tree` with node i's slice of every field but `skip` replaced by `new`'s."""
  # NOTE: dynamic_update_slice, not .at[i].set, whose bounds handling adds a select per field.
  return tree._replace(**{
      f: jax.lax.dynamic_update_index_in_dim(getattr(tree, f), getattr(new, f), i, 0)
      for f in tree._fields if f not in skip})


def _event(consts: node_lib.NodeConst, in_to_out: jax.Array, theta_star: jax.Array,
           carry: Carry, ev: tuple[jax.Array, jax.Array, jax.Array]) -> tuple[Carry, jax.Array]:
  """One event: node i reads its inbox from the ring, updates, writes its outbox.

  Rows, the SAG table and the dual are pooled (`node.Pool`): one [R, ...] / [K, d] array for
  the network, node i reading its range from row0_i on and its shards by global id. Slicing a
  node's table out and writing it back would copy it twice per event, which dominated the time
  at large M; pooling also lets shards change hands by moving range boundaries only.
  """
  i, k, src = ev
  h = carry.ring.stamp.shape[0]
  valid = src >= 0
  slot = jnp.where(valid, src % h, 0)
  inbox = node_lib.Inbox(theta=carry.ring.theta[slot],
                         sigma=carry.ring.sigma[slot, in_to_out[i]],
                         stamp=jnp.where(valid, carry.ring.stamp[slot], -1))
  const_i = _take(consts, i, node_lib.ROW_FIELDS)
  state_i = _take(carry.states, i, POOLED_STATE)
  new_state, out = node_lib.node_update(const_i, state_i, inbox)
  states = _put(carry.states, new_state, i, POOLED_STATE)._replace(
      **{f: getattr(new_state, f) for f in POOLED_STATE})
  at = k % h
  ring = Ring(carry.ring.theta.at[at].set(out.theta), carry.ring.sigma.at[at].set(out.sigma),
              carry.ring.stamp.at[at].set(out.stamp))
  err = jnp.linalg.norm(new_state.theta - theta_star) / jnp.linalg.norm(theta_star)
  last_err = carry.last_err.at[i].set(err)
  return Carry(states, ring, last_err), jnp.max(last_err)


POOLED_STATE = ("table", "w", "g_w")  # network-wide arrays every node indexes into


# NOTE: without region analysis, XLA:CPU's copy insertion copies the whole SAG table twice per
# loop iteration (a read and an in-place update of one row in the same while body); with it,
# the row update is in place. Per-compile option, so nothing global changes.
@functools.partial(jax.jit,
                   compiler_options={"xla_cpu_copy_insertion_use_region_analysis": True})
def _replay(consts: node_lib.NodeConst, in_to_out: jax.Array, theta_star: jax.Array,
            carry: Carry, node: jax.Array, k: jax.Array, src: jax.Array
            ) -> tuple[Carry, jax.Array]:
  """A chunk of events: one scan. Returns the carry and the worst error after each event [L]."""
  step = functools.partial(_event, consts, in_to_out, theta_star)
  return jax.lax.scan(step, carry, (node, k, src))


class Simulation:
  """A network (or the centralised node) stepped chunk by chunk; also usable for inspection.

  Args:
    adapter: the network's layout (`adaptive.Adapter`); the centralised node passes its pooled
      constants as `consts` instead.
    graph: the network (None for the centralised node).
    schedule: an `AsyncSchedule`, `SyncSchedule` or `CentralSchedule`.
    theta_star: [d].
    consts: pooled constants of the centralised node (one node, all shards).
  """

  def __init__(self, adapter: adaptive.Adapter | None, graph: Graph | None, schedule: Any,
               theta_star: np.ndarray, consts: node_lib.NodeConst | None = None,
               shards: int = 0):
    self.schedule, self.graph, self.adapter = schedule, graph, adapter
    consts = adapter.consts() if adapter is not None else consts
    shards = adapter.shards if adapter is not None else shards
    n = np.shape(consts.count)[0]
    d_out = np.shape(consts.push_out)[-1]
    d = np.shape(consts.phi)[-1]
    h = schedule.ring_size
    in_to_out = (graph.slot_tables()["in_to_out_slot"] if graph is not None
                 else np.zeros((1, 1), np.int64))
    init = node_lib.pooled_init(consts, shards)
    with jax.enable_x64(True):
      self._consts = jax.tree.map(jnp.asarray, consts)
      self._in_to_out = jnp.asarray(in_to_out)
      self._theta_star = jnp.asarray(theta_star, jnp.float64)
      self.carry = Carry(jax.tree.map(jnp.asarray, init),
                         Ring(jnp.zeros((h, d)), jnp.zeros((h, d_out, d)),
                              -jnp.ones(h, jnp.int64)),
                         jnp.asarray(relative_errors(init.theta, theta_star)))
    self.theta_star = np.asarray(theta_star)
    self.n = n
    self.k = 0
    self.clock = 0.0
    self.events: list[dict[str, Any]] = []  # re-plans and step back-offs, as they happened
    self.backoffs = 0

  def run_chunk(self) -> tuple[Chunk, np.ndarray]:
    """Draw and replay the next chunk; returns it with the worst error after each event.
    Then, if the nodes' measured speeds have moved (`adaptive.Adapter.observe`), re-plans the
    layout for the chunks that follow."""
    chunk = self.schedule.next_chunk()
    with jax.enable_x64(True):
      self.carry, worst = _replay(self._consts, self._in_to_out, self._theta_star, self.carry,
                                  jnp.asarray(chunk.node), jnp.asarray(chunk.k),
                                  jnp.asarray(chunk.src))
      worst = np.asarray(worst)
    self.k = int(chunk.k[-1]) + 1
    self.clock = max(self.clock, float(chunk.done.max()))
    if self.adapter is not None and self.adapter.observe(
        chunk.node, chunk.done - chunk.read):
      self.relayout("replan", speeds=[round(float(v), 4) for v in self.adapter.measured])
    return chunk, worst

  def relayout(self, why: str, **info: Any) -> None:
    """Rebuilds the constants from the adapter and carries the states over (`adaptive.migrate`)."""
    old = jax.tree.map(np.asarray, self._consts)
    new = self.adapter.consts()
    states = adaptive.migrate(self.adapter.rows, old, new, jax.tree.map(np.asarray,
                                                                        self.carry.states))
    with jax.enable_x64(True):
      self._consts = jax.tree.map(jnp.asarray, new)
      self.carry = self.carry._replace(states=jax.tree.map(jnp.asarray, states))
    self.events.append({"event": why, "k": self.k, "time": self.clock,
                        "shards_per_node": self.adapter.held().tolist(), **info})

  def back_off(self, to: Carry) -> None:
    """Returns to the carry `to` (an earlier one of this run) with smaller steps
    (`adaptive.back_off_scales`).
    Messages in flight at that point are forgotten (the push channel's running sums make that
    harmless), since the ring's slots have been written since."""
    self.carry = to._replace(ring=to.ring._replace(stamp=-jnp.ones_like(to.ring.stamp)))
    self.backoffs += 1
    alpha_scale, beta_scale = adaptive.back_off_scales(self.backoffs)
    if self.adapter is not None:
      self.adapter.alpha_scale, self.adapter.beta_scale = alpha_scale, beta_scale
      self.relayout("step_backoff", alpha_scale=alpha_scale, beta_scale=beta_scale)
    else:
      alpha_step, beta_step = adaptive.back_off_scales(self.backoffs - 1)
      with jax.enable_x64(True):
        self._consts = self._consts._replace(
            alpha=self._consts.alpha * alpha_scale / alpha_step,
            beta=self._consts.beta * beta_scale / beta_step)
      self.events.append({"event": "step_backoff", "k": self.k, "time": self.clock,
                          "alpha_scale": alpha_scale, "beta_scale": beta_scale})

  def states(self) -> node_lib.NodeState:
    """Stacked [N, ...] node states (numpy); table [R, 2], w and g_w [K, d] are pooled."""
    return jax.tree.map(np.asarray, self.carry.states)

  def consts(self) -> node_lib.NodeConst:
    """The current constants (numpy): row fields pooled [R, ...], the others [N]."""
    return jax.tree.map(np.asarray, self._consts)

  def theta(self) -> np.ndarray:
    return np.asarray(self.carry.states.theta)


def build(problem: Problem, graph: Graph | None, mode: str, timing: Timing, alpha: float,
          beta: float, sampling: str = "uniform", seed: int = 0, chunk: int = 4096,
          pull_lag: float = 0.0, plan: adaptive.Plan | None = None) -> Simulation:
  """A `Simulation` of `mode` ('async', 'sync' or 'centralized') on this problem.

  `plan` (async only): what the allocation and weights follow (`adaptive.Plan`); None keeps
  the problem's own allocation and the graph's own weights for the whole run.
  `pull_lag` (see `node.network_consts`) applies to 'async' only: in rounds every copy a node
  pulls is exactly as old as its own iterate, so there is no lag to make up for.
  """
  theta_star = problem.theta_star()
  if mode == "centralized":
    c = node_lib.centralized_const(problem, alpha, beta, sampling, seed)
    c = c._replace(**{f: getattr(c, f)[0] for f in node_lib.ROW_FIELDS})
    return Simulation(None, None, CentralSchedule(timing, chunk), theta_star, consts=c,
                      shards=problem.shards)
  if mode not in ("async", "sync"):
    raise ValueError(f"--mode={mode!r}: must be one of {', '.join(MODES)}")
  if mode == "sync" or plan is None:
    # As given: the problem's allocation, the graph's weights, nothing measured.
    declared = graph.speeds or ()
    plan = adaptive.Plan("speed", "speed" if declared else "uniform", declared)
    adapter = adaptive.Adapter(node_lib.pool(problem), graph, problem.rho, alpha, beta, plan,
                               sampling, seed, synchronous=mode == "sync",
                               pull_lag=pull_lag if mode == "async" else 0.0,
                               held=problem.shards_per_node())
  else:
    adapter = adaptive.Adapter(node_lib.pool(problem), graph, problem.rho, alpha, beta, plan,
                               sampling, seed, pull_lag=pull_lag)
  schedule = (AsyncSchedule(graph, timing, chunk) if mode == "async"
              else SyncSchedule(graph, timing, chunk))
  return Simulation(adapter, graph, schedule, theta_star)


def run(sim: Simulation, tol: float = 1e-10, max_updates: int = 10_000_000,
        max_time: float = math.inf, max_wall_s: float = math.inf, record_every: int = 0,
        milestones: tuple[float, ...] = (1e-4, 1e-6, 1e-8, 1e-10), divergence: float = 1e6,
        on_record: Callable[[dict[str, Any]], None] | None = None, backoffs: int = 0,
        backoff_growth: float = 10.0) -> RunResult:
  """Run until the worst node's relative error is below `tol` or a budget is spent.

  Args:
    sim: from `build`.
    tol: stop once every node's relative error is below it (checked per event).
    max_updates, max_time, max_wall_s: budgets in events, virtual time, host seconds (checked
      per chunk, so a run may overshoot by under one chunk).
    record_every: events between curve records; 0 means once per chunk.
    milestones: tolerances whose first crossing (event, virtual time) is reported.
    divergence: with no back-off left, the run fails when the worst error exceeds this
      multiple of its start.
    on_record: called with each record (a dict), e.g. to print progress or append JSONL; a
      re-plan or back-off is recorded as {"event": ...} (`Simulation.events`).
    backoffs: how many times the steps may be halved: when the worst error at the end of a
      chunk is non-finite or above `backoff_growth` times the lowest one at a chunk end so far,
      the run returns to that lowest point with every step halved (logged as a
      "step_backoff" event). 0: no back-off, a blow-up raises.

  Raises:
    DivergenceError: non-finite iterates or error growth past `divergence` with no back-off
      left, naming the step-size flags.
  """
  recorder = Recorder(sim.theta_star, on_record)
  start_err = float(np.max(relative_errors(sim.theta(), sim.theta_star)))
  wanted = sorted(set(milestones) | {tol}, reverse=True)
  lowest = _Lowest(start_err, sim.carry, backoffs, backoff_growth)
  logged = 0
  recorder.snapshot(sim.k, sim.clock, sim.theta())
  while True:
    chunk, worst = sim.run_chunk()
    recorder.add_chunk(chunk, worst, wanted, record_every)
    lowest.after_chunk(sim, float(worst[-1]))
    recorder.snapshot(sim.k, sim.clock, sim.theta())
    if on_record is not None:
      for ev in sim.events[logged:]:
        on_record(ev)
    logged = len(sim.events)
    _check_divergence(sim, worst, start_err, divergence, backoffs)
    stopped = _stop_reason(sim, tol in recorder.crossings, max_updates, max_time,
                           time.perf_counter() - recorder.t0 >= max_wall_s)
    if stopped is not None:
      break
  return recorder.result(
      sim.theta(), sim.k, sim.clock, stopped,
      extra={"events": list(sim.events),
             "step_backoffs": sum(e["event"] == "step_backoff" for e in sim.events),
             "replans": sum(e["event"] == "replan" for e in sim.events)})


class _Lowest:
  """The lowest worst error at a chunk end so far and the carry there: where a back-off returns.

  A chunk that ends non-finite or above `growth` times that error sends the run back to it with
  smaller steps (`Simulation.back_off`), while `left` back-offs remain.
  """

  def __init__(self, err: float, carry: Carry, left: int, growth: float):
    self.err, self.carry, self.left, self.growth = err, carry, left, growth

  def after_chunk(self, sim: Simulation, end_err: float) -> None:
    if self.left and not (math.isfinite(end_err) and end_err <= self.growth * self.err):
      self.left -= 1
      sim.back_off(self.carry)
      sim.events[-1].update(worst_rel_error=end_err, returned_to=self.err)
    elif math.isfinite(end_err) and end_err < self.err:
      self.err, self.carry = end_err, sim.carry


def _check_divergence(sim: Simulation, worst: np.ndarray, start_err: float, divergence: float,
                      backoffs: int) -> None:
  """Raises DivergenceError if this chunk blew up and was not answered by a back-off."""
  if not np.all(np.isfinite(worst)) or worst.max() > divergence * max(start_err, 1e-300):
    if not (sim.events and sim.events[-1]["event"] == "step_backoff"
            and sim.events[-1]["k"] == sim.k):
      raise DivergenceError(
          f"diverged after {sim.k} updates (worst relative error {worst.max():.3g}, started "
          f"at {start_err:.3g}): the step sizes are too large for this problem and network; "
          "lower --alpha and/or --beta" + (f" (after {backoffs} back-offs)" if backoffs
                                           else ""))


def _stop_reason(sim: Simulation, reached_tol: bool, max_updates: int, max_time: float,
                 out_of_wall: bool) -> str | None:
  """Why the run stops after this chunk, None to go on; checked in this order."""
  if reached_tol:
    return "tol"
  if sim.k >= max_updates:
    return "max_updates"
  if sim.clock >= max_time:
    return "max_time"
  if out_of_wall:
    return "wall"
  return None
