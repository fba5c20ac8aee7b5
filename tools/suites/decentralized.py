"""Decentralized policy evaluation: exactness and rate, speed-up, stragglers, real processes.

    python -m tools.benchmark decentralized [--quick] [--tiny]

Tables (rows are JSON objects with a `table` key):
  rate       the default problem run to 1e-10 by async, sync and centralized: final worst-node
             relative error, fitted c (error ~ c^k), consensus error, distance between methods.
  speedup    virtual time to relative error 1e-6 for N = 1, 2, 4, 8, 16 on the same data split
             N ways (random MDP, d = 20, exponential graph); primal step alpha in {20, 40} per
             pass (beta = 160): each N's best, and parallel efficiency T(1) / (N T(N)); and
             one fixed alpha = 20 for every N with --pull_lag L in {1.2, 2} (node i's step
             times 1 + (1 - a_ii) L; L = 1.2 is the measured staleness of a held copy).
             One shard per node, so theta* changes with N.
  speedup_fixed_shards  the same runs and columns with the data cut into K shards for every N
             (--shards=K, node i holds K / N of them): one problem, one theta*, for all N.
  stragglers N = 8, node 0 ten times slower: time to 1e-6 of async and sync push-pull (alpha 20
             and 40) with and without the straggler, and the growth factor, for one shard per
             node (the per-node problem; nothing can move) and for K = 80 shards spread
             uniformly or by speed (--allocation=speed --weights=speed, the remedy). theta*
             depends on the shards only, so all rows with the same K solve the same problem;
             "no straggler" is the uniform allocation (speed with equal speeds is the same).
  processes  the real runtime (one OS process per node, ZeroMQ) with 2 and 4 nodes: wall time
             to 1e-6 and the distance to the simulator's theta*.
Virtual time is deterministic; wall times depend on the machine and its load.
"""

from __future__ import annotations

import math
import traceback
from pathlib import Path
from typing import Any

import numpy as np

from tools.bench_common import Progress, SuiteResult, md_table

SIZES = {  # total samples of the speed-up / straggler problems, and the real-runtime problem
    # Straggler shards: a 10x straggler's quota of K shards is K / 71, so K = 80 gives it one
    # and the others 11-12 (within 6% of equal pass times); shards need about 80+ rows, below
    # that C_s is ill-conditioned and the default steps are at their edge (measured at 40).
    # Fixed shards: K must be a multiple of every N. K = 16 is the coarsest (800 rows a shard
    # at full size; N = 16 is then the one-shard-per-node problem), K = 80 is the straggler
    # problem (160 rows a shard).
    "full": {"speedup_samples": 12800, "straggler_samples": 12800, "straggler_shards": 80,
             "rate_samples": 1600, "process_samples": 1600, "nodes": (1, 2, 4, 8, 16),
             "process_nodes": (2, 4), "fixed_shards": (16, 80)},
    "quick": {"speedup_samples": 2400, "straggler_samples": 6400, "straggler_shards": 80,
              "rate_samples": 800, "process_samples": 800, "nodes": (1, 2, 4, 8, 16),
              "process_nodes": (2, 4), "fixed_shards": (16,)},
    "tiny": {"speedup_samples": 400, "straggler_samples": 800, "straggler_shards": 0,
             "rate_samples": 240, "process_samples": 200, "nodes": (1, 2, 4),
             "process_nodes": (2,), "fixed_shards": (4,)},
}
ALPHAS = (20.0, 40.0)
PULL_LAGS = (1.2, 2.0)  # with alpha = ALPHAS[0]
BETA = 160.0
STRAGGLER_NODES, SLOWDOWN = 8, 10.0


def _problem(samples: int, nodes: int, features: int = 20, shards: int = 0, speeds=None):
  from jaxrl_async.decentralized.problem import random_mdp

  return random_mdp(0, nodes, samples, features, states=50 if features == 20 else 20,
                    shards=shards, speeds=speeds)


