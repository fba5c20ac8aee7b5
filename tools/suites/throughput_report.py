"""The throughput suite's report (tools/suites/throughput.py): each pipeline row's ratios to its
parts, the headline (pipeline / limit), the plot and the markdown tables.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tools.bench_common import md_table
from tools.suites.throughput_measure import MODES, SIZES


def _ratio(a: float | None, b: float | None) -> float | None:
  return a / b if a and b else None


def add_ratios(rows: list[dict[str, Any]]) -> None:
  """On each task's pipeline rows: SPS / env_only (`vs_limit`, the headline on pipeline_async:
  the environments alone at the same sizes are the limit), SPS / min(actors alone, learner
  alone), and async / sync.

  Also SPS against the *serial* bound 1 / (1/actors + 1/learner): what the pipeline would do
  if actors and learner took turns on one resource. Above 1 means they overlap; at 1 they
  merely share (on a small CPU the GIL and the cores are that one resource).
  """
  by = {(r["task"], r["mode"]): r.get("sps") for r in rows}
  for r in rows:
    if r["mode"].startswith("pipeline"):
      r["vs_limit"] = _ratio(r.get("sps"), by.get((r["task"], "env_only")))
      parts = [by.get((r["task"], m)) for m in ("actors_only", "learner_only")]
      bound = min(parts) if all(parts) else None
      r["vs_bottleneck"] = _ratio(r.get("sps"), bound)
      r["vs_learner"] = _ratio(r.get("sps"), parts[1])
      r["vs_actors"] = _ratio(r.get("sps"), parts[0])
      serial = 1 / (1 / parts[0] + 1 / parts[1]) if all(parts) else None
      r["vs_serial"] = _ratio(r.get("sps"), serial)
    if r["mode"] == "pipeline_async":
      r["async_vs_sync"] = _ratio(r.get("sps"), by.get((r["task"], "pipeline_sync")))


def headline(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
  """task -> pipeline / limit: pipeline_async's SPS over env_only's at the same sizes."""
  by = {(r["task"], r["mode"]): r for r in rows}
  out = {}
  for task in dict.fromkeys(r["task"] for r in rows):
    pipe, env = by.get((task, "pipeline_async"), {}), by.get((task, "env_only"), {})
    out[task] = {"pipeline_sps": pipe.get("sps"), "limit_sps": env.get("sps"),
                 "pipeline_vs_limit": _ratio(pipe.get("sps"), env.get("sps")),
                 **{k: env.get(k, pipe.get(k)) for k in SIZES}}
  return out


def plot(rows: list[dict[str, Any]], path: Path) -> Path:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  tasks = list(dict.fromkeys(r["task"] for r in rows))
  fig, ax = plt.subplots(figsize=(2 + 2.5 * len(tasks), 4))
  width = 0.8 / len(MODES)
  for i, mode in enumerate(MODES):
    sps = [next((r.get("sps") or 0.0 for r in rows if r["task"] == t and r["mode"] == mode), 0.0)
           for t in tasks]
    ax.bar([k - 0.4 + width * (i + 0.5) for k in range(len(tasks))], sps, width, label=mode)
  ax.set_xticks(range(len(tasks)), tasks)
  ax.set(ylabel="env steps / s", title="throughput by mode")
  if any(r.get("sps") for r in rows):
    ax.set_yscale("log")
  ax.legend(fontsize="small")
  ax.grid(alpha=0.3, axis="y")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path


def tables(rows: list[dict[str, Any]], layouts: dict[str, dict[str, Any]] | None = None) -> str:
  pipelines = [r for r in rows if r["mode"].startswith("pipeline")]
  heads = [{"task": t, **h} for t, h in headline(rows).items()]
  lay = [{"task": t, "host": "{cores} cores, {devices} x {platform}".format(**j["host"]),
          **j["values"], "chosen": ",".join(j["chosen"]), "why": "; ".join(j["why"])}
         for t, j in (layouts or {}).items()]
  return ("## Pipeline / limit (pipeline_async over env_only at the same sizes)\n\n"
          + md_table(heads, ["task", *SIZES[:4], "limit_sps", "pipeline_sps",
                             "pipeline_vs_limit"])
          + ("\n## Layout (`--layout=auto` on this host)\n\n"
             + md_table(lay, ["task", "host", *SIZES, "chosen", "why"]) if lay else "")
          + "\n## SPS by mode\n\n"
          + md_table(rows, ["task", "mode", "sps", *SIZES[:4], "update_ms", "window_s",
                            "loadavg_1m", "note", "error"])
          + "\n## Pipeline against its parts\n\n"
          + md_table(pipelines, ["task", "mode", "sps", "vs_limit", "vs_bottleneck",
                                 "vs_actors", "vs_learner", "vs_serial", "async_vs_sync"])
          + "\n## The actors' step, split (fractions of actor-thread wall time; blocked and "
          "param fetch are timed inside write too)\n\n"
          + md_table([r for r in rows if r["mode"] in ("actors_only", "pipeline_async",
                                                       "pipeline_sync")],
                     ["task", "mode", "env_recv_frac", "h2d_frac", "inference_frac",
                      "d2h_frac", "env_send_frac", "write_frac", "blocked_frac",
                      "param_fetch_frac", "untimed_frac", "put_frac"])
          + "\n## Pipeline health over the window\n\n"
          + md_table(pipelines, ["task", "mode", "actor_blocked_frac", "learner_idle_frac",
                                 "queue_get_frac", "updates_per_s", "policy_lag_mean",
                                 "dropped_stale", "idle_env_steps"]))
