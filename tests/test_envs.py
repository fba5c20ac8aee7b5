"""EnvPool construction: the Atari settings reach the pool, and the trimmed import."""

import subprocess
import sys

from jaxrl_async import envs
from jaxrl_async.config import EnvConfig


def test_is_atari_knows_the_families():
  assert envs.is_atari("Breakout-v5") and envs.is_atari("Pong-v5")
  assert not envs.is_atari("CartPole-v1") and not envs.is_atari("HalfCheetah-v4")


def test_atari_settings_reach_the_pool():
  for life, clip, stack in [(True, True, 2), (False, False, 3)]:
    cfg = EnvConfig(env_id="Breakout-v5", num_envs=2, episodic_life=life, reward_clip=clip,
                    frame_stack=stack)
    pool = envs.make_pool(cfg, seed=0, num_envs=2, batch_size=2)
    assert (pool.config["episodic_life"], pool.config["reward_clip"]) == (life, clip)
    assert pool.observation_space.shape == (stack, 84, 84)
    pool.close()


def test_import_skips_unused_families_and_leaves_them_importable():
  # A fresh process: this one may have imported EnvPool whole already.
  code = """
import sys
from jaxrl_async import envs
envpool = envs.import_envpool()
ids = set(envpool.list_all_envs())
assert {"CartPole-v1", "Breakout-v5", "HalfCheetah-v4"} <= ids, "a supported family is missing"
assert "matplotlib" not in sys.modules, "jumanji's renderer was imported"
assert not any(n.startswith("envpool.jumanji") for n in sys.modules)
import envpool.jumanji.registration  # the stand-in is gone: a later import registers for real
assert len(envpool.list_all_envs()) > len(ids)
"""
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr[-2000:]