def _simulate(problem, nodes: int, mode: str, alpha: float, tol: float, slowdown=(),
              max_time: float = math.inf, max_updates: int = 60_000_000, speeds=None,
              pull_lag: float = 0.0):
  from jaxrl_async.decentralized import graphs, simulator
  from jaxrl_async.decentralized.schedule import Timing

  graph = graphs.exponential(nodes).with_speeds(speeds) if mode != "centralized" else None
  sim = simulator.build(problem, graph, mode, Timing(slowdown=slowdown), alpha, BETA,
                        pull_lag=pull_lag)
  return simulator.run(sim, tol=tol, max_updates=max_updates, max_time=max_time)


def rate_rows(size: dict[str, Any], out_dir: Path, progress: Progress) -> tuple[list, list]:
  from jaxrl_async.decentralized.experiment import plot
  from jaxrl_async.decentralized.simulator import fit_rate

  problem = _problem(size["rate_samples"], 4, 20 if size["rate_samples"] >= 800 else 8)
  rows, plots, thetas = [], [], {}
  for mode in ("async", "sync", "centralized"):
    r = _simulate(problem, 4, mode, ALPHAS[0], 1e-10)
    thetas[mode] = r.theta.mean(axis=0)
    rows.append({"table": "rate", "mode": mode, "nodes": 4 if mode != "centralized" else 1,
                 "problem": problem.name, "final_rel_error": r.final_rel_error,
                 "updates": r.updates, "virtual_time": r.elapsed, "rate_c": fit_rate(r.k, r.worst),
                 "one_minus_c": 1.0 - fit_rate(r.k, r.worst),
                 "consensus_error": r.consensus_error, "time_to_1e-6": r.time_to(1e-6),
                 "host_wall_s": r.wall_s})
    if mode == "async":
      sub = out_dir / "rate_async"
      sub.mkdir(parents=True, exist_ok=True)
      plots += [str(p.relative_to(out_dir)) for p in
                plot(r, sub, f"{problem.name}\nasync, exponential, N=4")]
    progress.step(f"rate {mode}: final {r.final_rel_error:.2e} c={rows[-1]['rate_c']:.8f}")
  norm = np.linalg.norm(problem.theta_star())
  for row in rows:
    row["rel_dist_to_async"] = float(np.linalg.norm(thetas[row["mode"]] - thetas["async"]) / norm)
  return rows, plots


