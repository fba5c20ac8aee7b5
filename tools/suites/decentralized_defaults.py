"""The decentralized suite's tables at default flags (issue 20): every run below is
`python -m experiments.policy_evaluation` with only the named flags changed, through the same
`experiment.run`. The full suite (tools/suites/decentralized.py) runs through
`python -m tools.benchmark decentralized`; these tables alone through
`python -m tools.suites.decentralized --tables=...` (`main`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tools.bench_common import Progress, md_table
from tools.suites.decentralized import SLOWDOWN, STRAGGLER_NODES

DEFAULT_NODES = (1, 2, 4, 8, 16)
CONVERGENCE_NODES = (2, 4, 8, 16)
TOPOLOGY_FAMILIES = ("ring", "exponential", "random")


def _defaults(tol: float, **flags: Any):
  from jaxrl_async.decentralized import experiment
  from jaxrl_async.decentralized.config import PolicyEvalConfig

  config = PolicyEvalConfig(tol=tol, max_wall_s=3000.0, **flags)
  return config, experiment.run(config)


def defaults_speedup_rows(progress: Progress, nodes=DEFAULT_NODES) -> list[dict[str, Any]]:
  """Virtual time to 1e-6 and 1e-8 at default flags for each N (one problem: 80 shards)."""
  rows = []
  for n in nodes:
    config, r = _defaults(1e-8, nodes=n)
    rows.append({"table": "defaults_speedup", "nodes": n, "shards": config.n_shards,
                 "T_1e-6": r.time_to(1e-6), "T_1e-8": r.time_to(1e-8),
                 "updates_1e-8": r.updates_to(1e-8), "step_backoffs": r.extra["step_backoffs"]})
    progress.step(f"defaults speedup N={n}: {rows[-1]['T_1e-8']}")
  for key in ("1e-6", "1e-8"):
    t1 = rows[0][f"T_{key}"]
    for row in rows:
      if t1 and row[f"T_{key}"]:
        row[f"efficiency_{key}"] = t1 / (row["nodes"] * row[f"T_{key}"])
  return rows


def defaults_straggler_rows(progress: Progress) -> list[dict[str, Any]]:
  """N = 8, node 0 10x slower from the start, from t = 5e4, or in [5e4, 1e5); async (speeds
  measured, nothing declared) and sync; growth against no straggler, at default flags."""
  cases = [("none", {}), ("from start", {"stragglers": 1}),
           ("from 5e4", {"stragglers": 1, "straggler_after": 5e4}),
           ("5e4 to 1e5", {"stragglers": 1, "straggler_after": 5e4, "straggler_until": 1e5})]
  rows = []
  for mode in ("async", "sync"):
    base = None
    for name, flags in cases:
      if mode == "sync" and name != "none" and name != "from start":
        continue
      _, r = _defaults(1e-8, nodes=STRAGGLER_NODES, mode=mode, straggler_slowdown=SLOWDOWN,
                       **flags)
      row = {"table": "defaults_stragglers", "mode": mode, "straggler": name,
             "T_1e-6": r.time_to(1e-6), "T_1e-8": r.time_to(1e-8),
             "replans": r.extra["replans"], "step_backoffs": r.extra["step_backoffs"]}
      base = base or row
      for key in ("1e-6", "1e-8"):
        if base[f"T_{key}"] and row[f"T_{key}"]:
          row[f"growth_{key}"] = row[f"T_{key}"] / base[f"T_{key}"]
      rows.append(row)
      progress.step(f"defaults stragglers {mode} {name}: {row['T_1e-8']}")
  return rows


def convergence_rows(progress: Progress, data: tuple[str, ...] = ("random_mdp", "mountain_car"),
                     nodes=CONVERGENCE_NODES, topologies=TOPOLOGY_FAMILIES
                     ) -> list[dict[str, Any]]:
  """Default flags to relative error 1e-8 for every N, data set and graph family."""
  rows = []
  for name in data:
    for topology in topologies:
      for n in nodes:
        row: dict[str, Any] = {"table": "convergence", "data": name, "topology": topology,
                               "nodes": n}
        try:
          config, r = _defaults(1e-8, nodes=n, data=name, topology=topology)
          row.update(shards=config.n_shards, stopped=r.stopped,
                     final_rel_error=r.final_rel_error, updates=r.updates,
                     virtual_time=r.elapsed, step_backoffs=r.extra["step_backoffs"],
                     host_wall_s=r.wall_s)
        except Exception as e:  # noqa: BLE001 - record and go on to the next row
          row["error"] = f"{type(e).__name__}: {e}"[:300]
        rows.append(row)
        progress.step(f"convergence {name} {topology} N={n}: {row.get('final_rel_error')}")
  return rows


FAULTS = (("clean", {}), ("drop 0.3", {"drop_prob": 0.3}),
          ("delay 1 ms exp.", {"link_delay_ms": 1.0, "delay_dist": "exponential"}),
          ("drop 0.3 + delay 1 ms exp.", {"drop_prob": 0.3, "link_delay_ms": 1.0,
                                          "delay_dist": "exponential"}))


def fault_rows(progress: Progress, nodes: int = 4) -> list[dict[str, Any]]:
  """The process runtime (real ZeroMQ sockets) with loss and delay injected in every node's
  links (`processes.Links`): wall time and updates to 1e-6, default flags otherwise, on a
  small problem (400 samples, d = 8) so that the four variants fit in minutes."""
  rows = []
  for name, flags in FAULTS:
    row: dict[str, Any] = {"table": "faults", "nodes": nodes, "faults": name}
    try:
      _, r = _defaults(1e-6, runtime="processes", nodes=nodes, samples=400, features=8,
                       states=20, **flags)
      row.update(stopped=r.stopped, wall_s_to_1e6=r.time_to(1e-6), updates=r.updates,
                 final_rel_error=r.final_rel_error, injected_drops=r.extra["injected_drops"],
                 queue_drops=r.extra["dropped_sends"], replans=r.extra["replans"],
                 step_backoffs=r.extra["step_backoffs"])
    except Exception as e:  # noqa: BLE001 - record and go on to the next row
      row["error"] = f"{type(e).__name__}: {e}"[:300]
    rows.append(row)
    progress.step(f"faults {name}: {row.get('wall_s_to_1e6')}")
  return rows


def defaults_tables(rows: list[dict[str, Any]]) -> str:
  by = {t: [r for r in rows if r["table"] == t] for t in
        ("defaults_speedup", "defaults_stragglers", "convergence", "faults")}
  out = ""
  if by["defaults_speedup"]:
    out += ("## Speed-up at default flags (80 shards of 160 rows, one problem for every N)\n\n"
            + md_table(by["defaults_speedup"], ["nodes", "shards", "T_1e-6", "efficiency_1e-6",
                                                "T_1e-8", "efficiency_1e-8", "updates_1e-8",
                                                "step_backoffs"]))
  if by["defaults_stragglers"]:
    out += (f"\n## Stragglers at default flags: N = {STRAGGLER_NODES}, node 0 {SLOWDOWN:g}x "
            "slower (measured, not declared)\n\n"
            + md_table(by["defaults_stragglers"], ["mode", "straggler", "T_1e-6", "growth_1e-6",
                                                   "T_1e-8", "growth_1e-8", "replans",
                                                   "step_backoffs"]))
  if by["convergence"]:
    out += ("\n## Default flags to 1e-8: every N, data set and graph family\n\n"
            + md_table(by["convergence"], ["data", "topology", "nodes", "shards", "stopped",
                                           "final_rel_error", "updates", "virtual_time",
                                           "step_backoffs", "host_wall_s", "error"]))
  if by["faults"]:
    out += ("\n## Real sockets with injected loss and delay (4 processes, 400 samples, d = 8, "
            "to 1e-6)\n\n"
            + md_table(by["faults"], ["faults", "stopped", "wall_s_to_1e6", "updates",
                                      "final_rel_error", "injected_drops", "queue_drops",
                                      "replans", "step_backoffs", "error"]))
  return out


def main(argv: list[str] | None = None) -> int:
  """`python -m tools.suites.decentralized --tables=defaults_speedup,defaults_stragglers,
  convergence,faults [--data=random_mdp] --out DIR`: the default-flag tables alone (the full suite
  runs through `python -m tools.benchmark decentralized`)."""
  import argparse
  import json

  parser = argparse.ArgumentParser(description=main.__doc__)
  parser.add_argument("--tables", default="defaults_speedup,defaults_stragglers,convergence")
  parser.add_argument("--data", default="random_mdp,mountain_car")
  parser.add_argument("--nodes", default="", help="comma-separated N for convergence")
  parser.add_argument("--topologies", default=",".join(TOPOLOGY_FAMILIES))
  parser.add_argument("--out", required=True)
  args = parser.parse_args(argv)
  out = Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  tables = args.tables.split(",")
  progress = Progress(99, "decentralized defaults")
  rows: list[dict[str, Any]] = []
  if "defaults_speedup" in tables:
    rows += defaults_speedup_rows(progress)
  if "defaults_stragglers" in tables:
    rows += defaults_straggler_rows(progress)
  if "faults" in tables:
    rows += fault_rows(progress)
  if "convergence" in tables:
    nodes = tuple(int(n) for n in args.nodes.split(",")) if args.nodes else CONVERGENCE_NODES
    rows += convergence_rows(progress, tuple(args.data.split(",")), nodes,
                             tuple(args.topologies.split(",")))
  (out / "rows.jsonl").write_text("".join(json.dumps(r, default=str) + "\n" for r in rows))
  (out / "tables.md").write_text(defaults_tables(rows))
  print(defaults_tables(rows))
  return 0


if __name__ == "__main__":
  import sys

  sys.exit(main())
