"""A stop is honoured in every phase: before start-up, while compiling, while env pools are
built, before the first update and while training. The run writes summary.json with the phase
and returns (a thread stuck in a call nothing can wake is left to end on its own); the launcher
exits 0 on SIGTERM at any time."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from jaxrl_async.runtime.learners import on_policy
from jaxrl_async.runtime.trainer import Trainer
from tests.conftest import small_config
from tests.fakes import fake_factory

ROOT = Path(__file__).resolve().parent.parent
ENV = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")


def stop_when(trainer, ready, reason="terminated", timeout_s=60.0):
  """Asks `trainer` to stop once `ready()` holds (polled from another thread)."""
  def watch():
    deadline = time.time() + timeout_s
    while not ready() and time.time() < deadline:
      time.sleep(0.01)
    trainer.request_stop(reason)
  thread = threading.Thread(target=watch, daemon=True)
  thread.start()
  return thread


def actors_alive():
  return [t.name for t in threading.enumerate() if t.name.startswith("actor-")]


@pytest.fixture(autouse=True)
def threads_end_on_their_own():
  """Threads a stop left in a sleep standing in for a C call must end once it returns: checked
  after each test (and the next test starts without them)."""
  yield
  deadline = time.time() + 60
  alive = lambda: [t.name for t in threading.enumerate()
                   if t.name == "learner" or t.name.startswith("actor-")]
  while alive() and time.time() < deadline:
    time.sleep(0.1)
  assert not alive()


def test_a_stop_before_the_run_starts_writes_the_summary_at_once(tmp_path):
  trainer = Trainer.from_config(small_config(total_env_steps=10**9), run_dir=tmp_path, quiet=True)
  trainer.request_stop("terminated")
  s = trainer.run().summary
  assert s["stop_reason"] == "terminated" and s["stop_phase"] == "setup"
  assert s["env_steps"] == 0 and s["updates"] == 0 and s["abandoned_threads"] == []
  assert json.loads((tmp_path / "summary.json").read_text())["stop_phase"] == "setup"


def test_max_wall_s_counts_from_the_given_start_and_ends_start_up(tmp_path):
  """A launcher passes the process's start: a cap already spent by imports ends the run in its
  start-up compiles, with a summary, instead of after them."""
  config = small_config(total_env_steps=10**9, max_wall_s=5.0)
  trainer = Trainer.from_config(config, run_dir=tmp_path, quiet=True,
                                started_at=time.time() - 10.0)
  t0 = time.time()
  s = trainer.run().summary
  assert s["stop_reason"] == "max_wall_s" and s["stop_phase"] == "compilation"
  assert s["updates"] == 0 and time.time() - t0 < 30


def test_a_stop_while_env_pools_are_built_abandons_them_and_returns(tmp_path):
  """EnvPool's construction is one C call; here it takes 20 s (a sleep no stop wakes). The run
  returns long before, names the actors it left, and they end once construction returns."""
  make = fake_factory(episode_len=9)
  building = []  # the actors inside construction (both, before the stop: under load the
  # second may start late, see the stop first and end cleanly, which is no abandonment)

  def slow_pool(cfg, seed, **kw):
    building.append(seed)
    time.sleep(20.0)
    return make(cfg, seed, **kw)

  config = small_config(num_actors=2, total_env_steps=10**9)
  trainer = Trainer.from_config(config, run_dir=tmp_path, quiet=True, pool_factory=slow_pool)
  stop_when(trainer, lambda: len(building) == 2)
  t0 = time.time()
  s = trainer.run().summary
  assert time.time() - t0 < 15
  assert s["stop_reason"] == "terminated" and s["stop_phase"] == "env_construction"
  # Both actors; on a loaded machine the learner may still be in its compile too.
  assert {"actor-0", "actor-1"} <= set(s["abandoned_threads"]) <= {"actor-0", "actor-1", "learner"}
  # (The fixture then checks that each saw the stop once its pool existed, and ended.)


def test_a_stop_during_the_update_compile_is_reported_as_compilation(tmp_path, monkeypatch):
  compiling = threading.Event()
  compile_ = on_policy.OnPolicyStep.compile

  def slow_compile(self, abstract_state):
    compiling.set()
    time.sleep(8.0)  # an XLA compile: nothing wakes it
    return compile_(self, abstract_state)

  monkeypatch.setattr(on_policy.OnPolicyStep, "compile", slow_compile)
  config = small_config(total_env_steps=10**9)
  trainer = Trainer.from_config(config, run_dir=tmp_path, quiet=True,
                                pool_factory=fake_factory(episode_len=9))
  # Once the actors run (their pools exist), the learner is still compiling.
  stop_when(trainer, lambda: compiling.is_set() and trainer.timings.get("train_start_wall_s")
            and len(actors_alive()) == 1)
  s = trainer.run().summary
  assert s["stop_reason"] == "terminated"
  assert s["stop_phase"] in ("compilation", "env_construction"), s["stop_phase"]
  assert "learner" in s["abandoned_threads"] and s["updates"] == 0


def updated(metrics: Path) -> bool:
  """A metrics record shows an update."""
  if not metrics.exists():
    return False
  lines = metrics.read_text().splitlines()[:-1]  # the last may be half written
  return any(json.loads(line)["version"] > 0 for line in lines)


@pytest.mark.parametrize("phase", ["first_rollout", "training"])
def test_a_stop_later_on_names_its_phase_and_leaves_nothing(tmp_path, phase):
  config = small_config(total_env_steps=10**9, max_policy_lag=0)
  gate = threading.Event()

  def slow_first(cfg, seed, **kw):  # no rollout before the stop: the learner waits
    pool = fake_factory(episode_len=9)(cfg, seed, **kw)
    recv = pool.recv

    def held_recv():  # EnvPool's recv returns within a step's time: this one at the stop
      while not gate.is_set() and not trainer.stop.is_set():
        gate.wait(0.01)
      return recv()
    pool.recv = held_recv
    return pool

  trainer = Trainer.from_config(config, run_dir=tmp_path, quiet=True, pool_factory=slow_first)
  if phase == "first_rollout":
    stop_when(trainer, lambda: trainer.timings.get("train_start_wall_s") is not None)
  else:
    gate.set()
    stop_when(trainer, lambda: updated(tmp_path / "metrics.jsonl"))
  try:
    s = trainer.run().summary
  finally:
    gate.set()
  assert s["stop_reason"] == "terminated"
  if phase == "first_rollout":
    # Compiles may outlast the actors' start on a loaded machine; never a later phase.
    assert s["stop_phase"] in ("compilation", "first_rollout") and s["updates"] == 0
  else:
    assert s["stop_phase"] == "training" and s["updates"] > 0
  assert s["abandoned_threads"] == [] or s["stop_phase"] == "compilation"


def test_sigterm_three_seconds_after_launch_exits_0_with_a_summary(tmp_path):
  """Wherever start-up is at 3 s (JAX's import, building, compiling), SIGTERM ends the run
  cleanly: exit 0 within 30 s and summary.json says where it stopped."""
  proc = subprocess.Popen(
      [sys.executable, "-m", "experiments.train", "--total_env_steps=100000000",
       "--stop_at_return=nan", f"--run_dir={tmp_path}"],
      cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  time.sleep(3.0)
  proc.send_signal(signal.SIGTERM)
  t0 = time.time()
  out, err = proc.communicate(timeout=60)
  assert proc.returncode == 0, err[-3000:]
  assert time.time() - t0 < 30
  s = json.loads((tmp_path / "summary.json").read_text())
  assert s["stop_reason"] == "terminated"
  assert s["stop_phase"] in ("setup", "compilation", "env_construction", "first_rollout",
                             "training")
  assert f"({s['stop_phase']})" in out
