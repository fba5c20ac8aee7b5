"""experiments/evaluate.py as a user runs it: a checkpoint's episodes, and a GIF for pixel envs."""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
from PIL import Image

from experiments.presets import preset
from jaxrl_async.algos import state_layout
from jaxrl_async.checkpoint import Checkpointer
from jaxrl_async.config import TrainConfig
from jaxrl_async.runtime.trainer import Trainer, validate

ROOT = Path(__file__).resolve().parent.parent
ENV = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")


def initial_checkpoint(run_dir: Path, **flat) -> TrainConfig:
  """A run's checkpoint at version 0 (its initial params), written without training: what
  evaluate reads (state and config) is all there, at a fraction of a run's cost."""
  # The key layout in the checkpoint follows the PRNG of this process, which evaluate then uses.
  config = TrainConfig.from_flat(flat | {"prng_impl": jax.config.jax_default_prng_impl})
  trainer = Trainer.from_config(config, validate(config, run_dir), run_dir=run_dir, quiet=True)
  ck = Checkpointer(run_dir, use_async=False)
  ck.save(0, trainer.programs.init_state(), {"version": 0, "config": config.to_flat(),
                                             "state_layout": state_layout(config.learner.algo)})
  ck.close()
  return config


def evaluate(run_dir: Path, *flags: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", "experiments.evaluate", f"--run_dir={run_dir}",
                         *flags], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=180)


def test_video_of_a_pixel_env_is_an_animated_gif_of_the_newest_frames(tmp_path):
  # pong_impala with a small Nature CNN; one env, 100 steps of one (unfinished) episode.
  initial_checkpoint(tmp_path, **preset("pong_impala") | dict(
      network="nature_cnn", num_actors=1, num_envs=2, rollout_len=4))
  gif = tmp_path / "episode.gif"
  r = evaluate(tmp_path, f"--video_path={gif}", "--episodes=1", "--max_steps=100")
  assert r.returncode == 0, r.stderr[-3000:]
  result = json.loads(r.stdout.strip().splitlines()[-1])
  assert result["video_path"] == str(gif) and result["video_frames"] == 101  # reset + 100 steps
  with Image.open(gif) as image:
    assert image.format == "GIF" and image.size == (84, 84)  # one 84x84 grey Atari frame
    # Pillow merges identical consecutive frames, so fewer than 101, but Pong moves.
    assert 1 < image.n_frames <= 101
    image.seek(image.n_frames - 1)  # every frame decodes


def test_video_of_a_vector_env_is_refused_naming_the_flag(tmp_path):
  initial_checkpoint(tmp_path, env_id="CartPole-v1", num_envs=4, hidden_sizes="8")
  gif = tmp_path / "episode.gif"
  r = evaluate(tmp_path, f"--video_path={gif}", "--episodes=1")
  assert r.returncode == 2, r.stderr[-3000:]
  lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
  assert len(lines) == 1 and "--video_path" in lines[0] and "pixel" in lines[0], r.stderr
  assert r.stdout == "" and not gif.exists()  # refused before any episode was played
