"""Who activates when, and which message each activation reads: the simulated network's clock.

A node's timing never depends on the values it computes, so the whole event order can be drawn
first (numpy, deterministic for a seed) and the values replayed in that order afterwards
(`simulator.py`). The model, in virtual time units:

* Node i activates back to back: activation n reads its inbox at t_n, computes for
  tau_n = compute_time * slowdown_i * U(1 - jitter, 1 + jitter), and at t_n + tau_n sends one
  message to each out-neighbour and reads again (t_{n+1} = t_n + tau_n). Nodes start at
  random phases t_0 ~ U(0, mean tau_i), so equal nodes do not move in lock step.
* A message sent at t is delivered at t + delta, delta = delay * {1, U(0, 2), min(Exp(1), 5)}
  (constant, uniform, exponential; bounded, as the method assumes); with `drop_prob` it is
  lost. Links need not be FIFO: a later message may overtake an earlier one.
* An activation reads, per in-neighbour, the newest message that arrived since its previous
  read (arrival <= t_n). Older ones it would discard anyway (timestamps), so only the newest
  matters; the node update still applies the timestamp rule itself.

Events are numbered k = 0, 1, ... in order of read time (ties by node id); a message is named
by the event that sent it. The synchronous baseline is the same picture with rounds: every node
reads at T_r, and round r+1 starts when the slowest node has finished and every message of
round r has arrived.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import numpy as np

from jaxrl_async.decentralized.graphs import Graph

DELAY_DISTS = ("constant", "uniform", "exponential")
_EXP_CAP = 5.0  # exponential delays are truncated at 5x their mean: delays must be bounded


@dataclasses.dataclass(frozen=True)
class Timing:
  """How long things take in the simulated network (virtual time units).

  Attributes:
    compute_time: mean time of one activation of a normal node.
    jitter: each activation's time is uniform in compute_time * [1 - jitter, 1 + jitter].
    slowdown: per-node factor on compute_time (stragglers > 1); () means all 1.
    delay: mean link delay. delay_dist: one of DELAY_DISTS.
    drop_prob: probability that a message is lost (asynchronous mode only).
    seed: the seed of every draw.
    slow_from, slow_until: the slowdowns hold for activations that start in [slow_from,
      slow_until); outside it every node computes at compute_time. (0, inf): all the time.
      A node that becomes slow mid-run, or recovers, without anyone declaring it.
  """

  compute_time: float = 1.0
  jitter: float = 0.1
  slowdown: tuple[float, ...] = ()
  delay: float = 0.2
  delay_dist: str = "uniform"
  drop_prob: float = 0.0
  seed: int = 0
  slow_from: float = 0.0
  slow_until: float = math.inf

  def __post_init__(self):
    if not self.compute_time > 0:
      raise ValueError(f"--compute_time={self.compute_time}: must be > 0")
    if not 0 <= self.jitter < 1:
      raise ValueError(f"--compute_jitter={self.jitter}: must be in [0, 1)")
    if any(not s >= 1 for s in self.slowdown):
      raise ValueError(f"--straggler_slowdown={self.slowdown}: must be >= 1")
    if not self.delay >= 0:
      raise ValueError(f"--delay={self.delay}: must be >= 0")
    if self.delay_dist not in DELAY_DISTS:
      raise ValueError(f"--delay_dist={self.delay_dist!r}: must be one of "
                       f"{', '.join(DELAY_DISTS)}")
    if not 0 <= self.drop_prob < 1:
      raise ValueError(f"--drop_prob={self.drop_prob}: must be in [0, 1)")
    if not 0 <= self.slow_from < self.slow_until:
      raise ValueError(f"--straggler_after={self.slow_from}, --straggler_until="
                       f"{self.slow_until}: must be 0 <= after < until")

  def factor(self, slow: np.ndarray, t: float | np.ndarray) -> np.ndarray:
    """The compute-time factor of nodes with slowdowns `slow` at time t (1 outside the window)."""
    inside = (self.slow_from <= t) & (t < self.slow_until)
    return np.where(inside, slow, 1.0)

  @property
  def varies(self) -> bool:
    return self.slow_from > 0 or self.slow_until < math.inf

  def slowdowns(self, n: int) -> np.ndarray:
    if not self.slowdown:
      return np.ones(n)
    if len(self.slowdown) != n:
      raise ValueError(f"slowdown has {len(self.slowdown)} entries for {n} nodes")
    return np.asarray(self.slowdown, np.float64)

  @property
  def max_delay(self) -> float:
    return self.delay * {"constant": 1.0, "uniform": 2.0, "exponential": _EXP_CAP}[
        self.delay_dist]

  def draw_delays(self, rng: np.random.Generator, size: int) -> np.ndarray:
    if self.delay_dist == "constant":
      return np.full(size, self.delay)
    if self.delay_dist == "uniform":
      return self.delay * rng.uniform(0.0, 2.0, size)
    return self.delay * np.minimum(rng.exponential(1.0, size), _EXP_CAP)


class Chunk(NamedTuple):
  """L consecutive events. node: [L] int. k: [L] int global event numbers. src: [L, D_in] int,
  the event that sent the message read from each in-slot (-1: none). done: [L] completion time
  t_n + tau_n of each event (virtual time). read: [L] its read time t_n (done - read is the
  activation interval a node measures itself)."""

  node: np.ndarray
  k: np.ndarray
  src: np.ndarray
  done: np.ndarray
  read: np.ndarray


class _Messages:
  """Messages not yet read: arrival time, receiver, receiver's in-slot, sending event."""

  def __init__(self):
    self.arrival = np.zeros(0)
    self.dst = np.zeros(0, np.int64)
    self.slot = np.zeros(0, np.int64)
    self.src = np.zeros(0, np.int64)

  def add(self, arrival, dst, slot, src) -> None:
    self.arrival = np.concatenate([self.arrival, arrival])
    self.dst = np.concatenate([self.dst, dst])
    self.slot = np.concatenate([self.slot, slot])
    self.src = np.concatenate([self.src, src])

  def keep(self, mask: np.ndarray) -> None:
    for name in ("arrival", "dst", "slot", "src"):
      setattr(self, name, getattr(self, name)[mask])


