"""What a soak (tools/soak.py) reads from its runs, and the checks it makes of them.

A run is a dict (it goes to results.json as it is): {"name", "sessions": [...],
"checkpoints": {version: {...}}, "damaged_checkpoints": {version: why}}. A session holds what
the soak saw of one process: how it ended, its /proc samples, its events
(tools/soak_child.py), the metrics lines it appended, the newest checkpoint when it was
launched, the checkpoints found damaged after it and, for the one that was SIGTERMed, its
summary.json.
Each check is {"run", "check", "ok", "detail"}.
"""

from __future__ import annotations

import collections
import json
import statistics
from pathlib import Path
from typing import Any

# How far a sampled quantity may move between the first and last quarter after warm-up.
FLAT_TOLERANCE = 0.05
# SIGTERM must end the process this soon (issue 19's bound for a requested stop).
SIGTERM_EXIT_S = 30.0
# What is compared of each sampled quantity in a window: RSS's median; the fewest threads and
# open files (a checkpoint save holds some for a moment; a leak raises the floor).
SAMPLED = {"rss_mib": statistics.median, "threads": min, "fds": min}
# Thread pools that grow with demand and shrink when idle, so their size follows the load, not a
# leak: TensorStore's shared pool (orbax's checkpoint I/O) starts a worker whenever work waits
# and no worker is idle, and ends one after 20 s idle (tensorstore/internal/thread/pool_impl.cc).
# With a save every few seconds none idles that long, and one busier save can leave two more for
# the rest of a soak (36 -> 38 in one CI run). They are counted apart from "threads".
ELASTIC_POOLS = ("ts_pool_worker",)


def proc_sample(pid: int) -> dict[str, Any] | None:
  """Host RSS (MiB), thread count, threads by name and open files of process `pid` from /proc;
  None once gone. (The names say whose a thread is when the count moves.)"""
  try:
    status = Path(f"/proc/{pid}/status").read_text()
    fds = sum(1 for _ in Path(f"/proc/{pid}/fd").iterdir())
    names = collections.Counter(_comm(task) for task in Path(f"/proc/{pid}/task").iterdir())
  except (FileNotFoundError, ProcessLookupError, PermissionError):
    return None
  fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
  if "VmRSS" not in fields:  # a zombie: exited, not yet reaped
    return None
  elastic = sum(names[name] for name in ELASTIC_POOLS)
  return {"rss_mib": int(fields["VmRSS"].split()[0]) / 1024,
          "threads": int(fields["Threads"]) - elastic, "elastic_threads": elastic, "fds": fds,
          "thread_names": dict(sorted(names.items()))}


def _comm(task: Path) -> str:
  try:
    return task.joinpath("comm").read_text().strip()
  except (FileNotFoundError, ProcessLookupError):  # the thread ended between the two reads
    return "(ended)"


def read_lines(path: Path, offset: int = 0) -> tuple[list[dict], int]:
  """The complete JSON lines of `path` from byte `offset`, and the offset after them (a torn
  last line, still being written, is left for the next read)."""
  if not path.exists():
    return [], offset
  with open(path, "rb") as f:
    f.seek(offset)
    data = f.read()
  end = data.rfind(b"\n") + 1
  records = []
  for line in data[:end].splitlines():
    try:
      records.append(json.loads(line))
    except json.JSONDecodeError:
      continue
  return records, offset + end


def newest_checkpoint(run_dir: Path) -> dict[str, Any] | None:
  """{"version", "env_steps"} of the checkpoint a resume of `run_dir` should start from."""
  from jaxrl_async.checkpoint import Checkpointer

  meta = Checkpointer(run_dir).read_meta()
  if meta is None:
    return None
  return {"version": int(meta["version"]), "env_steps": int(meta["counters"]["env_steps"])}


def checkpoint_record(run_dir: Path, version: int) -> dict[str, Any]:
  """A checkpoint's counters and what says whether the optimiser continued: the state's
  version and the optimiser's step counts (optax's `count` leaves)."""
  import jax

  from jaxrl_async.checkpoint import Checkpointer, read_on_host

  meta = Checkpointer(run_dir).read_meta(version)
  state = read_on_host(run_dir / "checkpoints" / str(version) / "state")
  counts = {jax.tree_util.keystr(path): int(x)
            for path, x in jax.tree_util.tree_flatten_with_path(state)[0]
            if "opt_state" in jax.tree_util.keystr(path) and "count" in jax.tree_util.keystr(path)}
  return {"version": int(meta["version"]), "env_steps": int(meta["counters"]["env_steps"]),
          "state_version": int(state["version"]), "opt_counts": counts,
          "has_replay": "replay" in meta}


def _check(run: dict, name: str, ok: bool, detail: str) -> dict[str, Any]:
  return {"run": run["name"], "check": name, "ok": bool(ok), "detail": detail}


