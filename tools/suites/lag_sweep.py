"""Lag sweep: what the lag cap K and the balance controller cost or buy, on time to solve.

CartPole-v1 and Acrobot-v1 (the cartpole_impala settings; Acrobot solved at -100), with
`--max_policy_lag` K in {0, 1, 2, 4, 8} and with no cap (`--free_running`), balance off and
auto (auto only where the config has a `balance` field), 3 seeds each; `--quick`: CartPole only,
1 seed. Each run is a separate training process. A row per (task, setting, seed) carries
`max_policy_lag` (null for no cap), `balance`, `seed`, `solved`, `solved_wall_s`,
`solved_env_steps`, `sps`, `policy_lag_mean`, `policy_lag_max`, `dropped_stale` and
`learner_idle_frac` (from summary.json and metrics.jsonl).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tools.bench_common import Progress, SuiteResult, md_table
from tools.suites.convergence import ACROBOT, median, plot_returns, run_train

PRESET = "cartpole_impala"
LAGS: tuple[int | None, ...] = (0, 1, 2, 4, 8, None)  # None: no cap (--free_running)
TASKS = {"CartPole-v1": {}, "Acrobot-v1": ACROBOT}


def balance_modes() -> tuple[str, ...]:
  """("off", "auto") where the config has a `balance` field, else ("off",)."""
  from jaxrl_async.config import TrainConfig

  return ("off", "auto") if "balance" in TrainConfig.flag_fields() else ("off",)


def setting_flags(lag: int | None, balance: str) -> dict[str, Any]:
  """The flags of one setting. "off" passes no balance flag (it may not exist); auto at a cap
  below the default target lag lowers --target_lag to the cap, which the config requires."""
  from jaxrl_async.config import TrainConfig

  flags: dict[str, Any] = {"free_running": True} if lag is None else {"max_policy_lag": lag}
  if balance != "off":
    flags["balance"] = balance
    target = TrainConfig.flag_fields()["target_lag"].default
    if lag is not None and lag < target:
      flags["target_lag"] = lag
  return flags


def run(out_dir: Path, quick: bool, tiny: bool = False) -> SuiteResult:
  tasks = {"CartPole-v1": TASKS["CartPole-v1"]} if quick or tiny else TASKS
  seeds = (0,) if quick or tiny else (0, 1, 2)
  lags = (0, 1, None) if tiny else LAGS
  balances = balance_modes()
  # NOTE: a run that does not solve costs its whole budget; 120 s is 5-10x a typical solve.
  budget_s = 40.0 if tiny else 100.0 if quick else 120.0
  grid = [(t, lag, b, s) for t in tasks for lag in lags for b in balances for s in seeds]
  progress = Progress(len(grid), "lag_sweep")
  rows = []
  for task, lag, balance, seed in grid:
    name = f"{task}-K{'free' if lag is None else lag}-{balance}-{seed}"
    run_dir = out_dir / "runs" / name
    # NOTE: records every 0.5 s (the default is 2 s): runs here solve in seconds, and the idle
    # fraction and SPS come from the records after the first update.
    flags = {**tasks[task], **setting_flags(lag, balance), "max_wall_s": budget_s,
             "log_every_s": 0.5}
    row = {"task": task, "max_policy_lag": lag, "balance": balance, "seed": seed,
           "run_dir": str(run_dir),
           **run_train(PRESET, seed, run_dir, flags, timeout_s=budget_s + 120)}
    rows.append(row)
    progress.step(f"{name}: " + (row.get("error") or (
        f"solved={row['solved']} at {row['solved_wall_s'] or float('nan'):.1f}s, "
        f"sps {row['sps']:,.0f}, lag {row['policy_lag_mean'] or 0:.2f}/"
        f"{row['policy_lag_max']}, idle {100 * (row['learner_idle_frac'] or 0):.0f}%")))
  ok = [r for r in rows if "error" not in r]
  plots = [plot_returns(ok, "max_policy_lag", out_dir / "lag_sweep.png",
                        "return against wall time per lag cap K (None: no cap)",
                        style_key="balance").name]
  config = {"preset": PRESET, "tasks": tasks, "lags": lags, "balance": balances,
            "seeds": seeds, "max_wall_s": budget_s}
  return SuiteResult(rows, tables(rows), config, plots)


def aggregate(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
  """One line per (task, K, balance): medians over seeds, worst case for lag and drops."""
  out = []
  keys = dict.fromkeys((r["task"], r["max_policy_lag"], r["balance"]) for r in rows)
  for task, lag, balance in keys:
    mine = [r for r in rows if (r["task"], r["max_policy_lag"], r["balance"]) == (task, lag,
                                                                                    balance)]
    solved = [r for r in mine if r.get("solved")]
    out.append({
        "task": task, "K": "none" if lag is None else lag, "balance": balance,
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


def balance_verdict(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
  """Issue 5's test of `--balance=auto`, per task: its median time to solve at each K against
  the best and the median of the fixed (`off`) settings' medians (K and no cap alike)."""
  table = aggregate(rows)
  out = []
  for task in dict.fromkeys(r["task"] for r in table):
    fixed = [r["time_to_solve_s"] for r in table if r["task"] == task and r["balance"] == "off"
             and r["time_to_solve_s"] is not None]
    if not fixed:
      continue
    best, mid = min(fixed), median(fixed)
    for r in table:
      if r["task"] == task and r["balance"] == "auto":
        t = r["time_to_solve_s"]
        out.append({"task": task, "K": r["K"], "auto_time_s": t, "best_fixed_s": best,
                    "median_fixed_s": mid, "auto_vs_best": t / best if t else None,
                    "within_10%_of_best": bool(t and t <= 1.1 * best),
                    "beats_median": bool(t and t < mid)})
  return out


def tables(rows: list[dict[str, Any]]) -> str:
  return ("## By setting (medians over seeds; lag max and dropped: worst seed)\n\n"
          + md_table(aggregate(rows), ["task", "K", "balance", "solved", "time_to_solve_s",
                                       "env_steps_to_solve", "sps", "lag_mean", "lag_max",
                                       "dropped", "learner_idle_%"])
          + "\n## balance=auto against the fixed settings (medians of time to solve)\n\n"
          + md_table(balance_verdict(rows), ["task", "K", "auto_time_s", "best_fixed_s",
                                             "median_fixed_s", "auto_vs_best",
                                             "within_10%_of_best", "beats_median"])
          + "\n## Every run\n\n"
          + md_table(rows, ["task", "max_policy_lag", "balance", "seed", "solved",
                            "solved_wall_s", "solved_env_steps", "sps", "policy_lag_mean",
                            "policy_lag_max", "dropped_stale", "learner_idle_frac", "loadavg_1m",
                            "error"]))
