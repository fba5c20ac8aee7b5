"""Lag sweep: what the lag cap K and the balance controller cost or buy, on time to solve.

CartPole-v1 and Acrobot-v1 (the cartpole_impala settings; Acrobot solved at -100), with
`--max_policy_lag` K in {0, 1, 2, 4, 8} and with no cap (`--free_running`), balance off and
auto (auto only where the config has a `balance` field), 3 seeds each; `--quick`: CartPole only,
1 seed; `seeds` replaces the seeds. Each run is a separate training process. A row per (task,
setting, seed) carries `max_policy_lag` (null for no cap), `balance`, `seed`, `solved`,
`solved_wall_s`, `solved_env_steps`, `sps`, `policy_lag_mean`, `policy_lag_max`,
`dropped_stale` and `learner_idle_frac` (from summary.json and metrics.jsonl), and
`lag_weighting`. The grid runs lag weighting off; `run(..., weightings=("off", "inverse"))`
adds, at the larger caps and with no cap (`WEIGHTED_LAGS`), balance off, each seed with
`--lag_weighting=inverse` (not by default: it did not clearly help the preset, BUILD_NOTES.md,
"Staleness correction").
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from pathlib import Path
from typing import Any

from tools.bench_common import (
  Progress,
  SuiteResult,
  choice_list,
  md_table,
  seed_list,
  write_results,
)
from tools.suites.convergence import ACROBOT, compile_programs, median, plot_returns, run_train

PRESET = "cartpole_impala"
LAGS: tuple[int | None, ...] = (0, 1, 2, 4, 8, None)  # None: no cap (--free_running)
TASKS = {"CartPole-v1": {}, "Acrobot-v1": ACROBOT}
# Where lags reach 2 and more, so down-weighting stale rollouts can matter (measured there).
WEIGHTED_LAGS: tuple[int | None, ...] = (4, 8, None)


def balance_modes() -> tuple[str, ...]:
  """("off", "auto") where the config has a `balance` field, else ("off",)."""
  from jaxrl_async.config import TrainConfig

  return ("off", "auto") if "balance" in TrainConfig.flag_fields() else ("off",)


def setting_flags(lag: int | None, balance: str, lag_weighting: str = "off") -> dict[str, Any]:
  """The flags of one setting. "off" passes no balance or lag weighting flag (they may not
  exist); auto at a cap below the default target lag lowers --target_lag to the cap, which the
  config requires."""
  from jaxrl_async.config import TrainConfig

  flags: dict[str, Any] = {"free_running": True} if lag is None else {"max_policy_lag": lag}
  if lag_weighting != "off":
    flags["lag_weighting"] = lag_weighting
  if balance != "off":
    flags["balance"] = balance
    target = TrainConfig.flag_fields()["target_lag"].default
    if lag is not None and lag < target:
      flags["target_lag"] = lag
  return flags


def run(out_dir: Path, quick: bool, tiny: bool = False,
        weightings: tuple[str, ...] = ("off",), seeds: list[int] | None = None,
        tasks: dict[str, dict[str, Any]] | None = None,
        lags: tuple[int | None, ...] | None = None) -> SuiteResult:
  tasks = tasks or ({"CartPole-v1": TASKS["CartPole-v1"]} if quick or tiny else TASKS)
  seeds = seeds or ([0] if quick or tiny else [0, 1, 2])
  lags = lags or ((0, 1, None) if tiny else LAGS)
  balances = balance_modes()
  # NOTE: a run that does not solve costs its whole budget; 120 s is 5-10x a typical solve.
  budget_s = 40.0 if tiny else 100.0 if quick else 120.0
  # Seeds outermost: a busy neighbour for some minutes then slows every setting a little,
  # instead of a few settings a lot.
  grid = []
  for s in seeds:
    grid += [(t, lag, b, "off", s) for t in tasks for lag in lags for b in balances]
    grid += [(t, lag, "off", w, s) for t in tasks for lag in lags if lag in WEIGHTED_LAGS
             for w in weightings if w != "off"]
  warmed = warm_programs(tasks, balances, weightings)
  rows = run_grid(out_dir, grid, tasks, budget_s, "lag_sweep")
  plots = [plot_lag_returns(rows, out_dir / "lag_sweep.png")]
  config = {"preset": PRESET, "tasks": tasks, "lags": lags, "balance": balances,
            "lag_weighting": weightings, "weighted_lags": WEIGHTED_LAGS,
            "seeds": seeds, "max_wall_s": budget_s, "compiled_first": warmed}
  return SuiteResult(rows, tables(rows, budget_s), config, plots)


def warm_programs(tasks: dict[str, dict[str, Any]], balances: tuple[str, ...],
                  weightings: tuple[str, ...]) -> list[str]:
  """Every program any setting may run, compiled before the first measured run. Without
  this, the fixed settings ran warm from their second run on while auto's second U compiled
  in the background of its runs until one lived to store it: on 2 cores that compile took
  half the throughput for 2 s of a 4-s solve. A cap, the balance mode and a seed reach no
  program, so one compile per task and lag weighting serves every K (at K = 1, with auto, the
  U values it may choose are compiled too)."""
  lines = []
  for task, flags in tasks.items():
    for weighting in dict.fromkeys(("off", *weightings)):
      extra = {**flags, **setting_flags(1, "auto" if "auto" in balances else "off", weighting)}
      lines.append(f"{task}, lag weighting {weighting}: "
                   + compile_programs(PRESET, extra, timeout_s=600))
      print(f"lag_sweep: {lines[-1]}", flush=True)
  return lines


def run_grid(out_dir: Path, grid: list[tuple[str, int | None, str, str, int]],
             tasks: dict[str, dict[str, Any]], budget_s: float, label: str
             ) -> list[dict[str, Any]]:
  """One training process per (task, K, balance, lag weighting, seed), in the grid's order."""
  progress = Progress(len(grid), label)
  rows = []
  for task, lag, balance, weighting, seed in grid:
    name = (f"{task}-K{'free' if lag is None else lag}-{balance}"
            f"{'' if weighting == 'off' else '-' + weighting}-{seed}").replace(" ", "_")
    run_dir = out_dir / "runs" / name
    # NOTE: records every 0.5 s (the default is 2 s): runs here solve in seconds, and the idle
    # fraction and SPS come from the records after the first update.
    flags = {**tasks[task], **setting_flags(lag, balance, weighting), "max_wall_s": budget_s,
             "log_every_s": 0.5}
    row = {"task": task, "max_policy_lag": lag, "balance": balance, "lag_weighting": weighting,
           "seed": seed, "run_dir": str(run_dir),
           **run_train(PRESET, seed, run_dir, flags, timeout_s=budget_s + 120)}
    rows.append(row)
    progress.step(f"{name}: " + (row.get("error") or (
        f"solved={row['solved']} at {row['solved_wall_s'] or float('nan'):.1f}s, "
        f"sps {row['sps']:,.0f}, lag {row['policy_lag_mean'] or 0:.2f}/"
        f"{row['policy_lag_max']}, idle {100 * (row['learner_idle_frac'] or 0):.0f}%")))
  return rows


