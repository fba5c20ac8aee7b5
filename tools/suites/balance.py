"""Balance: `--balance=auto` against the fixed settings where the learner is the bottleneck.

The lag sweep runs the cartpole_impala preset, whose learner idles 80-94% of the time on this
machine, so auto has nothing to decide there (BUILD_NOTES.md, issue 5). Here the same preset
has a network 8x wider (`--hidden_sizes=512,512`): at K >= 8 the learner never idles, the
actors wait for it, the mean lag is ~2, and auto's lag rule (pause an actor while the lag is
over target and the learner busy, if the other actors can still feed it) has a case to judge.

Fixed settings: balance off at K in {0, 1, 2, 8} and with no cap; auto at K = 8 and with no
cap. 10 seeds each (4 with --quick, 1 with --tiny), run seed by seed so that a change in the
machine's load touches every setting alike. Tables: the lag sweep's (by setting, issue 5's
verdict with bootstrap intervals, every run); an unsolved run counts as its whole budget.
"""

from __future__ import annotations

from pathlib import Path

from tools.bench_common import SuiteResult
from tools.suites.lag_sweep import PRESET, plot_lag_returns, run_grid, tables

TASK = "CartPole-v1 (hidden 512,512)"
TASKS = {TASK: {"hidden_sizes": "512,512"}}
FIXED: tuple[int | None, ...] = (0, 1, 2, 8, None)
AUTO: tuple[int | None, ...] = (8, None)


def run(out_dir: Path, quick: bool, tiny: bool = False) -> SuiteResult:
  seeds = range(1) if tiny else range(4) if quick else range(10)
  fixed, auto = ((0, None), (None,)) if tiny else (FIXED, AUTO)
  budget_s = 40.0 if tiny else 90.0
  settings = [(lag, "off") for lag in fixed] + [(lag, "auto") for lag in auto]
  grid = [(TASK, lag, balance, "off", s) for s in seeds for lag, balance in settings]
  rows = run_grid(out_dir, grid, TASKS, budget_s, "balance")
  plots = [plot_lag_returns(rows, out_dir / "balance.png")]
  config = {"preset": PRESET, "tasks": TASKS, "fixed": fixed, "auto": auto,
            "seeds": list(seeds), "max_wall_s": budget_s}
  return SuiteResult(rows, tables(rows, budget_s), config, plots)
