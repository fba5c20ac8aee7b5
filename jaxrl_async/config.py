"""Frozen, validated configuration: one dataclass per component, one `TrainConfig` over them.

Field names are the launcher's flag names, so every validation message can name the flag
(`--num_envs=0: must be >= 1`). Each field carries its help text in `metadata["help"]`; the
launcher builds its flags from these, so a field and its flag can never drift apart.
Derived sizes are properties, never written back.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any


class ConfigError(ValueError):
  """A bad configuration value, reported as one line that names the flag."""

  def __init__(self, flag: str, value: Any, allowed: str):
    self.flag, self.value, self.allowed = flag, value, allowed
    super().__init__(f"--{flag}={value!r}: {allowed}")


def _f(default: Any, help: str) -> Any:  # noqa: A002 - mirrors absl's argument name
  if isinstance(default, list | dict):
    raise TypeError("mutable defaults are not allowed in frozen configs")
  return dataclasses.field(default=default, metadata={"help": help})


def _check(ok: bool, flag: str, value: Any, allowed: str) -> None:
  if not ok:
    raise ConfigError(flag, value, allowed)


def _positive(obj: Any, *names: str) -> None:
  for name in names:
    value = getattr(obj, name)
    _check(isinstance(value, int) and not isinstance(value, bool) and value >= 1,
           name, value, "must be an integer >= 1")


def _unit_interval(obj: Any, *names: str, closed_low: bool = True) -> None:
  for name in names:
    value = getattr(obj, name)
    ok = isinstance(value, int | float) and (0.0 <= value if closed_low else 0.0 < value)
    _check(ok and value <= 1.0, name, value,
           f"must be in {'[' if closed_low else '('}0, 1]")


def _non_negative(obj: Any, *names: str) -> None:
  for name in names:
    value = getattr(obj, name)
    _check(isinstance(value, int | float) and value >= 0, name, value, "must be >= 0")


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
  balance: str = _f("off", "off: fixed actors; auto: while the learner is busy (idle under "
                    "--target_idle) pause actors to keep the mean lag under --target_lag; "
                    "while it idles, resume them.")
  target_lag: float = _f(0.5, "balance=auto: mean policy lag to stay under (below the cap K).")
  target_idle: float = _f(0.2, "balance=auto: learner idle fraction to stay under.")
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
    _unit_interval(self, "target_idle")
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
  algo: str = _f("impala", "Algorithm: impala, ppo or dqn.")
  learner_devices: int = _f(1, "Devices in the data-parallel learner mesh, per host (process).")

  def __post_init__(self):
    _check(self.algo in ALGO_CONFIGS, "algo", self.algo,
           f"must be one of {', '.join(ALGO_CONFIGS)}")
    _positive(self, "learner_devices")


@dataclasses.dataclass(frozen=True)
class ImpalaConfig:
  learning_rate: float = _f(1e-3, "Adam learning rate.")
  anneal_lr: bool = _f(False, "Anneal the learning rate linearly to 0 over total_env_steps.")
  discount: float = _f(0.99, "Discount gamma.")
  vtrace_lambda: float = _f(0.95, "V-trace lambda (trace cutting).")
  clip_rho: float = _f(1.0, "V-trace rho clip for the value targets.")
  clip_pg_rho: float = _f(1.0, "V-trace rho clip for the policy-gradient advantages.")
  entropy_coef: float = _f(0.01, "Entropy bonus coefficient.")
  value_coef: float = _f(0.5, "Value loss coefficient.")
  max_grad_norm: float = _f(0.5, "Global gradient-norm clip.")
  num_epochs: int = _f(1, "Passes over each batch (V-trace corrects the reuse).")
  num_minibatches: int = _f(1, "Minibatches per epoch, split along the env axis.")
  normalize_advantages: bool = _f(False, "Normalise policy-gradient advantages per minibatch.")
  clip_eps: float = _f(0.0, "Ratio clip of the PPO surrogate (ppo; impala: APPO's clip on the "
                       "V-trace advantage, 0 = IMPALA's plain policy gradient).")

  def __post_init__(self):
    _check(self.learning_rate > 0, "learning_rate", self.learning_rate, "must be > 0")
    _check(0 <= self.clip_eps < 1, "clip_eps", self.clip_eps, "must be in [0, 1)")
    _unit_interval(self, "discount", "vtrace_lambda")
    _check(self.clip_rho > 0, "clip_rho", self.clip_rho, "must be > 0")
    _check(self.clip_pg_rho > 0, "clip_pg_rho", self.clip_pg_rho, "must be > 0")
    _non_negative(self, "entropy_coef", "value_coef")
    _check(self.max_grad_norm > 0, "max_grad_norm", self.max_grad_norm, "must be > 0")
    _positive(self, "num_epochs", "num_minibatches")


@dataclasses.dataclass(frozen=True)
class PPOConfig:
  learning_rate: float = _f(2.5e-4, "Adam learning rate.")
  anneal_lr: bool = _f(True, "Anneal the learning rate linearly to 0 over total_env_steps.")
  discount: float = _f(0.99, "Discount gamma.")
  gae_lambda: float = _f(0.95, "GAE lambda.")
  clip_eps: float = _f(0.2, "PPO ratio clip epsilon.")
  anneal_clip: bool = _f(False, "Anneal the clip epsilon linearly to 0 with the learning rate.")
  entropy_coef: float = _f(0.0, "Entropy bonus coefficient.")
  value_coef: float = _f(0.5, "Value loss coefficient.")
  clip_value: bool = _f(False, "Clip the value loss like the policy ratio.")
  max_grad_norm: float = _f(0.5, "Global gradient-norm clip.")
  num_epochs: int = _f(4, "Passes over each batch.")
  num_minibatches: int = _f(4, "Minibatches per epoch: the update's transitions, shuffled, "
                            "cut into this many.")
  normalize_advantages: bool = _f(True, "Normalise advantages per minibatch.")
  normalize_obs: bool = _f(False, "Running mean/var observation normalisation (MuJoCo).")
  reward_scale: float = _f(1.0, "Rewards are multiplied by this for learning (episode "
                           "statistics stay raw); keeps MuJoCo value losses O(1).")

  def __post_init__(self):
    _check(self.learning_rate > 0, "learning_rate", self.learning_rate, "must be > 0")
    _unit_interval(self, "discount", "gae_lambda")
    _check(0 < self.clip_eps < 1, "clip_eps", self.clip_eps, "must be in (0, 1)")
    _non_negative(self, "entropy_coef", "value_coef")
    _check(self.max_grad_norm > 0, "max_grad_norm", self.max_grad_norm, "must be > 0")
    _positive(self, "num_epochs", "num_minibatches")
    _check(self.reward_scale > 0, "reward_scale", self.reward_scale, "must be > 0")


@dataclasses.dataclass(frozen=True)
class DQNConfig:
  learning_rate: float = _f(2.5e-4, "Adam learning rate.")
  discount: float = _f(0.99, "Discount gamma.")
  n_step: int = _f(3, "n-step return length.")
  batch_size: int = _f(256, "Transitions per gradient step (all learner devices together).")
  replay_size: int = _f(100_000, "Replay capacity in transitions (all learner devices together).")
  min_replay_size: int = _f(5_000, "Transitions in replay before learning starts.")
  samples_per_insert: float = _f(4.0, "Target reuse ratio: sampled per inserted transition.")
  spi_tolerance: float = _f(0.5, "Allowed error of the reuse ratio, in samples per insert: "
                            "the limiter's error buffer is spi_tolerance x min_replay_size "
                            "sampled transitions (Acme's convention).")
  target_update_every: int = _f(250, "Gradient steps between target copies (0: Polyak).")
  target_tau: float = _f(0.005, "Polyak factor when target_update_every is 0.")
  epsilon_start: float = _f(1.0, "Initial exploration epsilon.")
  epsilon_end: float = _f(0.05, "Final exploration epsilon of env row 0 (the others lower).")
  epsilon_decay_steps: int = _f(50_000, "Env steps over which epsilon decays.")
  epsilon_alpha: float = _f(7.0, "Ape-X spread: env row i of N (all actors) explores with "
                            "epsilon ** (1 + alpha i / (N - 1)); 0: every env alike.")
  max_grad_norm: float = _f(10.0, "Global gradient-norm clip.")
  huber_delta: float = _f(1.0, "Huber loss delta.")
  double_q: bool = _f(True, "Double DQN targets.")
  steps_per_dispatch: int = _f(1, "Gradient steps per compiled learner call (a lax.scan); "
                               "params are published after each call.")

  def __post_init__(self):
    _check(self.learning_rate > 0, "learning_rate", self.learning_rate, "must be > 0")
    _unit_interval(self, "discount")
    _positive(self, "n_step", "batch_size", "replay_size", "epsilon_decay_steps",
              "steps_per_dispatch")
    _non_negative(self, "min_replay_size", "target_update_every", "spi_tolerance")
    _check(self.samples_per_insert > 0, "samples_per_insert", self.samples_per_insert,
           "must be > 0")
    _check(self.replay_size >= self.batch_size, "replay_size", self.replay_size,
           f"must be >= --batch_size={self.batch_size} (one batch)")
    _check(self.min_replay_size <= self.replay_size, "min_replay_size", self.min_replay_size,
           f"must be <= --replay_size={self.replay_size}")
    _unit_interval(self, "target_tau", "epsilon_start", "epsilon_end")
    _non_negative(self, "epsilon_alpha")
    _check(self.max_grad_norm > 0, "max_grad_norm", self.max_grad_norm, "must be > 0")
    _check(self.huber_delta > 0, "huber_delta", self.huber_delta, "must be > 0")


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
  """One process per host on JAX's distributed runtime (runtime/distributed.py)."""

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


