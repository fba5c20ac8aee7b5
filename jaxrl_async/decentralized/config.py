"""The policy-evaluation run's configuration: one frozen dataclass, validated on construction.

Field names are the flag names of `experiments/policy_evaluation.py`, which builds its flags from
these fields (help text in `metadata["help"]`), so every message can name the flag:
`--nodes=0: must be an integer >= 1`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxrl_async.decentralized.adaptive import MODES as FOLLOW
from jaxrl_async.decentralized.graphs import TOPOLOGIES
from jaxrl_async.decentralized.problem import SPLITS
from jaxrl_async.decentralized.schedule import DELAY_DISTS
from jaxrl_async.decentralized.transport import is_loopback, parse_endpoint, parse_hosts

DATA = ("random_mdp", "mountain_car")
MODES = ("async", "sync", "centralized")
RUNTIMES = ("simulated", "processes")
SAMPLINGS = ("uniform", "cyclic")
DEFAULT_FEATURES = {"random_mdp": 20, "mountain_car": 300}
# Default data sizes. random_mdp: 12800 rows make 80 shards of 160 rows (--shards=-1), fine
# enough for the allocation to give a 10x straggler one shard and the others 11-12, and coarse
# enough for every shard's C_s to be well conditioned (measured: lambda_min 3.0e-3 at 160 rows,
# 4.5e-5 at 40). mountain_car: 1600 transitions, as before.
DEFAULT_SAMPLES = {"random_mdp": 12800, "mountain_car": 1600}
SHARD_ROWS = 160  # --shards=-1: shards of at least this many rows (see DEFAULT_SAMPLES)


class ConfigError(ValueError):
  """A bad setting, reported as one line that names the flag, the value and what is allowed."""

  def __init__(self, flag: str, value: Any, allowed: str):
    self.flag, self.value, self.allowed = flag, value, allowed
    super().__init__(f"--{flag}={value!r}: {allowed}")


def _f(default: Any, help: str) -> Any:  # noqa: A002 - mirrors absl's argument name
  return dataclasses.field(default=default, metadata={"help": help})


def _is_int(v: Any) -> bool:
  return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
  return isinstance(v, int | float) and not isinstance(v, bool)


@dataclasses.dataclass(frozen=True)
class PolicyEvalConfig:
  """Everything one run needs; derived values are properties."""

  nodes: int = _f(4, "Number of nodes N.")
  topology: str = _f("exponential", f"Directed graph: {', '.join(TOPOLOGIES)}.")
  out_degree: int = _f(0, "Out-degree of each node for --topology=random; 0: min(2, N - 1) "
                       "(2 is more than two nodes can have).")
  edges: str = _f("", "Directed edges for --topology=custom, as src-dst pairs: '0-1,1-2,2-0'.")
  data: str = _f("random_mdp", f"Data source: {', '.join(DATA)}.")
  split: str = _f("parallel", "parallel: the --samples transitions are divided among the nodes; "
                  "multi_agent: every node holds them all, with its own local rewards.")
  samples: int = _f(0, "Transitions in total (parallel) or shared by all nodes (multi_agent); "
                    "0: the data's default (random_mdp 12800, mountain_car 1600).")
  shards: int = _f(-1, "--split=parallel: cut the transitions into this many equal shards, each "
                   "with its own dual; a node holds whole shards. theta* depends on the shards, "
                   "not on which node holds them. 0: one shard per node (nothing can move); "
                   f"-1: N * floor(samples / (N * {SHARD_ROWS})), at least N (shards of "
                   f"{SHARD_ROWS}+ rows, the same count for every N that divides it).")
  allocation: str = _f("measured", "How the shards are spread over the nodes: uniform; speed "
                       "(in proportion to the declared speeds, 1 / --straggler_slowdown); "
                       "measured (in proportion to speeds measured online from each node's "
                       "activation intervals, re-planned during the run when they change; "
                       "async only, else uniform; with --runtime=processes shards move by a "
                       "hand-over). Needs --shards well above --nodes.")
  weights: str = _f("measured", "Pull/push weights: uniform over a node's neighbours and "
                    "itself; speed (in proportion to the declared speeds); measured (to the "
                    "speeds measured online, as --allocation). A slow node's stale copy counts "
                    "less, and less tracker mass waits at a slow node.")
  features: int = _f(0, "Feature dimension d; 0 means the data's default (random_mdp 20, "
                     "mountain_car 300).")
  states: int = _f(50, "States of the random MDP.")
  gamma: float = _f(0.9, "Discount factor.")
  rho: float = _f(0.01, "Ridge coefficient rho of the MSPBE.")
  alpha: float = _f(20.0, "Primal step per pass over a node's rows (node i steps alpha / M_i).")
  beta: float = _f(160.0, "Dual step per pass over a node's rows (node i steps beta / M_i).")
  pull_lag: float = _f(-1.0, "Async: multiply node i's primal step by 1 + (1 - a_ii) * this, "
                       "to make up for the pull's averaging with in-neighbours' copies that "
                       "are this many activations behind; 0: off; -1: by runtime, 2 simulated "
                       "(1.5-2 measured best, every N), 0 processes (there 2 took 1.3-1.6x "
                       "the updates at N = 2 and 4: a copy is fresher than in the simulator).")
  sampling: str = _f("uniform", "SAG row choice: uniform (SAG) or cyclic (IAG).")
  mode: str = _f("async", f"Method: {', '.join(MODES)} (centralized: one node, all data).")
  runtime: str = _f("simulated", f"Where nodes run: {', '.join(RUNTIMES)}.")
  stragglers: int = _f(0, "How many nodes are slow (nodes 0..k-1).")
  straggler_slowdown: float = _f(10.0, "How many times slower a straggler computes.")
  straggler_after: float = _f(0.0, "Stragglers are slow from this time on (virtual time, or "
                              "wall seconds after the start with --runtime=processes): a node "
                              "that becomes slow mid-run. 0: from the start.")
  straggler_until: float = _f(0.0, "Stragglers recover at this time (same units); 0: never.")
  max_backoffs: int = _f(12, "When the worst error grows 10x above its lowest (or stops being "
                         "finite), halve every step (and, simulated, go back to that lowest "
                         "point), at most this many times, each logged; 0: stop with an error "
                         "naming --alpha and --beta instead.")
  compute_time: float = _f(1.0, "Simulated: mean time of one activation (virtual units).")
  compute_jitter: float = _f(0.1, "Simulated: activation times uniform in mean * [1 -/+ this].")
  delay: float = _f(0.2, "Simulated: mean link delay (virtual units).")
  delay_dist: str = _f("uniform", f"Simulated: link delay law: {', '.join(DELAY_DISTS)}.")
  drop_prob: float = _f(0.0, "Probability a message is lost (async only; the running sums of "
                        "the push channel make later messages carry the lost mass). With "
                        "--runtime=processes the sender drops it before the socket.")
  link_delay_ms: float = _f(0.0, "--runtime=processes: mean delay in milliseconds injected into "
                            "every message on its way to the socket, drawn from --delay_dist; "
                            "messages overtake each other. 0: none.")
  tol: float = _f(1e-10, "Stop when every node's ||theta_i - theta*|| / ||theta*|| is below this.")
  max_updates: int = _f(20_000_000, "Budget: node activations k in total.")
  max_time: float = _f(0.0, "Budget: virtual time (simulated); 0 means none.")
  max_wall_s: float = _f(300.0, "Budget: wall-clock seconds of the run itself.")
  seed: int = _f(0, "Seed of the data, graph, sampling and simulated timing.")
  hosts: str = _f("", "--runtime=processes: the address each node listens on, ADDR (one node) "
                  "or ADDR:COUNT (COUNT nodes), comma-separated IPv4 addresses, node ids in "
                  "order; the counts add up to --nodes. Empty: every node on 127.0.0.1.")
  coordinator: str = _f("", "--runtime=processes: ADDR:PORT where this process listens for "
                        "nodes started elsewhere by a launcher (experiments/launch/"
                        "policy_evaluation_hosts.py), each with this address and its node id. "
                        "Empty: this process starts every node itself, on this machine.")
  curve: bool = _f(False, "--runtime=processes: ZeroMQ CURVE authentication and encryption on "
                   "loopback too (it is always on when an address is not loopback), keys made "
                   "for this run.")
  curve_keys: str = _f("", "--runtime=processes: the run's CURVE key file (only its owner may "
                       "read it; the launcher writes one). Empty: this process makes the keys "
                       "and hands them to the nodes it starts through their environment.")
  run_dir: str = _f("", "Where metrics.jsonl, summary.json and the plots go; empty: "
                    "runs/policy_evaluation-<data>-<runtime>-<mode>-N<nodes>-<seed>, with -2, "
                    "-3, ... appended while that name is in use. A given one that holds a "
                    "run's results is refused unless --overwrite.")

  def __post_init__(self):
    for name in ("nodes", "states", "max_updates"):
      value = getattr(self, name)
      if not (_is_int(value) and value >= 1):
        raise ConfigError(name, value, "must be an integer >= 1")
    for name in ("features", "stragglers", "seed", "samples", "max_backoffs", "out_degree"):
      value = getattr(self, name)
      if not (_is_int(value) and value >= 0):
        raise ConfigError(name, value, "must be an integer >= 0")
    if not (_is_int(self.shards) and self.shards >= -1):
      raise ConfigError("shards", self.shards, "must be an integer >= -1 (-1: automatic, 0: one "
                        "per node)")
    self._choice("topology", TOPOLOGIES)
    self._choice("data", DATA)
    self._choice("split", SPLITS)
    self._choice("allocation", FOLLOW)
    self._choice("weights", FOLLOW)
    self._choice("sampling", SAMPLINGS)
    self._choice("mode", MODES)
    self._choice("runtime", RUNTIMES)
    self._choice("delay_dist", DELAY_DISTS)
    self._range("gamma", 0.0, 1.0, "must be in [0, 1)", hi_open=True)
    self._range("drop_prob", 0.0, 1.0, "must be in [0, 1)", hi_open=True)
    self._range("compute_jitter", 0.0, 1.0, "must be in [0, 1)", hi_open=True)
    for name in ("rho", "alpha", "beta", "compute_time", "tol", "max_wall_s"):
      value = getattr(self, name)
      if not (_is_num(value) and value > 0):
        raise ConfigError(name, value, "must be a number > 0")
    if not (_is_num(self.pull_lag) and (self.pull_lag >= 0 or self.pull_lag == -1)):
      raise ConfigError("pull_lag", self.pull_lag, "must be >= 0, or -1 (by runtime)")
    for name in ("delay", "max_time", "straggler_after", "straggler_until", "link_delay_ms"):
      value = getattr(self, name)
      if not (_is_num(value) and value >= 0):
        raise ConfigError(name, value, "must be a number >= 0")
    if not (_is_num(self.straggler_slowdown) and self.straggler_slowdown >= 1):
      raise ConfigError("straggler_slowdown", self.straggler_slowdown, "must be a number >= 1")
    if self.straggler_until and not self.straggler_until > self.straggler_after:
      raise ConfigError("straggler_until", self.straggler_until,
                        f"must be 0 (never) or > --straggler_after={self.straggler_after}")
    if self.stragglers > self.nodes:
      raise ConfigError("stragglers", self.stragglers, f"must be <= --nodes={self.nodes}")
    if self.topology == "random" and self.nodes > 1 and not self.n_out_degree <= self.nodes - 1:
      raise ConfigError("out_degree", self.out_degree,
                        f"must be in [1, {self.nodes - 1}] for --nodes={self.nodes}")
    if (self.topology == "custom") != bool(self.edges):
      raise ConfigError("edges", self.edges, "must be given exactly when --topology=custom")
    if self.split == "parallel" and self.nodes > self.n_samples:
      raise ConfigError("nodes", self.nodes, f"larger than the data (--samples="
                        f"{self.n_samples}); with --split=parallel each node needs at least one "
                        "transition")
    if self.shards > 0 and self.split == "parallel" and self.shards < self.nodes:
      raise ConfigError("shards", self.shards, f"must be -1, 0 or >= --nodes={self.nodes} "
                        "(every node holds at least one shard)")
    if self.split == "parallel" and self.shards > self.n_samples:
      raise ConfigError("shards", self.shards, f"larger than the data (--samples="
                        f"{self.n_samples}); each shard needs at least one transition")
    if self.split == "multi_agent" and self.shards not in (-1, 0, self.nodes):
      raise ConfigError("shards", self.shards, "must be 0 with --split=multi_agent (each node's "
                        "data carries its own rewards and cannot be resharded)")
    if self.split == "multi_agent" and self.allocation == "speed":
      raise ConfigError("allocation", self.allocation, "must be uniform or measured with "
                        "--split=multi_agent (each node's data carries its own rewards; "
                        "measured then moves nothing)")
    if self.mode == "sync" and self.drop_prob > 0:
      raise ConfigError("drop_prob", self.drop_prob,
                        "must be 0 with --mode=sync (a synchronous round waits for every message)")
    if self.mode == "centralized" and self.runtime == "processes":
      raise ConfigError("runtime", self.runtime,
                        "must be simulated with --mode=centralized (one node has no network)")
    if self.runtime == "processes" and self.mode == "sync":
      raise ConfigError("runtime", self.runtime,
                        "processes runs --mode=async only; the sync baseline is simulated")
    if self.link_delay_ms and self.runtime != "processes":
      raise ConfigError("link_delay_ms", self.link_delay_ms, "needs --runtime=processes "
                        "(the simulated network takes --delay)")
    self._check_network()
    if self.data == "mountain_car" and self.features not in (0, 300):
      raise ConfigError("features", self.features,
                        "must be 300 (or 0) with --data=mountain_car: 15 x 20 RBF grid")

  def _check_network(self) -> None:
    for name in ("hosts", "coordinator"):
      value = getattr(self, name)
      if value and self.runtime != "processes":
        raise ConfigError(name, value, "needs --runtime=processes")
    try:
      parse_hosts(self.hosts, self.nodes)
    except ValueError as e:
      raise ConfigError("hosts", self.hosts, str(e)) from None
    if self.coordinator:
      try:
        parse_endpoint(self.coordinator)
      except ValueError as e:
        raise ConfigError("coordinator", self.coordinator, str(e)) from None
    for name in ("curve", "curve_keys"):
      value = getattr(self, name)
      if value and self.runtime != "processes":
        raise ConfigError(name, value, "needs --runtime=processes")
    if self.curve_keys == "-":
      raise ConfigError("curve_keys", "-", "must be a file (only a node reads its keys from "
                        "stdin)")
    if self.coordinator and self.uses_curve and not self.curve_keys:
      raise ConfigError("curve_keys", self.curve_keys, "must be given with --coordinator when "
                        "CURVE is on (--curve, or an address that is not loopback): the nodes "
                        "started elsewhere need the same keys; experiments/launch/"
                        "policy_evaluation_hosts.py makes them")

  def _choice(self, name: str, allowed: tuple[str, ...]) -> None:
    value = getattr(self, name)
    if value not in allowed:
      raise ConfigError(name, value, f"must be one of {', '.join(allowed)}")

  def _range(self, name: str, lo: float, hi: float, allowed: str, hi_open: bool) -> None:
    value = getattr(self, name)
    ok = _is_num(value) and lo <= value and (value < hi if hi_open else value <= hi)
    if not ok:
      raise ConfigError(name, value, allowed)

  @property
  def host_addrs(self) -> tuple[str, ...]:
    """The address each node listens on."""
    return parse_hosts(self.hosts, self.nodes)

  @property
  def uses_curve(self) -> bool:
    """CURVE on every socket: asked for, keys given, or an address that is not loopback."""
    if self.runtime != "processes":
      return False
    addrs = list(self.host_addrs)
    if self.coordinator:
      addrs.append(parse_endpoint(self.coordinator)[0])
    return bool(self.curve or self.curve_keys) or not all(is_loopback(a) for a in addrs)

  @property
  def dim(self) -> int:
    return self.features or DEFAULT_FEATURES[self.data]

  @property
  def n_out_degree(self) -> int:
    return self.out_degree or max(1, min(2, self.nodes - 1))

  @property
  def n_pull_lag(self) -> float:
    if self.pull_lag >= 0:
      return float(self.pull_lag)
    return 0.0 if self.runtime == "processes" else 2.0

  @property
  def n_samples(self) -> int:
    return self.samples or DEFAULT_SAMPLES[self.data]

  @property
  def n_shards(self) -> int:
    """K as `problem.split_rows` takes it (0: one shard per node)."""
    if self.split == "multi_agent":
      return 0
    if self.shards >= 0:
      return self.shards
    return self.nodes * max(1, self.n_samples // (self.nodes * SHARD_ROWS))

  @property
  def adapts(self) -> bool:
    """Whether the layout follows speeds measured during the run (simulated async only)."""
    return (self.runtime == "simulated" and self.mode == "async"
            and "measured" in (self.allocation, self.weights))

  @property
  def plan(self):
    """The `adaptive.Plan` of a simulated async run."""
    from jaxrl_async.decentralized.adaptive import Plan

    return Plan(self.allocation, self.weights, tuple(1.0 / s for s in self.slowdowns))

  @property
  def slowdowns(self) -> tuple[float, ...]:
    """Per-node compute-time factors: the first `stragglers` nodes are slow."""
    return tuple(float(self.straggler_slowdown) if i < self.stragglers else 1.0
                 for i in range(self.nodes))

  @property
  def speeds(self) -> tuple[float, ...] | None:
    """Relative node speeds the problem's own allocation follows: None (uniform; a measured
    allocation starts uniform) or 1 / slowdown."""
    if self.allocation != "speed":
      return None
    return tuple(1.0 / s for s in self.slowdowns)

  @property
  def weight_speeds(self) -> tuple[float, ...] | None:
    """Relative node speeds the graph's own weights follow: None (uniform; measured weights
    start uniform) or 1 / slowdown."""
    if self.weights != "speed":
      return None
    return tuple(1.0 / s for s in self.slowdowns)

  @staticmethod
  def flag_fields() -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(PolicyEvalConfig)}

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)
