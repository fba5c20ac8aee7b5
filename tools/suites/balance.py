"""Balance: `--balance=auto` against the fixed settings where the learner is the bottleneck.

The lag sweep runs the cartpole_impala preset, whose learner idles 80-94% of the time on this
machine, so auto has nothing to decide there (BUILD_NOTES.md, issue 5). Here the same preset
has a network 8x wider (`--hidden_sizes=512,512`): at K >= 8 the learner never idles, the
actors wait for it, the mean lag is ~2, and auto's lag rule (pause an actor while the lag is
over target and the learner busy, if the other actors can still feed it) has a case to judge.

Fixed settings: balance off at K in {0, 1, 2, 8} and with no cap; auto at K = 8 and with no
cap. 10 seeds each (4 with --quick, 1 with --tiny), run seed by seed so that a change in the
machine's load touches every setting alike. Tables: the lag sweep's (by setting, every run)
plus issue 5's verdict with a bootstrap interval, since the seed-to-seed spread of time to solve
(+-15-50%) is of the size of the 10% the verdict asks about. An unsolved run counts as its
whole budget.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from tools.bench_common import SuiteResult, md_table
from tools.suites.convergence import median
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
  md = (tables(rows) + "\n## balance=auto against the fixed settings, with 90% bootstrap "
        "intervals (unsolved runs count as the budget)\n\n"
        + md_table(verdict(rows, budget_s), ["K", "auto_s", "best_fixed", "best_fixed_s",
                                             "median_fixed_s", "auto_vs_best",
                                             "auto_vs_best_90%", "auto_vs_median",
                                             "auto_vs_median_90%", "within_10%_of_best",
                                             "beats_median"]))
  config = {"preset": PRESET, "tasks": TASKS, "fixed": fixed, "auto": auto,
            "seeds": list(seeds), "max_wall_s": budget_s}
  return SuiteResult(rows, md, config, plots)


def times_by_setting(rows: list[dict[str, Any]], budget_s: float
                     ) -> dict[tuple[Any, str], list[float]]:
  """Time to solve per (K, balance) over seeds; an unsolved or failed run counts as the budget."""
  out: dict[tuple[Any, str], list[float]] = {}
  for r in rows:
    t = r.get("solved_wall_s") if r.get("solved") else None
    out.setdefault((r["max_policy_lag"], r["balance"]), []).append(
        budget_s if t is None else t)
  return out


def ratios(times: dict[tuple[Any, str], list[float]], lag: Any) -> tuple[float, float]:
  """auto's median time at `lag` over the best and over the median of the fixed medians."""
  fixed = sorted(median(v) for (_, b), v in times.items() if b == "off")
  auto = median(times[lag, "auto"])
  return auto / fixed[0], auto / median(fixed)


def verdict(rows: list[dict[str, Any]], budget_s: float, draws: int = 2000, seed: int = 0
            ) -> list[dict[str, Any]]:
  """Issue 5's test per auto setting, with 5-95% bootstrap intervals of both ratios (seeds
  resampled with replacement within every setting)."""
  times = times_by_setting(rows, budget_s)
  fixed = {k: median(v) for k, v in times.items() if k[1] == "off"}
  if not fixed:
    return []
  rng = random.Random(seed)
  best_key = min(fixed, key=fixed.get)
  out = []
  for lag, balance in times:
    if balance != "auto":
      continue
    vs_best, vs_median = ratios(times, lag)
    boot = [ratios({k: rng.choices(v, k=len(v)) for k, v in times.items()}, lag)
            for _ in range(draws)]
    lo_hi = lambda xs: (f"{xs[int(0.05 * len(xs))]:.2f}-{xs[int(0.95 * len(xs)) - 1]:.2f}")
    out.append({
        "K": "none" if lag is None else lag, "auto_s": median(times[lag, "auto"]),
        "best_fixed": f"K={'none' if best_key[0] is None else best_key[0]}",
        "best_fixed_s": fixed[best_key], "median_fixed_s": median(list(fixed.values())),
        "auto_vs_best": vs_best, "auto_vs_best_90%": lo_hi(sorted(b[0] for b in boot)),
        "auto_vs_median": vs_median, "auto_vs_median_90%": lo_hi(sorted(b[1] for b in boot)),
        "within_10%_of_best": vs_best <= 1.1, "beats_median": vs_median < 1.0})
  return out
