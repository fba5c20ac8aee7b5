"""Startup: where the seconds before learning go, with the compilation cache cold and warm.

For each CartPole preset (cartpole_impala only with --quick) and seed (0, 1, 2; seed 0 only with
--quick): one training process with a fresh, empty `--compilation_cache_dir` (cold), then one
more with the same folder (warm). Issue 3's criterion is the median over the 3 seeds.
Each row has the run's `timings` from summary.json (import_s, compile_init_s, compile_policy_s,
compile_update_s, train_start_wall_s, first_update_wall_s; all *_wall_s are from process start),
its time to solve and the process's own wall time. Two bare-import rows give the floor: a
Python that imports jax, flax, optax and envpool, and one that imports the trainer.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tools.bench_common import Progress, SuiteResult, md_table
from tools.suites.convergence import REPO, median, run_train

PHASES = ("import_s", "compile_init_s", "compile_policy_s", "compile_update_s",
          "train_start_wall_s", "first_update_wall_s", "solved_wall_s", "process_wall_s")
BARE_IMPORTS = {"jax+flax+optax+envpool": "import jax, flax.linen, optax, envpool",
                "jaxrl_async trainer": "import jaxrl_async.runtime.trainer"}


def time_import(statement: str, reps: int) -> float | None:
  """Median wall time of a fresh Python running `statement`."""
  times = []
  for _ in range(reps):
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", statement], cwd=REPO, capture_output=True,
                          timeout=120)
    if done.returncode == 0:
      times.append(time.perf_counter() - t0)
  return median(times)


def presets(quick: bool) -> list[str]:
  from experiments.presets import PRESETS

  if quick:
    return ["cartpole_impala"]
  return sorted(p for p in PRESETS if p.startswith("cartpole_"))


def run(out_dir: Path, quick: bool, tiny: bool = False) -> SuiteResult:
  names = presets(quick or tiny)
  seeds = (0,) if quick or tiny else (0, 1, 2)
  budget_s = 40.0 if tiny else 120.0
  progress = Progress(len(names) * len(seeds) * 2 + len(BARE_IMPORTS), "startup")
  rows: list[dict[str, Any]] = []
  for label, statement in BARE_IMPORTS.items():
    rows.append({"task": "bare import", "cache": label,
                 "process_wall_s": time_import(statement, 1 if tiny else 3)})
    progress.step(f"bare import {label}: {rows[-1]['process_wall_s']:.2f}s")
  for preset in names:
    for seed in seeds:
      cache = out_dir / "cache" / f"{preset}-{seed}"
      shutil.rmtree(cache, ignore_errors=True)
      for state in ("cold", "warm"):
        run_dir = out_dir / "runs" / f"{preset}-{seed}-{state}"
        flags = {"compilation_cache_dir": cache, "max_wall_s": budget_s}
        row = {"task": preset, "cache": state, "seed": seed, "run_dir": str(run_dir),
               **run_train(preset, seed, run_dir, flags, timeout_s=budget_s + 120)}
        rows.append(row)
        progress.step(f"{preset} {state} seed {seed}: " + (row.get("error") or (
            f"first update at {row['first_update_wall_s']:.1f}s, solved at "
            f"{row['solved_wall_s'] or float('nan'):.1f}s")))
  return SuiteResult(rows, tables(rows), {"presets": names, "seeds": list(seeds),
                                          "max_wall_s": budget_s},
                     [plot(rows, out_dir / "startup.png").name])


def medians(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
  out = []
  for key in dict.fromkeys((r["task"], r["cache"]) for r in rows if r["task"] != "bare import"):
    mine = [r for r in rows if (r["task"], r["cache"]) == key]
    out.append({"task": key[0], "cache": key[1], "runs": len(mine),
                **{p: median([r.get(p) for r in mine]) for p in PHASES}})
  return out


def plot(rows: list[dict[str, Any]], path: Path) -> Path:
  """Stacked phases per (preset, cache): imports, start-up to train start, waiting for the
  first update, learning to the solve."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  table = medians(rows)
  fig, ax = plt.subplots(figsize=(8, 1.5 + 0.6 * max(len(table), 1)))
  spans = (("imports", None, "import_s"), ("to train start", "import_s", "train_start_wall_s"),
           ("to first update", "train_start_wall_s", "first_update_wall_s"),
           ("learning to solve", "first_update_wall_s", "solved_wall_s"))
  labels = [f"{r['task']} ({r['cache']})" for r in table]
  for name, start_key, end_key in spans:
    starts = [(r.get(start_key) or 0.0) if start_key else 0.0 for r in table]
    widths = [max((r.get(end_key) or s) - s, 0.0) for r, s in zip(table, starts, strict=True)]
    ax.barh(labels, widths, left=starts, label=name)
  ax.set(xlabel="seconds from process start (medians)", title="start-up")
  ax.legend(fontsize="small", loc="lower right")
  ax.grid(alpha=0.3, axis="x")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path


def tables(rows: list[dict[str, Any]]) -> str:
  bare = [r for r in rows if r["task"] == "bare import"]
  runs = [r for r in rows if r["task"] != "bare import"]
  return ("## Bare imports (a fresh Python, median wall time)\n\n"
          + md_table(bare, ["cache", "process_wall_s"])
          + "\n## Phases, medians (seconds; *_wall_s from process start)\n\n"
          + md_table(medians(rows), ["task", "cache", "runs", *PHASES])
          + "\n## Every run\n\n"
          + md_table(runs, ["task", "cache", "seed", *PHASES, "solved", "solved_env_steps",
                            "error"]))
