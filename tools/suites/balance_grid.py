"""Balance grid: `--balance=auto` against a grid of fixed settings, judged by throughput and lag.

Time to solve varies 0.26-0.55 in log time from seed to seed on this machine (BUILD_NOTES.md,
issue 5); throughput and lag at a fixed cap K vary far less, so here each setting is one
training run of `max_wall_s` seconds (CartPole IMPALA, K = 1, no stop at a return) and is
judged by its steady state: the median env steps/s and the mean actors-blocked and learner-idle
fractions over the metrics records after the first `warmup_s`, the lag histogram of the whole
run, the rollouts dropped. Fixed settings: rollouts per update U x actors N; auto starts from
U = 1 with the most actors (the worst corner: 2 tickets for N actors) and must find its way.

Regimes ($JAXRL_BENCH_TASKS, comma separated; default both CPU ones):
- `fast`: a tiny MLP learner (16,16, one epoch of one minibatch) that idles most of the time;
- `learner_bound`: hidden 512,512 with 4 epochs of 2 minibatches, where the learner is the
  bottleneck on 2 cores;
- `breakout`: the breakout_impala preset, for a GPU host (on a CPU it only shows the tool runs).

Verdicts per regime: auto's SPS over the best fixed setting's, its blocked and idle fractions,
its lag and drops, beside the issue's thresholds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

from tools.bench_common import Progress, SuiteResult, md_table, write_results
from tools.suites.convergence import lag_mean, read_records, run_train

K = 1
REGIMES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "fast": ("cartpole_impala", "CartPole-v1, tiny MLP learner",
             {"hidden_sizes": "16,16", "num_epochs": 1, "num_minibatches": 1}),
    "learner_bound": ("cartpole_impala", "CartPole-v1, hidden 512,512",
                      {"hidden_sizes": "512,512"}),
    "breakout": ("breakout_impala", "Breakout-v5 (GPU host)", {}),
}
GRID_U = (1, 2, 3, 6)
GRID_ACTORS = (2, 4, 6)


def regimes() -> list[str]:
  keep = [t for t in os.environ.get("JAXRL_BENCH_TASKS", "").split(",") if t in REGIMES]
  return keep or ["fast", "learner_bound"]


def settings(quick: bool, tiny: bool) -> list[tuple[str, int, int]]:
  """(balance, U, N) of each run: the fixed grid, then auto from U = 1 with the most actors."""
  us, ns = ((1, 6), (6,)) if tiny else ((1, 3, 6), (2, 6)) if quick else (GRID_U, GRID_ACTORS)
  return [("off", u, n) for n in ns for u in us] + [("auto", 1, max(ns))]


def steady(run_dir: Path, warmup_s: float) -> dict[str, Any]:
  """The steady state of one run from its metrics records after `warmup_s`."""
  records = [r for r in read_records(run_dir) if r.get("wall_s", 0.0) >= warmup_s]
  if not records:
    return {"error": f"no metrics records after {warmup_s:.0f}s"}
  mean = lambda k: statistics.fmean(float(r.get(k) or 0.0) for r in records)
  return {"sps": statistics.median(float(r["sps"]) for r in records),
          "actors_blocked": mean("actor_blocked_frac"), "learner_idle": mean("learner_idle_frac"),
          "end_u": records[-1].get("rollouts_per_update"),
          "end_active": records[-1].get("active_actors")}


def run(out_dir: Path, quick: bool, tiny: bool = False) -> SuiteResult:
  budget_s, warmup_s = (12.0, 6.0) if tiny else (30.0, 12.0) if quick else (45.0, 15.0)
  return run_settings(out_dir, regimes(), settings(quick, tiny), budget_s, warmup_s)


def run_settings(out_dir: Path, names: list[str], chosen: list[tuple[str, int, int]],
                 budget_s: float, warmup_s: float) -> SuiteResult:
  """One training run per (regime, setting), in order; rows with their steady state."""
  rows: list[dict[str, Any]] = []
  grid = [(r, s) for r in names for s in chosen]
  progress = Progress(len(grid), "balance_grid")
  for regime, (balance, u, n) in grid:
    preset, label, extra = REGIMES[regime]
    run_dir = out_dir / "runs" / f"{regime}-{balance}-U{u}-N{n}"
    flags = {**extra, "max_policy_lag": K, "rollouts_per_update": u, "num_actors": n,
             "balance": balance, "stop_at_return": float("nan"), "max_wall_s": budget_s,
             "total_env_steps": 10**12, "log_every_s": 1.0, "checkpoint_at_end": False,
             "checkpoint_every_s": 0, "layout": "preset"}
    row = run_train(preset, 0, run_dir, flags, timeout_s=budget_s + 240)
    row = {"regime": regime, "task": label, "balance": balance, "U": u, "actors": n} | row
    if not row.get("error"):
      summary = json.loads((run_dir / "summary.json").read_text())
      hist = summary.get("lag_hist") or {}
      row |= steady(run_dir, warmup_s) | {"lag_mean": lag_mean(hist), "lag_hist": hist,
                                          "decisions": len(summary["balance_decisions"])}
    rows.append(row)
    progress.step(f"{regime} {balance} U={u} N={n}: {row.get('sps', 0):.0f} sps")
  config = {"K": K, "max_wall_s": budget_s, "warmup_s": warmup_s, "regimes": names,
            "settings": chosen}
  return SuiteResult(rows, tables(rows), config)


def verdicts(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
  out = []
  for regime in dict.fromkeys(r["regime"] for r in rows):
    ok = [r for r in rows if r["regime"] == regime and not r.get("error")]
    fixed = [r for r in ok if r["balance"] == "off"]
    for auto in (r for r in ok if r["balance"] == "auto"):
      if not fixed:
        continue
      best = max(fixed, key=lambda r: r["sps"])
      out.append({"regime": regime, "auto_sps": auto["sps"], "best_fixed": f"U={best['U']} "
                  f"N={best['actors']}", "best_sps": best["sps"],
                  "auto_vs_best": auto["sps"] / best["sps"],
                  "median_fixed_sps": statistics.median(r["sps"] for r in fixed),
                  "auto_blocked": auto["actors_blocked"], "auto_idle": auto["learner_idle"],
                  "auto_lag_mean": auto["lag_mean"], "auto_max_lag": auto.get("policy_lag_max"),
                  "auto_dropped": auto.get("dropped_stale"),
                  "auto_end": f"U={auto['end_u']} N={auto['end_active']}"})
  return out


def tables(rows: list[dict[str, Any]]) -> str:
  cols = ["regime", "balance", "U", "actors", "sps", "actors_blocked", "learner_idle",
          "lag_mean", "lag_hist", "policy_lag_max", "dropped_stale", "end_u", "end_active",
          "decisions", "loadavg_1m", "error"]
  return ("## Every setting (steady state after the warm-up)\n\n" + md_table(rows, cols)
          + "\n\n## auto against the fixed settings\n\n"
          + md_table(verdicts(rows), ["regime", "auto_sps", "best_fixed", "best_sps",
                                      "auto_vs_best", "median_fixed_sps", "auto_blocked",
                                      "auto_idle", "auto_lag_mean", "auto_max_lag",
                                      "auto_dropped", "auto_end"]))


def main(argv: list[str] | None = None) -> int:
  """Chosen settings only, side by side (the suite runs the whole grid):

      python -m tools.suites.balance_grid OUT --regimes learner_bound \
          --settings auto:1:6,off:6:2,off:3:6,off:1:6
  """
  parser = argparse.ArgumentParser(prog="python -m tools.suites.balance_grid",
                                   description=main.__doc__.splitlines()[0])
  parser.add_argument("out", type=Path)
  parser.add_argument("--regimes", default="fast,learner_bound")
  parser.add_argument("--settings", required=True, help="balance:U:N, comma separated")
  parser.add_argument("--max_wall_s", type=float, default=45.0)
  parser.add_argument("--warmup_s", type=float, default=15.0)
  args = parser.parse_args(argv)
  names = args.regimes.split(",")
  if any(r not in REGIMES for r in names):
    parser.error(f"--regimes={args.regimes}: each must be one of {', '.join(REGIMES)}")
  try:
    chosen = [(b, int(u), int(n)) for b, u, n in (x.split(":") for x in args.settings.split(","))]
  except ValueError:
    parser.error(f"--settings={args.settings}: must be balance:U:N items, e.g. auto:1:6")
  if any(b not in ("off", "auto") or u < 1 or n < 1 for b, u, n in chosen):
    parser.error(f"--settings={args.settings}: balance is off or auto, U and N >= 1")
  result = run_settings(args.out, names, chosen, args.max_wall_s, args.warmup_s)
  write_results(args.out, "balance_grid", result, " ".join(["python -m tools.suites.balance_grid",
                                                           *(argv or sys.argv[1:])]))
  print(result.tables_md)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
