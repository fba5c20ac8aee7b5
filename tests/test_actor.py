"""Rollout assembly in the actor, against a fake EnvPool whose observations name env and step."""

import threading
import time

import jax
import numpy as np
import pytest

from jaxrl_async import envs
from jaxrl_async.metrics import EpisodeStats
from jaxrl_async.runtime.build import build
from jaxrl_async.runtime.pipeline.actor import Actor
from jaxrl_async.runtime.pipeline.params import ParamStore
from jaxrl_async.runtime.pipeline.queue import RolloutQueue
from jaxrl_async.runtime.pipeline.rate import RateController
from jaxrl_async.runtime.trainer import Trainer
from tests.conftest import small_config
from tests.fakes import fake_factory

EPISODE_LEN = 5


def collect(config, n: int, tmp_path, consume_delay_s: float = 0.0):
  """Runs one actor on a FakePool and returns its first n rollouts as host arrays, its episode
  stats and the actor; each rollout's ticket comes back `consume_delay_s` after it arrives."""
  spec = envs.env_spec(config.env)
  parts = build(config, spec, tmp_path)
  trainer = Trainer(parts, quiet=True)
  state = trainer.programs.init_state()
  store = ParamStore()
  store.publish(parts.algo.actor_params(state), 0)
  queue = RolloutQueue(4)
  controller = RateController(config.rate)
  stop = threading.Event()
  stats = EpisodeStats(5, float("nan"), lambda: 0)
  actor = Actor(0, config, spec, parts.algo, trainer.programs.policy_step(store.latest()[0]),
                parts.actor_device, parts.mesh, queue, store, controller, stats, stop,
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
      time.sleep(consume_delay_s)
      controller.published(controller.version, [info.ticket])
  finally:
    stop.set()
    queue.close()
    controller.close()
    thread.join(5.0)
  assert not thread.is_alive()
  return out, stats, actor


@pytest.mark.parametrize("batch,delay", [(8, 0.0), (4, 0.0), (3, 0.0), (8, 0.02), (4, 0.02),
                                         (3, 0.02)])
def test_rollout_columns_are_consecutive_steps_of_one_env(batch, delay, tmp_path):
  # batch 8 is sync mode; 4 and 3 are async (EnvPool returns a random subset each recv). With a
  # slow consumer, envs reach rollouts whose tickets are not granted yet: they park, and in
  # async mode some step off the record (idle steps), which leave gaps between rollouts.
  config = small_config(num_envs=8, env_batch_size=batch, rollout_len=6)
  rollouts, stats, actor = collect(config, 6, tmp_path, delay)
  T, E = 6, 8
  gaps = 0
  for k, r in enumerate(rollouts):
    obs = r.obs
    assert obs.shape == (T + 1, E, 4)
    np.testing.assert_array_equal(obs[:, :, 0], np.broadcast_to(np.arange(E), (T + 1, E)))
    # Column e holds T + 1 consecutive steps of env e; the next rollout starts where this one
    # ends, or later by the idle steps in between.
    np.testing.assert_array_equal(obs[:, :, 1], obs[:1, :, 1] + np.arange(T + 1)[:, None])
    if k > 0:
      gap = obs[0, :, 1] - rollouts[k - 1].obs[T, :, 1]
      assert (gap >= 0).all()
      gaps += int(gap.sum())
    ends_t = obs[:-1, :, 2] == EPISODE_LEN  # obs[t] ends an episode: transition t is a reset
    np.testing.assert_array_equal(r.valid, ~ends_t)
    np.testing.assert_array_equal(r.rewards, np.where(ends_t, 0.0, 1.0))
    ended_next = obs[1:, :, 2] == EPISODE_LEN
    np.testing.assert_array_equal(r.terminated | r.truncated, ended_next)
    assert not (r.terminated & r.truncated).any()
  assert gaps <= actor.timers.idle_env_steps
  if batch == 8:  # sync mode parks every env together: no step is ever off the record
    assert gaps == 0 and actor.timers.idle_env_steps == 0
  if delay:
    assert actor.timers.parked_env_waits > 0
  assert any(r.truncated.any() for r in rollouts) and any(r.terminated.any() for r in rollouts)
  assert stats.episodes > 0
  assert stats.return_mean() == EPISODE_LEN  # reset steps never count towards a return
