"""A soak's outputs (tools/soak.py): results.json, soak.md (a table per run and the checks) and
soak.png (host RSS, threads and open files over the soak, with kills, SIGTERM and faults)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

CPU_NOTE = "null: the CPU backend reports no device memory (memory_stats() is None)"


def device_memory_note(drivers: list[Any]) -> str | None:
  """None where some process reported device memory; else why every value is null."""
  for d in drivers:
    for s in d.run["sessions"]:
      if any(e.get("bytes_in_use") is not None for e in s["events"]
             if e["event"] == "device_memory"):
        return None
  return CPU_NOTE


def _device_peak_mib(run: dict) -> float | None:
  values = [e["bytes_in_use"] for s in run["sessions"] for e in s["events"]
            if e["event"] == "device_memory" and e.get("bytes_in_use") is not None]
  return max(values) / 2**20 if values else None


def lost_to_kills(run: dict) -> list[int]:
  """Per SIGKILL: the versions the killed session logged past the checkpoint the next resumed
  from (the work since the last checkpoint, which a kill -9 loses by design)."""
  out = []
  sessions = run["sessions"]
  for killed, nxt in zip(sessions, sessions[1:], strict=False):
    restored = [e["version"] for e in nxt["events"] if e["event"] == "restored"]
    logged = [m["version"] for m in killed["metrics"]]
    if killed["ended_by"] == "SIGKILL" and restored and logged:
      out.append(max(0, max(logged) - restored[0]))
  return out


def _flat_cell(f: dict, fmt: str) -> str:
  """The first and last resumed sessions' medians, and the worst drift within a session."""
  within = max((r for r in f["within"] if r["change"] is not None),
               key=lambda r: abs(r["change"]), default=None)
  if within is None:
    return "too few samples"
  cell = f"within {within['change']:+.1%}"
  if f["across"]:
    a, b = f["across"][0], f["across"][-1]
    cell = f"{a['median']:{fmt}} → {b['median']:{fmt}} ({b['change']:+.1%}); " + cell
  return cell


def run_row(run: dict) -> list[str]:
  sessions = run["sessions"]
  ends = [s["ended_by"] for s in sessions]
  faults = [e for s in sessions for e in s["events"] if e["event"] == "fault"]
  recovered = [c for c in run["checks"] if c["check"].endswith("fault recovered") and c["ok"]]
  resumes = [c for c in run["checks"] if c["check"].endswith("resumed")]
  last, summary = sessions[-1], sessions[-1].get("summary") or {}
  versions = [m["version"] for s in sessions for m in s["metrics"]]
  device = _device_peak_mib(run)
  return [
      run["name"], str(len(sessions)), f"{ends.count('SIGKILL')} / {ends.count('SIGTERM')}",
      f"{len(faults)} ({len(recovered)})",
      f"{sum(c['ok'] for c in resumes)} of {len(resumes)}",
      f"{max(versions, default=0)}", f"{summary.get('env_steps', '-')}",
      _flat_cell(run["flat"]["rss_mib"], ".0f"), _flat_cell(run["flat"]["threads"], ".0f"),
      _flat_cell(run["flat"]["fds"], ".0f"), "null" if device is None else f"{device:.0f}",
      f"{summary.get('lost_rollouts', '-')} ({summary.get('lost_env_steps', '-')} steps)",
      f"{sum(lost_to_kills(run))} in {len(lost_to_kills(run))} kills",
      f"{last.get('exit_s') or 0:.1f}",
  ]


HEADER = ["run", "sessions", "SIGKILL / SIGTERM", "faults (recovered)", "resumes continued",
          "last version", "env steps", "host RSS MiB: resumed sessions, first → last; worst "
          "drift within one", "threads", "open files", "device MiB",
          "rollouts lost to faults (last session)", "versions redone after SIGKILL",
          "SIGTERM to exit, s"]


def table(results: dict) -> str:
  lines = [f"Soak of {results['minutes']:g} minutes ({results['wall_s'] / 60:.1f} min of wall "
           f"time): sessions of {results['plan']['session_s']:.0f} s, checkpoints every "
           f"{results['plan']['checkpoint_every_s']:g} s, samples every "
           f"{results['plan']['sample_s']:g} s, warm-up {results['plan']['warmup_s']:g} s after "
           "each session's first update; medians of a session's first and last thirds.", ""]
  lines += ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
  lines += ["| " + " | ".join(run_row(r)) + " |" for r in results["runs"]]
  if results["device_memory_note"]:
    lines += ["", f"Device memory: {results['device_memory_note']}."]
  lines += ["", "| run | check | ok | detail |", "|---|---|---|---|"]
  lines += [f"| {c['run']} | {c['check']} | {'yes' if c['ok'] else '**NO**'} | "
            f"{c['detail'].replace('|', '/')} |" for r in results["runs"] for c in r["checks"]]
  return "\n".join(lines) + "\n"


def plot(results: dict, path: Path) -> None:
  keys = [("rss_mib", "host RSS (MiB)"), ("threads", "threads (no elastic pool)"),
          ("fds", "open files")]
  fig, axes = plt.subplots(len(keys), 1, figsize=(10, 8), sharex=True)
  t0 = min(s["launched_t"] for r in results["runs"] for s in r["sessions"])
  for color, run in zip(("tab:blue", "tab:orange", "tab:green"), results["runs"], strict=False):
    for i, s in enumerate(run["sessions"]):
      xs = [(x["t"] - t0) / 60 for x in s["samples"]]
      for ax, (key, _) in zip(axes, keys, strict=True):
        ax.plot(xs, [x[key] for x in s["samples"]], color=color,
                label=run["name"] if i == 0 else None)
      end = (s["samples"][-1]["t"] - t0) / 60 if s["samples"] else None
      for ax in axes:
        if end is not None:
          ax.axvline(end, color=color, ls="--" if s["ended_by"] == "SIGKILL" else "-", lw=0.8)
        for e in s["events"]:
          if e["event"] == "fault":
            ax.axvline((e["t"] - t0) / 60, color=color, ls=":", lw=0.8)
  for ax, (_, label) in zip(axes, keys, strict=True):
    ax.set_ylabel(label)
    ax.grid(alpha=0.3)
  axes[0].legend(loc="lower right")
  axes[0].set_title("soak: dashed = SIGKILL and resume, solid = SIGTERM, dotted = actor fault")
  axes[-1].set_xlabel("minutes")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def write(results: dict, out_dir: Path) -> None:
  (out_dir / "results.json").write_text(json.dumps(results, indent=1, default=str))
  (out_dir / "soak.md").write_text(table(results))
  plot(results, out_dir / "soak.png")