def speedup_rows(size: dict[str, Any], progress: Progress, shards: int = 0) -> list[dict[str, Any]]:
  """Time to 1e-6 against N; shards = 0: one shard per node, else the same K shards for all N."""
  rows, table = [], "speedup_fixed_shards" if shards else "speedup"
  for n in size["nodes"]:
    problem = _problem(size["speedup_samples"], n, shards=shards)
    row: dict[str, Any] = {"table": table, "nodes": n, "shards": shards or n,
                           "samples": size["speedup_samples"],
                           "rows_per_node": int(problem.count[0])}
    for alpha in ALPHAS:
      key = f"T_alpha{alpha:g}"
      cap = 3.0 * row.get(f"T_alpha{ALPHAS[0]:g}") if row.get(f"T_alpha{ALPHAS[0]:g}") else math.inf
      try:
        r = _simulate(problem, n, "async", alpha, 1e-6, max_time=cap)
        row[key], row[f"k_alpha{alpha:g}"] = r.time_to(1e-6), r.updates_to(1e-6)
        if row[key] is None:  # not diverged: slower than the cap (3x alpha = 20's time)
          row[f"note_alpha{alpha:g}"] = f"stopped by {r.stopped} at {r.final_rel_error:.2e}"
      except Exception as e:  # noqa: BLE001 - a diverging step is a result, not a crash
        row[key] = None
        row[f"note_alpha{alpha:g}"] = type(e).__name__
      progress.step(f"{table} K={shards or n} N={n} alpha={alpha:g}: T={row[key]}")
    for lag in PULL_LAGS:  # one node has no in-neighbours: the factor is 1 there
      key = f"T_lag{lag:g}"
      if n == 1:
        row[key] = row[f"T_alpha{ALPHAS[0]:g}"]
        continue
      try:
        r = _simulate(problem, n, "async", ALPHAS[0], 1e-6, pull_lag=lag,
                      max_time=3.0 * rows[0][f"T_alpha{ALPHAS[0]:g}"] / n
                      if rows and rows[0].get(f"T_alpha{ALPHAS[0]:g}") else math.inf)
        row[key] = r.time_to(1e-6)
        if row[key] is None:
          row[f"note_lag{lag:g}"] = f"stopped by {r.stopped} at {r.final_rel_error:.2e}"
      except Exception as e:  # noqa: BLE001 - a diverging step is a result, not a crash
        row[key], row[f"note_lag{lag:g}"] = None, type(e).__name__
      progress.step(f"{table} K={shards or n} N={n} alpha={ALPHAS[0]:g} pull_lag={lag:g}: "
                    f"T={row[key]}")
    times = {a: row[f"T_alpha{a:g}"] for a in ALPHAS if row.get(f"T_alpha{a:g}")}
    if times:
      best = min(times, key=times.get)
      row["alpha_best"], row["T_best"] = best, times[best]
    else:
      row["error"] = "no step size reached 1e-6"
    notes = [f"{k[5:]}: {v}" for k, v in row.items() if k.startswith("note_")]
    if notes:
      row["notes"] = "; ".join(notes)
    rows.append(row)
  t1_best = rows[0].get("T_best")
  t1_20 = rows[0].get(f"T_alpha{ALPHAS[0]:g}")
  for row in rows:
    n = row["nodes"]
    if t1_best and row.get("T_best"):
      row["efficiency_best"] = t1_best / (n * row["T_best"])
      row["speedup_best"] = t1_best / row["T_best"]
    if t1_20 and row.get(f"T_alpha{ALPHAS[0]:g}"):
      row["efficiency_alpha20"] = t1_20 / (n * row[f"T_alpha{ALPHAS[0]:g}"])
    for lag in PULL_LAGS:
      if t1_20 and row.get(f"T_lag{lag:g}"):
        row[f"efficiency_lag{lag:g}"] = t1_20 / (n * row[f"T_lag{lag:g}"])
  return rows


def straggler_rows(size: dict[str, Any], progress: Progress) -> list[dict[str, Any]]:
  n, samples = STRAGGLER_NODES, size["straggler_samples"]
  slow = (SLOWDOWN,) + (1.0,) * (n - 1)
  speeds = tuple(1.0 / s for s in slow)
  variants = [(0, "uniform")]  # (shards, allocation and weights); 0: one shard per node
  if size["straggler_shards"]:
    variants += [(size["straggler_shards"], "uniform"), (size["straggler_shards"], "speed")]
  rows = []
  for mode in ("async", "sync"):
    for alpha in ALPHAS:
      base: dict[int, float | None] = {}
      for shards, alloc in variants:
        row: dict[str, Any] = {"table": "stragglers", "mode": mode, "nodes": n,
                               "slowdown": SLOWDOWN, "alpha": alpha, "samples": samples,
                               "shards": shards or n, "allocation": alloc, "weights": alloc}
        if shards not in base:  # no straggler: equal speeds, so uniform == speed
          try:
            r = _simulate(_problem(samples, n, shards=shards), n, mode, alpha, 1e-6)
            base[shards] = r.time_to(1e-6)
          except Exception as e:  # noqa: BLE001 - a diverging step is a result, not a crash
            base[shards], row["note"] = None, f"no straggler: {type(e).__name__}"
          progress.step(f"stragglers {mode} alpha={alpha:g} K={shards or n}: none {base[shards]}")
        problem = _problem(samples, n, shards=shards, speeds=speeds if alloc == "speed" else None)
        row["rows_straggler"] = int(problem.count[0])
        row["rows_other"] = int(problem.count[1:].max())
        row["T_no_straggler"] = base[shards]
        try:
          r = _simulate(problem, n, mode, alpha, 1e-6, slowdown=slow,
                        speeds=speeds if alloc == "speed" else None)
          row["T_one_straggler"] = r.time_to(1e-6)
        except Exception as e:  # noqa: BLE001 - a diverging step is a result, not a crash
          row["T_one_straggler"], row["note"] = None, type(e).__name__
        progress.step(f"stragglers {mode} alpha={alpha:g} K={shards or n} {alloc}: "
                      f"{row['T_one_straggler']}")
        if row["T_no_straggler"] and row["T_one_straggler"]:
          row["growth"] = row["T_one_straggler"] / row["T_no_straggler"]
        else:
          row["error"] = "did not reach 1e-6"
        rows.append(row)
  return rows


