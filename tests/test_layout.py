"""The host-sized layout: today's sizes on the 2-core CPU, fed envs on accelerator hosts, explicit
flags always win, every preset valid on every host."""

import json
import subprocess
import sys

import pytest

from experiments.presets import PRESETS, preset
from jaxrl_async import layout
from jaxrl_async.config import ConfigError, TrainConfig

CPU2 = layout.Host(cores=2, platform="cpu", devices=1, device_kind="cpu")
GPU16 = layout.Host(cores=16, platform="gpu", devices=1, device_kind="NVIDIA H200")
GPU8X = layout.Host(cores=96, platform="gpu", devices=8, device_kind="NVIDIA H100")

# The sizes each preset ran with on the 2-core CPU before layouts existed (commit a44f5c3).
TODAY = {"cartpole_impala": (2, 16), "cartpole_ppo": (1, 8), "cartpole_dqn": (2, 8),
         "hopper_ppo": (1, 32), "halfcheetah_ppo": (1, 32), "breakout_impala": (2, 16),
         "pong_impala": (2, 16), "breakout_ppo": (1, 8), "pong_ppo": (1, 8), "pong_dqn": (2, 8)}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_two_core_cpu_keeps_todays_sizes(name):
  values, chosen = layout.choose("auto", preset(name), set(), CPU2)
  config = TrainConfig.from_flat(values)
  assert (config.actor.num_actors, config.env.num_envs) == TODAY[name]
  assert config.rate.rollouts_per_update == 1 and config.env.env_batch_size == 0
  assert chosen.why and chosen.to_json()["host"]["cores"] == 2


@pytest.mark.parametrize("host", [GPU16, GPU8X], ids=["1gpu", "8gpu"])
@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_is_valid_on_accelerator_hosts(name, host):
  values, chosen = layout.choose("auto", preset(name), set(), host)
  config = TrainConfig.from_flat(values)  # raises ConfigError if the layout broke a rule
  sync = config.rate.capped and config.rate.max_policy_lag == 0
  if sync:  # the batch is the algorithm's: envs kept, one actor, more EnvPool threads
    assert config.env.num_envs == preset(name)["num_envs"] and config.actor.num_actors == 1
    assert config.env.env_threads > 1
  else:
    assert config.env.is_async and config.env.num_envs == 2 * config.env.env_batch_size
    assert config.actor.num_actors * config.env.env_threads <= host.cores
    assert config.learner.learner_devices == host.devices
  json.dumps(chosen.to_json())


def test_one_gpu_sixteen_cores_feeds_envpool_at_its_peak():
  values, _ = layout.choose("auto", preset("breakout_impala"), set(), GPU16)
  config = TrainConfig.from_flat(values)
  # EnvPool alone peaked at 64 envs, batch 32 on that host (16.2k Breakout steps/s).
  assert (config.env.num_envs, config.env.env_batch_size) == (64, 32)
  assert config.actor.num_actors * config.env.env_threads == 16
  # 2 async actors, each with 2 rollouts in flight at a boundary, at K = 1: U = 4.
  assert config.rate.rollouts_per_update == 4


def test_explicit_flags_win_and_are_reported():
  values = preset("breakout_impala") | {"num_envs": 24, "num_actors": 6}
  out, chosen = layout.choose("auto", values, {"num_envs", "num_actors"}, GPU16)
  assert out["num_envs"] == 24 and out["num_actors"] == 6
  assert "num_envs" not in chosen.chosen and "num_actors" not in chosen.chosen
  assert any("num_envs=24 given as a flag" in w for w in chosen.why)
  assert out["env_batch_size"] == 12  # async halves of the envs given, not the layout's 32
  TrainConfig.from_flat(out)
  # The rule for rollouts per update follows the actors actually used: 6 async actors want
  # 12 rollouts in flight, more than K + 1 = 2.
  assert out["rollouts_per_update"] == 12


def test_preset_mode_keeps_sizes_but_decouples_concurrency():
  values = preset("cartpole_impala") | {"num_actors": 4}
  out, chosen = layout.choose("preset", values, {"num_actors"}, GPU16)
  assert out["num_envs"] == 16 and "env_batch_size" not in out
  assert out["rollouts_per_update"] == 4
  out, _ = layout.choose("preset", values | {"rollouts_per_update": 1},
                         {"num_actors", "rollouts_per_update"}, GPU16)
  assert out["rollouts_per_update"] == 1


@pytest.mark.parametrize("n,k,free,async_envs,u", [
    (1, 0, False, False, 1), (2, 1, False, False, 1), (2, 0, False, False, 2),
    (4, 1, False, False, 4), (3, 2, False, False, 1), (8, 1, True, False, 1),
    (1, 1, False, True, 1), (1, 0, False, True, 2), (2, 1, False, True, 4),
    (2, 3, False, True, 1), (8, 1, True, True, 1)])
def test_rollouts_per_update_rule(n, k, free, async_envs, u):
  assert layout.rollouts_per_update(n, k, free, async_envs) == u


def test_bad_layout_is_refused():
  with pytest.raises(ConfigError, match="--layout='big'"):
    layout.choose("big", {}, set(), CPU2)


def test_launcher_refuses_a_bad_layout_with_status_2():
  out = subprocess.run([sys.executable, "-m", "experiments.train", "--layout=big"],
                       capture_output=True, text=True, timeout=120)
  assert out.returncode == 2
  assert out.stderr.strip().splitlines()[-1] == (
      "train: --layout='big': must be one of auto, preset")


def test_detect_host_sees_this_process():
  host = layout.detect_host()
  assert host.cores >= 1 and host.devices >= 1 and host.platform == "cpu"
