"""Algorithms: CartPole solve times (PPO, DQN beside IMPALA), the Hopper PPO learning curve,
and end-to-end throughput of the Atari presets.

Each run is `python -m experiments.train --preset=... --seed=... --run_dir=... --quiet` in a
fresh process (convergence.run_train), so times count from process start.
- CartPole: cartpole_ppo, cartpole_dqn and cartpole_impala, seeds 0-2 (seed 0 with --quick);
  solved = return_mean >= 475 over the last 20 episodes.
- Hopper: hopper_ppo for 1M env steps (200k with --quick); the row records the first env step
  count at which return_mean reached 2,000, and the learning curve is plotted.
- Atari: every breakout_* and pong_* preset for a fixed wall-time budget (short runs: their
  SPS after the first update, not their learning); pong_dqn starts learning after 2,000 steps
  instead of 10,000 so that the short run reaches the replay.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tools.bench_common import Progress, SuiteResult, md_table
from tools.suites.convergence import median, read_records, run_train

CARTPOLE = ("cartpole_ppo", "cartpole_dqn", "cartpole_impala")
ATARI = ("breakout_impala", "breakout_ppo", "pong_impala", "pong_ppo", "pong_dqn")
HOPPER_TARGET = 2_000.0


def _steps_to(records: list[dict[str, Any]], target: float) -> int | None:
  for r in records:
    if r.get("return_mean") is not None and r["return_mean"] >= target:
      return int(r["env_steps"])
  return None


def run(out_dir: Path, quick: bool, tiny: bool = False) -> SuiteResult:
  seeds = (0,) if quick else (0, 1, 2)
  hopper_steps = 50_000 if tiny else 200_000 if quick else 1_000_000
  atari_s = 20.0 if tiny else 45.0 if quick else 120.0
  cartpole = CARTPOLE[:1] if tiny else CARTPOLE
  atari = ATARI[:1] if tiny else ATARI
  progress = Progress(len(cartpole) * len(seeds) + 1 + len(atari), "algos")
  rows: list[dict[str, Any]] = []

  for preset in cartpole:
    for seed in seeds:
      run_dir = out_dir / "runs" / f"{preset}-{seed}"
      row = {"part": "cartpole", "task": preset, "seed": seed, "run_dir": str(run_dir),
             **run_train(preset, seed, run_dir, {"max_wall_s": 300.0}, timeout_s=420.0)}
      rows.append(row)
      progress.step(f"{preset} seed {seed}: {row.get('error') or row['solved_wall_s']}")

  run_dir = out_dir / "runs" / "hopper_ppo-0"
  row = {"part": "hopper", "task": "hopper_ppo", "seed": 0, "run_dir": str(run_dir),
         **run_train("hopper_ppo", 0, run_dir, {"total_env_steps": hopper_steps},
                     timeout_s=3_600.0)}
  if "error" not in row:
    records = read_records(run_dir)
    row["steps_to_2000"] = _steps_to(records, HOPPER_TARGET)
    row["best_return_mean"] = max((r["return_mean"] for r in records
                                   if r.get("return_mean") is not None), default=None)
  rows.append(row)
  progress.step(f"hopper_ppo: {row.get('error') or row.get('best_return_mean')}")

  for preset in atari:
    run_dir = out_dir / "runs" / f"{preset}-0"
    flags: dict[str, Any] = {"max_wall_s": atari_s, "log_every_s": 5.0}
    if preset.endswith("_dqn"):
      flags["min_replay_size"] = 2_000
    row = {"part": "atari", "task": preset, "seed": 0, "run_dir": str(run_dir),
           **run_train(preset, 0, run_dir, flags, timeout_s=atari_s + 300.0)}
    rows.append(row)
    progress.step(f"{preset}: {row.get('error') or round(row['sps'])} SPS")

  plots = [_plot_hopper([r for r in rows if r["part"] == "hopper" and "error" not in r],
                        out_dir / "hopper_ppo.png")]
  return SuiteResult(rows, _tables(rows), {"seeds": seeds, "hopper_steps": hopper_steps,
                                           "atari_wall_s": atari_s},
                     [p for p in plots if p])


def _plot_hopper(rows: list[dict[str, Any]], path: Path) -> str | None:
  if not rows:
    return None
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(6, 4))
  for r in rows:
    recs = [x for x in read_records(Path(r["run_dir"])) if x.get("return_mean") is not None]
    ax.plot([x["env_steps"] for x in recs], [x["return_mean"] for x in recs],
            label=f"seed {r['seed']}")
  ax.axhline(HOPPER_TARGET, color="grey", linestyle="--", label="2,000")
  ax.set(title="hopper_ppo (Hopper-v4)", xlabel="env steps", ylabel="return_mean (20 episodes)")
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path.name


def _tables(rows: list[dict[str, Any]]) -> str:
  cart = [r for r in rows if r["part"] == "cartpole"]
  summary = []
  for task in dict.fromkeys(r["task"] for r in cart):
    mine = [r for r in cart if r["task"] == task]
    solved = [r for r in mine if r.get("solved")]
    summary.append({
        "task": task, "solved": f"{len(solved)}/{len(mine)}",
        "median_solved_wall_s": median([r["solved_wall_s"] for r in solved]),
        "max_solved_wall_s": max((r["solved_wall_s"] for r in solved), default=None),
        "median_solved_env_steps": median([r["solved_env_steps"] for r in solved]),
        "median_sps": median([r.get("sps") for r in mine])})
  out = "## CartPole-v1: time to solve (from process start)\n\n"
  out += md_table(summary, ["task", "solved", "median_solved_wall_s", "max_solved_wall_s",
                            "median_solved_env_steps", "median_sps"]) if summary else ""
  out += "\n" + md_table(cart, ["task", "seed", "solved", "solved_wall_s", "solved_env_steps",
                                "sps", "first_update_wall_s", "error"])
  out += "\n## Hopper-v4 PPO\n\n" + md_table(
      [r for r in rows if r["part"] == "hopper"],
      ["task", "env_steps", "wall_s", "best_return_mean", "final_return_mean", "steps_to_2000",
       "sps", "error"])
  out += "\n## Atari presets, short runs\n\n" + md_table(
      [r for r in rows if r["part"] == "atari"],
      ["task", "env_steps", "wall_s", "sps", "first_update_wall_s", "final_return_mean",
       "stop_reason", "error"])
  return out
