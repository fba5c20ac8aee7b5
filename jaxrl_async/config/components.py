"""The settings of each component a run is built from: envs, actors, rate control, network,
learner, checkpoints, the distributed runtime and the run itself."""

from __future__ import annotations

import dataclasses

from jaxrl_async.config.checks import _check, _f, _non_negative, _positive, _unit_interval


@dataclasses.dataclass(frozen=True)
class EnvConfig:
  env_id: str = _f("CartPole-v1", "EnvPool task id, e.g. CartPole-v1, Breakout-v5, Hopper-v4.")
  num_envs: int = _f(16, "Environments per actor (one EnvPool per actor thread).")
  env_batch_size: int = _f(0, "EnvPool batch size; < num_envs is async mode, 0 means num_envs.")
  env_threads: int = _f(0, "EnvPool worker threads per actor; 0 lets EnvPool decide.")
  episodic_life: bool = _f(False, "Atari: end the training episode at a life loss.")
  reward_clip: bool = _f(True, "Atari: clip rewards to {-1, 0, 1} (statistics keep raw returns).")
  frame_stack: int = _f(4, "Atari: frames stacked per observation.")

  def __post_init__(self):
    _check(isinstance(self.env_id, str) and bool(self.env_id), "env_id", self.env_id,
           "must be a non-empty EnvPool task id")
    _positive(self, "num_envs", "frame_stack")
    _non_negative(self, "env_batch_size", "env_threads")
    _check(self.env_batch_size <= self.num_envs, "env_batch_size", self.env_batch_size,
           f"must be <= --num_envs={self.num_envs} (0 means equal)")

  @property
  def batch_size(self) -> int:
    return self.env_batch_size or self.num_envs

  @property
  def is_async(self) -> bool:
    return self.batch_size < self.num_envs


@dataclasses.dataclass(frozen=True)
class ActorConfig:
  num_actors: int = _f(2, "Actor threads, each stepping its own EnvPool.")
  rollout_len: int = _f(32, "Steps per env in one rollout (T).")

  def __post_init__(self):
    _positive(self, "num_actors", "rollout_len")


LAG_WEIGHTINGS = ("off", "inverse", "exp")


@dataclasses.dataclass(frozen=True)
class RateConfig:
  max_policy_lag: int = _f(1, "Hard cap K on policy lag in versions; 0 is synchronous.")
  free_running: bool = _f(False, "No lag cap at all: actors never wait for versions and the "
                          "queue (queue_capacity) only bounds memory; for comparison only.")
  rollouts_per_update: int = _f(1, "Rollouts the learner concatenates into one update.")
  queue_capacity: int = _f(0, "Rollout queue bound; 0 derives it from the lag cap.")
  balance: str = _f("off", "off: fixed settings; auto: each window, move the rollouts per "
                    "update, the rollouts in flight (within the cap K), the active actors and "
                    "(replay) the SPI target towards --target_lag, --target_idle and "
                    "--target_blocked (runtime/pipeline/balance.py).")
  target_lag: float = _f(0.5, "balance=auto: mean policy lag to stay under (below the cap K).")
  target_idle: float = _f(0.2, "balance=auto: learner idle fraction to stay under.")
  target_blocked: float = _f(0.15, "balance=auto: fraction of the time the actors may wait on "
                             "tickets (or the learner's inserts).")
  balance_every_s: float = _f(1.0, "balance=auto: seconds between control steps.")
  lag_weighting: str = _f("off", "Staleness correction on top of the V-trace/PPO ratios (impala, "
                          "ppo): each rollout's loss terms count w(L) times, L its policy lag at "
                          "the update: off (w = 1), inverse (1 / (1 + L)) or exp "
                          "(exp(-L / lag_weighting_tau)).")
  lag_weighting_tau: float = _f(2.0, "lag_weighting=exp: the decay scale, in versions.")

  def __post_init__(self):
    _check(isinstance(self.max_policy_lag, int) and self.max_policy_lag >= 0,
           "max_policy_lag", self.max_policy_lag, "must be an integer >= 0")
    _positive(self, "rollouts_per_update")
    _non_negative(self, "queue_capacity")
    _check(self.balance in ("off", "auto"), "balance", self.balance, "must be off or auto")
    _check(isinstance(self.target_lag, int | float) and self.target_lag >= 0, "target_lag",
           self.target_lag, "must be >= 0")
    if self.balance == "auto" and not self.free_running:
      _check(self.target_lag <= self.max_policy_lag, "target_lag", self.target_lag,
             f"must be <= --max_policy_lag={self.max_policy_lag} (the hard cap)")
    _unit_interval(self, "target_idle", "target_blocked")
    _check(self.balance_every_s > 0, "balance_every_s", self.balance_every_s, "must be > 0")
    _check(self.lag_weighting in LAG_WEIGHTINGS, "lag_weighting", self.lag_weighting,
           f"must be one of {', '.join(LAG_WEIGHTINGS)}")
    _check(isinstance(self.lag_weighting_tau, int | float) and self.lag_weighting_tau > 0,
           "lag_weighting_tau", self.lag_weighting_tau, "must be > 0")

  @property
  def capped(self) -> bool:
    return not self.free_running

  @property
  def max_in_flight(self) -> int:
    """Rollouts started but not yet consumed; (K + 1) U keeps the lag at consumption <= K."""
    if not self.capped:
      return max(self.queue_capacity, 4 * self.rollouts_per_update)
    return (self.max_policy_lag + 1) * self.rollouts_per_update

  @property
  def resolved_queue_capacity(self) -> int:
    return max(self.queue_capacity, self.max_in_flight)


