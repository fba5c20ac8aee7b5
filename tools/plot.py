"""Plots of one or several runs, from their metrics.jsonl and summary.json.

    python tools/plot.py RUN_DIR [RUN_DIR ...] [--out DIR]

writes into DIR (default: the run's folder for one run, ./plots for several):
- `learning_curves.png`: return_mean against env steps and against wall time;
- `lag_hist.png`: how many rollouts were learned from at each policy lag;
- `sps.png`: env steps per second over time, with learner idle and actor blocked fractions.
Needs only matplotlib (Agg backend), so it runs on a machine without a display or JAX.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load_run(run_dir: Path) -> dict[str, Any]:
  """{"records": metrics.jsonl as dicts, "summary": summary.json or {}}; a torn last line (a
  run still writing) is skipped."""
  run_dir = Path(run_dir)
  records = []
  path = run_dir / "metrics.jsonl"
  if path.exists():
    for line in path.read_text().splitlines():
      try:
        records.append(json.loads(line))
      except json.JSONDecodeError:
        continue
  summary_path = run_dir / "summary.json"
  summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
  if not records and not summary:
    raise FileNotFoundError(f"{run_dir}: no metrics.jsonl or summary.json")
  return {"records": records, "summary": summary}


def labels(run_dirs: list[Path]) -> list[str]:
  """Short unique names: the folder name, or parent/name where names repeat."""
  names = [Path(d).resolve().name for d in run_dirs]
  if len(set(names)) == len(names):
    return names
  return [f"{Path(d).resolve().parent.name}/{Path(d).resolve().name}" for d in run_dirs]


def lag_histogram(run: dict[str, Any]) -> dict[int, int]:
  """The whole run's lag counts: summary.json's, else the sum of the per-interval windows."""
  hist = run["summary"].get("lag_hist")
  if not hist:
    hist = collections.Counter()
    for r in run["records"]:
      hist.update({k: int(v) for k, v in (r.get("lag_hist") or {}).items()})
  return {int(k): int(v) for k, v in hist.items()}


def _series(records: list[dict[str, Any]], x: str, y: str) -> tuple[list[float], list[float]]:
  pairs = [(r[x], r[y]) for r in records if r.get(x) is not None and r.get(y) is not None]
  return [p[0] for p in pairs], [p[1] for p in pairs]


def plot_learning_curves(runs: list[dict[str, Any]], names: list[str], path: Path) -> Path:
  fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
  for run, name in zip(runs, names, strict=True):
    for ax, x in zip(axes, ("env_steps", "wall_s"), strict=True):
      xs, ys = _series(run["records"], x, "return_mean")
      ax.plot(xs, ys, label=name)
  axes[0].set(xlabel="env steps", ylabel="return (mean of last episodes)")
  axes[1].set(xlabel="wall time since process start (s)")
  for ax in axes:
    ax.grid(alpha=0.3)
  axes[1].legend(fontsize="small")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path


def plot_lag_hist(runs: list[dict[str, Any]], names: list[str], path: Path) -> Path:
  fig, ax = plt.subplots(figsize=(6, 4))
  width = 0.8 / max(len(runs), 1)
  for i, (run, name) in enumerate(zip(runs, names, strict=True)):
    hist = lag_histogram(run)
    total = sum(hist.values()) or 1
    lags = sorted(hist)
    ax.bar([k - 0.4 + width * (i + 0.5) for k in lags], [hist[k] / total for k in lags],
           width=width, label=name)
  ax.set(xlabel="policy lag at consumption (versions)", ylabel="fraction of rollouts learned")
  ax.xaxis.get_major_locator().set_params(integer=True)
  ax.legend(fontsize="small")
  ax.grid(alpha=0.3, axis="y")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path


def plot_sps(runs: list[dict[str, Any]], names: list[str], path: Path) -> Path:
  fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
  for run, name in zip(runs, names, strict=True):
    (line,) = top.plot(*_series(run["records"], "wall_s", "sps"), label=name)
    xs, idle = _series(run["records"], "wall_s", "learner_idle_frac")
    bottom.plot(xs, [100 * v for v in idle], color=line.get_color())
    xs, blocked = _series(run["records"], "wall_s", "actor_blocked_frac")
    bottom.plot(xs, [100 * v for v in blocked], color=line.get_color(), linestyle="--")
  top.set(ylabel="env steps / s")
  bottom.set(xlabel="wall time since process start (s)",
             ylabel="% of time (solid: learner idle,\ndashed: actors blocked)", ylim=(-2, 102))
  top.legend(fontsize="small")
  for ax in (top, bottom):
    ax.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path


def plot_runs(run_dirs: list[Path], out_dir: Path) -> list[Path]:
  """Draws the three figures for `run_dirs` into `out_dir`; returns their paths."""
  runs = [load_run(Path(d)) for d in run_dirs]
  names = labels([Path(d) for d in run_dirs])
  out_dir.mkdir(parents=True, exist_ok=True)
  return [plot_learning_curves(runs, names, out_dir / "learning_curves.png"),
          plot_lag_hist(runs, names, out_dir / "lag_hist.png"),
          plot_sps(runs, names, out_dir / "sps.png")]


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="plot", description=__doc__.split("\n\n")[0])
  parser.add_argument("run_dirs", nargs="+", type=Path, help="Run folders (with metrics.jsonl).")
  parser.add_argument("--out", type=Path, default=None,
                      help="Where the PNGs go (default: the run's folder, or ./plots).")
  args = parser.parse_args(argv)
  out = args.out or (args.run_dirs[0] if len(args.run_dirs) == 1 else Path("plots"))
  try:
    paths = plot_runs(args.run_dirs, out)
  except FileNotFoundError as e:
    print(f"plot: {e}", file=sys.stderr)
    return 2
  for p in paths:
    print(p)
  return 0


if __name__ == "__main__":
  sys.exit(main())