def process_rows(size: dict[str, Any], progress: Progress) -> list[dict[str, Any]]:
  from jaxrl_async.decentralized import graphs
  from jaxrl_async.decentralized.processes import run_processes

  rows = []
  for n in size["process_nodes"]:
    problem = _problem(size["process_samples"], n)
    row: dict[str, Any] = {"table": "processes", "nodes": n, "problem": problem.name}
    try:
      r = run_processes(problem, graphs.exponential(n), ALPHAS[0], BETA, tol=1e-6,
                        max_wall_s=240.0)
      theta_star = problem.theta_star()
      row.update({"stopped": r.stopped, "final_rel_error": r.final_rel_error,
                  "wall_s_to_1e-6": r.time_to(1e-6), "updates": r.updates,
                  "updates_per_s": r.updates / max(r.wall_s, 1e-9),
                  "dropped_sends": r.extra.get("dropped_sends"),
                  "max_rel_dist_to_theta_star": float(np.max(
                      np.linalg.norm(r.theta - theta_star, axis=1)) / np.linalg.norm(theta_star))})
      if r.stopped != "tol":
        row["error"] = f"stopped by {r.stopped} at {r.final_rel_error:.2e}"
    except Exception as e:  # noqa: BLE001 - record and go on to the next row
      row["error"] = f"{type(e).__name__}: {e}"[:500]
      traceback.print_exc()
    rows.append(row)
    progress.step(f"processes N={n}: {row.get('wall_s_to_1e-6')} s")
  return rows


def plot_speedup(rows: list[dict[str, Any]], out_dir: Path, name: str = "speedup.png") -> str:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(5.4, 3.8))
  ns = [r["nodes"] for r in rows]
  for key, label in ((f"T_alpha{ALPHAS[0]:g}", f"alpha={ALPHAS[0]:g}"),
                     (f"T_alpha{ALPHAS[1]:g}", f"alpha={ALPHAS[1]:g}"), ("T_best", "best")):
    pts = [(r["nodes"], r[key]) for r in rows if r.get(key)]
    if pts:
      ax.loglog(*zip(*pts, strict=True), "o-", label=label)
  if rows[0].get("T_best"):
    ax.loglog(ns, [rows[0]["T_best"] / n for n in ns], "k:", label="ideal T(1)/N")
  if rows[0]["table"] == "speedup_fixed_shards":
    ax.set_title(f"{rows[0]['shards']} shards for every N", fontsize=9)
  ax.set_xlabel("nodes N (same total data)")
  ax.set_ylabel("virtual time to 1e-6")
  ax.legend(fontsize=8)
  ax.grid(True, which="both", alpha=0.3)
  fig.tight_layout()
  fig.savefig(out_dir / name, dpi=110)
  plt.close(fig)
  return name