class _Links:
  """Every directed link j -> i as parallel arrays (sender, receiver, receiver's in-slot)."""

  def __init__(self, graph: Graph):
    slots = graph.slot_tables()
    self.d_in = slots["in_nbr"].shape[1]
    src, dst, slot = [], [], []
    for i in range(graph.n):
      for s, j in enumerate(slots["in_nbr"][i]):
        if j >= 0:
          src.append(j)
          dst.append(i)
          slot.append(s)
    self.src, self.dst, self.slot = (np.asarray(x, np.int64) for x in (src, dst, slot))
    self.by_sender = [np.flatnonzero(self.src == j) for j in range(graph.n)]


class AsyncSchedule:
  """Chunks of events of the fully asynchronous network, deterministic for `timing.seed`."""

  def __init__(self, graph: Graph, timing: Timing, chunk: int):
    self.graph, self.timing, self.chunk = graph, timing, chunk
    self.n = graph.n
    self._rng = np.random.default_rng(timing.seed)
    self._links = _Links(graph)
    self._slow = timing.slowdowns(self.n)
    # The slowest each node can be (ring bound), and its mean now (chunk horizon).
    self._mean_tau = timing.compute_time * self._slow
    # Future activations per node (read times and compute times), consumed from the front.
    start = self._rng.uniform(0.0, 1.0, self.n) * self._tau_at(np.arange(self.n), 0.0)
    self._times = [np.array([start[i]]) for i in range(self.n)]
    self._taus = [self._draw_tau(i, 1, start[i]) for i in range(self.n)]
    self._pending = _Messages()
    self._next_k = 0

  @property
  def ring_size(self) -> int:
    """A bound on (reading event - sending event) + 1 over every message ever read.

    A message read at t_k was sent at t_src + tau_src and arrived within max_delay, and its
    reader reads at most one compute time after it arrives; every event in between is one of
    at most window / tau_min_i + 1 activations of each node i.
    """
    t = self.timing
    # A node out of its slow window computes at compute_time: the shortest it can take.
    tau_min = (np.full(self.n, t.compute_time) if t.varies else self._mean_tau) * (1 - t.jitter)
    window = 2 * self._mean_tau.max() * (1 + t.jitter) + t.max_delay
    return int(np.sum(np.floor(window / tau_min) + 1)) + 2

  def _tau_at(self, i, t) -> np.ndarray:
    """Mean compute time of node(s) i for an activation starting at t."""
    return self.timing.compute_time * self.timing.factor(self._slow[i], t)

  def _draw_tau(self, i: int, size: int, t: float) -> np.ndarray:
    j = self.timing.jitter
    return self._tau_at(i, t) * self._rng.uniform(1 - j, 1 + j, size)

  def _extend(self, i: int, until: float) -> None:
    """Make node i's future activations reach past `until`."""
    while self._times[i][-1] <= until:
      t_next = self._times[i][-1] + self._taus[i][-1]
      size = max(64, int(4 * (until - self._times[i][-1]) / self._tau_at(i, t_next)))
      taus = self._draw_tau(i, size, t_next)
      starts = t_next + np.concatenate([[0.0], np.cumsum(taus[:-1])])
      if self.timing.varies:
        # Drawn at the factor of t_next; keep them only up to the next change of the factor.
        changes = [c for c in (self.timing.slow_from, self.timing.slow_until) if c > t_next]
        if changes:
          keep = max(1, int(np.searchsorted(starts, min(changes), side="left")))
          starts, taus = starts[:keep], taus[:keep]
      self._times[i] = np.concatenate([self._times[i], starts])
      self._taus[i] = np.concatenate([self._taus[i], taus])

  def next_chunk(self) -> Chunk:
    """The next `chunk` events in read-time order, with the message each of them reads."""
    now = min(t[0] for t in self._times)
    rate = np.sum(1.0 / self._tau_at(np.arange(self.n), now))
    horizon = min(t[0] for t in self._times) + 1.5 * self.chunk / rate
    while True:
      for i in range(self.n):
        self._extend(i, horizon)
      cand_t = np.concatenate([t[t <= horizon] for t in self._times])
      if cand_t.size >= self.chunk:
        break
      horizon += self.chunk / rate
    cand_node = np.concatenate([np.full(np.sum(t <= horizon), i)
                                for i, t in enumerate(self._times)])
    order = np.lexsort((cand_node, cand_t))[: self.chunk]
    node, t_read = cand_node[order], cand_t[order]
    tau = np.empty(self.chunk)
    for i in range(self.n):
      mine = node == i
      m = int(mine.sum())
      tau[mine] = self._taus[i][:m]
      self._times[i], self._taus[i] = self._times[i][m:], self._taus[i][m:]
    k = self._next_k + np.arange(self.chunk)
    self._next_k += self.chunk
    self._send(node, k, t_read + tau)
    src = self._deliver(node, k, t_read)
    return Chunk(node, k, src, t_read + tau, t_read)

  def _send(self, node: np.ndarray, k: np.ndarray, t_send: np.ndarray) -> None:
    links = self._links
    link_ids = [links.by_sender[j] for j in node]
    counts = np.array([len(x) for x in link_ids])
    if counts.sum() == 0:
      return
    ids = np.concatenate(link_ids)
    arrival = np.repeat(t_send, counts) + self.timing.draw_delays(self._rng, ids.size)
    kept = self._rng.uniform(size=ids.size) >= self.timing.drop_prob
    self._pending.add(arrival[kept], links.dst[ids][kept], links.slot[ids][kept],
                      np.repeat(k, counts)[kept])

  def _deliver(self, node: np.ndarray, k: np.ndarray, t_read: np.ndarray) -> np.ndarray:
    """src [L, D_in]: for each event, the newest message per slot that arrived by its read."""
    src = -np.ones((self.chunk, self._links.d_in), np.int64)
    msgs = self._pending
    read = np.zeros(msgs.arrival.size, bool)
    for i in range(self.n):
      pos = np.flatnonzero(node == i)  # node i's events in this chunk, in time order
      if pos.size == 0:
        continue
      mine = np.flatnonzero(msgs.dst == i)
      at = np.searchsorted(t_read[pos], msgs.arrival[mine], side="left")
      ok = at < pos.size
      rows, sel = pos[at[ok]], mine[ok]
      np.maximum.at(src, (rows, msgs.slot[sel]), msgs.src[sel])
      read[sel] = True
    msgs.keep(~read)
    lag = (k[:, None] - src)[src >= 0]
    if lag.size and lag.max() >= self.ring_size:
      raise RuntimeError(f"internal: message lag {lag.max()} >= ring size {self.ring_size}")
    return src