ALGO_CONFIGS: dict[str, type] = {"impala": ImpalaConfig, "ppo": PPOConfig, "dqn": DQNConfig}
COMPONENTS = (EnvConfig, ActorConfig, RateConfig, NetworkConfig, LearnerConfig, CheckpointConfig,
              DistributedConfig, RunConfig)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """The whole run. Built from a flat {flag: value} mapping by `from_flat`."""

  env: EnvConfig = dataclasses.field(default_factory=EnvConfig)
  actor: ActorConfig = dataclasses.field(default_factory=ActorConfig)
  rate: RateConfig = dataclasses.field(default_factory=RateConfig)
  network: NetworkConfig = dataclasses.field(default_factory=NetworkConfig)
  learner: LearnerConfig = dataclasses.field(default_factory=LearnerConfig)
  algo: Any = dataclasses.field(default_factory=ImpalaConfig)
  checkpoint: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)
  distributed: DistributedConfig = dataclasses.field(default_factory=DistributedConfig)
  run: RunConfig = dataclasses.field(default_factory=RunConfig)

  def __post_init__(self):
    expected = ALGO_CONFIGS.get(self.learner.algo)
    _check(expected is not None and isinstance(self.algo, expected), "algo", self.learner.algo,
           f"needs its config class {getattr(expected, '__name__', '?')}")
    per_device, rem = divmod(self.env.num_envs, self.learner.learner_devices)
    _check(rem == 0, "num_envs", self.env.num_envs,
           f"must be divisible by --learner_devices={self.learner.learner_devices}")
    minibatches = getattr(self.algo, "num_minibatches", 1)
    local_envs = per_device * self.rate.rollouts_per_update
    _check(local_envs % minibatches == 0, "num_minibatches", minibatches,
           f"must divide the envs per learner device per update ({local_envs})")
    # NOTE: DQN learns from a replay, where a sample's lag at the update is not one rollout's;
    # weighting it would need per-sample versions in the replay.
    _check(self.rate.lag_weighting == "off" or self.learner.algo in ("impala", "ppo"),
           "lag_weighting", self.rate.lag_weighting,
           f"is for the on-policy algorithms (impala, ppo), not --algo={self.learner.algo}")
    if self.distributed.enabled:
      _check(self.learner.algo in ("impala", "ppo"), "algo", self.learner.algo,
             "multi-process training supports the on-policy algorithms (impala, ppo) only")

  @property
  def env_steps_per_rollout(self) -> int:
    return self.actor.rollout_len * self.env.num_envs

  @property
  def env_steps_per_update(self) -> int:
    return self.env_steps_per_rollout * self.rate.rollouts_per_update

  @staticmethod
  def flag_fields(algo: str | None = None) -> dict[str, dataclasses.Field]:
    """Every flag-settable field by name (the algorithm's too, when `algo` is given)."""
    classes = list(COMPONENTS) + ([ALGO_CONFIGS[algo]] if algo else list(ALGO_CONFIGS.values()))
    out: dict[str, dataclasses.Field] = {}
    for cls in classes:
      for f in dataclasses.fields(cls):
        out.setdefault(f.name, f)
    return out

  @classmethod
  def from_flat(cls, values: dict[str, Any]) -> TrainConfig:
    """Routes each {flag: value} to the component that owns it; unknown names are errors."""
    algo = values.get("algo", LearnerConfig.algo)
    _check(algo in ALGO_CONFIGS, "algo", algo, f"must be one of {', '.join(ALGO_CONFIGS)}")
    parts: dict[str, dict[str, Any]] = {}
    owners = {f.name: key for key, c in _component_keys(algo) for f in dataclasses.fields(c)}
    for name, value in values.items():
      if name not in owners:
        raise ConfigError(name, value, f"is not a setting of algorithm {algo!r}")
      parts.setdefault(owners[name], {})[name] = value
    built = {key: c(**parts.get(key, {})) for key, c in _component_keys(algo)}
    return cls(**built)

  def to_flat(self) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, _ in _component_keys(self.learner.algo):
      out.update(dataclasses.asdict(getattr(self, key)))
    return out

  def to_json(self) -> str:
    return json.dumps(self.to_flat(), sort_keys=True)


def _component_keys(algo: str) -> list[tuple[str, type]]:
  return [("env", EnvConfig), ("actor", ActorConfig), ("rate", RateConfig),
          ("network", NetworkConfig), ("learner", LearnerConfig), ("algo", ALGO_CONFIGS[algo]),
          ("checkpoint", CheckpointConfig), ("distributed", DistributedConfig),
          ("run", RunConfig)]
