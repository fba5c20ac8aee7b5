"""EnvPool construction, the env spec, and episode statistics.

EnvPool auto-resets: the step after an episode ends returns the first observation of the next
episode with reward 0, and the action sent for it is ignored. `EpisodeTracker` knows this, so
that step neither counts towards an episode nor is learned from (the actor marks it invalid).
Truncation (time limit) ends an episode for the statistics but is not a terminal state for
learning: the final observation EnvPool returns at truncation is bootstrapped from.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import sys
import types
import warnings
from typing import Any

import numpy as np

from jaxrl_async.config import ConfigError, EnvConfig


@dataclasses.dataclass(frozen=True)
class EnvSpec:
  """What the learner and the networks need to know about an environment."""

  env_id: str
  obs_shape: tuple[int, ...]
  obs_dtype: np.dtype
  discrete: bool
  num_actions: int  # discrete actions, or the action dimension for continuous
  action_low: tuple[float, ...] = ()
  action_high: tuple[float, ...] = ()

  @property
  def action_shape(self) -> tuple[int, ...]:
    return () if self.discrete else (self.num_actions,)

  @property
  def action_dtype(self) -> np.dtype:
    return np.dtype(np.int32) if self.discrete else np.dtype(np.float32)


# EnvPool registers every family it ships when imported. These five have observations this
# package does not take (dicts, dm_env timesteps, board games) and cost 0.35-0.5 s of a CartPole
# run's 4 s (jumanji's renderer imports matplotlib): `import_envpool` skips their registration.
SKIPPED_FAMILIES = ("jumanji", "pgx", "mujoco.playground", "mujoco.myosuite", "mujoco.dmc")


def import_envpool() -> types.ModuleType:
  """`import envpool`, without registering SKIPPED_FAMILIES when this is the first import.

  An empty module stands in for each skipped `registration` module during the import and is
  removed after it, so a later explicit import of one registers it as usual.
  """
  if "envpool" in sys.modules:
    return sys.modules["envpool"]
  names = [f"envpool.{f}.registration" for f in SKIPPED_FAMILIES]
  stubs = {n: types.ModuleType(n) for n in names if n not in sys.modules}
  sys.modules.update(stubs)
  try:
    import envpool
  finally:
    for name, stub in stubs.items():
      if sys.modules.get(name) is stub:
        del sys.modules[name]
  return envpool


# gymnasium warns that EnvPool's float64 Box bounds are cast to float32: harmless, and a
# `catch_warnings` block is not thread-safe (actors make their pools in their own threads).
warnings.filterwarnings("ignore", message=".*precision lowered by casting to float32")


@functools.lru_cache(maxsize=1)
def _all_env_ids() -> tuple[str, ...]:
  return tuple(import_envpool().list_all_envs())


def is_atari(env_id: str) -> bool:
  return env_id.endswith("-v5") and _family(env_id) == "atari"


def _family(env_id: str) -> str:
  # A registry entry is (import path, spec class, kwargs), e.g. ("envpool.atari", ...).
  entry = import_envpool().registration.registry.specs.get(env_id)
  return "atari" if entry is not None and entry[0] == "envpool.atari" else "other"


def check_env_id(env_id: str) -> None:
  """Raises a ConfigError naming close ids when EnvPool has no such task."""
  ids = _all_env_ids()
  if env_id not in ids:
    close = difflib.get_close_matches(env_id, ids, n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise ConfigError("env_id", env_id, f"is not an EnvPool task id of a supported family{hint}")


def _make_kwargs(cfg: EnvConfig) -> dict[str, Any]:
  if is_atari(cfg.env_id):
    return dict(episodic_life=cfg.episodic_life, reward_clip=cfg.reward_clip,
                stack_num=cfg.frame_stack, img_height=84, img_width=84, gray_scale=True,
                noop_max=30, repeat_action_probability=0.0)
  return {}


def make_pool(cfg: EnvConfig, seed: int, num_envs: int | None = None,
              batch_size: int | None = None) -> Any:
  """An EnvPool with the gymnasium API; async when batch_size < num_envs."""
  num_envs = num_envs or cfg.num_envs
  batch_size = batch_size or (cfg.batch_size if num_envs == cfg.num_envs else num_envs)
  return import_envpool().make(cfg.env_id, env_type="gymnasium", num_envs=num_envs,
                               batch_size=batch_size, num_threads=cfg.env_threads, seed=seed,
                               **_make_kwargs(cfg))


def env_spec(cfg: EnvConfig) -> EnvSpec:
  check_env_id(cfg.env_id)
  pool = make_pool(cfg, seed=0, num_envs=1, batch_size=1)
  obs_space, act_space = pool.observation_space, pool.action_space
  dtype = np.dtype(np.float32) if np.issubdtype(obs_space.dtype, np.floating) else obs_space.dtype
  if hasattr(act_space, "n"):
    spec = EnvSpec(cfg.env_id, tuple(obs_space.shape), dtype, True, int(act_space.n))
  else:
    spec = EnvSpec(cfg.env_id, tuple(obs_space.shape), dtype, False, int(act_space.shape[0]),
                   tuple(float(x) for x in act_space.low), tuple(float(x) for x in act_space.high))
  pool.close()
  return spec


class EpisodeTracker:
  """Per-env running return and length over EnvPool's auto-reset stream.

  `update` takes one `recv()` worth of data. A *step end* (terminated or truncated as EnvPool
  returns it; with Atari's episodic life a lost life is one) makes the env's next observation a
  reset observation, whose transition is not real. A *true end* (game over or time limit) ends
  an episode for the statistics, which therefore count raw, whole-game returns.
  """

  def __init__(self, num_envs: int):
    self.ret = np.zeros(num_envs, np.float64)
    self.len = np.zeros(num_envs, np.int64)
    # At the start every env's first recv is a reset observation, as after a step end.
    self.ended = np.ones(num_envs, bool)

  def update(self, env_ids: np.ndarray, reward: np.ndarray, step_end: np.ndarray,
             true_end: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Args: env ids [b], raw rewards [b], step_end [b], true_end [b].

    Returns: (finished returns [f], finished lengths [f], obs_ends_step [b]); an observation
    that ends a step is followed by EnvPool's reset step, which the actor marks invalid.
    """
    live = ~self.ended[env_ids]
    ids_live = env_ids[live]
    self.ret[ids_live] += reward[live]
    self.len[ids_live] += 1
    done_ids = env_ids[live & true_end]
    finished_ret, finished_len = self.ret[done_ids].copy(), self.len[done_ids].copy()
    self.ret[done_ids] = 0.0
    self.len[done_ids] = 0
    ends = live & step_end
    self.ended[env_ids] = ends
    return finished_ret, finished_len, ends