def check_sessions(run: dict) -> list[dict]:
  """Every session lived until the soak ended it (a process that exits on its own, say on an
  import error, is named with its stderr's last line)."""
  out = []
  for s in run["sessions"]:
    lines = Path(s["stderr"]).read_text().strip().splitlines() if Path(s["stderr"]).exists() \
        else []
    out.append(_check(run, f"session {s['index']} ended by the soak ({s['ended_by']})",
                      s["ended_by"] in ("SIGKILL", "SIGTERM"),
                      f"rc {s['returncode']}; stderr: {lines[-1][:200] if lines else ''}"))
  return out


def check_resumes(run: dict) -> list[dict]:
  """Every resumed session restored the newest checkpoint (version and counters) and went on
  from it: its first metrics line is past the checkpoint, not back at zero."""
  out = []
  for s in run["sessions"][1:]:
    before, restored = s["checkpoint_before"], [e for e in s["events"]
                                                if e["event"] == "restored"]
    name = f"session {s['index']} resumed"
    if before is None or not restored:
      out.append(_check(run, name, False, f"checkpoint before {before}, restored {restored}"))
      continue
    r = restored[0]
    same = r["version"] == before["version"] and r["counters"]["env_steps"] == before["env_steps"]
    first = s["metrics"][0] if s["metrics"] else None
    went_on = (first is not None and first["version"] >= r["version"]
               and first["env_steps"] > r["counters"]["env_steps"])
    out.append(_check(run, name, same and went_on,
                      f"newest checkpoint v{before['version']} ({before['env_steps']} env steps), "
                      f"restored v{r['version']} ({r['counters']['env_steps']}), first line "
                      f"v{first and first['version']} ({first and first['env_steps']})"))
    if "--checkpoint_replay" in s["flags"]:
      replay = [e["ok"] for e in s["events"] if e["event"] == "replay_restored"]
      out.append(_check(run, f"session {s['index']} replay restored", replay == [True],
                        f"replay restores: {replay}"))
  return out


def check_optimiser(run: dict) -> list[dict]:
  """The optimiser's step counts grow with the version at one rate in every checkpoint: a
  resume that reset the optimiser (or the version) would break the ratio."""
  records = [c for c in run["checkpoints"].values() if c["version"] > 0]
  by_leaf: dict[str, set] = {}
  for c in records:
    for leaf, count in c["opt_counts"].items():
      by_leaf.setdefault(leaf, set()).add(round(count / c["version"], 6))
  consistent = all(c["state_version"] == c["version"] for c in records)
  ok = bool(records) and bool(by_leaf) and consistent and all(len(r) == 1 for r in by_leaf.values())
  detail = (f"{len(records)} checkpoints (v{min(c['version'] for c in records)}.."
            f"v{max(c['version'] for c in records)}); count/version per leaf: "
            f"{ {k: sorted(v) for k, v in by_leaf.items()} }" if records else "no checkpoints read")
  return [_check(run, "optimiser state continued", ok, detail)]


def check_damaged(run: dict) -> list[dict]:
  """A checkpoint that does not restore was cut short by a SIGKILL (a save, or the deletion of
  the oldest step after one): found only after a killed session. What the kill had in flight
  is lost, and counted here; the resume reads the newest that restores (`check_resumes`)."""
  found = {s["index"]: s.get("damaged_checkpoints", []) for s in run["sessions"]}
  unkilled = {i: v for i, v in found.items() if v and run["sessions"][i]["ended_by"] != "SIGKILL"}
  return [_check(run, "damaged checkpoints only from kills", not unkilled,
                 f"{sum(map(len, found.values()))} damaged "
                 f"({run.get('damaged_checkpoints', {})}); after sessions not killed: "
                 f"{unkilled}")]


def check_faults(run: dict) -> list[dict]:
  """Each injected actor fault was recovered: training went on after it (newer versions in the
  metrics), and the SIGTERMed session's summary counts its restarts."""
  out = []
  for s in run["sessions"]:
    for fault in (e for e in s["events"] if e["event"] == "fault"):
      later = [m["version"] for m in s["metrics"] if m.get("_t", 0) > fault["t"] + 1]
      before = [m["version"] for m in s["metrics"] if m.get("_t", 0) <= fault["t"]]
      ok = bool(later) and max(later) > max(before, default=-1)
      out.append(_check(run, f"session {s['index']} actor fault recovered", ok,
                        f"actor {fault['actor']} at +{fault['t'] - s['launched_t']:.0f} s; "
                        f"versions after it: {later[:1]}..{later[-1:]}"))
  return out


