"""Shared test set-up: CPU only, quiet logs, small configs."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from jaxrl_async.algos.base import Rollout  # noqa: E402
from jaxrl_async.config import TrainConfig  # noqa: E402


def small_config(**overrides) -> TrainConfig:
  values = dict(env_id="CartPole-v1", num_envs=8, num_actors=1, rollout_len=8,
                max_policy_lag=1, total_env_steps=4_000, stop_at_return=float("nan"),
                log_every_s=0.5, hidden_sizes="16,16", checkpoint_at_end=False,
                checkpoint_every_s=0.0)
  values.update(overrides)
  return TrainConfig.from_flat(values)


def random_batch(T: int, B: int, rng: np.random.Generator, behaviour_version: int = 0
                 ) -> Rollout:
  """A CartPole-shaped IMPALA/PPO batch of host arrays: random obs, rewards, episode ends and
  behaviour log-probs, about 10% invalid steps, acted with params `behaviour_version`."""
  return Rollout(
      obs=rng.normal(size=(T + 1, B, 4)).astype(np.float32),
      actions=rng.integers(0, 2, size=(T, B)).astype(np.int32),
      rewards=rng.normal(size=(T, B)).astype(np.float32),
      terminated=rng.random((T, B)) < 0.1, truncated=rng.random((T, B)) < 0.05,
      valid=rng.random((T, B)) > 0.1,
      extras={"logp": np.log(rng.uniform(0.2, 0.8, size=(T, B))).astype(np.float32)},
      behaviour_version=np.full((1, B), behaviour_version, np.int32))


@pytest.fixture
def cfg_factory():
  return small_config
