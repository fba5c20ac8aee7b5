"""A soak: long runs under faults, with memory, threads and open files watched.

    python -m tools.soak --minutes=30 --out_dir=soak-30

runs a CartPole IMPALA run and a CartPole DQN run with --checkpoint_replay side by side, each
as a series of `python -m tools.soak_child` processes (experiments.train plus an injected
actor fault, see tools/soak_child.py) on one --run_dir: every session but the last is ended by
SIGKILL and the next resumes (--resume), the last is ended by SIGTERM; every session has one
actor fault at a random time. Sessions last about 5 minutes (M / round(M / 5)), and a soak
shorter than 12.5 minutes has two. Every --sample_s seconds it samples the process's host
RSS, threads and open files from /proc (device memory comes from the process itself, null
where the device reports none, as the CPU does). It writes OUT/results.json, OUT/soak.md
(the table) and OUT/soak.png, checks (tools/soak_checks.py) that after warm-up the samples stay
within 5%, that every resume continued version, optimiser state and counters, that a
checkpoint that does not restore follows only a kill (counted, not read), that faults were
recovered and only in-flight rollouts lost, and exits 1 naming each failed check.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tools import soak_checks as checks
from tools import soak_report

ROOT = Path(__file__).resolve().parent.parent
# The runs: CartPole IMPALA and DQN with its replay checkpointed, never solving (no stop).
RUNS = {
    "impala": ["--preset=cartpole_impala"],
    "dqn": ["--preset=cartpole_dqn", "--checkpoint_replay"],
}
COMMON = ["--quiet", "--stop_at_return=nan", "--total_env_steps=1000000000000",
          "--actor_restarts=3", "--log_every_s=2"]

METRICS_KEPT = ("version", "env_steps", "wall_s", "return_mean", "sps")


class Plan:
  """Session length, checkpoint interval and warm-up, scaled with the soak's minutes."""

  def __init__(self, minutes: float, sample_s: float):
    self.minutes, self.sample_s = minutes, sample_s
    self.sessions = max(2, round(minutes / 5))
    self.session_s = minutes * 60 / self.sessions
    self.checkpoint_every_s = min(60.0, max(3.0, self.session_s / 6))
    self.warmup_s = min(60.0, max(3.0, self.session_s / 10))

  def fault_after_s(self, rng: random.Random) -> float:
    """When a session's actor fault fires, from its first rollout: in the middle half of what
    is left of the session after start-up (~15 s here)."""
    return rng.uniform(0.2, 0.5) * max(10.0, self.session_s - 15)

  def to_json(self) -> dict[str, Any]:
    return dict(vars(self))


class RunDriver:
  """One run's sessions: launches, samples, ends (SIGKILL or, for the last, SIGTERM) and reads
  back each session. `tick` is called every half second."""

  def __init__(self, name: str, flags: list[str], out_dir: Path, plan: Plan, rng: random.Random):
    self.name, self.plan, self.rng = name, plan, rng
    self.run_dir, self.events_dir = out_dir / "runs" / name, out_dir / "events"
    self.flags = [*COMMON, *flags, f"--run_dir={self.run_dir}",
                  f"--checkpoint_every_s={plan.checkpoint_every_s:g}"]
    self.run: dict[str, Any] = {"name": name, "sessions": [], "checkpoints": {},
                                "damaged_checkpoints": {}}
    self.proc: subprocess.Popen | None = None
    self.session: dict[str, Any] = {}
    self._metrics_offset = 0
    self._term_t: float | None = None
    self._last_sample_t = 0.0

  @property
  def done(self) -> bool:
    return self.proc is None and len(self.run["sessions"]) == self.plan.sessions

  def tick(self, now: float) -> None:
    if self.proc is None:
      if not self.done:
        self._launch(now)
      return
    if self.proc.poll() is not None:
      self._finish(now)
      return
    if now - self._last_sample_t >= self.plan.sample_s:
      self._last_sample_t = now
      sample = checks.proc_sample(self.proc.pid)
      if sample is not None:
        self.session["samples"].append({"t": now, **sample})
    self._read_metrics()
    self._maybe_end(now)

  def _launch(self, now: float) -> None:
    index = len(self.run["sessions"])
    resume = index > 0
    flags = [*self.flags, "--resume"] if resume else list(self.flags)
    events = self.events_dir / f"{self.name}-{index}.jsonl"
    fault_after_s = self.plan.fault_after_s(self.rng)
    env = dict(os.environ, JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"),
               SOAK_EVENTS=str(events), SOAK_FAULT_AFTER_S=f"{fault_after_s:.1f}",
               SOAK_SAMPLE_S=str(self.plan.sample_s), PYTHONUNBUFFERED="1")
    self.session = {
        "index": index, "flags": flags, "fault_after_s": fault_after_s, "launched_t": now,
        "end_t": now + self.plan.session_s, "signal_t": None, "samples": [],
        "metrics": [], "events": [], "ended_by": None, "returncode": None,
        "checkpoint_before": checks.newest_checkpoint(self.run_dir) if resume else None,
        "stderr": str(self.events_dir / f"{self.name}-{index}.stderr"),
    }
    with open(self.session["stderr"], "w") as err:
      self.proc = subprocess.Popen([sys.executable, "-m", "tools.soak_child", *flags], cwd=ROOT,
                                   env=env, stdout=subprocess.DEVNULL, stderr=err)
    self._term_t = None

  def _read_metrics(self) -> None:
    records, self._metrics_offset = checks.read_lines(self.run_dir / "metrics.jsonl",
                                                      self._metrics_offset)
    # The record's time: the process's wall_s counts from its start.
    self.session["metrics"] += [{"_t": self.session["launched_t"] + r["wall_s"],
                                 **{k: r.get(k) for k in METRICS_KEPT}} for r in records]

  def _maybe_end(self, now: float) -> None:
    s, last = self.session, len(self.run["sessions"]) == self.plan.sessions - 1
    if now < s["end_t"] or s["ended_by"] is not None:
      return
    if last:
      self.proc.send_signal(signal.SIGTERM)
      s["ended_by"], s["signal_t"], self._term_t = "SIGTERM", now, now
      return
    # A kill before this session's first checkpoint would test nothing new: wait for one,
    # up to another session's length. (Folder names only: the process is still writing.)
    from jaxrl_async.checkpoint import Checkpointer

    versions = Checkpointer(self.run_dir).resume_candidates()
    before = s["checkpoint_before"]
    if (versions and (before is None or versions[0] > before["version"])) \
        or now > s["end_t"] + self.plan.session_s:
      self.proc.send_signal(signal.SIGKILL)
      s["ended_by"], s["signal_t"] = "SIGKILL", now

  def _finish(self, now: float) -> None:
    s = self.session
    s["returncode"] = self.proc.returncode
    s["ended_by"] = s["ended_by"] or "exit"
    s["exit_s"] = now - self._term_t if self._term_t is not None else None
    self.proc = None
    self._read_metrics()
    s["events"], _ = checks.read_lines(self.events_dir / f"{self.name}-{s['index']}.jsonl")
    summary = self.run_dir / "summary.json"
    if s["ended_by"] == "SIGTERM" and summary.exists():
      s["summary"] = {k: v for k, v in json.loads(summary.read_text()).items()
                      if k not in ("config", "timings", "layout", "balance_decisions")}
    s["damaged_checkpoints"] = self._read_checkpoints()
    newest = checks.newest_checkpoint(self.run_dir)
    s["final_checkpoint"] = newest and newest["version"]
    self.run["sessions"].append(s)

  def _read_checkpoints(self) -> list[int]:
    """Reads each checkpoint of the run dir once; returns the versions newly found damaged.
    A damaged one is recorded apart with why, not read: a SIGKILL can cut short a save, or
    orbax deleting the oldest step after one (CI, 7ee81ae: a numbered folder left with
    state/ and replay/ and no meta/). The resume skips it (`check_damaged`)."""
    from jaxrl_async.checkpoint import Checkpointer

    ckpt, damaged = Checkpointer(self.run_dir), self.run["damaged_checkpoints"]
    new = []
    for version in ckpt.resume_candidates():
      key = str(version)
      if key in self.run["checkpoints"] or key in damaged:
        continue
      why = ckpt.problem(version)
      if why is None:
        self.run["checkpoints"][key] = checks.checkpoint_record(self.run_dir, version)
      else:
        damaged[key] = why
        new.append(version)
    return new