def check_sigterm(run: dict, max_in_flight: int) -> list[dict]:
  """The SIGTERMed session exited 0 in time with a summary and a final checkpoint, and lost
  only the rollouts its actor faults had in flight."""
  s = run["sessions"][-1]
  summary = s.get("summary") or {}
  faults = sum(e["event"] == "fault" for e in s["events"])
  restored = [e["version"] for e in s["events"] if e["event"] == "restored"]
  exit_s = s.get("exit_s")
  ok = (s["ended_by"] == "SIGTERM" and s["returncode"] == 0 and exit_s is not None
        and exit_s <= SIGTERM_EXIT_S and summary.get("stop_reason") == "terminated")
  out = [_check(run, "SIGTERM: exit 0 with summary", ok,
                f"rc {s['returncode']} after {exit_s and round(exit_s, 1)} s, stop_reason "
                f"{summary.get('stop_reason')}")]
  final = s.get("final_checkpoint")
  out.append(_check(run, "SIGTERM: final checkpoint", final is not None
                    and final == summary.get("version"),
                    f"newest checkpoint v{final}, summary v{summary.get('version')}"))
  if len(run["sessions"]) > 1:
    out.append(_check(run, "SIGTERM: summary's resumed_from_version",
                      restored and summary.get("resumed_from_version") == restored[0],
                      f"summary {summary.get('resumed_from_version')}, restored {restored}"))
  restarts, lost = summary.get("actor_restarts"), summary.get("lost_rollouts", -1)
  out.append(_check(run, "SIGTERM: faults restarted, only in-flight rollouts lost",
                    restarts == faults and faults <= lost <= faults * max_in_flight,
                    f"{faults} faults, {restarts} restarts, {lost} rollouts lost (<= "
                    f"{max_in_flight} in flight each), {summary.get('lost_env_steps')} env steps"))
  return out


def warm_samples(session: dict, warmup_s: float) -> list[dict]:
  """The session's samples after its warm-up, to the signal that ended it. Warm-up is what a
  process does once: it ends `warmup_s` after the first update (the update's compile, and
  DQN's replay warm-up, come before it), and not before the first checkpoint save (orbax
  starts two threads of its own there, for the rest of the process: 29 -> 31 here)."""
  m = session["metrics"]
  trained = [r["_t"] for r in m if r["version"] > m[0]["version"]] if m else []
  if not trained:
    return []
  saved = [e["t"] for e in session["events"] if e["event"] == "saved"]
  start = max(trained[0] + warmup_s, saved[0] if saved else 0.0)
  end = session.get("signal_t") or float("inf")
  return [x for x in session["samples"] if start <= x["t"] < end]


def _median_change(first: float, last: float) -> float | None:
  return (last - first) / first if first else None


def flatness(run: dict, warmup_s: float) -> dict[str, dict]:
  """Per sampled quantity, after each session's warm-up: within each session, its first and
  last third (by SAMPLED's statistic); across the resumed sessions, each one's against the
  first resumed one's. (A fresh session is compared with itself only: it compiles what a resumed one
  loads from the executable cache, which leaves it more memory and threads.)"""
  warm = [(s["index"], warm_samples(s, warmup_s)) for s in run["sessions"]]
  out = {}
  for key, stat in SAMPLED.items():
    within = []
    for index, samples in warm:
      values = [x[key] for x in samples]
      third = len(values) // 3
      if third >= 1:
        first, last = stat(values[:third]), stat(values[-third:])
        within.append({"session": index, "n": len(values), "first": first, "last": last,
                       "change": _median_change(first, last), "min": min(values),
                       "max": max(values)})
    medians = [(index, stat([x[key] for x in samples]))
               for index, samples in warm if index > 0 and samples]
    across = [{"session": index, "median": m, "change": _median_change(medians[0][1], m)}
              for index, m in medians]
    out[key] = {"within": within, "across": across}
  elastic = [x["elastic_threads"] for _, samples in warm for x in samples if "elastic_threads" in x]
  out["threads"]["elastic"] = [min(elastic), max(elastic)] if elastic else None
  return out


def _worst(rows: list[dict]) -> dict | None:
  rows = [r for r in rows if r["change"] is not None]
  return max(rows, key=lambda r: abs(r["change"])) if rows else None


def check_flat(run: dict, flat: dict[str, dict]) -> list[dict]:
  out = []
  for key, f in flat.items():
    within, across = _worst(f["within"]), _worst(f["across"])
    ok = within is not None and all(abs(w["change"]) <= FLAT_TOLERANCE
                                    for w in (within, across) if w is not None)
    detail = "no session had samples after warm-up"
    if within is not None:
      detail = (f"worst within a session: {within['first']:.1f} -> {within['last']:.1f} "
                f"({within['change']:+.1%}, session {within['session']}, range "
                f"{within['min']:.1f}..{within['max']:.1f}, {within['n']} samples)")
    if across is not None:
      values = ", ".join(f"{r['median']:.1f}" for r in f["across"])
      detail += f"; resumed sessions: {values} (worst {across['change']:+.1%})"
    if f.get("elastic"):
      detail += f"; besides, {ELASTIC_POOLS[0]} {f['elastic'][0]}..{f['elastic'][1]}"
    out.append(_check(run, f"{key} flat within {FLAT_TOLERANCE:.0%}", ok, detail))
  return out
