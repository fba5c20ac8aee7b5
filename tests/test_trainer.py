"""End-to-end runs of the trainer: learning, determinism, the lag cap, shutdown and failures."""

import random
import threading
import time

import jax
import numpy as np
import pytest

from jaxrl_async.runtime.learners import on_policy as learner_mod
from jaxrl_async.runtime.pipeline import actor as actor_mod
from jaxrl_async.runtime.trainer import ThreadFailed, Trainer
from tests.conftest import small_config


def run(config, tmp_path, **kwargs):
  return Trainer.from_config(config, run_dir=tmp_path, quiet=True, **kwargs).run()


def component_threads_alive(within_s: float = 30.0):
  """Component threads still alive `within_s` after the run returned. A thread in a call
  nothing can wake (the update's compile) is left to end on its own after a stop: it must then
  end, once that call returns."""
  deadline = time.time() + within_s
  while True:
    alive = [t.name for t in threading.enumerate()
             if t.name == "learner" or t.name.startswith("actor-")]
    if not alive or time.time() > deadline:
      return alive
    time.sleep(0.05)


IMPALA_CARTPOLE = dict(num_actors=2, num_envs=16, rollout_len=32, hidden_sizes="64,64",
                       total_env_steps=120_000, stop_at_return=200.0)


def test_learns_cartpole(tmp_path):
  config = small_config(**IMPALA_CARTPOLE)
  result = run(config, tmp_path)
  s = result.summary
  assert s["solved"], f"return_mean only {s['final_return_mean']} after {s['env_steps']} steps"
  assert s["max_policy_lag_seen"] <= 1
  assert (tmp_path / "summary.json").exists() and (tmp_path / "metrics.jsonl").exists()
  assert not component_threads_alive()


def test_k0_one_actor_is_deterministic(tmp_path):
  config = small_config(max_policy_lag=0, num_actors=1, total_env_steps=3_000)
  a = run(config, tmp_path / "a")
  b = run(config, tmp_path / "b")
  assert a.version == b.version > 5
  leaves_a = jax.tree.leaves(jax.device_get(a.state.params))
  leaves_b = jax.tree.leaves(jax.device_get(b.state.params))
  for x, y in zip(leaves_a, leaves_b, strict=True):
    np.testing.assert_array_equal(x, y)
  assert a.summary["lag_hist"] == {"0": a.version}


@pytest.mark.parametrize("batch", [0, 3], ids=["sync", "async"])
@pytest.mark.parametrize("K", [0, 1, 3])
def test_lag_cap_holds_with_random_delays(K, batch, tmp_path, monkeypatch):
  rng = random.Random(K)
  emit, add = actor_mod.Actor._emit, learner_mod.OnPolicyStep.add

  def slow_emit(self, seg, k):
    time.sleep(rng.choice([0.0, 0.0, 0.01, 0.03]))
    return emit(self, seg, k)

  def slow_add(self, rollout, ticket):
    time.sleep(rng.choice([0.0, 0.005, 0.02]))
    return add(self, rollout, ticket)

  monkeypatch.setattr(actor_mod.Actor, "_emit", slow_emit)
  monkeypatch.setattr(learner_mod.OnPolicyStep, "add", slow_add)
  config = small_config(max_policy_lag=K, num_actors=3, total_env_steps=6_000,
                        env_batch_size=batch)
  s = run(config, tmp_path).summary
  assert s["dropped_stale"] == 0  # throttled on each rollout's first step, never dropped
  assert s["max_policy_lag_seen"] <= K
  assert max(int(k) for k in s["lag_hist"]) <= K
  assert s["updates"] > 10


def fail_emits(monkeypatch, which):
  """Makes Actor._emit raise on the calls whose (1-based) numbers are in `which`."""
  calls = []
  emit = actor_mod.Actor._emit

  def failing_emit(self, seg, k):
    calls.append(1)
    if which(len(calls)):
      raise RuntimeError("injected actor failure")
    return emit(self, seg, k)

  monkeypatch.setattr(actor_mod.Actor, "_emit", failing_emit)


def test_actor_exception_ends_the_run_with_its_traceback(tmp_path, monkeypatch):
  fail_emits(monkeypatch, lambda n: n == 3)
  config = small_config(num_actors=2, total_env_steps=10**9, actor_restarts=0)
  t0 = time.time()
  with pytest.raises(ThreadFailed, match="injected actor failure") as info:
    run(config, tmp_path)
  assert "failing_emit" in str(info.value)  # the traceback travels to the main thread
  assert time.time() - t0 < 30
  assert not component_threads_alive()


def test_failed_actor_is_restarted_and_the_loss_counted(tmp_path, monkeypatch):
  fail_emits(monkeypatch, lambda n: n == 3)
  config = small_config(num_actors=2, total_env_steps=3_000, actor_restarts=2)
  s = run(config, tmp_path).summary
  assert s["stop_reason"] == "budget"
  assert s["actor_restarts"] == 1 and s["lost_rollouts"] == 1 and s["lost_env_steps"] > 0


def test_actor_failing_past_the_restart_limit_stops_the_run(tmp_path, monkeypatch):
  fail_emits(monkeypatch, lambda n: n >= 2)
  config = small_config(num_actors=1, total_env_steps=10**9, actor_restarts=2)
  with pytest.raises(ThreadFailed, match="injected actor failure"):
    run(config, tmp_path)
  assert not component_threads_alive()


def test_stops_at_budget_and_shuts_down(tmp_path):
  config = small_config(num_actors=2, total_env_steps=2_000)
  s = run(config, tmp_path).summary
  assert s["stop_reason"] == "budget" and s["updates"] == -(-2_000 // (8 * 8))
  assert not component_threads_alive()
