"""Convergence: wall time and env steps to solve, each run a separate training process.

Every CartPole preset in `experiments.presets.PRESETS` (names starting "cartpole_") and Acrobot-v1
(the cartpole_impala settings, solved at a mean return of -100 over the last episodes: the
reward threshold gym registers for Acrobot-v1), 3 seeds each (1 with --quick). A run is
`python -m experiments.train --preset=... --seed=... --run_dir=... --quiet` in a fresh process,
so its time counts from process start (imports and compilation included), as a user sees it;
the numbers come from the run's summary.json and metrics.jsonl.

This module also holds what the process-based suites (startup, lag_sweep) share: starting a
training process and reading a finished run.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tools.bench_common import Progress, SuiteResult, md_table

REPO = Path(__file__).resolve().parents[2]
ACROBOT = {"env_id": "Acrobot-v1", "stop_at_return": -100.0}


# -- training processes (shared with the startup and lag_sweep suites) -------------------------


def train_command(preset: str, seed: int, run_dir: Path, flags: dict[str, Any] | None = None
                  ) -> list[str]:
  cmd = [sys.executable, "-m", "experiments.train", f"--preset={preset}", f"--seed={seed}",
         f"--run_dir={run_dir}", "--quiet"]
  for name, value in (flags or {}).items():
    value = str(value).lower() if isinstance(value, bool) else value
    cmd.append(f"--{name}={value}")
  return cmd


def run_train(preset: str, seed: int, run_dir: Path, flags: dict[str, Any] | None = None,
              timeout_s: float = 600.0, env: dict[str, str] | None = None,
              repo: Path = REPO) -> dict[str, Any]:
  """Runs one training process of the checkout `repo` to the end; returns `read_run`'s row plus
  the process's own wall time, or a row with `error` (exit status and the last lines of its
  output)."""
  cmd = train_command(preset, seed, run_dir, flags)
  run_env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})}
  load = os.getloadavg()[0]  # the machine is shared: a busy neighbour explains odd numbers
  t0 = time.perf_counter()
  try:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=repo,
                          env=run_env)
  except subprocess.TimeoutExpired:
    return {"error": f"killed after {timeout_s:.0f}s", "command": " ".join(cmd[1:])}
  wall = time.perf_counter() - t0
  row: dict[str, Any] = {"command": " ".join(["python", *cmd[1:]]), "process_wall_s": wall,
                         "loadavg_1m": load}
  if done.returncode != 0 or not (run_dir / "summary.json").exists():
    tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
    return row | {"error": f"exit {done.returncode}: {tail}"}
  return row | read_run(run_dir)


def compile_programs(preset: str, flags: dict[str, Any] | None = None, timeout_s: float = 600.0,
                     repo: Path = REPO) -> str:
  """`experiments.train --compile_only` for `preset` with `flags`: every program a run of that
  config compiles, in the cache before the measured runs (a suite that compares settings must
  not let one pay a compile the others were served). Returns the launcher's line."""
  cmd = [*train_command(preset, 0, Path("unused"), flags), "--compile_only"]
  done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=repo,
                        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
  if done.returncode != 0:
    tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
    raise RuntimeError(f"{' '.join(cmd[1:])}: exit {done.returncode}: {tail}")
  return done.stdout.strip().splitlines()[-1]


def read_records(run_dir: Path) -> list[dict[str, Any]]:
  out = []
  path = Path(run_dir) / "metrics.jsonl"
  if path.exists():
    for line in path.read_text().splitlines():
      try:
        out.append(json.loads(line))
      except json.JSONDecodeError:
        continue
  return out


def lag_mean(hist: dict[str, int]) -> float | None:
  n = sum(hist.values())
  return sum(int(k) * v for k, v in hist.items()) / n if n else None


def time_weighted(records: list[dict[str, Any]], key: str) -> float | None:
  """Mean of a per-interval fraction over `records`, each weighted by its interval."""
  total = weight = 0.0
  for prev, cur in zip(records, records[1:], strict=False):
    dt, value = cur["wall_s"] - prev["wall_s"], cur.get(key)
    if dt > 0 and value is not None:
      total, weight = total + value * dt, weight + dt
  return total / weight if weight else None


def read_run(run_dir: Path) -> dict[str, Any]:
  """A finished run's row: the summary's outcome, lag and timings, and from metrics.jsonl the
  SPS and learner idle fraction after the first update (start-up excluded)."""
  s = json.loads((Path(run_dir) / "summary.json").read_text())
  records = [r for r in read_records(run_dir) if r.get("version", 0) >= 1]
  timings = s.get("timings", {})
  if len(records) >= 2 and records[-1]["wall_s"] > records[0]["wall_s"]:
    a, b = records[0], records[-1]
    sps = (b["env_steps"] - a["env_steps"]) / (b["wall_s"] - a["wall_s"])
  else:
    start = timings.get("train_start_wall_s") or 0.0
    sps = s["env_steps"] / max(s["wall_s"] - start, 1e-9)
  return {
      "solved": bool(s.get("solved")),
      "solved_wall_s": s.get("solved_wall_s"),
      "solved_env_steps": s.get("solved_env_steps"),
      "final_return_mean": s.get("final_return_mean"),
      "stop_reason": s.get("stop_reason"),
      "env_steps": s.get("env_steps"),
      "wall_s": s.get("wall_s"),
      "sps": sps,
      "policy_lag_mean": lag_mean(s.get("lag_hist") or {}),
      "policy_lag_max": s.get("max_policy_lag_seen"),
      "dropped_stale": s.get("dropped_stale"),
      "idle_env_steps": s.get("idle_env_steps"),
      "updates": s.get("updates"),
      "learner_idle_frac": time_weighted(records, "learner_idle_frac"),
      **{k: timings.get(k) for k in ("import_s", "compile_init_s", "compile_policy_s",
                                     "compile_update_s", "train_start_wall_s",
                                     "first_update_wall_s")},
  }