class SyncSchedule:
  """Synchronous push-pull: rounds in which every node reads the previous round's messages.

  A round lasts until its slowest node has finished and every message of the round has
  arrived: T_{r+1} = T_r + max over senders j and their links of (tau_j + delta). Chunks hold
  whole rounds (the chunk length is rounded down to a multiple of N).
  """

  def __init__(self, graph: Graph, timing: Timing, chunk: int):
    if timing.drop_prob > 0:
      raise ValueError(f"--drop_prob={timing.drop_prob}: must be 0 with --mode=sync (a "
                       "synchronous round waits for every message)")
    self.graph, self.timing, self.n = graph, timing, graph.n
    self.rounds_per_chunk = max(1, chunk // self.n)
    self.chunk = self.rounds_per_chunk * self.n
    self._rng = np.random.default_rng(timing.seed)
    self._links = _Links(graph)
    self._slots = graph.slot_tables()
    self._slow = timing.slowdowns(self.n)
    self._round, self._t = 0, 0.0

  @property
  def ring_size(self) -> int:
    return 2 * self.n + 1

  def next_chunk(self) -> Chunk:
    n, r0 = self.n, self._round
    node = np.tile(np.arange(n), self.rounds_per_chunk)
    k = r0 * n + np.arange(self.chunk)
    rnd = r0 + np.arange(self.chunk) // n
    in_nbr = self._slots["in_nbr"][node]  # [L, D_in]
    src = np.where((in_nbr >= 0) & (rnd[:, None] > 0), (rnd[:, None] - 1) * n + in_nbr, -1)
    done, read = np.empty(self.chunk), np.empty(self.chunk)
    j = self.timing.jitter
    for r in range(self.rounds_per_chunk):
      mean_tau = self.timing.compute_time * self.timing.factor(self._slow, self._t)
      tau = mean_tau * self._rng.uniform(1 - j, 1 + j, n)
      span = tau.copy()
      links = self._links
      if links.src.size:
        arrive = tau[links.src] + self.timing.draw_delays(self._rng, links.src.size)
        np.maximum.at(span, links.src, arrive)
      done[r * n:(r + 1) * n] = self._t + tau
      read[r * n:(r + 1) * n] = self._t
      self._t += span.max()
    self._round += self.rounds_per_chunk
    return Chunk(node, k, src, done, read)


class CentralSchedule:
  """One node activating back to back (the centralised reference): no messages."""

  def __init__(self, timing: Timing, chunk: int):
    self.timing, self.chunk, self.n = timing, chunk, 1
    self._rng = np.random.default_rng(timing.seed)
    self._k, self._t = 0, 0.0

  @property
  def ring_size(self) -> int:
    return 1

  def next_chunk(self) -> Chunk:
    j = self.timing.jitter
    tau = self.timing.compute_time * self._rng.uniform(1 - j, 1 + j, self.chunk)
    done = self._t + np.cumsum(tau)
    self._t = float(done[-1])
    k = self._k + np.arange(self.chunk)
    self._k += self.chunk
    return Chunk(np.zeros(self.chunk, np.int64), k, -np.ones((self.chunk, 1), np.int64), done,
                 done - tau)