@dataclasses.dataclass(frozen=True)
class NetworkConfig:
  network: str = _f("mlp", "Torso: mlp, nature_cnn or impala_resnet.")
  hidden_sizes: str = _f("64,64", "MLP layer widths, comma separated.")
  activation: str = _f("tanh", "MLP activation: tanh or relu.")
  shared_torso: bool = _f(False, "Actor and critic share one torso (always true for CNNs).")

  def __post_init__(self):
    _check(self.network in ("mlp", "nature_cnn", "impala_resnet"), "network", self.network,
           "must be one of mlp, nature_cnn, impala_resnet")
    _check(self.activation in ("tanh", "relu"), "activation", self.activation,
           "must be tanh or relu")
    try:
      sizes = self.layer_sizes
    except ValueError:
      sizes = ()
    _check(len(sizes) >= 1 and all(s >= 1 for s in sizes), "hidden_sizes", self.hidden_sizes,
           "must be comma-separated positive integers, e.g. 64,64")

  @property
  def layer_sizes(self) -> tuple[int, ...]:
    return tuple(int(s) for s in str(self.hidden_sizes).split(",") if s.strip())


@dataclasses.dataclass(frozen=True)
class LearnerConfig:
  algo: str = _f("impala", "Algorithm, by its name in jaxrl_async/algos/registry.py: impala, "
                 "ppo, dqn, ...")
  learner_devices: int = _f(1, "Devices in the data-parallel learner mesh, per host (process).")

  def __post_init__(self):
    from jaxrl_async.algos.registry import ALGORITHMS  # not at import: see algorithm_configs

    _check(self.algo in ALGORITHMS, "algo", self.algo, f"must be one of {', '.join(ALGORITHMS)}")
    _positive(self, "learner_devices")


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
  checkpoint_every_s: float = _f(120.0, "Seconds between checkpoints; 0 disables the timer.")
  checkpoint_every_updates: int = _f(0, "Versions between checkpoints; 0 disables.")
  keep_checkpoints: int = _f(3, "Checkpoints kept (older ones are deleted).")
  checkpoint_at_end: bool = _f(True, "Save a final checkpoint when the run ends or is stopped.")
  checkpoint_replay: bool = _f(False, "Off-policy (dqn): checkpoints also hold the replay and "
                               "its limiter counters, and --resume continues them (large: "
                               "pong_dqn's replay is 2.9 GB).")
  resume: bool = _f(False, "Continue from the newest complete checkpoint in --run_dir.")

  def __post_init__(self):
    _non_negative(self, "checkpoint_every_s", "checkpoint_every_updates")
    _positive(self, "keep_checkpoints")

  @property
  def enabled(self) -> bool:
    return bool(self.checkpoint_every_s or self.checkpoint_every_updates or
                self.checkpoint_at_end)


CLUSTER_DETECTION = ("auto", "slurm", "ompi", "mpi4py", "gcetpu", "gketpu")


