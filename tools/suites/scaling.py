"""Scaling: throughput against learner devices (1, 2, 4) and actor threads (1, 2, 4).

Every point is a separate process (`tools.suites.throughput --worker`) on the CPU with
XLA_FLAGS=--xla_force_host_platform_device_count=4, so each sees the same 4 devices and only
the setting changes: learner devices N runs `learner_only` and `pipeline_async` with
--learner_devices=N; actor threads M runs `actors_only` and `pipeline_async` with
--num_actors=M. Forced CPU devices share the host's cores, so on a small machine this measures
the cost of sharding and of more threads (their overheads), not a speed-up; the same suite on a
multi-GPU host measures the speed-up.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tools.bench_common import Progress, SuiteResult, md_table
from tools.suites import throughput

FORCED_DEVICES = 4
LEARNER_DEVICES = (1, 2, 4)
ACTOR_THREADS = (1, 2, 4)


def worker_env() -> dict[str, str]:
  flags = os.environ.get("XLA_FLAGS", "")
  return {**os.environ, "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "3",
          "XLA_FLAGS": f"{flags} --xla_force_host_platform_device_count={FORCED_DEVICES}".strip()}


def points(tiny: bool, quick: bool) -> list[tuple[str, str, int, dict[str, Any]]]:
  """(task, axis, value, flat config) for every point; each is measured in two modes."""
  tasks = throughput.task_configs(tiny)
  if tiny or quick:
    tasks = {"cartpole": tasks["cartpole"]}
  out = []
  for task, flat in tasks.items():
    # The env axis is split over the learner devices: keep it divisible by the largest mesh.
    base = {**flat, "num_envs": max(flat.get("num_envs", 16), 4)}
    minibatches = base.get("num_minibatches", 1)
    for n in LEARNER_DEVICES:
      # Each device's env slice must still split into the update's minibatches.
      if (base["num_envs"] // n) % minibatches:
        continue
      out.append((task, "learner_devices", n, {**base, "learner_devices": n}))
    for m in ACTOR_THREADS:
      out.append((task, "num_actors", m, {**base, "num_actors": m}))
  return out


MODES = {"learner_devices": ("learner_only", "pipeline_async"),
         "num_actors": ("actors_only", "pipeline_async")}


def run(out_dir: Path, quick: bool, tiny: bool = False) -> SuiteResult:
  window = throughput.WINDOWS["tiny" if tiny else "quick" if quick else "full"]
  todo = points(tiny, quick)
  progress = Progress(sum(len(MODES[axis]) for _, axis, _, _ in todo), "scaling")
  rows = []
  for task, axis, value, flat in todo:
    for mode in MODES[axis]:
      run_dir = out_dir / "runs" / f"{task}-{axis}{value}-{mode}"
      row = {"task": task, "axis": axis, "value": value, "mode": mode,
             **throughput.run_worker(mode, flat, window, run_dir, env=worker_env())}
      rows.append(row)
      progress.step(f"{task} {axis}={value} {mode}: " + (
          f"{row['sps']:,.0f} sps" if row.get("sps") else row.get("error", "")))
  add_speedups(rows)
  return SuiteResult(rows, tables(rows), {"forced_cpu_devices": FORCED_DEVICES,
                                          "window": vars(window),
                                          "tasks": sorted({t for t, *_ in todo})},
                     [plot(rows, out_dir / "scaling.png").name])


def add_speedups(rows: list[dict[str, Any]]) -> None:
  """speedup: SPS over the same task, axis and mode at the axis's smallest value."""
  base = {}
  for r in sorted(rows, key=lambda r: r["value"]):
    base.setdefault((r["task"], r["axis"], r["mode"]), r.get("sps"))
  for r in rows:
    b = base.get((r["task"], r["axis"], r["mode"]))
    r["speedup"] = r["sps"] / b if r.get("sps") and b else None


def plot(rows: list[dict[str, Any]], path: Path) -> Path:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  for ax, axis in zip(axes, MODES, strict=True):
    for task in dict.fromkeys(r["task"] for r in rows):
      for mode in MODES[axis]:
        pts = sorted((r["value"], r["sps"]) for r in rows
                     if (r["task"], r["axis"], r["mode"]) == (task, axis, mode) and r.get("sps"))
        if pts:
          ax.plot(*zip(*pts, strict=True), marker="o", label=f"{task} {mode}")
    ax.set(xlabel=axis, ylabel="env steps / s", xscale="log", yscale="log")
    ax.set_xticks(LEARNER_DEVICES if axis == "learner_devices" else ACTOR_THREADS)
    ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
  fig.suptitle(f"scaling ({FORCED_DEVICES} forced CPU devices)")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path


def tables(rows: list[dict[str, Any]]) -> str:
  return ("## SPS by setting (speedup: over the smallest setting of the same axis and mode)\n\n"
          + md_table(rows, ["task", "axis", "value", "mode", "sps", "speedup", "update_ms",
                            "env_recv_frac", "inference_frac", "learner_idle_frac", "loadavg_1m",
                            "error"]))
