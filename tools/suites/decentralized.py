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
The tables at default flags (`python -m tools.suites.decentralized --tables=...`) are in
decentralized_defaults.py.
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


if __name__ == "__main__":
  import sys

  # The default-flag tables' command line keeps this module's name (BUILD_NOTES uses it).
  from tools.suites.decentralized_defaults import main

  sys.exit(main())
