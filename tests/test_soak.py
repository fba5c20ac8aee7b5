"""The soak tool (tools/soak.py): a one-minute soak passes its checks, and the checks fail on
the faults they are there to find (a leak, a reset optimiser, a resume from the wrong place)."""

import json
import random
import subprocess
import sys
from pathlib import Path

from tools import soak_checks as checks

ROOT = Path(__file__).resolve().parent.parent


def test_a_one_minute_soak_kills_resumes_terminates_and_passes_its_checks(tmp_path):
  r = subprocess.run([sys.executable, "-m", "tools.soak", "--minutes=1", "--sample_s=1",
                      f"--out_dir={tmp_path}"], cwd=ROOT, capture_output=True, text=True,
                     timeout=150)
  assert r.returncode == 0, r.stderr[-3000:]
  results = json.loads((tmp_path / "results.json").read_text())
  assert [run["name"] for run in results["runs"]] == ["impala", "dqn"]
  for run in results["runs"]:
    assert [s["ended_by"] for s in run["sessions"]] == ["SIGKILL", "SIGTERM"]
    assert all(any(e["event"] == "fault" for e in s["events"]) for s in run["sessions"])
    assert len(run["sessions"][0]["samples"]) >= 10 and all(c["ok"] for c in run["checks"])
  assert results["device_memory_note"]  # on CPU: null, and the table says why
  table = (tmp_path / "soak.md").read_text()
  assert "| impala | 2 | 1 / 1 |" in table and "| dqn | 2 | 1 / 1 |" in table
  assert (tmp_path / "soak.png").stat().st_size > 10_000


def _session(index, rss, threads=30, fds=4, resumed_from=None):
  """A session of 30 samples 1 s apart whose updates start at t = 0 (no warm-up left)."""
  samples = [{"t": float(t), "rss_mib": rss(t), "threads": threads, "fds": fds}
             for t in range(30)]
  metrics = [{"_t": -1.0 + t, "version": 100 * index + t, "env_steps": 1000 * (index + t)}
             for t in range(31)]
  events = [] if resumed_from is None else [
      {"event": "restored", "version": resumed_from, "counters": {"env_steps": 0}}]
  return {"index": index, "samples": samples, "metrics": metrics, "events": events,
          "signal_t": None, "flags": [],
          "checkpoint_before": None if index == 0 else {"version": resumed_from, "env_steps": 0}}


def _flat_ok(run):
  return {c["check"]: c["ok"] for c in checks.check_flat(run, checks.flatness(run, 0.0))}


def test_flatness_fails_on_a_leak_within_a_session_and_across_resumes():
  steady = {"name": "r", "sessions": [_session(0, lambda t: 500.0),
                                      _session(1, lambda t: 400.0, resumed_from=50)]}
  assert all(_flat_ok(steady).values())  # a fresh session may sit higher than resumed ones
  leaking = {"name": "r", "sessions": [_session(0, lambda t: 400.0 + 2 * t)]}
  assert not _flat_ok(leaking)["rss_mib flat within 5%"]
  growing = {"name": "r", "sessions": [_session(i, lambda t, i=i: 400.0 * 1.04 ** i,
                                                resumed_from=50) for i in range(1, 4)]}
  assert not _flat_ok(growing)["rss_mib flat within 5%"]
  more_files = {"name": "r", "sessions": [_session(1, lambda t: 400.0, fds=4, resumed_from=5),
                                          _session(2, lambda t: 400.0, fds=6, resumed_from=5)]}
  assert not _flat_ok(more_files)["fds flat within 5%"]
  # Threads a first checkpoint save starts for good are warm-up, not a leak; after it, more are.
  first_save = {"name": "r", "sessions": [_session(0, lambda t: 400.0)]}
  for x in first_save["sessions"][0]["samples"]:
    x["threads"] = 29 if x["t"] < 12 else 31
  assert not _flat_ok(first_save)["threads flat within 5%"]
  first_save["sessions"][0]["events"].append({"event": "saved", "t": 12.0, "version": 12})
  assert _flat_ok(first_save)["threads flat within 5%"]


def test_a_reset_optimiser_or_a_resume_from_another_checkpoint_fails():
  def record(version, count):
    return {"version": version, "env_steps": 0, "state_version": version,
            "opt_counts": {"count": count}}

  run = {"name": "r", "sessions": [], "checkpoints": {"10": record(10, 80), "20": record(20, 160)}}
  assert checks.check_optimiser(run)[0]["ok"]
  run["checkpoints"]["30"] = record(30, 80)  # the optimiser restarted at version 20
  assert not checks.check_optimiser(run)[0]["ok"]

  resumed = _session(1, lambda t: 400.0, resumed_from=50)
  run = {"name": "r", "sessions": [_session(0, lambda t: 400.0), resumed]}
  assert checks.check_resumes(run)[0]["ok"]
  resumed["metrics"] = [dict(m, version=m["version"] - 100) for m in resumed["metrics"]]
  assert not checks.check_resumes(run)[0]["ok"]  # its first line is behind the checkpoint
  resumed["checkpoint_before"]["version"] = 60
  resumed["metrics"] = _session(1, lambda t: 400.0)["metrics"]
  assert not checks.check_resumes(run)[0]["ok"]  # not the newest checkpoint


def test_threads_of_an_elastic_library_pool_are_counted_apart_from_the_rest():
  import os
  import threading

  before = checks.proc_sample(os.getpid())
  stop = threading.Event()
  workers = [threading.Thread(target=stop.wait, daemon=True) for _ in range(3)]
  for w in workers:
    w.start()
  try:  # two look like TensorStore's on-demand I/O workers, one like any other thread
    for w in workers[:2]:
      Path(f"/proc/self/task/{w.native_id}/comm").write_text(checks.ELASTIC_POOLS[0])
    during = checks.proc_sample(os.getpid())
  finally:
    stop.set()
  assert during["elastic_threads"] == before["elastic_threads"] + 2
  assert during["threads"] == before["threads"] + 1
  assert during["thread_names"][checks.ELASTIC_POOLS[0]] >= 2


def test_a_checkpoint_a_kill_cut_short_is_counted_apart_and_only_kills_may_leave_one(tmp_path):
  """CI at 7ee81ae: a SIGKILL while orbax deleted the oldest step after a save left a numbered
  folder with state/ and no meta/. The soak records it apart with why (reading it raised), and
  the check holds it to sessions that were killed."""
  from tools.soak import Plan, RunDriver

  driver = RunDriver("dqn", [], tmp_path, Plan(1, 1.0), random.Random(0))
  (driver.run_dir / "checkpoints" / "10880" / "state").mkdir(parents=True)
  assert driver._read_checkpoints() == [10880] and driver._read_checkpoints() == []
  assert driver.run["damaged_checkpoints"] == {"10880": "meta/metadata is missing"}
  assert driver.run["checkpoints"] == {}
  for ended_by, ok in (("SIGKILL", True), ("SIGTERM", False)):
    run = {"name": "dqn", "sessions": [{"index": 0, "ended_by": ended_by,
                                        "damaged_checkpoints": [10880]}]}
    assert checks.check_damaged(run)[0]["ok"] is ok
