"""Rollout assembly in the actor, against a fake EnvPool whose observations name env and step."""

import threading

import jax
import numpy as np
import pytest

from jaxrl_async import envs
from jaxrl_async.metrics import EpisodeStats
from jaxrl_async.runtime.actor import Actor
from jaxrl_async.runtime.params import ParamStore
from jaxrl_async.runtime.queue import RolloutQueue
from jaxrl_async.runtime.rate import RateController
from jaxrl_async.runtime.trainer import Trainer
from tests.conftest import small_config
from tests.fakes import fake_factory

EPISODE_LEN = 5


def collect(config, n: int, tmp_path):
  """Runs one actor on a FakePool and returns its first n rollouts as host arrays."""
  spec = envs.env_spec(config.env)
  trainer = Trainer(config, spec, run_dir=tmp_path, quiet=True)
  state = trainer._init_state()
  store = ParamStore()
  store.publish(trainer.algo.actor_params(state), 0)
  queue = RolloutQueue(4)
  controller = RateController(config.rate)
  stop = threading.Event()
  stats = EpisodeStats(5, float("nan"), lambda: 0)
  actor = Actor(0, config, spec, trainer.algo, trainer._policy_step(store.latest()[0]),
                trainer.actor_device, trainer.mesh, queue, store, controller, stats, stop,
                pool_factory=fake_factory(episode_len=EPISODE_LEN, truncate_every=3))
  thread = threading.Thread(target=actor.run, daemon=True)
  thread.start()
  out = []
  try:
    while len(out) < n:
      item = queue.get(5.0)
      assert item is not None, "actor produced nothing"
      rollout, info = item
      out.append(jax.device_get(rollout))
      controller.published(controller.version, [info.ticket])
  finally:
    stop.set()
    queue.close()
    controller.close()
    thread.join(5.0)
  assert not thread.is_alive()
  return out, stats


@pytest.mark.parametrize("batch", [8, 4, 3])
def test_rollout_columns_are_consecutive_steps_of_one_env(batch, tmp_path):
  # batch 8 is sync mode; 4 and 3 are async (EnvPool returns a random subset each recv).
  config = small_config(num_envs=8, env_batch_size=batch, rollout_len=6)
  rollouts, stats = collect(config, 4, tmp_path)
  T, E = 6, 8
  for k, r in enumerate(rollouts):
    obs = r.obs
    assert obs.shape == (T + 1, E, 4)
    np.testing.assert_array_equal(obs[:, :, 0], np.broadcast_to(np.arange(E), (T + 1, E)))
    # Column e holds env e's global steps kT .. (k+1)T.
    np.testing.assert_array_equal(obs[:, :, 1], (k * T + np.arange(T + 1))[:, None] * np.ones(E))
    ends_t = obs[:-1, :, 2] == EPISODE_LEN  # obs[t] ends an episode: transition t is a reset
    np.testing.assert_array_equal(r.valid, ~ends_t)
    np.testing.assert_array_equal(r.rewards, np.where(ends_t, 0.0, 1.0))
    ended_next = obs[1:, :, 2] == EPISODE_LEN
    np.testing.assert_array_equal(r.terminated | r.truncated, ended_next)
    assert not (r.terminated & r.truncated).any()
    if k > 0:
      np.testing.assert_array_equal(rollouts[k - 1].obs[T], obs[0])
  assert any(r.truncated.any() for r in rollouts) and any(r.terminated.any() for r in rollouts)
  assert stats.episodes > 0
  assert stats.return_mean() == EPISODE_LEN  # reset steps never count towards a return
