"""Zero drops by construction: with async EnvPool (envs running ahead of their rollout) and
random env delays, no rollout is ever too stale to learn from, at any cap K, and what the actors
step off the record while they wait for a ticket is counted."""

import pytest

from jaxrl_async.runtime.trainer import Trainer
from tests.conftest import small_config
from tests.fakes import fake_factory


@pytest.mark.parametrize("K", [0, 1, 2])
@pytest.mark.parametrize("actors,batch,U", [(3, 3, 1), (3, 5, 3), (1, 4, 1)])
def test_async_envpool_never_drops(K, actors, batch, U, tmp_path):
  config = small_config(num_actors=actors, num_envs=8, env_batch_size=batch, rollout_len=8,
                        max_policy_lag=K, rollouts_per_update=U, total_env_steps=8_000,
                        seed=K)
  trainer = Trainer.from_config(config, run_dir=tmp_path, quiet=True,
                                pool_factory=fake_factory(episode_len=9, jitter_s=0.002))
  s = trainer.run().summary
  assert s["dropped_stale"] == 0
  assert s["max_policy_lag_seen"] <= K
  assert max(int(k) for k in s["lag_hist"]) <= K
  assert sum(s["lag_hist"].values()) == s["updates"] * U
  assert s["updates"] * U * 64 <= s["env_steps"]
  # Steps taken off the record are counted, and bounded by what was stepped at all.
  assert 0 <= s["idle_env_steps"] < s["env_steps"]
