"""A two-process run on 127.0.0.1 survives a SIGKILL of one process: the other exits soon with
one line naming the dead peer, and both then resume from the same agreed checkpoint and go on.

The processes are the real launcher, experiments/train.py, as in test_multihost.py.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from jaxrl_async.config import DistributedConfig
from jaxrl_async.runtime.cluster import hosts
from jaxrl_async.runtime.supervision import ThreadFailed
from tests.test_multihost import ENV, ROOT, free_port, kill_all

PEER_TIMEOUT_S = 10
# What the survivor may take beyond --peer_timeout_s. Measured here: when the kill breaks a
# gloo collective the survivor exits in ~0.1 s; when it waits in a checkpoint's barrier instead,
# the watchdog ends it 9.3-10.9 s after the kill (it polls every second), ~10 s under load 5.
EXIT_MARGIN_S = 5
EVERY_UPDATES = 2  # --checkpoint_every_updates
GLOBAL_STEPS_PER_UPDATE = 2 * 4 * 8  # processes x --num_envs x --rollout_len
START_DEADLINE_S = 75  # for the checkpoints before the kill, on a loaded machine (~10 s here)


def launch(run_dir: Path, logs: Path, *extra: str) -> list[subprocess.Popen]:
  """Both processes; each one's stdout and stderr go to logs/<process id>.log (files, not pipes:
  nothing has to drain them while the test waits)."""
  logs.mkdir(parents=True)
  args = [sys.executable, "-m", "experiments.train", "--num_processes=2",
          f"--coordinator_address=127.0.0.1:{free_port()}", f"--peer_timeout_s={PEER_TIMEOUT_S}",
          f"--run_dir={run_dir}", "--stop_at_return=nan", "--num_envs=4", "--num_actors=1",
          "--rollout_len=8", "--hidden_sizes=16", "--num_epochs=1", "--num_minibatches=1",
          "--log_every_s=0.5", "--checkpoint_every_s=0",
          f"--checkpoint_every_updates={EVERY_UPDATES}", "--quiet", *extra]
  procs = []
  for pid in (0, 1):
    with open(logs / f"{pid}.log", "w") as log:
      procs.append(subprocess.Popen(args + [f"--process_id={pid}"], cwd=ROOT, env=ENV,
                                    stdout=log, stderr=subprocess.STDOUT))
  return procs


def log_of(logs: Path, pid: int) -> str:
  return (logs / f"{pid}.log").read_text(errors="replace")


def checkpoints(run_dir: Path) -> list[int]:
  """Complete checkpoints: orbax renames a step's folder to its number once every process
  wrote its part (an interrupted save stays <version>.orbax-checkpoint-tmp)."""
  folder = run_dir / "checkpoints"
  if not folder.is_dir():
    return []
  return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())


def test_a_killed_peer_ends_the_other_and_both_resume_from_the_same_checkpoint(tmp_path):
  """SIGKILL process 1 once checkpoints are saved; process 0 exits within --peer_timeout_s
  (plus EXIT_MARGIN_S) with one line naming process 1; both rerun with --resume continue from
  the newest checkpoint, with its counters."""
  t0 = time.time()
  run_dir = tmp_path / "run"
  first = tmp_path / "first"
  procs = launch(run_dir, first, "--total_env_steps=100000000", "--checkpoint_at_end=false")
  try:
    # 1. Train until agreed checkpoints are on disk (version 4: some episodes have ended, so
    # their counter is not 0), then kill process 1 mid-run.
    deadline = time.time() + START_DEADLINE_S
    while not any(v >= 2 * EVERY_UPDATES for v in checkpoints(run_dir)):
      if time.time() > deadline or any(p.poll() is not None for p in procs):
        kill_all(procs)
        pytest.fail("no checkpoint:\n" + "\n".join(log_of(first, i)[-2000:] for i in (0, 1)))
      time.sleep(0.2)
    t_kill = time.time()
    os.kill(procs[1].pid, signal.SIGKILL)
    # 2. Process 0 must not wait for it for ever: it exits soon, saying who died.
    try:
      procs[0].wait(timeout=PEER_TIMEOUT_S + 60)
    except subprocess.TimeoutExpired:
      pytest.fail(f"process 0 still ran {PEER_TIMEOUT_S + 60} s after the kill:\n"
                  + log_of(first, 0)[-3000:])
    waited = time.time() - t_kill
  finally:
    kill_all(procs)
  err = log_of(first, 0)
  lines = [ln for ln in err.splitlines() if ln.startswith("jaxrl_async: process 0: ")]
  why = f"status {procs[0].returncode} after {waited:.1f} s:\n{err[-6000:]}"
  assert procs[0].returncode in (1, hosts.EXIT_PEER_LOST) and len(lines) == 1, why
  # A broken collective ("... a peer probably died (process 1) ...") or the watchdog
  # ("process 1 stopped responding ..."), whichever comes first.
  assert "process 1" in lines[0].removeprefix("jaxrl_async: process 0: "), lines[0]
  assert waited < PEER_TIMEOUT_S + EXIT_MARGIN_S, f"{waited:.1f} s: {lines[0]}"
  print(f"survivor exited {waited:.2f} s after the kill, status {procs[0].returncode}: {lines[0]}")

  # 3. Both resume from the newest complete checkpoint (only a save every process finished is
  # complete), run 2 more saves' worth of updates from it, and stop at the same version.
  agreed = checkpoints(run_dir)[-1]
  meta = json.loads((run_dir / "checkpoints" / str(agreed) / "meta" / "metadata").read_text())
  target = agreed + 2 * EVERY_UPDATES
  second = tmp_path / "second"
  procs = launch(run_dir, second, "--resume",
                 f"--total_env_steps={target * GLOBAL_STEPS_PER_UPDATE}")
  try:
    for p in procs:
      p.wait(timeout=120)
  finally:
    kill_all(procs)
  assert [p.returncode for p in procs] == [0, 0], "\n".join(log_of(second, i)[-3000:]
                                                           for i in (0, 1))
  summaries = [json.loads((run_dir / "summary.json").read_text()),
               json.loads((run_dir / "process_1" / "summary.json").read_text())]
  for s in summaries:
    assert s["resumed_from_version"] == agreed, (s["resumed_from_version"], agreed)
    assert s["version"] == target and s["stop_reason"] == "budget", (s["version"], target)
    # Counters go on from the checkpoint's (process 0's, on every host), not from zero.
    assert s["env_steps"] > meta["counters"]["env_steps"] > 0, (s["env_steps"], meta)
    assert s["episodes"] >= meta["counters"]["episodes"], (s["episodes"], meta)
  saved, end = meta["global_counters"], summaries[0]["distributed"]
  assert saved["env_steps"] >= agreed * GLOBAL_STEPS_PER_UPDATE and saved["episodes"] > 0, saved
  more = 2 * EVERY_UPDATES * GLOBAL_STEPS_PER_UPDATE
  assert end["global_env_steps"] >= saved["env_steps"] + more, (end, saved)
  assert end["global_episodes"] >= saved["episodes"], (end, saved)
  # A save the kill interrupted left an unfinished folder: the resumed run saves that version
  # again in its place.
  assert checkpoints(run_dir)[-2:] == [agreed + EVERY_UPDATES, target], checkpoints(run_dir)
  assert not [p for p in (run_dir / "checkpoints").iterdir() if not p.name.isdigit()]
  print(f"resumed from {agreed} to {target}; checkpoint counters {meta['counters']}, "
        f"global {saved}; took {time.time() - t0:.1f} s")
  assert time.time() - t0 < 150, f"took {time.time() - t0:.0f} s"


def test_a_failed_collective_names_the_peer(monkeypatch):
  """Gloo does not say which peer left a collective; with two processes it can only be the
  other one, and the survivor's line says so."""
  error = RuntimeError("Gloo all-reduce failed: Read error: Connection reset by peer")
  cfg = DistributedConfig(peer_timeout_s=PEER_TIMEOUT_S)
  for me, peer in ((0, 1), (1, 0)):
    monkeypatch.setattr(hosts, "_watchdog", SimpleNamespace(me=me, n=2))
    assert f"a peer probably died (process {peer});" in hosts.describe_failure(error, cfg)
  monkeypatch.setattr(hosts, "_watchdog", SimpleNamespace(me=2, n=4))
  assert "(one of processes 0, 1, 3);" in hosts.describe_failure(error, cfg)
  monkeypatch.setattr(hosts, "_watchdog", None)  # not joined: no names to give
  assert "a peer probably died; see its log" in hosts.describe_failure(error, cfg)
  assert hosts.describe_failure(ValueError("bad"), cfg).startswith("this process failed")
  # A thread's failure carries its traceback: the line shown is the error's, not the header.
  failed = ThreadFailed("learner failed:\nTraceback (most recent call last):\n  File \"x.py\", "
                        "line 1, in run\njax.errors.JaxRuntimeError: UNKNOWN: Gloo all-reduce "
                        "failed: Connection reset by peer")
  assert ("(ThreadFailed: jax.errors.JaxRuntimeError: UNKNOWN: Gloo all-reduce failed: "
          "Connection reset by peer)") in hosts.describe_failure(failed, cfg)
