"""One line per finished run: what was lost, the lag, and who waited for whom.

For each RUN_DIR (summary.json and metrics.jsonl of `experiments.train`): env steps, updates,
rollouts per update, `dropped_stale` and `idle_env_steps`, and the share of all env steps they
lost (dropped rollouts x T x B plus idle steps, over env steps), the largest lag learned from
and the lag histogram, SPS over the training time, and the mean actor-blocked and learner-idle
fractions over the metrics records (the first, which holds the compile, and the last, partial,
are left out when there are more than two).

  python -m tools.run_summary RUN_DIR [RUN_DIR ...]
  python -m tools.run_summary --decisions RUN_DIR [RUN_DIR ...]
  python -m tools.run_summary --windows RUN_DIR [RUN_DIR ...]

`--decisions` lists instead each run's `--balance=auto` decisions, one line apiece: when, the
lever, the setting it leads to (U, F, active actors), the window it read (learner idle, actors
blocked, mean lag, the learner's rollouts per busy second) and its reason. `--windows` gives a
line per stretch of `--balance=auto` control windows at one setting: their number and seconds,
the throughput (rollouts learned per second) timed between finished updates and as counted at
the windows' ticks, each with the windows' scatter (sd over mean: the noise a verdict reads),
and the idle, blocked and lag pooled as the controller pools them.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import statistics
from pathlib import Path
from typing import Any

from tools.suites.convergence import read_records


def summarize(run_dir: Path) -> dict[str, Any]:
  s = json.loads((run_dir / "summary.json").read_text())
  c = s["config"]
  records = read_records(run_dir)
  window = records[1:-1] if len(records) > 2 else records
  mean = lambda key: sum(r.get(key, 0.0) for r in window) / max(len(window), 1)
  idle_steps = s.get("idle_env_steps", 0)
  lost = s["dropped_stale"] * c["rollout_len"] * c["num_envs"] + idle_steps
  start = (s.get("timings") or {}).get("train_start_wall_s") or 0.0
  return {"run": run_dir.name, "env_steps": s["env_steps"], "updates": s["updates"],
          "rollouts_per_update": c["rollouts_per_update"], "dropped_stale": s["dropped_stale"],
          "idle_env_steps": idle_steps, "lost_frac": lost / max(s["env_steps"], 1),
          "max_lag": s["max_policy_lag_seen"], "lag_hist": s["lag_hist"],
          "sps": s["env_steps"] / max(s["wall_s"] - start, 1e-9),
          "actor_blocked": mean("actor_blocked_frac"), "learner_idle": mean("learner_idle_frac")}


def decisions(run_dir: Path) -> list[str]:
  """The run's balance decisions, one line apiece (`--decisions`)."""
  s = json.loads((run_dir / "summary.json").read_text())
  lines = []
  for d in s.get("balance_decisions") or []:
    w = d.get("window") or {}
    lines.append(f"{run_dir.name} {d['wall_s']:7.2f}s {d['lever']:<22} U{d['rollouts_per_update']} "
                 f"F{d['in_flight']} N{d['active_actors']}  idle {w.get('learner_idle', 0):.2f} "
                 f"blocked {w.get('actors_blocked', 0):.2f} lag {w.get('lag_mean', 0):.2f} "
                 f"rate {w.get('learner_rate', 0):.0f}  "
                 f"{d['reason']}")
  return lines


def _scatter(values: list[float]) -> float:
  """Standard deviation over the mean (0 for fewer than two values)."""
  return statistics.stdev(values) / max(statistics.mean(values), 1e-9) if len(values) > 1 else 0.0


def windows(run_dir: Path) -> list[str]:
  """The run's control windows, a line per stretch at one setting (`--windows`)."""
  from jaxrl_async.runtime.pipeline.balance_window import Window

  fields = {f.name for f in dataclasses.fields(Window)}
  setting = lambda w: (w["rollouts_per_update"], w["in_flight"], w["active_actors"])
  records = [w for r in read_records(run_dir) for w in r.get("balance_windows") or []]
  return [_stretch_line(run_dir.name, key, group[0]["wall_s"],
                        [Window(**{k: v for k, v in w.items() if k in fields}) for w in group])
          for key, g in itertools.groupby(records, key=setting) for group in [list(g)]]


def _stretch_line(name: str, key: tuple[int, int, int], start_s: float, ws: list[Any]) -> str:
  """Pooled as the controller pools them; the throughput timed (the timed windows only) and
  counted (all), each with the windows' scatter."""
  from jaxrl_async.runtime.pipeline.balance_window import pooled

  timed = [w for w in ws if w.timed]
  p = pooled(ws)
  counted = p.consumed / max(p.seconds, 1e-9)
  per_s = pooled(timed).throughput if timed else 0.0
  return (f"{name} {start_s:7.2f}s U{key[0]} F{key[1]} N{key[2]}  {len(ws):3d} windows "
          f"{p.seconds:6.1f}s  timed {per_s:7.2f}/s (sd "
          f"{100 * _scatter([w.throughput for w in timed]):4.1f}%, {len(timed)} timed)  counted "
          f"{counted:7.2f}/s (sd {100 * _scatter([w.consumed / w.seconds for w in ws]):4.1f}%)  "
          f"idle {p.learner_idle:.2f} blocked {p.actors_blocked:.2f} lag {p.lag_mean:.2f}")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("run_dirs", nargs="+", type=Path)
  parser.add_argument("--decisions", action="store_true",
                      help="list each run's --balance=auto decisions instead")
  parser.add_argument("--windows", action="store_true",
                      help="list each run's --balance=auto control windows by setting instead")
  args = parser.parse_args()
  if args.decisions or args.windows:
    show, none = (decisions, "decisions") if args.decisions else (windows, "windows")
    for run_dir in args.run_dirs:
      print("\n".join(show(run_dir)) or f"{run_dir.name}: no balance {none}")
    return
  print("| run | env steps | updates | U | dropped | idle steps | lost | max lag | lag hist | SPS "
        "| actors blocked | learner idle |")
  print("|---|---|---|---|---|---|---|---|---|---|---|---|")
  for run_dir in args.run_dirs:
    r = summarize(run_dir)
    print(f"| {r['run']} | {r['env_steps']} | {r['updates']} | {r['rollouts_per_update']} | "
          f"{r['dropped_stale']} | {r['idle_env_steps']} | {r['lost_frac']:.3f} | "
          f"{r['max_lag']} | {r['lag_hist']} | {r['sps']:,.0f} | {r['actor_blocked']:.2f} | "
          f"{r['learner_idle']:.2f} |")


if __name__ == "__main__":
  main()