def run(out_dir: Path, quick: bool, tiny: bool = False) -> SuiteResult:
  out_dir.mkdir(parents=True, exist_ok=True)
  size = SIZES["tiny" if tiny else "quick" if quick else "full"]
  variants = 3 if size["straggler_shards"] else 1
  per_speedup = (len(ALPHAS) + len(PULL_LAGS)) * len(size["nodes"]) - len(PULL_LAGS)
  steps = (3 + per_speedup * (1 + len(size["fixed_shards"]))
           + 2 * len(ALPHAS) * (variants + (2 if variants > 1 else 1))
           + len(size["process_nodes"]))
  progress = Progress(steps, "decentralized")
  rate, plots = rate_rows(size, out_dir, progress)
  speed = speedup_rows(size, progress)
  plots.append(plot_speedup(speed, out_dir))
  fixed = []
  for k in size["fixed_shards"]:
    fixed_k = speedup_rows(size, progress, shards=k)
    plots.append(plot_speedup(fixed_k, out_dir, f"speedup_fixed_shards_K{k}.png"))
    fixed += fixed_k
  speed_cols = (["nodes", "shards", "rows_per_node", f"T_alpha{ALPHAS[0]:g}",
                 f"T_alpha{ALPHAS[1]:g}", "alpha_best", "T_best", "speedup_best",
                 "efficiency_best", "efficiency_alpha20"]
                + [c for lag in PULL_LAGS for c in (f"T_lag{lag:g}", f"efficiency_lag{lag:g}")]
                + ["notes"])
  strag = straggler_rows(size, progress)
  procs = process_rows(size, progress)
  tables = (
      "## Exactness and rate (random MDP, N = 4, exponential graph, to 1e-10)\n\n"
      + md_table(rate, ["mode", "nodes", "final_rel_error", "one_minus_c", "consensus_error",
                        "updates", "virtual_time", "rel_dist_to_async"])
      + f"\n## Speed-up: virtual time to 1e-6, {size['speedup_samples']} samples split N ways "
      f"(beta = {BETA:g})\n\n"
      + md_table(speed, speed_cols)
      + f"\n## Speed-up with fixed shards: the same K shards (one theta*) for every N, "
      f"{size['speedup_samples']} samples, virtual time to 1e-6 (beta = {BETA:g})\n\n"
      + md_table(fixed, speed_cols)
      + f"\n## Stragglers: N = {STRAGGLER_NODES}, node 0 {SLOWDOWN:g}x slower, "
      f"{size['straggler_samples']} samples, virtual time to 1e-6 (allocation = weights)\n\n"
      + md_table(strag, ["mode", "alpha", "shards", "allocation", "rows_straggler",
                         "rows_other", "T_no_straggler", "T_one_straggler", "growth", "note"])
      + "\n## Real processes (ZeroMQ, one OS process per node), wall time to 1e-6\n\n"
      + md_table(procs, ["nodes", "problem", "wall_s_to_1e-6", "updates", "updates_per_s",
                         "final_rel_error", "max_rel_dist_to_theta_star", "dropped_sends",
                         "error"]))
  return SuiteResult(rows=rate + speed + fixed + strag + procs, tables_md=tables,
                     config={"sizes": size, "alphas": ALPHAS, "beta": BETA,
                             "pull_lags": PULL_LAGS, "fixed_shards": size["fixed_shards"],
                             "straggler_nodes": STRAGGLER_NODES, "slowdown": SLOWDOWN},
                     plots=plots)


# ----------------------------------------------------------------------------------------------
# Default flags (issue 20): every run below is `python -m experiments.policy_evaluation` with
# only the named flags changed, through the same `experiment.run`.

DEFAULT_NODES = (1, 2, 4, 8, 16)
CONVERGENCE_NODES = (2, 4, 8, 16)
TOPOLOGY_FAMILIES = ("ring", "exponential", "random")


def _defaults(tol: float, **flags: Any):
  from jaxrl_async.decentralized import experiment
  from jaxrl_async.decentralized.config import PolicyEvalConfig

  config = PolicyEvalConfig(tol=tol, max_wall_s=3000.0, **flags)
  return config, experiment.run(config)


def defaults_speedup_rows(progress: Progress, nodes=DEFAULT_NODES) -> list[dict[str, Any]]:
  """Virtual time to 1e-6 and 1e-8 at default flags for each N (one problem: 80 shards)."""
  rows = []
  for n in nodes:
    config, r = _defaults(1e-8, nodes=n)
    rows.append({"table": "defaults_speedup", "nodes": n, "shards": config.n_shards,
                 "T_1e-6": r.time_to(1e-6), "T_1e-8": r.time_to(1e-8),
                 "updates_1e-8": r.updates_to(1e-8), "step_backoffs": r.extra["step_backoffs"]})
    progress.step(f"defaults speedup N={n}: {rows[-1]['T_1e-8']}")
  for key in ("1e-6", "1e-8"):
    t1 = rows[0][f"T_{key}"]
    for row in rows:
      if t1 and row[f"T_{key}"]:
        row[f"efficiency_{key}"] = t1 / (row["nodes"] * row[f"T_{key}"])
  return rows