def plot_lag_returns(rows: list[dict[str, Any]], path: Path) -> str:
  """Return against wall time, a colour per K, a line style per balance (and lag weighting)."""
  ok = [r for r in rows if "error" not in r]
  style = "balance/lag_weighting"
  styled = [{**r, style: r["balance"] + ("" if r.get("lag_weighting", "off") == "off"
                                         else "/" + r["lag_weighting"])} for r in ok]
  return plot_returns(styled, "max_policy_lag", path,
                      "return against wall time per lag cap K (None: no cap)",
                      style_key=style).name


def aggregate(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
  """One line per (task, K, balance, lag weighting): medians over seeds, worst case for lag and
  drops."""
  out = []
  key = lambda r: (r["task"], r["max_policy_lag"], r["balance"], r.get("lag_weighting", "off"))
  for task, lag, balance, weighting in dict.fromkeys(map(key, rows)):
    mine = [r for r in rows if key(r) == (task, lag, balance, weighting)]
    solved = [r for r in mine if r.get("solved")]
    out.append({
        "task": task, "K": "none" if lag is None else lag, "balance": balance,
        "lag_weighting": weighting,
        "solved": f"{len(solved)}/{len(mine)}",
        "time_to_solve_s": median([r["solved_wall_s"] for r in solved]),
        "env_steps_to_solve": median([r["solved_env_steps"] for r in solved]),
        "sps": median([r.get("sps") for r in mine]),
        "lag_mean": median([r.get("policy_lag_mean") for r in mine]),
        "lag_max": max((r.get("policy_lag_max") or 0 for r in mine), default=None),
        "dropped": max((r.get("dropped_stale") or 0 for r in mine), default=None),
        "learner_idle_%": (100 * v if (v := median([r.get("learner_idle_frac")
                                                     for r in mine])) is not None else None),
    })
  return out


def times_by_setting(rows: list[dict[str, Any]], budget_s: float
                     ) -> dict[tuple[Any, Any, str], list[float]]:
  """Time to solve per (task, K, balance) over seeds, without lag weighting; an unsolved or
  failed run counts as the budget (inf: as never)."""
  out: dict[tuple[Any, Any, str], list[float]] = {}
  for r in rows:
    if r.get("lag_weighting", "off") != "off":
      continue
    t = r.get("solved_wall_s") if r.get("solved") else None
    out.setdefault((r.get("task"), r["max_policy_lag"], r["balance"]), []).append(
        budget_s if t is None else t)
  return out


BEST = "best"  # the verdict's last row per task: auto at its fastest K (the "best auto")


def _auto_lag(times: dict[tuple[Any, Any, str], list[float]], task: Any, lag: Any) -> Any:
  """`lag`, or for BEST the K whose auto median is least, chosen afresh in each bootstrap
  draw (fixing it from the whole sample would flatter its interval)."""
  if lag != BEST:
    return lag
  autos = {k[1]: median(v) for k, v in times.items() if k[0] == task and k[2] == "auto"}
  return min(autos, key=autos.get)


def _ratios(times: dict[tuple[Any, Any, str], list[float]], task: Any, lag: Any
            ) -> tuple[float, float, float]:
  """auto's median time at `lag` over the best and over the median of the fixed medians, and
  synchronous training's (K = 0, off) over auto's: the convergence-time speed-up (nan without
  a K = 0 run)."""
  fixed = sorted(median(v) for (t, _, b), v in times.items() if t == task and b == "off")
  auto = median(times[task, _auto_lag(times, task, lag), "auto"])
  sync = times.get((task, 0, "off"))
  return auto / fixed[0], auto / median(fixed), median(sync) / auto if sync else math.nan


def balance_verdict(rows: list[dict[str, Any]], budget_s: float = math.inf, draws: int = 2000,
                    seed: int = 0) -> list[dict[str, Any]]:
  """Issue 5's test of `--balance=auto`, per task and auto setting, and per task a last row
  for auto at its fastest K (`BEST`): its median time to solve
  against the best and the median of the fixed (`off`) settings' medians (K and no cap alike,
  without lag weighting), with 5-95% bootstrap intervals of both ratios (seeds resampled with
  replacement within every setting): the seed-to-seed spread is of the size of the 10% the
  test asks about."""
  times = times_by_setting(rows, budget_s)
  rng = random.Random(seed)
  lo_hi = lambda xs: f"{xs[int(0.05 * len(xs))]:.2f}-{xs[int(0.95 * len(xs)) - 1]:.2f}"
  out = []
  keys = list(times)
  keys += [(t, BEST, "auto") for t in dict.fromkeys(k[0] for k in keys if k[2] == "auto")]
  for task, lag, balance in keys:
    fixed = {k: median(v) for k, v in times.items() if k[0] == task and k[2] == "off"}
    if balance != "auto" or not fixed:
      continue
    best_key = min(fixed, key=fixed.get)
    vs_best, vs_median, speedup = _ratios(times, task, lag)
    boot = [_ratios({k: rng.choices(v, k=len(v)) for k, v in times.items()}, task, lag)
            for _ in range(draws)]
    out.append({
        "task": task, "K": _k_label(times, task, lag), "auto_K": _auto_lag(times, task, lag),
        "auto_time_s": median(times[task, _auto_lag(times, task, lag), "auto"]),
        "best_fixed": f"K={'none' if best_key[1] is None else best_key[1]}",
        "best_fixed_s": fixed[best_key], "median_fixed_s": median(list(fixed.values())),
        "auto_vs_best": vs_best, "auto_vs_best_90%": lo_hi(sorted(b[0] for b in boot)),
        "auto_vs_median": vs_median, "auto_vs_median_90%": lo_hi(sorted(b[1] for b in boot)),
        "within_10%_of_best": vs_best <= 1.1, "beats_median": vs_median < 1.0,
        "speedup_vs_sync": speedup, "speedup_vs_sync_90%": lo_hi(sorted(b[2] for b in boot))})
  return out


def _k_label(times: dict[tuple[Any, Any, str], list[float]], task: Any, lag: Any) -> str | int:
  k = _auto_lag(times, task, lag)
  k = "none" if k is None else k
  return f"best auto (K={k})" if lag == BEST else k


def tables(rows: list[dict[str, Any]], budget_s: float = math.inf) -> str:
  return ("## By setting (medians over seeds; lag max and dropped: worst seed)\n\n"
          + md_table(aggregate(rows), ["task", "K", "balance", "lag_weighting", "solved",
                                       "time_to_solve_s", "env_steps_to_solve", "sps",
                                       "lag_mean", "lag_max", "dropped", "learner_idle_%"])
          + "\n## balance=auto against the fixed settings (medians of time to solve; an "
          "unsolved run counts as the budget; 90% bootstrap intervals)\n\n"
          + md_table(balance_verdict(rows, budget_s),
                     ["task", "K", "auto_time_s", "best_fixed", "best_fixed_s", "median_fixed_s",
                      "auto_vs_best", "auto_vs_best_90%", "auto_vs_median",
                      "auto_vs_median_90%", "within_10%_of_best", "beats_median",
                      "speedup_vs_sync", "speedup_vs_sync_90%"])
          + "\n## Every run\n\n"
          + md_table(rows, ["task", "max_policy_lag", "balance", "lag_weighting", "seed",
                            "solved", "solved_wall_s", "solved_env_steps", "sps",
                            "policy_lag_mean", "policy_lag_max", "dropped_stale",
                            "learner_idle_frac", "loadavg_1m", "error"]))


def main(argv: list[str] | None = None) -> int:
  """Chosen tasks, caps, seeds and lag weightings (the suite runs its defaults):

      python -m tools.suites.lag_sweep OUT --seeds 0-4 --weightings off,inverse
  """
  parser = argparse.ArgumentParser(prog="python -m tools.suites.lag_sweep",
                                   description=main.__doc__.splitlines()[0])
  parser.add_argument("out", type=Path)
  parser.add_argument("--tasks", type=choice_list(TASKS), default=list(TASKS))
  parser.add_argument("--lags", default="0,1,2,4,8,none", help="K values; none: no cap")
  parser.add_argument("--seeds", type=seed_list, default=[0, 1, 2])
  parser.add_argument("--weightings", type=choice_list(("off", "inverse", "exp")),
                      default=["off"], help="lag weightings also run at K in 4, 8, none")
  args = parser.parse_args(argv)
  try:
    lags = tuple(None if x == "none" else int(x) for x in args.lags.split(","))
  except ValueError:
    parser.error(f"--lags={args.lags}: must be integers >= 0 or none, comma separated")
  if any(k is not None and k < 0 for k in lags):
    parser.error(f"--lags={args.lags}: must be integers >= 0 or none, comma separated")
  result = run(args.out, False, weightings=tuple(args.weightings), seeds=args.seeds,
               tasks={t: TASKS[t] for t in args.tasks}, lags=lags)
  write_results(args.out, "lag_sweep", result,
                " ".join(["python -m tools.suites.lag_sweep", *(argv or sys.argv[1:])]))
  print(result.tables_md)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
