"""The launcher as a user runs it: bad input exits 2 with one line naming the flag; Ctrl-C."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ENV = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")


def train(*args, timeout=120, env=None):
  return subprocess.run([sys.executable, "-m", "experiments.train", *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=timeout, env=env or ENV)


@pytest.mark.parametrize("args, flag", [
    (["--env_id=CartPol-v1"], "env_id"),
    (["--num_envs=0"], "num_envs"),
    (["--rollout_len=-3"], "rollout_len"),
    (["--max_policy_lag=-1"], "max_policy_lag"),
    (["--num_envs=6", "--learner_devices=4"], "num_envs"),
    (["--env_batch_size=32", "--num_envs=16"], "env_batch_size"),
    (["--learner_devices=64", "--num_envs=128"], "learner_devices"),
    (["--preset=nope"], "preset"),
    (["--num_envs=abc"], "num_envs"),
    (["--algo=impala", "--gae_lambda=0.9"], "gae_lambda"),
    (["--compile_only", "--compilation_cache=false"], "compile_only"),
])
def test_bad_input_exits_2_with_one_line_naming_the_flag(args, flag, tmp_path):
  r = train(*args, f"--run_dir={tmp_path}")
  assert r.returncode == 2, r.stderr[-2000:]
  lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
  assert len(lines) == 1, r.stderr
  assert f"--{flag}" in lines[0] or f"{flag}" in lines[0]
  assert not (tmp_path / "metrics.jsonl").exists()  # nothing started


def test_unknown_env_suggests_close_names(tmp_path):
  r = train("--env_id=CartPol-v1", f"--run_dir={tmp_path}")
  assert "CartPole-v1" in r.stderr


def test_sigint_shuts_down_cleanly(tmp_path):
  proc = subprocess.Popen(
      [sys.executable, "-m", "experiments.train", "--total_env_steps=100000000",
       "--stop_at_return=nan", f"--run_dir={tmp_path}", "--log_every_s=0.5"],
      cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  deadline = time.time() + 90
  metrics = tmp_path / "metrics.jsonl"
  while not metrics.exists() or not metrics.stat().st_size:
    assert time.time() < deadline and proc.poll() is None, proc.stderr.read() if proc.poll() else ""
    time.sleep(0.2)
  proc.send_signal(signal.SIGINT)
  out, err = proc.communicate(timeout=30)
  assert proc.returncode == 0, err[-3000:]
  summary = json.loads((tmp_path / "summary.json").read_text())
  assert summary["stop_reason"] == "interrupted"
  assert summary["env_steps"] > 0


def test_run_dir_with_an_earlier_runs_checkpoints_needs_resume(tmp_path):
  (tmp_path / "checkpoints" / "12").mkdir(parents=True)  # orbax names a complete step by number
  r = train(f"--run_dir={tmp_path}")
  assert r.returncode == 2, r.stderr[-2000:]
  assert "--run_dir" in r.stderr and "--resume" in r.stderr
  assert not (tmp_path / "metrics.jsonl").exists()


def test_default_run_dir_moves_past_one_in_use(tmp_path):
  from experiments.train import default_run_dir
  from jaxrl_async.config import TrainConfig

  config = TrainConfig.from_flat({"seed": 3})
  assert default_run_dir("p", config, tmp_path) == tmp_path / "p-3"
  (tmp_path / "p-3").mkdir()  # empty: still free
  assert default_run_dir("p", config, tmp_path) == tmp_path / "p-3"
  (tmp_path / "p-3" / "metrics.jsonl").write_text("{}\n")
  (tmp_path / "p-3-2").mkdir()
  (tmp_path / "p-3-2" / "summary.json").write_text("{}")
  assert default_run_dir("p", config, tmp_path) == tmp_path / "p-3-3"
  resumed = TrainConfig.from_flat({"seed": 3, "resume": True})
  assert default_run_dir("p", resumed, tmp_path) == tmp_path / "p-3"