def defaults_straggler_rows(progress: Progress) -> list[dict[str, Any]]:
  """N = 8, node 0 10x slower from the start, from t = 5e4, or in [5e4, 1e5); async (speeds
  measured, nothing declared) and sync; growth against no straggler, at default flags."""
  cases = [("none", {}), ("from start", {"stragglers": 1}),
           ("from 5e4", {"stragglers": 1, "straggler_after": 5e4}),
           ("5e4 to 1e5", {"stragglers": 1, "straggler_after": 5e4, "straggler_until": 1e5})]
  rows = []
  for mode in ("async", "sync"):
    base = None
    for name, flags in cases:
      if mode == "sync" and name != "none" and name != "from start":
        continue
      _, r = _defaults(1e-8, nodes=STRAGGLER_NODES, mode=mode, straggler_slowdown=SLOWDOWN,
                       **flags)
      row = {"table": "defaults_stragglers", "mode": mode, "straggler": name,
             "T_1e-6": r.time_to(1e-6), "T_1e-8": r.time_to(1e-8),
             "replans": r.extra["replans"], "step_backoffs": r.extra["step_backoffs"]}
      base = base or row
      for key in ("1e-6", "1e-8"):
        if base[f"T_{key}"] and row[f"T_{key}"]:
          row[f"growth_{key}"] = row[f"T_{key}"] / base[f"T_{key}"]
      rows.append(row)
      progress.step(f"defaults stragglers {mode} {name}: {row['T_1e-8']}")
  return rows


def convergence_rows(progress: Progress, data: tuple[str, ...] = ("random_mdp", "mountain_car"),
                     nodes=CONVERGENCE_NODES, topologies=TOPOLOGY_FAMILIES
                     ) -> list[dict[str, Any]]:
  """Default flags to relative error 1e-8 for every N, data set and graph family."""
  rows = []
  for name in data:
    for topology in topologies:
      for n in nodes:
        row: dict[str, Any] = {"table": "convergence", "data": name, "topology": topology,
                               "nodes": n}
        try:
          config, r = _defaults(1e-8, nodes=n, data=name, topology=topology)
          row.update(shards=config.n_shards, stopped=r.stopped,
                     final_rel_error=r.final_rel_error, updates=r.updates,
                     virtual_time=r.elapsed, step_backoffs=r.extra["step_backoffs"],
                     host_wall_s=r.wall_s)
        except Exception as e:  # noqa: BLE001 - record and go on to the next row
          row["error"] = f"{type(e).__name__}: {e}"[:300]
        rows.append(row)
        progress.step(f"convergence {name} {topology} N={n}: {row.get('final_rel_error')}")
  return rows


FAULTS = (("clean", {}), ("drop 0.3", {"drop_prob": 0.3}),
          ("delay 1 ms exp.", {"link_delay_ms": 1.0, "delay_dist": "exponential"}),
          ("drop 0.3 + delay 1 ms exp.", {"drop_prob": 0.3, "link_delay_ms": 1.0,
                                          "delay_dist": "exponential"}))


def fault_rows(progress: Progress, nodes: int = 4) -> list[dict[str, Any]]:
  """The process runtime (real ZeroMQ sockets) with loss and delay injected in every node's
  links (`processes.Links`): wall time and updates to 1e-6, default flags otherwise, on a
  small problem (400 samples, d = 8) so that the four variants fit in minutes."""
  rows = []
  for name, flags in FAULTS:
    row: dict[str, Any] = {"table": "faults", "nodes": nodes, "faults": name}
    try:
      _, r = _defaults(1e-6, runtime="processes", nodes=nodes, samples=400, features=8,
                       states=20, **flags)
      row.update(stopped=r.stopped, wall_s_to_1e6=r.time_to(1e-6), updates=r.updates,
                 final_rel_error=r.final_rel_error, injected_drops=r.extra["injected_drops"],
                 queue_drops=r.extra["dropped_sends"], replans=r.extra["replans"],
                 step_backoffs=r.extra["step_backoffs"])
    except Exception as e:  # noqa: BLE001 - record and go on to the next row
      row["error"] = f"{type(e).__name__}: {e}"[:300]
    rows.append(row)
    progress.step(f"faults {name}: {row.get('wall_s_to_1e6')}")
  return rows


