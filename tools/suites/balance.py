"""Balance: `--balance=auto` against the fixed settings where the learner is the bottleneck.

The lag sweep runs the cartpole_impala preset, whose learner idles 80-94% of the time on this
machine, so auto has nothing to decide there (BUILD_NOTES.md, issue 5). Here the same preset
has a network 8x wider (`--hidden_sizes=512,512`), in two regimes ($JAXRL_BENCH_TASKS, comma
separated, picks them; default `2_actors`):
- `2_actors` (the preset's): at K >= 8 the learner never idles, the mean lag is ~2, and auto's
  lag rule (pause an actor while the lag is over target and the learner busy, if the other
  actors can still feed it) has a case to judge;
- `8_actors`: production is over-provisioned (4x the actors), so auto can pause actors without
  starving the learner (with no cap it goes down to 3).

Fixed settings: balance off at K in {0, 1, 2, 8} and with no cap; auto at K = 8 and with no
cap. 10 seeds each (4 with --quick, 1 with --tiny; `seeds` replaces them), run seed by seed so
that a change in the machine's load touches every setting alike. Tables: the lag sweep's (by
setting, issue 5's verdict with bootstrap intervals, every run); an unsolved run counts as its
whole budget.

Runs of several invocations pool (the verdict tightens with seeds):

    python -m tools.suites.balance DIR [DIR ...]   # each DIR holds a results.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
from pathlib import Path
from typing import Any

from tools.bench_common import SuiteResult
from tools.suites.lag_sweep import (
  PRESET,
  balance_verdict,
  plot_lag_returns,
  run_grid,
  tables,
  times_by_setting,
)

REGIMES = {
    "2_actors": ("CartPole-v1 (hidden 512,512)", {"hidden_sizes": "512,512"}),
    "8_actors": ("CartPole-v1 (hidden 512,512, 8 actors)",
                 {"hidden_sizes": "512,512", "num_actors": 8}),
}
FIXED: tuple[int | None, ...] = (0, 1, 2, 8, None)
AUTO: tuple[int | None, ...] = (8, None)


def regimes() -> dict[str, dict[str, Any]]:
  """task label -> flags of the regimes $JAXRL_BENCH_TASKS names (the variable also names other
  suites' tasks: those are not this suite's concern); default: 2_actors."""
  keep = [t for t in os.environ.get("JAXRL_BENCH_TASKS", "").split(",") if t in REGIMES]
  return dict(REGIMES[t] for t in keep or ["2_actors"])


def run(out_dir: Path, quick: bool, tiny: bool = False,
        seeds: list[int] | None = None) -> SuiteResult:
  seeds = seeds or list(range(1 if tiny else 4 if quick else 10))
  fixed, auto = ((0, None), (None,)) if tiny else (FIXED, AUTO)
  budget_s = 40.0 if tiny else 90.0
  tasks = regimes()
  settings = [(lag, "off") for lag in fixed] + [(lag, "auto") for lag in auto]
  grid = [(task, lag, balance, "off", s) for task in tasks for s in seeds
          for lag, balance in settings]
  rows = run_grid(out_dir, grid, tasks, budget_s, "balance")
  plots = [plot_lag_returns(rows, out_dir / "balance.png")]
  config = {"preset": PRESET, "tasks": tasks, "fixed": fixed, "auto": auto,
            "seeds": seeds, "max_wall_s": budget_s}
  return SuiteResult(rows, tables(rows, budget_s), config, plots)


def seeds_for(verdict: dict[str, Any], seeds: int, half_width: float = 0.1) -> int:
  """Seeds a setting would need for the upper side of auto_vs_best's 90% interval to come
  within `half_width` of the estimate (intervals narrow as 1/sqrt(seeds))."""
  upper = float(verdict["auto_vs_best_90%"].split("-")[1])
  return math.ceil(seeds * ((upper - verdict["auto_vs_best"]) / half_width) ** 2)


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m tools.suites.balance",
                                   description="Pool balance (or lag_sweep) results.")
  parser.add_argument("dirs", nargs="+", type=Path, help="folders holding a results.json")
  args = parser.parse_args(argv)
  rows: list[dict[str, Any]] = []
  budgets = {}  # an unsolved run counts as its budget: pooled runs must share one
  for d in args.dirs:
    path = d / "results.json"
    if not path.is_file():
      parser.error(f"{d}: no results.json there")
    record = json.loads(path.read_text())
    budget = record.get("config", {}).get("max_wall_s")
    if budget is None:
      parser.error(f"{path}: no config.max_wall_s (the budget an unsolved run counts as)")
    budgets[str(d)] = budget
    rows += record["rows"]
  if len(set(budgets.values())) > 1:
    parser.error(f"budgets differ ({budgets}): pool runs of one max_wall_s")
  budget_s = next(iter(budgets.values()))
  print(tables(rows, budget_s).split("\n## Every run")[0])
  times = times_by_setting(rows, budget_s)
  # The spread that sets how many seeds a verdict needs: a ratio of two medians at n seeds has a
  # 90% interval of about +-2.9 sd/sqrt(n) in log time (a median's error taken as 1.25 sd/sqrt n).
  for (task, lag, mode), ts in times.items():
    name = f"{task}, K={'none' if lag is None else lag} {mode}"
    if len(ts) < 2:
      print(f"{name}: one seed, no spread")
      continue
    sd = statistics.stdev(math.log(t) for t in ts)
    print(f"{name}: sd of log time {sd:.2f} over {len(ts)} seeds; +-10% needs about "
          f"{math.ceil((2.9 * sd / 0.1) ** 2)} seeds")
  for v in balance_verdict(rows, budget_s):
    n = len(times[v["task"], v["auto_K"], "auto"])
    print(f"{v['task']}, auto K={v['K']}: {n} seeds; a +-0.10 interval of auto_vs_best needs "
          f"about {seeds_for(v, n)}")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
