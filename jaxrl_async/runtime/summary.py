"""summary.json: what a run did, written once its threads have stopped."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from jaxrl_async.metrics import wall_s


def write_summary(trainer: Any, reason: str, actors: list[Any], learner: Any, controller: Any,
                  stats: Any, monitor: Any, threads: list[Any], phase: str,
                  abandoned: list[str]) -> dict[str, Any]:
  """The run's summary.json (counters, timings, the config, what the layout chose), written to
  the trainer's run dir and returned. `phase` is where the run was when it stopped; `abandoned`
  names threads left in a call nothing can wake."""
  now = wall_s()
  parts = trainer.parts
  t = learner.timers.snapshot()
  lost = [a.timers.snapshot() for a in actors]
  timings = dict(trainer.timings)
  timings["compile_update_s"] = t.compile_s
  timings["first_update_wall_s"] = t.first_update_wall_s
  timings["executables_loaded"] = sorted(parts.executables.loaded)
  summary = {
      "solved": stats.solved.is_set(),
      "solved_wall_s": stats.solved_wall_s,
      "solved_env_steps": stats.solved_env_steps,
      "final_return_mean": stats.return_mean(),
      "stop_reason": reason,
      "stop_phase": phase,
      # The last line of the first failed thread's traceback (the whole one is raised).
      "error": next((th.error.strip().splitlines()[-1] for th in threads if th.error), None),
      "abandoned_threads": abandoned,
      "env_steps": monitor.env_steps(),
      "episodes": trainer.start.episodes + stats.episodes,
      "updates": t.updates,
      "version": learner.version,
      "resumed_from_version": trainer.start.resumed_from,
      "replay_restored": trainer.replay_restored,
      "wall_s": now,
      "wall_s_total": trainer.start.wall_s_total + now,
      "max_policy_lag_seen": controller.max_lag_seen,
      "dropped_stale": controller.dropped_stale,
      "dropped_lag_hist": {str(k): v for k, v in sorted(controller.dropped_lag_hist.items())},
      "lag_hist": {str(k): v for k, v in sorted(controller.lag_hist.items())},
      "nonfinite_skipped": learner.nonfinite_skipped,
      "actor_restarts": sum(th.restarts for th in threads),
      "lost_rollouts": sum(a.lost_rollouts for a in lost),
      "lost_env_steps": sum(a.lost_env_steps for a in lost),
      "idle_env_steps": sum(a.idle_env_steps for a in lost),
      "checkpoints_saved": parts.checkpointer.saves if parts.checkpointer else 0,
      # Damaged checkpoints a resume passed over (version -> why), set aside beside the good.
      "checkpoints_skipped": ({str(v): why for v, why in parts.checkpointer.skipped.items()}
                              if parts.checkpointer else {}),
      "balance_decisions": (list(monitor.balancer.decisions)
                            if monitor.balancer else []),
      "balance_setting": (dataclasses.asdict(monitor.balancer.setting)
                          if monitor.balancer else None),
      "timings": timings,
      "layout": parts.layout,
      "config": parts.config.to_flat(),
  }
  if parts.cluster is not None:
    summary["distributed"] = parts.cluster.summary(learner.step)
  parts.run_dir.mkdir(parents=True, exist_ok=True)
  (parts.run_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
  return summary
