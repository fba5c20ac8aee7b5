"""Everything about a training config that can be checked before a thread starts: devices,
the env's action space against the algorithm, checkpoints to resume or not to overwrite,
cluster settings. Each failure is a ConfigError naming the flag (exit status 2)."""

from __future__ import annotations

from pathlib import Path

import jax

from jaxrl_async import algos, envs
from jaxrl_async.checkpoint import Checkpointer, check_compatible, check_layout
from jaxrl_async.config import ConfigError, TrainConfig


def check_devices(config: TrainConfig) -> list[jax.Device]:
  devices = jax.local_devices()
  n = config.learner.learner_devices
  if n > len(devices):
    raise ConfigError("learner_devices", n, f"must be <= the {len(devices)} local devices "
                      f"({devices[0].platform}); on CPU set XLA_FLAGS="
                      f"--xla_force_host_platform_device_count={n}")
  return devices[:n]


def validate(config: TrainConfig, run_dir: Path | None = None) -> envs.EnvSpec:
  """Everything that can be checked before a thread starts; raises ConfigError."""
  spec = envs.env_spec(config.env)
  check_devices(config)
  algos.check(config, spec)  # the algorithm's checks (discrete actions, its run settings)
  if config.checkpoint.checkpoint_replay and not algos.is_off_policy(config.learner.algo):
    off_policy = [name for name in algos.ALGORITHMS if algos.is_off_policy(name)]
    raise ConfigError("checkpoint_replay", True,
                      f"needs an off-policy algorithm with a replay ({', '.join(off_policy)}); "
                      f"--algo={config.learner.algo} learns from its rollouts and has none")
  from jaxrl_async.loggers import check_kind

  check_kind(config.run.logger)
  if config.distributed.enabled or config.distributed.actor_devices:
    from jaxrl_async.runtime.cluster.hosts import check_cluster

    check_cluster(config, Path(run_dir or config.run.run_dir))
  if config.checkpoint.resume:
    meta = Checkpointer(Path(run_dir or config.run.run_dir)).read_meta()
    if meta is not None:
      check_compatible(meta["config"], config.to_flat(),
                       with_replay=config.checkpoint.checkpoint_replay and "replay" in meta)
      check_layout(meta, algos.state_layout(config.learner.algo))
  return spec


def check_run_dir(config: TrainConfig, run_dir: Path) -> None:
  """A new (not resumed) training run needs a run_dir without checkpoints: it would mix its
  own with the earlier run's, and fail on the first step number they share."""
  if (not config.checkpoint.resume and config.checkpoint.enabled
      and Checkpointer(run_dir).has_checkpoints()):
    raise ConfigError("run_dir", str(run_dir), "holds an earlier run's checkpoints: pass "
                      "--resume to continue it, or choose another --run_dir")