def _device_indices(text: str) -> tuple[int, ...]:
  """'0,2' -> (0, 2); raises ValueError on anything else (empty items, negatives, repeats)."""
  out = tuple(int(s) for s in str(text).split(","))
  if any(i < 0 for i in out) or len(set(out)) != len(out):
    raise ValueError(text)
  return out


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
  """One process per host on JAX's distributed runtime (runtime/cluster/hosts.py)."""

  coordinator_address: str = _f("", "host:port of process 0's coordinator; set it (with "
                                "--num_processes, --process_id) to train over several processes.")
  num_processes: int = _f(1, "Processes in the run, one per host; 1 is single-process.")
  process_id: int = _f(0, "This process's index, 0 .. num_processes - 1 (0 hosts the coordinator).")
  cluster_detection: str = _f("", "Take coordinator, process count and id from the cluster: auto "
                              "(whatever JAX detects: SLURM, Open MPI, TPU VMs), or one of "
                              "slurm, ompi, mpi4py, gcetpu, gketpu; empty: off.")
  local_device_ids: str = _f("", "Accelerator ids this process may use, comma separated; empty: "
                             "JAX's choice (all, but one per process under SLURM/Open MPI).")
  actor_devices: str = _f("", "Local device indices for the actors' policy, comma separated; "
                          "empty: auto (CPU or as many accelerators as --learner_devices: shared "
                          "with the learner; a spare accelerator: device 0, learners after it).")
  peer_timeout_s: float = _f(60.0, "A peer process silent this long is declared dead: this one "
                             "exits (status 75) naming it. JAX's heartbeat is 2x this (backstop).")
  init_timeout_s: int = _f(300, "Seconds to wait for every process to join at start-up.")

  def __post_init__(self):
    _positive(self, "num_processes", "init_timeout_s")
    _check(isinstance(self.process_id, int) and 0 <= self.process_id < self.num_processes,
           "process_id", self.process_id, f"must be in [0, --num_processes={self.num_processes})")
    _check(self.cluster_detection in ("",) + CLUSTER_DETECTION, "cluster_detection",
           self.cluster_detection, f"must be empty or one of {', '.join(CLUSTER_DETECTION)}")
    if self.cluster_detection:
      _check(self.num_processes == 1 and self.process_id == 0, "num_processes",
             self.num_processes, "is taken from the cluster with --cluster_detection; leave it "
             "and --process_id unset")
    elif self.num_processes > 1:
      _check(bool(self.coordinator_address), "coordinator_address", self.coordinator_address,
             "must be host:port when --num_processes > 1 (or set --cluster_detection=auto)")
    if self.coordinator_address:
      host, _, port = str(self.coordinator_address).rpartition(":")
      _check(bool(host) and port.isdigit() and 0 < int(port) < 65536, "coordinator_address",
             self.coordinator_address, "must be host:port, e.g. 10.0.0.1:1234")
    for name in ("actor_devices", "local_device_ids"):
      try:
        _ = _device_indices(getattr(self, name)) if getattr(self, name) else ()
      except ValueError:
        _check(False, name, getattr(self, name),
               "must be distinct device indices >= 0, comma separated, e.g. 0 or 0,1")
    _check(isinstance(self.peer_timeout_s, int | float) and self.peer_timeout_s > 0,
           "peer_timeout_s", self.peer_timeout_s, "must be > 0")

  @property
  def enabled(self) -> bool:
    """Whether this run joins JAX's distributed runtime (even as a cluster of one)."""
    return bool(self.coordinator_address or self.cluster_detection) or self.num_processes > 1

  @property
  def actor_device_indices(self) -> tuple[int, ...]:
    return _device_indices(self.actor_devices) if self.actor_devices else ()

  @property
  def local_device_indices(self) -> tuple[int, ...] | None:
    return _device_indices(self.local_device_ids) if self.local_device_ids else None


@dataclasses.dataclass(frozen=True)
class RunConfig:
  total_env_steps: int = _f(2_000_000, "Stop after this many env steps (all actors together).")
  stop_at_return: float = _f(475.0, "Stop when return_mean reaches this; nan disables.")
  return_window: int = _f(20, "Finished episodes averaged into return_mean.")
  seed: int = _f(0, "Seed for params, actions and environments.")
  run_dir: str = _f("", "Where metrics.jsonl, summary.json and checkpoints go; "
                      "empty: runs/<preset>-<seed>, or -2, -3, ... after it when in use.")
  log_every_s: float = _f(2.0, "Seconds between progress lines and metrics.jsonl records.")
  compilation_cache: bool = _f(True, "Use JAX's persistent compilation cache and, in it, the "
                                     "cache of whole executables (warm starts).")
  compilation_cache_dir: str = _f("", "Cache folder; empty means ~/.cache/jaxrl_async/xla.")
  max_wall_s: float = _f(0.0, "Stop after this many seconds of training; 0 means no limit.")
  prng_impl: str = _f("rbg", "JAX PRNG: rbg (compiles faster here) or threefry2x32.")
  logger: str = _f("none", "Also write metrics to: none, tensorboard (event files in --run_dir) "
                   "or wandb (where installed); metrics.jsonl is always written.")
  actor_restarts: int = _f(2, "Times a failed actor thread is restarted before the run stops.")
  max_nonfinite_updates: int = _f(10, "Consecutive non-finite updates (skipped) that stop the run.")

  def __post_init__(self):
    _positive(self, "total_env_steps", "return_window")
    _check(isinstance(self.seed, int) and self.seed >= 0, "seed", self.seed, "must be >= 0")
    _check(self.log_every_s > 0, "log_every_s", self.log_every_s, "must be > 0")
    _non_negative(self, "max_wall_s", "actor_restarts")
    _positive(self, "max_nonfinite_updates")
    _check(self.prng_impl in ("rbg", "threefry2x32", "unsafe_rbg"), "prng_impl", self.prng_impl,
           "must be rbg, threefry2x32 or unsafe_rbg")
    _check(self.logger in ("none", "tensorboard", "wandb"), "logger", self.logger,
           "must be none, tensorboard or wandb")


COMPONENTS = (EnvConfig, ActorConfig, RateConfig, NetworkConfig, LearnerConfig, CheckpointConfig,
              DistributedConfig, RunConfig)
