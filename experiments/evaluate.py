"""Evaluate a checkpoint: `python -m experiments.evaluate --run_dir=RUN_DIR [--episodes=10]`.

Loads the newest (or `--version`) checkpoint of a run with the config saved beside it, plays N
episodes with the greedy or the sampled policy on a fresh EnvPool, and prints mean/std return.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from absl import app, flags

from experiments.cli import parse_flags
from jaxrl_async.config import ConfigError, TrainConfig

_RUN_DIR = flags.DEFINE_string("run_dir", None, "Run folder holding checkpoints/.")
_EPISODES = flags.DEFINE_integer("episodes", 10, "Episodes to play.")
_GREEDY = flags.DEFINE_bool("greedy", True, "Greedy actions (argmax / mean); else sampled.")
_VERSION = flags.DEFINE_integer("version", None, "Checkpoint version; default the newest.")
_SEED = flags.DEFINE_integer("seed", 12345, "Seed of the evaluation envs and actions.")
_MAX_STEPS = flags.DEFINE_integer("max_steps", 1_000_000, "Give up after this many env steps.")


def evaluate(run_dir: Path, episodes: int, greedy: bool, version: int | None, seed: int,
             max_steps: int) -> dict:
  import jax
  import numpy as np

  from jaxrl_async import envs
  from jaxrl_async.checkpoint import Checkpointer
  from jaxrl_async.runtime.trainer import Trainer

  ck = Checkpointer(run_dir)
  meta = ck.read_meta(version)
  if meta is None:
    raise ConfigError("run_dir", str(run_dir), "holds no complete checkpoint")
  flat = dict(meta["config"], num_actors=1, learner_devices=1, resume=False,
              checkpoint_at_end=False)
  config = TrainConfig.from_flat(flat)
  jax.config.update("jax_default_prng_impl", config.run.prng_impl)
  trainer = Trainer(config, run_dir=run_dir, quiet=True)
  state, meta = ck.restore(trainer._abstract_state(), version or meta["version"])
  params = jax.device_put(trainer.algo.actor_params(state), trainer.actor_device)
  if greedy:
    if trainer.algo.greedy_policy is None:
      raise ConfigError("greedy", True, f"{config.learner.algo} has no greedy policy")
    act = jax.jit(lambda p, o, k: (trainer.algo.greedy_policy(p, o), k))
  else:
    policy = trainer.algo.make_policy(0)
    act = jax.jit(lambda p, o, k: (policy(p, o, jax.random.split(k)[1])[0],
                                   jax.random.split(k)[0]))
  n = min(episodes, 16)
  pool = envs.make_pool(config.env, seed=seed, num_envs=n, batch_size=n)
  tracker = envs.EpisodeTracker(n)
  key = jax.random.key(seed)
  returns: list[float] = []
  obs, _ = pool.reset()
  tracker.ended[:] = False  # reset() already consumed the reset step
  ids = np.arange(n)
  atari = envs.is_atari(config.env.env_id)
  steps = 0
  while len(returns) < episodes and steps < max_steps:
    action, key = act(params, obs.astype(trainer.spec.obs_dtype), key)
    obs, reward, term, trunc, info = pool.step(np.asarray(action), ids)
    steps += n
    true_end = (info["terminated"].astype(bool) | trunc) if atari else (term | trunc)
    ret, _, _ = tracker.update(ids, info["reward"] if atari else reward, term | trunc, true_end)
    returns.extend(float(r) for r in ret)
  pool.close()
  returns = returns[:episodes]
  return {"version": meta["version"], "episodes": len(returns),
          "return_mean": float(np.mean(returns)) if returns else None,
          "return_std": float(np.std(returns)) if returns else None, "greedy": greedy}


def main(argv: list[str]) -> int:
  if len(argv) > 1 or not _RUN_DIR.value:
    print("evaluate: --run_dir is required", file=sys.stderr)
    return 2
  try:
    result = evaluate(Path(_RUN_DIR.value), _EPISODES.value, _GREEDY.value, _VERSION.value,
                      _SEED.value, _MAX_STEPS.value)
  except ConfigError as e:
    print(f"evaluate: {e}", file=sys.stderr)
    return 2
  print(json.dumps(result))
  return 0


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
