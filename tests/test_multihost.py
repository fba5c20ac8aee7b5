"""Multi-process training on JAX's distributed runtime: two processes on 127.0.0.1 (CPU, gloo),
each in a subprocess of its own (XLA_FLAGS and jax.distributed must be set before JAX starts).

The equality test spawns tests/multihost_main.py twice (2 devices each) plus a 4-device
single-process reference; the fault tests run the real launcher, experiments/train.py.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
ENV = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="3")


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def free_port_in(ports: range) -> int:
  for port in np.random.default_rng().permutation(ports):
    with socket.socket() as s:
      try:
        s.bind(("127.0.0.1", int(port)))
      except OSError:
        continue
      return int(port)
  raise RuntimeError(f"no free port in {ports}")


def kill_all(procs):
  for p in procs:
    if p.poll() is None:
      p.kill()
  for p in procs:
    p.wait(timeout=30)


def result_of(out: str) -> dict:
  lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
  assert lines, out[-3000:]
  return json.loads(lines[-1][len("RESULT "):])


def test_two_processes_train_in_lockstep_and_match_one_process(tmp_path):
  t0 = time.time()
  out_dir, run_dir = tmp_path / "out", tmp_path / "run"
  out_dir.mkdir()
  ref = subprocess.run([sys.executable, "-m", "tests.multihost_main", "reference", str(out_dir)],
                       cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
  assert ref.returncode == 0 and "REFERENCE_OK" in ref.stdout, ref.stderr[-3000:]
  port = free_port()
  procs = [subprocess.Popen([sys.executable, "-m", "tests.multihost_main", "worker", str(pid),
                             str(port), str(run_dir), str(out_dir)], cwd=ROOT, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for pid in (0, 1)]
  try:
    outs = [p.communicate(timeout=170) for p in procs]
  finally:
    kill_all(procs)
  for p, (out, err) in zip(procs, outs, strict=True):
    assert p.returncode == 0, f"rc={p.returncode}\n{out[-2000:]}\n{err[-4000:]}"
  r0, r1 = (result_of(out) for out, _ in outs)

  # One global step over 2 processes x 2 devices == one step of one process with 4 devices.
  assert r0["global_step"] == r1["global_step"]  # every device of both processes agrees
  reference = np.load(out_dir / "reference.npz")
  for pid in (0, 1):
    got = np.load(out_dir / f"global_step_{pid}.npz")
    assert len(got.files) == len(reference.files)
    for name in reference.files:
      np.testing.assert_allclose(got[name], reference[name], rtol=2e-5, atol=2e-6)

  # A run to its budget: same version, same params everywhere; one checkpoint of the run.
  a, b = r0["first"], r1["first"]
  assert a["version"] == b["version"] == 10 and a["stop_reason"] == b["stop_reason"] == "budget"
  assert a["params"] == b["params"]
  assert (run_dir / "checkpoints" / "10").is_dir()
  # Global env steps (process 0) count both hosts' actors: at least what the learner consumed.
  assert 10 * 8 * 8 <= a["distributed"]["global_env_steps"] <= a["env_steps"] + b["env_steps"]
  assert (run_dir / "metrics.jsonl").exists() and (run_dir / "process_1" / "metrics.jsonl").exists()
  record = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
  assert "global_sps" in record and record["process_index"] == 0

  # Resumed; process 1 alone hits --max_wall_s, and both stop with it at the same version.
  a, b = r0["second"], r1["second"]
  assert a["resumed_from"] == b["resumed_from"] == 10
  assert a["version"] == b["version"] > 10 and a["params"] == b["params"]
  assert a["stop_reason"] == b["stop_reason"] == "max_wall_s"
  assert a["distributed"]["agreed_stop"]["process"] == 1
  assert a["distributed"]["agreed_stop"]["version"] == b["distributed"]["agreed_stop"]["version"]
  assert (run_dir / "checkpoints" / str(a["version"])).is_dir()
  assert time.time() - t0 < 180, f"took {time.time() - t0:.0f} s"


# -- a process that dies or hangs must not leave the others waiting in a collective ----------

PEER_TIMEOUT_S = 10


def launch_pair(tmp_path):
  port = free_port()
  args = [sys.executable, "-m", "experiments.train", "--num_processes=2",
          f"--coordinator_address=127.0.0.1:{port}", f"--peer_timeout_s={PEER_TIMEOUT_S}",
          f"--run_dir={tmp_path}", "--total_env_steps=100000000", "--stop_at_return=nan",
          "--num_envs=4", "--num_actors=1", "--rollout_len=8", "--hidden_sizes=16",
          "--num_epochs=1", "--num_minibatches=1", "--log_every_s=0.5",
          "--checkpoint_at_end=false", "--checkpoint_every_s=0", "--quiet"]
  procs = [subprocess.Popen(args + [f"--process_id={pid}"], cwd=ROOT, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for pid in (0, 1)]
  # Training has started everywhere once both processes logged a version >= 1.
  logs = [tmp_path / "metrics.jsonl", tmp_path / "process_1" / "metrics.jsonl"]
  deadline = time.time() + 150
  while not all(_version(log) >= 1 for log in logs):
    if time.time() > deadline or any(p.poll() is not None for p in procs):
      kill_all(procs)
      pytest.fail("training did not start:\n" + "\n".join(p.stderr.read()[-2000:] for p in procs))
    time.sleep(0.5)
  return procs


def _version(path: Path) -> int:
  try:
    return json.loads(path.read_text().strip().splitlines()[-1])["version"]
  except (OSError, IndexError, ValueError):
    return -1


@pytest.mark.parametrize("fault, victim", [("kill", 1), ("hang", 1), ("kill", 0)])
def test_a_dead_or_hung_peer_ends_the_others_with_a_clear_error(tmp_path, fault, victim):
  procs = launch_pair(tmp_path)
  survivor = procs[1 - victim]
  try:
    t_fault = time.time()
    os.kill(procs[victim].pid, signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
    _, err = survivor.communicate(timeout=PEER_TIMEOUT_S + 60)
    waited = time.time() - t_fault
  finally:
    kill_all(procs)
  assert survivor.returncode != 0, err[-3000:]
  assert waited < PEER_TIMEOUT_S + 60
  if fault == "hang":  # nothing breaks a socket: only the watchdog can tell
    assert survivor.returncode == 75, err[-3000:]
    assert f"process {victim} stopped responding" in err, err[-3000:]
  elif victim == 1:  # the coordinator's host survives: our message
    assert ("process 1 stopped responding" in err or "a peer probably died" in err), err[-3000:]
  else:  # the coordinator itself died: JAX's client or our watchdog says so
    assert any(s in err for s in ("lost the coordinator", "a peer probably died",
                                  "another task died")), err[-3000:]


def test_cluster_detection_reads_slurms_environment(tmp_path):
  """`--cluster_detection=slurm` with SLURM's variables set by hand (2 tasks on this machine):
  JAX takes the coordinator (first node of the step's node list, port from the job id), the
  process count and each id from them; both processes train to the same version."""
  port = free_port_in(range(61440, 65536))  # JAX takes 61440 + job id % 4096
  slurm = {"SLURM_JOB_ID": str(port - 61440), "SLURM_STEP_NODELIST": "127.0.0.1",
           "SLURM_NTASKS": "2", "SLURM_STEP_NUM_NODES": "1"}
  args = [sys.executable, "-m", "experiments.train", "--cluster_detection=slurm",
          f"--run_dir={tmp_path}", "--total_env_steps=128", "--stop_at_return=nan",
          "--num_envs=4", "--num_actors=1", "--rollout_len=8", "--hidden_sizes=16",
          "--num_epochs=1", "--num_minibatches=1", "--checkpoint_every_s=0", "--quiet"]
  procs = [subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=dict(ENV, **slurm, SLURM_PROCID=str(i),
                                                SLURM_LOCALID=str(i)))
           for i in (0, 1)]
  try:
    errs = [p.communicate(timeout=170)[1] for p in procs]
  finally:
    kill_all(procs)
  assert [p.returncode for p in procs] == [0, 0], "\n".join(e[-2000:] for e in errs)
  a = json.loads((tmp_path / "summary.json").read_text())
  b = json.loads((tmp_path / "process_1" / "summary.json").read_text())
  assert (a["distributed"]["process_index"], b["distributed"]["process_index"]) == (0, 1)
  assert a["distributed"]["num_processes"] == b["distributed"]["num_processes"] == 2
  assert a["version"] == b["version"] == 2  # 128 global env steps = 2 updates of 2 x 32
