"""Evaluate a fixed policy over a directed network: `python -m experiments.policy_evaluation`.

    python -m experiments.policy_evaluation                       # random MDP, 4 nodes, async
    python -m experiments.policy_evaluation --mode=sync --stragglers=1
    python -m experiments.policy_evaluation --data=mountain_car --nodes=8 --max_wall_s=120
    python -m experiments.policy_evaluation --runtime=processes --nodes=2 --tol=1e-6
    python -m experiments.policy_evaluation --runtime=processes --nodes=4 --tol=1e-6 \
        --hosts=127.0.0.1,127.0.0.2,127.0.0.3:2           # nodes listen on these addresses
    experiments/launch/policy_evaluation_hosts.py --via=ssh --hosts=10.0.0.2,10.0.0.3:2 \
        --coordinator=10.0.0.1:5555 -- --tol=1e-6        # nodes on other machines, CURVE
    python -m experiments.policy_evaluation --runtime=processes --nodes=4 --tol=1e-6 --curve \
        --hosts=127.0.0.1,127.0.0.2,127.0.0.3,127.0.0.4   # CURVE on loopback too
    python -m experiments.policy_evaluation --nodes=8 --stragglers=1 --tol=1e-6
        # one node 10x slower, found by measurement: its shards and weights follow
    python -m experiments.policy_evaluation --nodes=8 --stragglers=1 --straggler_after=5e4
        # the same node slows down mid-run
    python -m experiments.policy_evaluation --runtime=processes --nodes=4 --tol=1e-6 \
        --drop_prob=0.3 --link_delay_ms=2 --delay_dist=exponential  # lossy, reordering links

Every setting is a flag (help text from `jaxrl_async.decentralized.config`). Runs until every
node's relative error is below --tol or a budget is spent, prints progress, and writes
metrics.jsonl, summary.json and two PNGs to --run_dir (default
runs/policy_evaluation-<data>-<runtime>-<mode>-N<nodes>-<seed>, with -2, -3, ... appended while
that name is in use; an explicit --run_dir that holds a run's results is refused unless
--overwrite). Bad input exits with status 2 and one line naming the flag, before anything starts;
divergence exits 1 naming the step-size flags.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time

from absl import app, flags

from experiments.cli import parse_flags
from jaxrl_async.decentralized.config import ConfigError, PolicyEvalConfig
from jaxrl_async.decentralized.graphs import GraphError
from jaxrl_async.decentralized.problem import ProblemError

_QUIET = flags.DEFINE_bool("quiet", False, "No progress lines on the console.")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace the results in an explicit --run_dir "
                               "that already holds a run's summary.json or metrics.jsonl.")
_DEFINERS = {bool: flags.DEFINE_bool, int: flags.DEFINE_integer, float: flags.DEFINE_float,
             str: flags.DEFINE_string}
_CONFIG_FLAGS = {
    name: _DEFINERS[type(field.default)](name, field.default, field.metadata["help"])
    for name, field in PolicyEvalConfig.flag_fields().items()
}


def resolve_config() -> PolicyEvalConfig:
  return PolicyEvalConfig(**{name: holder.value for name, holder in _CONFIG_FLAGS.items()})


def progress_printer(quiet: bool, clock: str):
  last = [0.0]

  def show(record: dict) -> None:
    if "event" in record:  # a re-plan or a step back-off: always shown, it changes the run
      info = {k: v for k, v in record.items() if k not in ("event", "k", "time")}
      print(f"k={record.get('k', 0):>10d} {clock}={record['time']:>12.1f} {record['event']}: "
            f"{json.dumps(info)}", flush=True)
      return
    if quiet or time.monotonic() - last[0] < 1.0:
      return
    last[0] = time.monotonic()
    print(f"k={record['k']:>10d} {clock}={record['time']:>12.1f} "
          f"worst_rel_error={record['worst_rel_error']:.3e} "
          f"consensus={record['consensus_error']:.2e} wall={record['wall_s']:.1f}s", flush=True)

  return show


def _placement(config: PolicyEvalConfig) -> str:
  if config.runtime != "processes":
    return ""
  where = f" on {config.hosts or '127.0.0.1'}"
  where += f", coordinator {config.coordinator}" if config.coordinator else ""
  return where + (", CURVE" if config.uses_curve else "")


def main(argv: list[str]) -> int:
  if len(argv) > 1:
    print(f"policy_evaluation: unexpected arguments {argv[1:]}", file=sys.stderr)
    return 2
  try:
    config = resolve_config()
    from jaxrl_async.decentralized import experiment

    experiment.check_run_dir(config, _OVERWRITE.value)
    experiment.check_network(config)
    graph = experiment.make_graph(config)
    problem = experiment.make_problem(config)
  except (ConfigError, GraphError, ProblemError) as e:
    print(f"policy_evaluation: {e}", file=sys.stderr)
    return 2
  del graph  # built only to refuse a bad topology before anything starts
  from jaxrl_async.decentralized.simulator import DivergenceError

  run_dir = experiment.claim_run_dir(config)
  config = dataclasses.replace(config, run_dir=str(run_dir))
  clock = "wall_s" if config.runtime == "processes" else "virtual_time"
  print(f"policy_evaluation: {problem.name}, {config.topology} graph, mode={config.mode}, "
        f"runtime={config.runtime}{_placement(config)}, N={config.nodes}, alpha={config.alpha}, "
        f"beta={config.beta}, pull_lag={config.n_pull_lag}, {problem.shards} shards "
        f"({config.allocation} allocation), {config.weights} weights, rows per node "
        f"{problem.count.tolist()} -> {run_dir}", flush=True)
  writer = experiment.MetricsWriter(run_dir / "metrics.jsonl")
  show = progress_printer(_QUIET.value, clock)
  try:
    result = experiment.run(config, problem, on_record=lambda r: (writer(r), show(r)))
  except DivergenceError as e:
    print(f"policy_evaluation: {e}", file=sys.stderr)
    return 1
  finally:
    writer.close()
  summary = experiment.summary(config, result, problem)
  (run_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
  experiment.plot(result, run_dir, f"{problem.name}\n{config.mode}, {config.topology}, "
                  f"N={config.nodes}", "wall seconds" if clock == "wall_s" else "virtual time")
  print(f"done: {result.stopped} final_rel_error={summary['final_rel_error']:.3e} "
        f"updates={summary['updates']} {clock}={summary[clock]:.1f} "
        f"rate_c={summary['rate_c']:.8f} consensus_error={summary['consensus_error']:.2e} "
        f"-> {run_dir}/summary.json", flush=True)
  return 0


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
