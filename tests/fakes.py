"""An EnvPool-shaped fake: deterministic, instant, and able to run async with random readiness.

Env e's observation at its step n is [e, n_total, n_in_episode, 0] (float32), so a test can
check that every column of a rollout is one env's consecutive steps. Episodes last
`episode_len` steps; every `truncate_every`-th episode ends by truncation instead. Like EnvPool,
the step after an episode end is a reset step with reward 0.
"""

from __future__ import annotations

import numpy as np


class FakePool:

  def __init__(self, num_envs: int, batch_size: int, seed: int = 0, episode_len: int = 7,
               truncate_every: int = 3, delay_s: float = 0.0, jitter_s: float = 0.0):
    self.num_envs, self.batch_size = num_envs, batch_size
    self.rng = np.random.default_rng(seed)
    self.episode_len, self.truncate_every = episode_len, truncate_every
    self.total = np.zeros(num_envs, np.int64)
    self.in_ep = np.zeros(num_envs, np.int64)
    self.episodes = np.zeros(num_envs, np.int64)
    self.ended = np.ones(num_envs, bool)
    self.ready: list[int] = []
    self.delay_s = delay_s
    self.jitter_s = jitter_s  # each recv also waits uniform(0, jitter_s): random env speeds
    self.closed = False

  def async_reset(self) -> None:
    self.ready = list(range(self.num_envs))

  def _step(self, e: int) -> tuple:
    if self.ended[e]:
      self.in_ep[e], self.ended[e] = 0, False
      reward, term, trunc = 0.0, False, False
    else:
      self.in_ep[e] += 1
      reward = 1.0
      end = self.in_ep[e] >= self.episode_len
      trunc = bool(end and (self.episodes[e] % self.truncate_every == self.truncate_every - 1))
      term = bool(end and not trunc)
      if end:
        self.episodes[e] += 1
        self.ended[e] = True
    obs = np.array([e, self.total[e], self.in_ep[e], 0], np.float32)
    self.total[e] += 1
    return obs, reward, term, trunc

  def recv(self):
    if self.delay_s or self.jitter_s:
      import time
      time.sleep(self.delay_s + self.jitter_s * self.rng.random())
    if self.batch_size < self.num_envs:  # async: a random subset of the ready envs
      idx = self.rng.choice(len(self.ready), self.batch_size, replace=False)
      ids = [self.ready[i] for i in sorted(idx)]
    else:
      ids = list(self.ready)
    assert len(ids) == self.batch_size, "recv with fewer ready envs than batch_size"
    for e in ids:
      self.ready.remove(e)
    steps = [self._step(e) for e in ids]
    obs = np.stack([s[0] for s in steps])
    reward = np.array([s[1] for s in steps], np.float32)
    term = np.array([s[2] for s in steps], bool)
    trunc = np.array([s[3] for s in steps], bool)
    return obs, reward, term, trunc, {"env_id": np.array(ids, np.int32)}

  def send(self, action, env_id) -> None:
    assert len(action) == len(env_id)
    self.ready.extend(int(e) for e in env_id)

  def close(self) -> None:
    self.closed = True


def fake_factory(**kwargs):
  def make(cfg, seed, num_envs=None, batch_size=None):
    return FakePool(num_envs or cfg.num_envs, batch_size or cfg.batch_size, seed=seed, **kwargs)
  return make
