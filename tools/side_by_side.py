"""Two checkouts of this repo, one training command, side by side on one machine at one time.

For each seed, a cold run (a fresh, empty compilation cache) and then a warm run (the same cache)
of each checkout, interleaved old, new, old, new, so that the machine's load falls on both
alike. Prints one row per run and the medians of time to solve from launch (`solved_wall_s`,
process start to the return target), cold and warm, with new / old.

  git worktree add /tmp/old a44f5c3
  python -m tools.side_by_side --old /tmp/old --new . --seeds 0-2 [--flags '{"num_envs": 32}']
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from tools.bench_common import seed_list
from tools.suites.convergence import run_train


def run_one(tree: Path, preset: str, seed: int, flags: dict[str, Any], cache: Path,
            run_dir: Path, timeout_s: float) -> dict[str, Any]:
  """One training process of the checkout `tree` (its own package first on sys.path)."""
  flags = {**flags, "compilation_cache_dir": cache, "checkpoint_at_end": False,
           "checkpoint_every_s": 0}
  return run_train(preset, seed, run_dir, flags, timeout_s, env={"PYTHONPATH": str(tree)},
                   repo=tree)


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--old", type=Path, required=True)
  parser.add_argument("--new", type=Path, default=Path("."))
  parser.add_argument("--preset", default="cartpole_impala")
  parser.add_argument("--seeds", type=seed_list, default=[0, 1, 2])
  parser.add_argument("--flags", type=json.loads, default={})
  parser.add_argument("--timeout_s", type=float, default=300.0)
  args = parser.parse_args()
  trees = {"old": args.old.resolve(), "new": args.new.resolve()}
  rows = []
  with tempfile.TemporaryDirectory() as tmp:
    for seed in args.seeds:
      for name, tree in trees.items():
        cache = Path(tmp) / f"cache-{name}-{seed}"
        for phase in ("cold", "warm"):
          row = run_one(tree, args.preset, seed, args.flags, cache,
                        Path(tmp) / f"run-{name}-{seed}-{phase}", args.timeout_s)
          rows.append({"tree": name, "seed": seed, "phase": phase} | row)
          print(json.dumps(rows[-1]), flush=True)
  print("\n| phase | old median solved_wall_s | new median solved_wall_s | new / old | "
        "unsolved old, new |\n|---|---|---|---|---|")
  for phase in ("cold", "warm"):
    med, unsolved = {}, {}
    for name in trees:
      mine = [r for r in rows if r["tree"] == name and r["phase"] == phase]
      times = [r["solved_wall_s"] for r in mine if r.get("solved")]
      med[name] = statistics.median(times) if times else float("nan")
      unsolved[name] = len(mine) - len(times)
    print(f"| {phase} | {med['old']:.2f} | {med['new']:.2f} | {med['new'] / med['old']:.3f} | "
          f"{unsolved['old']}, {unsolved['new']} |")
  return 0


if __name__ == "__main__":
  sys.exit(main())
