"""Where an actor's steps go: per-rollout host buffers, each env column's place in them, and
which envs are parked at a rollout boundary or out on an idle step (pipeline/actor.py says
why).

Env e's recorded transitions [kT, (k+1)T) form column e of rollout k; EnvPool returns a step's
reward and ends with the next obs, so obs n also closes transition n - 1 and, when n % T == 0,
is the previous rollout's bootstrap obs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxrl_async import envs
from jaxrl_async.algos.base import Rollout
from jaxrl_async.runtime.sharding import host_buffer


class RolloutSegment:
  """Host buffers for one rollout; fresh ones each time, since device_put copies asynchronously
  (or, on a CPU device, aliases them: `host_buffer`), so they are never written after the put."""

  def __init__(self, T: int, E: int, spec: envs.EnvSpec, extras_spec: dict[str, Any]):
    self.obs = host_buffer((T + 1, E) + spec.obs_shape, spec.obs_dtype)
    self.actions = host_buffer((T, E) + spec.action_shape, spec.action_dtype)
    self.rewards = host_buffer((T, E), np.float32)
    self.terminated = host_buffer((T, E), bool)
    self.truncated = host_buffer((T, E), bool)
    self.valid = host_buffer((T, E), bool)
    self.extras = {k: host_buffer((T, E) + shape, dtype)
                   for k, (shape, dtype) in extras_spec.items()}
    self.version: int | None = None

  def rollout(self) -> Rollout:
    version = host_buffer((1, self.obs.shape[1]), np.int32)
    version[:] = self.version  # the oldest params version that acted in it
    return Rollout(self.obs, self.actions, self.rewards, self.terminated, self.truncated,
                   self.valid, self.extras, behaviour_version=version)


class EnvState:
  """Where each of an actor's envs stands: recorded steps, parked at a boundary, or out on an
  idle step; and which rollouts are being made."""

  def __init__(self, num_envs: int, spec: envs.EnvSpec):
    self.counts = np.zeros(num_envs, np.int64)  # recorded obs per env = its next obs's time
    self.idle = np.zeros(num_envs, bool)  # its last step was an idle step (in no rollout)
    self.parked = np.zeros(num_envs, bool)  # waits at a rollout boundary for its ticket
    self.held_obs = np.zeros((num_envs,) + spec.obs_shape, spec.obs_dtype)  # parked envs' obs
    self.held_valid = np.zeros(num_envs, bool)
    self.n_idle = self.n_parked = 0
    self.in_pool = num_envs  # stepping in EnvPool (sent, not yet received)
    self.next_emit, self.open_upto = 0, 0  # rollouts [next_emit, open_upto] are being made

  def received(self, ids: np.ndarray) -> tuple[np.ndarray, Any, int]:
    """The time index of each received obs, which envs' previous step was recorded (None: all),
    and how many come back from an idle step (each starts its rollout again from this obs)."""
    if not self.n_idle:
      n = self.counts[ids]
      self.counts[ids] = n + 1
      return n, None, 0
    back = self.idle[ids]
    n = self.counts[ids] - back
    self.counts[ids] = n + 1
    self.idle[ids] = False
    returned = int(back.sum())
    self.n_idle -= returned
    return n, ~back, returned

  def park(self, ids: np.ndarray, obs: np.ndarray, valid: np.ndarray) -> None:
    self.held_obs[ids], self.held_valid[ids] = obs, valid
    self.parked[ids] = True
    self.n_parked = int(self.parked.sum())

  def release_parked(self) -> np.ndarray:
    released = np.flatnonzero(self.parked)
    self.parked[:] = False
    self.n_parked = 0
    return released

  def step_idle(self, count: int) -> np.ndarray:
    chosen = np.flatnonzero(self.parked)[:count]
    self.parked[chosen], self.idle[chosen] = False, True
    self.n_parked -= len(chosen)
    self.n_idle += len(chosen)
    return chosen


def write_observation(segments, new_segment, T, n, ids, obs, reward, terminated, truncated,
                       recorded=None):
  """Stores obs n of envs `ids`, and the results of their transition n - 1 (EnvPool returns
  those with obs n). Obs n is also the bootstrap obs of the previous segment when n % T == 0.
  `recorded` (None: all) marks the envs whose previous step was recorded: the others come back
  from an idle step, whose obs only replaces their rollout's first one."""
  has_prev = n >= 1 if recorded is None else (n >= 1) & recorded
  for k, sel in by_segment(n[has_prev] - 1, T):
    rows, cols = (n[has_prev][sel] - 1) % T, ids[has_prev][sel]
    seg = segments[k]
    seg.rewards[rows, cols] = reward[has_prev][sel]
    seg.terminated[rows, cols] = terminated[has_prev][sel]
    seg.truncated[rows, cols] = truncated[has_prev][sel]
  for k, sel in by_segment(n, T):
    seg = segments[k] if k in segments else segments.setdefault(k, new_segment())
    rows, cols = n[sel] % T, ids[sel]
    seg.obs[rows, cols] = obs[sel]
    boundary = (rows == 0) & (k > 0)
    if recorded is not None:
      boundary &= recorded[sel]
    if boundary.any():
      segments[k - 1].obs[T, cols[boundary]] = obs[sel][boundary]


def write_action(segments, T, n, ids, action, valid, extras, version):
  for k, sel in by_segment(n, T):
    seg, rows, cols = segments[k], n[sel] % T, ids[sel]
    seg.actions[rows, cols] = action[sel]
    seg.valid[rows, cols] = valid[sel]
    for name, value in extras.items():
      seg.extras[name][rows, cols] = value[sel]
    seg.version = version if seg.version is None else min(seg.version, version)


def by_segment(times: np.ndarray, T: int):
  """Yields (segment k, boolean selector) for the distinct segments `times` fall in."""
  if len(times) == 0:
    return
  ks = times // T
  first = ks[0]
  if ks[-1] == first and (ks == first).all():  # the common case, and always so in sync mode
    yield int(first), slice(None)
    return
  for k in np.unique(ks):
    yield int(k), ks == k
