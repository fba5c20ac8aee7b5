"""Fuzzing the flag space: invalid values never start a thread and always name a flag; valid
small configs run one update."""

import os
import subprocess
import sys
import threading
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxrl_async.config import ConfigError, TrainConfig
from jaxrl_async.runtime.trainer import Trainer, validate

ROOT = Path(__file__).resolve().parent.parent

# (flag, strategy of invalid values)
INVALID = {
    "num_envs": st.integers(max_value=0),
    "env_batch_size": st.integers(max_value=-1),
    "rollout_len": st.integers(max_value=0),
    "num_actors": st.integers(max_value=0),
    "max_policy_lag": st.integers(max_value=-1),
    "rollouts_per_update": st.integers(max_value=0),
    "learner_devices": st.integers(min_value=2, max_value=64),  # 1 device here
    "learning_rate": st.floats(max_value=0.0, allow_nan=False),
    "discount": st.floats(min_value=1.0001, max_value=10.0),
    "vtrace_lambda": st.floats(max_value=-0.0001, allow_nan=False, allow_infinity=False),
    "num_epochs": st.integers(max_value=0),
    "total_env_steps": st.integers(max_value=0),
    "env_id": st.sampled_from(["CartPol-v1", "Pong", "nope-v0", "cartpole-v1"]),
    "network": st.text(min_size=1, max_size=8).filter(
        lambda s: s not in ("mlp", "nature_cnn", "impala_resnet")),
    "hidden_sizes": st.sampled_from(["", "a,b", "0", "-4,4", "64,,x"]),
    "balance": st.text(max_size=5).filter(lambda s: s not in ("off", "auto")),
    "keep_checkpoints": st.integers(max_value=0),
}


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(flag=st.sampled_from(sorted(INVALID)), data=st.data())
def test_invalid_values_fail_before_any_thread_naming_a_flag(flag, data):
  value = data.draw(INVALID[flag])
  values = {"num_envs": 8, flag: value}
  if flag == "learner_devices":
    values["num_envs"] = 2 * value  # divisible, so the device count is what fails
  threads_before = threading.active_count()
  try:
    validate(TrainConfig.from_flat(values))
  except ConfigError as e:
    assert str(e).startswith("--") and "\n" not in str(e)
    assert e.flag in TrainConfig.flag_fields() or e.flag in ("env_id",)
  else:
    raise AssertionError(f"--{flag}={value!r} was accepted")
  assert threading.active_count() == threads_before


def test_invalid_values_exit_2_from_the_launcher(tmp_path):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  for args in (["--num_actors=0"], ["--discount=1.5"], ["--hidden_sizes=a,b"]):
    r = subprocess.run([sys.executable, "-m", "experiments.train", f"--run_dir={tmp_path}",
                        *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and args[0].split("=")[0] in r.stderr


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(num_envs=st.sampled_from([2, 4, 8]), rollout_len=st.integers(1, 6),
       max_policy_lag=st.integers(0, 3), num_actors=st.integers(1, 3),
       epochs=st.integers(1, 2), minibatches=st.sampled_from([1, 2]))
def test_valid_small_configs_run_one_update(tmp_path_factory, num_envs, rollout_len,
                                            max_policy_lag, num_actors, epochs, minibatches):
  config = TrainConfig.from_flat(dict(
      num_envs=num_envs, rollout_len=rollout_len, max_policy_lag=max_policy_lag,
      num_actors=num_actors, num_epochs=epochs, num_minibatches=minibatches,
      total_env_steps=num_envs * rollout_len, stop_at_return=float("nan"),
      hidden_sizes="8", checkpoint_at_end=False, checkpoint_every_s=0.0))
  run_dir = tmp_path_factory.mktemp("fuzz")
  s = Trainer.from_config(config, run_dir=run_dir, quiet=True).run().summary
  assert s["updates"] == 1 and s["version"] == 1
