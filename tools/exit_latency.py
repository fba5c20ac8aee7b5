"""How long the launcher's process lives past the end its summary records.

`python -m tools.exit_latency [--runs=3] [--tree=PATH] [--flags='{"seed": 1}']` runs
`python -m experiments.train` (the default CartPole run unless flags are given) from the
repository at PATH (default: this one) and, per run, reports the process's exit time less the
summary's `wall_s` (both counted from the process's start: the spawn here, /proc there), and the
final checkpoint's time. The goal: exit within 0.5 s of `wall_s` when no final checkpoint is due.
Writes --out (JSON) and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOAL_S = 0.5


def one_run(tree: Path, flags: dict, run_dir: Path) -> dict:
  args = [f"--{k}={v}" for k, v in flags.items()]
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  t0 = time.time()
  r = subprocess.run([sys.executable, "-m", "experiments.train", "--quiet",
                      f"--run_dir={run_dir}", *args], cwd=tree, env=env, capture_output=True,
                     text=True, timeout=900)
  lived = time.time() - t0
  if r.returncode != 0:
    raise SystemExit(f"exit_latency: the run failed ({r.returncode}):\n{r.stderr[-3000:]}")
  s = json.loads((run_dir / "summary.json").read_text())
  return {"lived_s": lived, "wall_s": s["wall_s"], "exit_after_wall_s": lived - s["wall_s"],
          "final_checkpoint_s": s["timings"].get("final_checkpoint_s"),
          "stop_reason": s["stop_reason"]}


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--runs", type=int, default=3)
  parser.add_argument("--tree", type=Path, default=ROOT, help="the repository to run")
  parser.add_argument("--flags", default="{}", help="JSON: extra experiments.train flags")
  parser.add_argument("--out", type=Path, default=Path("runs/exit_latency.json"))
  a = parser.parse_args()
  if a.runs < 1:
    parser.error(f"--runs={a.runs}: must be >= 1")
  flags = json.loads(a.flags)
  rows = []
  with tempfile.TemporaryDirectory() as tmp:
    for i in range(a.runs):
      rows.append(one_run(a.tree.resolve(), flags, Path(tmp) / f"run{i}"))
  gaps = [r["exit_after_wall_s"] for r in rows]
  result = {"tree": str(a.tree), "flags": flags, "runs": rows, "median_s": statistics.median(gaps),
            "max_s": max(gaps), "goal_s": GOAL_S, "met": max(gaps) <= GOAL_S}
  a.out.parent.mkdir(parents=True, exist_ok=True)
  a.out.write_text(json.dumps(result, indent=1))
  print("| run | wall_s | exit - wall_s | final checkpoint s | stop |\n|---|---|---|---|---|")
  for i, r in enumerate(rows):
    ck = r["final_checkpoint_s"]
    print(f"| {i} | {r['wall_s']:.2f} | {r['exit_after_wall_s']:.3f} | "
          f"{'-' if ck is None else f'{ck:.3f}'} | {r['stop_reason']} |")
  print(f"median {result['median_s']:.3f} s, max {result['max_s']:.3f} s: goal <= {GOAL_S} s "
        f"{'met' if result['met'] else 'NOT met'}")
  return 0 if result["met"] else 1


if __name__ == "__main__":
  sys.exit(main())
