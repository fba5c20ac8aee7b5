"""Evaluate a checkpoint: `python -m experiments.evaluate --run_dir=RUN_DIR [--episodes=10]`.

Loads the newest (or `--version`) checkpoint of a run with the config saved beside it, plays N
episodes with the greedy or the sampled policy on a fresh EnvPool, and prints mean/std return.
For pixel envs, `--video_path=FILE.gif` also writes the first evaluation env's frames (its
episodes one after another) as an animated GIF.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from absl import app, flags, logging

from experiments.cli import parse_flags
from jaxrl_async.config import ConfigError, TrainConfig

_RUN_DIR = flags.DEFINE_string("run_dir", None, "Run folder holding checkpoints/.")
_EPISODES = flags.DEFINE_integer("episodes", 10, "Episodes to play.")
_GREEDY = flags.DEFINE_bool("greedy", True, "Greedy actions (argmax / mean); else sampled.")
_VERSION = flags.DEFINE_integer("version", None, "Checkpoint version; default the newest.")
_SEED = flags.DEFINE_integer("seed", 12345, "Seed of the evaluation envs and actions.")
_MAX_STEPS = flags.DEFINE_integer("max_steps", 1_000_000, "Give up after this many env steps.")
_VIDEO_PATH = flags.DEFINE_string(
    "video_path", "", "Pixel envs (Atari): write the first evaluation env's frames (the newest "
    "frame of each observation stack) to this .gif file; empty: no video. Needs Pillow "
    "(pip install 'jaxrl_async[video]').")

# Atari runs at 60 Hz and EnvPool repeats each action for 4 frames: 15 observations a second
# is real time.
VIDEO_FPS = 15


def check_video(video_path: str, spec: Any) -> None:
  """Refuses a video that cannot be written, before anything starts; raises ConfigError."""
  if len(spec.obs_shape) != 3:
    raise ConfigError("video_path", video_path,
                      f"needs a pixel env, but {spec.env_id} observes a vector of shape "
                      f"{spec.obs_shape}; leave it empty")
  path = Path(video_path)
  if path.suffix.lower() != ".gif":
    raise ConfigError("video_path", video_path, "must end in .gif (an animated GIF is written)")
  if not path.parent.is_dir():
    raise ConfigError("video_path", video_path, f"its folder {path.parent} does not exist")
  try:
    import PIL  # noqa: F401
  except ImportError:
    raise ConfigError("video_path", video_path,
                      "needs Pillow: pip install 'jaxrl_async[video]'") from None


def newest_frame(obs: Any) -> Any:
  """One env's channel-first pixel observation [C, H, W] -> its newest frame [H, W] (uint8).

  EnvPool stacks Atari's grey frames oldest first, so the last channel is the current one.
  """
  return obs[-1]


def write_gif(path: Path, frames: list, fps: int = VIDEO_FPS) -> int:
  """Writes [H, W] uint8 frames as a looping animated GIF; returns the frames given."""
  from PIL import Image

  images = [Image.fromarray(f) for f in frames]
  # Pillow merges consecutive identical frames into one longer frame: same video, smaller.
  images[0].save(path, format="GIF", save_all=True, append_images=images[1:],
                 duration=round(1000 / fps), loop=0)
  return len(images)


def evaluate(run_dir: Path, episodes: int, greedy: bool, version: int | None, seed: int,
             max_steps: int, video_path: str = "") -> dict:
  import jax
  import numpy as np

  from jaxrl_async import algos, envs
  from jaxrl_async.checkpoint import Checkpointer, check_layout
  from jaxrl_async.runtime.build import abstract_state, build
  from jaxrl_async.runtime.validation import validate

  ck = Checkpointer(run_dir)
  meta = ck.read_meta(version)
  if meta is None:
    raise ConfigError("run_dir", str(run_dir), "holds no complete checkpoint")
  check_layout(meta, algos.state_layout(meta["config"]["algo"]), "run_dir", str(run_dir),
               "evaluate it with the version that wrote it")
  flat = dict(meta["config"], num_actors=1, learner_devices=1, resume=False,
              checkpoint_at_end=False, checkpoint_replay=False)
  config = TrainConfig.from_flat(flat)
  jax.config.update("jax_default_prng_impl", config.run.prng_impl)
  spec = validate(config, run_dir)
  if video_path:
    check_video(video_path, spec)
  parts = build(config, spec, run_dir)
  algo = parts.algo
  state, meta = ck.restore(abstract_state(parts), version or meta["version"])
  params = jax.device_put(algo.actor_params(state), parts.actor_device)
  if greedy:
    if algo.greedy_policy is None:
      raise ConfigError("greedy", True, f"{config.learner.algo} has no greedy policy")
    act = jax.jit(lambda p, o, k: (algo.greedy_policy(p, o), k))
  else:
    policy = algo.make_policy(0)
    act = jax.jit(lambda p, o, k: (policy(p, o, jax.random.split(k)[1])[0],
                                   jax.random.split(k)[0]))
  n = min(episodes, 16)
  pool = envs.make_pool(config.env, seed=seed, num_envs=n, batch_size=n)
  tracker = envs.EpisodeTracker(n)
  key = jax.random.key(seed)
  returns: list[float] = []
  obs, _ = pool.reset()
  tracker.ended[:] = False  # reset() already consumed the reset step
  frames = [newest_frame(obs[0]).copy()] if video_path else None
  ids = np.arange(n)
  atari = envs.is_atari(config.env.env_id)
  steps = 0
  while len(returns) < episodes and steps < max_steps:
    action, key = act(params, obs.astype(spec.obs_dtype), key)
    obs, reward, term, trunc, info = pool.step(np.asarray(action), ids)
    steps += n
    if frames is not None:
      frames.append(newest_frame(obs[0]).copy())
    true_end = (info["terminated"].astype(bool) | trunc) if atari else (term | trunc)
    ret, _, _ = tracker.update(ids, info["reward"] if atari else reward, term | trunc, true_end)
    returns.extend(float(r) for r in ret)
  pool.close()
  returns = returns[:episodes]
  result = {"version": meta["version"], "episodes": len(returns),
            "return_mean": float(np.mean(returns)) if returns else None,
            "return_std": float(np.std(returns)) if returns else None, "greedy": greedy}
  if frames is not None:
    result |= {"video_path": video_path, "video_frames": write_gif(Path(video_path), frames)}
  return result


def main(argv: list[str]) -> int:
  if len(argv) > 1 or not _RUN_DIR.value:
    print("evaluate: --run_dir is required", file=sys.stderr)
    return 2
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)  # orbax chatters at INFO; errors stay one line
  try:
    result = evaluate(Path(_RUN_DIR.value), _EPISODES.value, _GREEDY.value, _VERSION.value,
                      _SEED.value, _MAX_STEPS.value, _VIDEO_PATH.value)
  except ConfigError as e:
    print(f"evaluate: {e}", file=sys.stderr)
    return 2
  print(json.dumps(result))
  return 0


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