def run_checks(run: dict[str, Any], plan: Plan) -> tuple[list[dict], dict]:
  from jaxrl_async.config import TrainConfig

  config = TrainConfig.from_flat(json.loads((Path(run["run_dir"]) / "summary.json").read_text())
                                 ["config"]) if run["sessions"][-1].get("summary") else None
  max_in_flight = config.rate.max_in_flight if config else 0
  flat = checks.flatness(run, plan.warmup_s)
  found = (checks.check_sessions(run) + checks.check_resumes(run) + checks.check_optimiser(run)
           + checks.check_damaged(run) + checks.check_faults(run)
           + checks.check_sigterm(run, max_in_flight) + checks.check_flat(run, flat))
  return found, flat


def soak(minutes: float, out_dir: Path, sample_s: float, seed: int) -> int:
  plan = Plan(minutes, sample_s)
  for name in RUNS:
    if (out_dir / "runs" / name).exists():
      print(f"soak: --out_dir={out_dir} holds an earlier soak's runs; choose another",
            file=sys.stderr)
      return 2
  (out_dir / "events").mkdir(parents=True, exist_ok=True)
  rng = random.Random(seed)
  drivers = [RunDriver(name, flags, out_dir, plan, rng) for name, flags in RUNS.items()]
  t0 = time.time()
  try:
    while not all(d.done for d in drivers):
      for d in drivers:
        d.tick(time.time())
      time.sleep(0.5)
  finally:
    for d in drivers:  # an interrupted soak leaves no training process behind
      if d.proc is not None and d.proc.poll() is None:
        d.proc.kill()
  results = {"minutes": minutes, "wall_s": time.time() - t0, "plan": plan.to_json(),
             "device_memory_note": soak_report.device_memory_note(drivers), "runs": []}
  failed = []
  for d in drivers:
    d.run["run_dir"] = str(d.run_dir)
    found, flat = run_checks(d.run, plan)
    d.run["checks"], d.run["flat"] = found, flat
    results["runs"].append(d.run)
    failed += [c for c in found if not c["ok"]]
  soak_report.write(results, out_dir)
  for c in failed:
    print(f"soak: FAILED {c['run']}: {c['check']}: {c['detail']}", file=sys.stderr)
  print(f"soak: {len(failed)} of {sum(len(r['checks']) for r in results['runs'])} checks failed "
        f"-> {out_dir}/soak.md")
  return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--minutes", type=float, default=30.0, help="length of the soak")
  parser.add_argument("--out_dir", type=Path, default=Path("soak"), help="where results go")
  parser.add_argument("--sample_s", type=float, default=5.0, help="seconds between samples")
  parser.add_argument("--seed", type=int, default=0, help="seeds the fault times")
  args = parser.parse_args(argv)
  if args.minutes <= 0 or args.sample_s <= 0:
    parser.error("--minutes and --sample_s must be > 0")
  return soak(args.minutes, args.out_dir.resolve(), args.sample_s, args.seed)


if __name__ == "__main__":
  sys.exit(main())