def defaults_tables(rows: list[dict[str, Any]]) -> str:
  by = {t: [r for r in rows if r["table"] == t] for t in
        ("defaults_speedup", "defaults_stragglers", "convergence", "faults")}
  out = ""
  if by["defaults_speedup"]:
    out += ("## Speed-up at default flags (80 shards of 160 rows, one problem for every N)\n\n"
            + md_table(by["defaults_speedup"], ["nodes", "shards", "T_1e-6", "efficiency_1e-6",
                                                "T_1e-8", "efficiency_1e-8", "updates_1e-8",
                                                "step_backoffs"]))
  if by["defaults_stragglers"]:
    out += (f"\n## Stragglers at default flags: N = {STRAGGLER_NODES}, node 0 {SLOWDOWN:g}x "
            "slower (measured, not declared)\n\n"
            + md_table(by["defaults_stragglers"], ["mode", "straggler", "T_1e-6", "growth_1e-6",
                                                   "T_1e-8", "growth_1e-8", "replans",
                                                   "step_backoffs"]))
  if by["convergence"]:
    out += ("\n## Default flags to 1e-8: every N, data set and graph family\n\n"
            + md_table(by["convergence"], ["data", "topology", "nodes", "shards", "stopped",
                                           "final_rel_error", "updates", "virtual_time",
                                           "step_backoffs", "host_wall_s", "error"]))
  if by["faults"]:
    out += ("\n## Real sockets with injected loss and delay (4 processes, 400 samples, d = 8, "
            "to 1e-6)\n\n"
            + md_table(by["faults"], ["faults", "stopped", "wall_s_to_1e6", "updates",
                                      "final_rel_error", "injected_drops", "queue_drops",
                                      "replans", "step_backoffs", "error"]))
  return out


def main(argv: list[str] | None = None) -> int:
  """`python -m tools.suites.decentralized --tables=defaults_speedup,defaults_stragglers,
  convergence,faults [--data=random_mdp] --out DIR`: the default-flag tables alone (the full suite
  runs through `python -m tools.benchmark decentralized`)."""
  import argparse
  import json

  parser = argparse.ArgumentParser(description=main.__doc__)
  parser.add_argument("--tables", default="defaults_speedup,defaults_stragglers,convergence")
  parser.add_argument("--data", default="random_mdp,mountain_car")
  parser.add_argument("--nodes", default="", help="comma-separated N for convergence")
  parser.add_argument("--topologies", default=",".join(TOPOLOGY_FAMILIES))
  parser.add_argument("--out", required=True)
  args = parser.parse_args(argv)
  out = Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  tables = args.tables.split(",")
  progress = Progress(99, "decentralized defaults")
  rows: list[dict[str, Any]] = []
  if "defaults_speedup" in tables:
    rows += defaults_speedup_rows(progress)
  if "defaults_stragglers" in tables:
    rows += defaults_straggler_rows(progress)
  if "faults" in tables:
    rows += fault_rows(progress)
  if "convergence" in tables:
    nodes = tuple(int(n) for n in args.nodes.split(",")) if args.nodes else CONVERGENCE_NODES
    rows += convergence_rows(progress, tuple(args.data.split(",")), nodes,
                             tuple(args.topologies.split(",")))
  (out / "rows.jsonl").write_text("".join(json.dumps(r, default=str) + "\n" for r in rows))
  (out / "tables.md").write_text(defaults_tables(rows))
  print(defaults_tables(rows))
  return 0


if __name__ == "__main__":
  import sys

  sys.exit(main())
