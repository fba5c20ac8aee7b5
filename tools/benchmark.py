"""The reproducible benchmark suite.

    python -m tools.benchmark SUITE [--out DIR] [--quick] [--tiny] [--seeds LIST]

SUITE is one of throughput, transfer, convergence, startup, lag_sweep, balance, balance_grid,
decentralized, scaling, algos, or `all` (each into DIR/<suite>; a suite missing from the checkout
is reported and skipped). Each writes DIR/results.json (raw rows, config, machine, versions, git
revision),
DIR/results.md (tables) and its PNG plots, and prints a progress line per step. `--quick` is the
short version (minutes); `--tiny` shrinks the sizes further for tests (suites without a tiny size
run their quick version). `--seeds` (e.g. 10-19) replaces the seeds of the suites that run seeds
(lag_sweep, balance), so a study can be extended and pooled later
(`python -m tools.suites.balance DIR ...`). Exit status: 0 when every row has a result, 1 when
some row failed (its `error` says why), 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from tools.bench_common import SuiteResult, seed_list, write_results

# decentralized and algos are other engineers' suites, dispatched the same way.
SUITES = ("throughput", "transfer", "convergence", "startup", "lag_sweep", "balance",
          "balance_grid", "decentralized", "scaling", "algos")


def load_suite(name: str) -> Any:
  """The suite's module, imported only when asked for (some import JAX, one is someone else's)."""
  try:
    return importlib.import_module(f"tools.suites.{name}")
  except ModuleNotFoundError as e:
    if e.name != f"tools.suites.{name}":
      raise  # the suite exists but something it imports does not
    raise SystemExit(f"benchmark: suite {name!r} is not available: tools/suites/{name}.py "
                     "does not exist in this checkout") from e


def run_suite(name: str, out_dir: Path, quick: bool, tiny: bool, command: str,
              seeds: list[int] | None = None) -> SuiteResult:
  module = load_suite(name)
  params = inspect.signature(module.run).parameters
  kwargs: dict[str, Any] = {"tiny": True} if tiny and "tiny" in params else {}
  if seeds is not None and "seeds" in params:
    kwargs["seeds"] = seeds
  t0 = time.time()
  result = module.run(out_dir, quick or tiny, **kwargs)
  result.config = {**result.config, "quick": quick, "tiny": tiny,
                   "suite_wall_s": time.time() - t0}
  path = write_results(out_dir, name, result, command)
  failed = sum(1 for r in result.rows if r.get("error"))
  print(f"{name}: {len(result.rows)} rows ({failed} failed) in {time.time() - t0:.0f}s -> "
        f"{path} and {out_dir / 'results.md'}", flush=True)
  return result


def main(argv: list[str] | None = None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  parser = argparse.ArgumentParser(prog="python -m tools.benchmark",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("suite", choices=SUITES + ("all",))
  parser.add_argument("--out", type=Path, default=None,
                      help="Results folder (default: bench_out/<suite>).")
  parser.add_argument("--quick", action="store_true", help="The short version of the suite.")
  parser.add_argument("--tiny", action="store_true", help="Test sizes (implies --quick).")
  parser.add_argument("--seeds", type=seed_list, default=None,
                      help="Seeds for lag_sweep and balance, e.g. 10-19 or 0,3,5.")
  args = parser.parse_args(argv)
  if (args.seeds is not None and args.suite != "all"
      and "seeds" not in inspect.signature(load_suite(args.suite).run).parameters):
    parser.error(f"--seeds={','.join(map(str, args.seeds))}: the {args.suite} suite runs no "
                 "seeds (lag_sweep and balance do)")
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  command = shlex.join(["python", "-m", "tools.benchmark", *argv])
  names = SUITES if args.suite == "all" else (args.suite,)
  base = args.out or Path("bench_out") / ("" if args.suite == "all" else args.suite)
  failed = False
  for name in names:
    out_dir = base / name if args.suite == "all" else base
    try:
      result = run_suite(name, out_dir, args.quick, args.tiny, command, args.seeds)
    except SystemExit as e:
      if args.suite != "all":
        raise
      print(e, file=sys.stderr, flush=True)  # `all` goes on with the suites that exist
      failed = True
      continue
    failed = failed or any(r.get("error") for r in result.rows)
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