def median(values: list[Any]) -> float | None:
  values = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
  return statistics.median(values) if values else None


def plot_returns(rows: list[dict[str, Any]], colour_key: str, path: Path, title: str,
                 style_key: str | None = None) -> Path:
  """Return against wall time: one panel per task, a colour per `colour_key` value, a line
  style per `style_key` value, a line per run."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  tasks = list(dict.fromkeys(r["task"] for r in rows)) or ["no finished runs"]
  fig, axes = plt.subplots(1, len(tasks), figsize=(7 * len(tasks), 4.5), squeeze=False)
  colours = plt.get_cmap("tab10").colors
  styles = ("-", "--", ":", "-.")
  colour_of = {v: colours[i % len(colours)]
               for i, v in enumerate(dict.fromkeys(r.get(colour_key) for r in rows))}
  style_of = {v: styles[i % len(styles)]
              for i, v in enumerate(dict.fromkeys(r.get(style_key) for r in rows))}
  for ax, task in zip(axes[0], tasks, strict=True):
    labelled = set()
    for r in rows:
      if r["task"] != task:
        continue
      setting = (r.get(colour_key), r.get(style_key))
      label = ", ".join(f"{k}={v}" for k, v in zip((colour_key, style_key), setting,
                                                   strict=True) if k)
      recs = [x for x in read_records(Path(r["run_dir"])) if x.get("return_mean") is not None]
      ax.plot([x["wall_s"] for x in recs], [x["return_mean"] for x in recs],
              color=colour_of[setting[0]], linestyle=style_of[setting[1]], alpha=0.8,
              label=None if setting in labelled else label)
      labelled.add(setting)
    ax.set(title=task, xlabel="wall time since process start (s)", ylabel="return")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[1]:
      ax.legend(fontsize="x-small", loc="center left", bbox_to_anchor=(1.0, 0.5))
  fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path


# -- the suite ----------------------------------------------------------------------------------


def tasks() -> dict[str, tuple[str, dict[str, Any]]]:
  """task -> (preset, extra flags): every cartpole_* preset, and Acrobot-v1."""
  from experiments.presets import PRESETS

  out = {name: (name, {}) for name in sorted(PRESETS) if name.startswith("cartpole_")}
  out["acrobot_impala"] = ("cartpole_impala", dict(ACROBOT))
  return out


def run(out_dir: Path, quick: bool, tiny: bool = False) -> SuiteResult:
  seeds = (0,) if quick else (0, 1, 2)
  # A budget per run: unsolved runs end at max_wall_s, and a hung one is killed.
  budget_s = 60.0 if tiny else 150.0 if quick else 400.0
  todo = tasks()
  if tiny:
    todo = {k: v for k, v in todo.items() if k == "cartpole_impala"}
  progress = Progress(len(todo) * len(seeds), "convergence")
  rows = []
  for task, (preset, flags) in todo.items():
    for seed in seeds:
      run_dir = out_dir / "runs" / f"{task}-{seed}"
      row = {"task": task, "preset": preset, "seed": seed, "run_dir": str(run_dir),
             **run_train(preset, seed, run_dir, {**flags, "max_wall_s": budget_s},
                         timeout_s=budget_s + 120)}
      rows.append(row)
      progress.step(f"{task} seed {seed}: " + (row.get("error") or (
          f"solved={row['solved']} in {row['solved_wall_s'] or float('nan'):.1f}s, "
          f"{row['solved_env_steps']} steps")))
  ok = [r for r in rows if "error" not in r]
  plots = [plot_returns(ok, "seed", out_dir / "convergence.png",
                        "return against wall time").name]
  return SuiteResult(rows, tables(rows), {"seeds": seeds, "max_wall_s": budget_s,
                                          "tasks": {k: v for k, v in todo.items()}}, plots)


def tables(rows: list[dict[str, Any]]) -> str:
  summary = []
  for task in dict.fromkeys(r["task"] for r in rows):
    mine = [r for r in rows if r["task"] == task]
    solved = [r for r in mine if r.get("solved")]
    summary.append({
        "task": task, "solved": f"{len(solved)}/{len(mine)}",
        "median_solved_wall_s": median([r["solved_wall_s"] for r in solved]),
        "median_solved_env_steps": median([r["solved_env_steps"] for r in solved]),
        "max_solved_wall_s": max((r["solved_wall_s"] for r in solved), default=None),
        "median_sps": median([r.get("sps") for r in mine]),
        "median_import_s": median([r.get("import_s") for r in mine]),
        "median_first_update_wall_s": median([r.get("first_update_wall_s") for r in mine]),
    })
  return ("## Time to solve (wall time from process start; medians over seeds)\n\n"
          + md_table(summary, list(summary[0]) if summary else ["task"])
          + "\n## Every run\n\n"
          + md_table(rows, ["task", "seed", "solved", "solved_wall_s", "solved_env_steps",
                            "final_return_mean", "sps", "first_update_wall_s", "process_wall_s",
                            "stop_reason", "loadavg_1m", "error"]))
