"""A run from a `PolicyEvalConfig`: build the problem, graph and timing, run, write the results.

Shared by `experiments/policy_evaluation.py` and the benchmark suite, so both measure the same
thing. Outputs in the run directory: `metrics.jsonl` (one record per progress snapshot),
`summary.json` (headline numbers plus the resolved config) and two PNGs of every node's
||theta_i - theta*|| / ||theta*||, against updates k and against (virtual or wall) time.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from jaxrl_async.decentralized import graphs, transport
from jaxrl_async.decentralized import problem as problem_lib
from jaxrl_async.decentralized.config import ConfigError, PolicyEvalConfig
from jaxrl_async.decentralized.schedule import Timing
from jaxrl_async.decentralized.simulator import RunResult, fit_rate
from jaxrl_async.decentralized.transport import check_bindable, parse_endpoint


def make_problem(config: PolicyEvalConfig) -> problem_lib.Problem:
  if config.data == "mountain_car":
    from jaxrl_async.decentralized.mountain_car import mountain_car  # imports EnvPool

    return mountain_car(config.seed, config.nodes, config.n_samples, config.gamma, config.rho,
                        config.split, config.n_shards, config.speeds)
  return problem_lib.random_mdp(config.seed, config.nodes, config.n_samples, config.dim,
                                config.states, config.gamma, config.rho, config.split,
                                config.n_shards, config.speeds)


def make_graph(config: PolicyEvalConfig) -> graphs.Graph:
  return graphs.make(config.topology, config.nodes, config.n_out_degree, config.seed,
                     config.edges, config.weight_speeds)


def make_timing(config: PolicyEvalConfig) -> Timing:
  return Timing(config.compute_time, config.compute_jitter, config.slowdowns, config.delay,
                config.delay_dist, config.drop_prob, config.seed, config.straggler_after,
                config.straggler_until or math.inf)


def run(config: PolicyEvalConfig, problem: problem_lib.Problem | None = None,
        on_record: Callable[[dict[str, Any]], None] | None = None) -> RunResult:
  """Run `config` to its tolerance or budget (raises simulator.DivergenceError on blow-up)."""
  problem = make_problem(config) if problem is None else problem
  graph = make_graph(config) if config.mode != "centralized" else None
  if config.runtime == "processes":
    from jaxrl_async.decentralized.processes import run_processes

    coordinator = parse_endpoint(config.coordinator) if config.coordinator else None
    return run_processes(problem, graph, config.alpha, config.beta, config.sampling,
                         config.seed, config.tol, config.max_wall_s, config.slowdowns,
                         on_record=on_record, pull_lag=config.n_pull_lag,
                         hosts=config.host_addrs, coordinator=coordinator,
                         keys=curve_keys(config), faults=make_faults(config),
                         plan=config.plan,
                         max_backoffs=config.max_backoffs)
  from jaxrl_async.decentralized import simulator

  sim = simulator.build(problem, graph, config.mode, make_timing(config), config.alpha,
                        config.beta, config.sampling, config.seed, pull_lag=config.n_pull_lag,
                        plan=config.plan if config.adapts else None)
  return simulator.run(sim, config.tol, config.max_updates, config.max_time or math.inf,
                       config.max_wall_s, on_record=on_record, backoffs=config.max_backoffs)


def make_faults(config: PolicyEvalConfig) -> dict[str, Any]:
  """What the process runtime injects into its links and nodes (`processes.Faults`)."""
  return {"drop_prob": config.drop_prob, "delay_s": config.link_delay_ms / 1000.0,
          "delay_dist": config.delay_dist, "slow_from_s": config.straggler_after,
          "slow_until_s": config.straggler_until or math.inf}


RESULT_FILES = ("summary.json", "metrics.jsonl")


def default_run_dir_name(config: PolicyEvalConfig) -> str:
  return (f"policy_evaluation-{config.data}-{config.runtime}-{config.mode}-N{config.nodes}"
          f"-{config.seed}")


def check_run_dir(config: PolicyEvalConfig, overwrite: bool = False) -> None:
  """Refuses (ConfigError naming --run_dir) an explicit --run_dir that holds a run's results,
  unless `overwrite`. A default-named run dir is never refused: `claim_run_dir` moves past it."""
  path = Path(config.run_dir) if config.run_dir else None
  if path is None or overwrite:
    return
  held = [name for name in RESULT_FILES if (path / name).exists()]
  if held:
    raise ConfigError("run_dir", str(path), f"already holds a run's {held[0]}; give another "
                      "--run_dir, or --overwrite to replace that run's results")


def curve_keys(config: PolicyEvalConfig) -> dict[str, Any] | None:
  """The run's CURVE keys: read from --curve_keys, made here, or None when CURVE is off.
  ConfigError naming --curve_keys when the file will not do."""
  if not config.uses_curve:
    return None
  if not config.curve_keys:
    return transport.make_keys(config.nodes)
  started_here = range(0) if config.coordinator else range(config.nodes)
  try:
    return transport.read_keys(config.curve_keys, config.nodes, started_here)
  except ValueError as e:
    raise ConfigError("curve_keys", config.curve_keys, str(e)) from None


def check_network(config: PolicyEvalConfig) -> None:
  """Refuses (ConfigError naming the flag) addresses this machine cannot listen on (every
  --hosts address when this process starts the nodes itself, else the --coordinator endpoint)
  and a --curve_keys file that will not do."""
  if config.runtime != "processes":
    return
  if config.curve_keys:
    curve_keys(config)
  if config.coordinator:
    addr, port = parse_endpoint(config.coordinator)
    flag, value, checks = "coordinator", config.coordinator, [(addr, port)]
  else:
    flag, value, checks = "hosts", config.hosts, [(a, 0) for a in sorted(set(config.host_addrs))]
  for addr, port in checks:
    try:
      check_bindable(addr, port)
    except ValueError as e:
      raise ConfigError(flag, value, str(e)) from None


def claim_run_dir(config: PolicyEvalConfig, root: Path = Path("runs")) -> Path:
  """Creates and returns the run's directory: --run_dir when given, else
  ROOT/policy_evaluation-<data>-<runtime>-<mode>-N<nodes>-<seed>, with -2, -3, ... appended
  while that name is in use (a non-empty directory), so the same command run again, or one that
  differs only in a flag outside the name, starts a new run instead of overwriting one."""
  if config.run_dir:
    path = Path(config.run_dir)
    path.mkdir(parents=True, exist_ok=True)
    return path
  base = root / default_run_dir_name(config)
  path, n = base, 1
  while True:
    try:
      path.mkdir(parents=True)  # atomic: two runs started together cannot both take one name
      return path
    except FileExistsError:
      if path.is_dir() and not any(path.iterdir()):
        return path  # an empty folder, as a run interrupted before its first record leaves
    n += 1
    path = base.with_name(f"{base.name}-{n}")


def summary(config: PolicyEvalConfig, result: RunResult, problem: problem_lib.Problem
            ) -> dict[str, Any]:
  """The headline numbers of a run, JSON-ready."""
  clock = "wall_s" if config.runtime == "processes" else "virtual_time"
  out = {
      "final_rel_error": result.final_rel_error,
      "node_rel_errors": [float(e) for e in result.node_err[-1]],
      "updates": int(result.updates),
      clock: float(result.elapsed),
      "host_wall_s": float(result.wall_s),
      "rate_c": fit_rate(result.k, result.worst),
      "consensus_error": result.consensus_error,
      "stopped": result.stopped,
      "time_to": {f"{t:g}": result.time_to(t) for t in sorted(result.crossings, reverse=True)},
      "updates_to": {f"{t:g}": result.updates_to(t)
                     for t in sorted(result.crossings, reverse=True)},
      "theta_star_norm": float(np.linalg.norm(result.theta_star)),
      "rows_per_node": [int(c) for c in problem.count],
      "shards": problem.shards,
      "config": config.to_dict(),
  }
  out.update({k: v for k, v in result.extra.items() if isinstance(v, int | float | list)})
  out["samples"], out["allocation_final"] = problem.count.sum().item(), _final_allocation(result)
  return out


def _final_allocation(result: RunResult) -> list[int] | None:
  """Shards per node after the last re-plan, None when the layout never changed."""
  plans = [e for e in result.extra.get("events", []) if "shards_per_node" in e]
  return plans[-1]["shards_per_node"] if plans else None


def plot(result: RunResult, out_dir: Path, title: str, time_label: str = "virtual time"
         ) -> list[Path]:
  """errors_vs_k.png and errors_vs_time.png: every node's relative error, log scale."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  paths = []
  for name, x_nodes, x_worst, label in (
      ("errors_vs_k.png", result.node_k, result.k, "updates k (all nodes)"),
      ("errors_vs_time.png", result.node_time, result.time, time_label)):
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for i in range(result.node_err.shape[1]):
      ax.semilogy(x_nodes, result.node_err[:, i], lw=0.8, alpha=0.6,
                  label=f"node {i}" if result.node_err.shape[1] <= 8 else None)
    ax.semilogy(x_worst, result.worst, "k--", lw=1.0, label="worst node")
    ax.set_xlabel(label)
    ax.set_ylabel("||theta_i - theta*|| / ||theta*||")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_dir / name, dpi=110)
    plt.close(fig)
    paths.append(out_dir / name)
  return paths


class MetricsWriter:
  """Appends one JSON object per record to metrics.jsonl."""

  def __init__(self, path: Path):
    self.path = path
    self._file = path.open("w")

  def __call__(self, record: dict[str, Any]) -> None:
    self._file.write(json.dumps(record) + "\n")
    self._file.flush()

  def close(self) -> None:
    self._file.close()
