"""How reliably a learning setting reaches a return: one in-process run per seed.

  python -m tools.seed_spread --values=tests.test_dqn:DQN_CARTPOLE --seeds=0-29 \\
      --flags='{"total_env_steps": 100000, "stop_at_return": 100}'
  python -m tools.seed_spread --preset=cartpole_dqn --seeds=0-9

Sizes the learning tests (a test that solves on 27 seeds of 30 fails CI one run in ten) and
shows a preset's spread. With --values the settings are a dict of flat values in a module
(a test's), over `tests.conftest.small_config`, exactly as the test builds its config; with
--preset, over the preset. Prints a line per seed (solved, env steps, final and best return
mean) and then: solved n/N, median and worst env steps to solve. Exit status 1 when a seed did
not solve.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import tempfile
import time
from pathlib import Path

from tools.bench_common import seed_list


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  group = parser.add_mutually_exclusive_group(required=True)
  group.add_argument("--values", help="module:NAME of a dict of flat settings (a test's)")
  group.add_argument("--preset", help="a preset of experiments/presets.py")
  parser.add_argument("--flags", default="{}", help="JSON dict of settings over those")
  parser.add_argument("--seeds", default="0-9", type=seed_list, help="e.g. 0-29 or 0,3,5")
  args = parser.parse_args()

  from jaxrl_async.config import TrainConfig
  from jaxrl_async.runtime.trainer import Trainer
  from tools.suites.convergence import read_records

  over = json.loads(args.flags)
  if args.values:
    from tests.conftest import small_config

    module, _, name = args.values.partition(":")
    values = getattr(importlib.import_module(module), name)
    make = lambda seed: small_config(**{**values, **over, "seed": seed})
  else:
    from experiments.presets import preset

    make = lambda seed: TrainConfig.from_flat({**preset(args.preset), **over, "seed": seed})
  solved_steps, seeds = [], args.seeds
  with tempfile.TemporaryDirectory() as tmp:
    for seed in seeds:
      config = make(seed)
      run_dir = Path(tmp) / str(seed)
      t0 = time.perf_counter()
      s = Trainer.from_config(config, run_dir=run_dir, quiet=True).run().summary
      returns = [r["return_mean"] for r in read_records(run_dir)
                 if r.get("return_mean") is not None]
      print(f"seed {seed}: solved={s['solved']} env_steps={s['env_steps']} "
            f"final={s['final_return_mean']} best={max(returns, default=None)} "
            f"{time.perf_counter() - t0:.1f}s", flush=True)
      if s["solved"]:
        solved_steps.append(s["env_steps"])
  print(f"solved {len(solved_steps)}/{len(seeds)}; env steps to solve: median "
        f"{statistics.median(solved_steps) if solved_steps else None}, worst "
        f"{max(solved_steps, default=None)}")
  return 0 if len(solved_steps) == len(seeds) else 1


if __name__ == "__main__":
  raise SystemExit(main())
