"""DQN's settings (`--algo=dqn`), its checks against the rest of the run, and what its factory
takes from the run. Free of JAX: the launcher makes its flags from these fields."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from jaxrl_async.config.checks import (
  ConfigError,
  _check,
  _f,
  _non_negative,
  _positive,
  _unit_interval,
)

if TYPE_CHECKING:
  from jaxrl_async.config import TrainConfig
  from jaxrl_async.envs import EnvSpec


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


def check_run(config: TrainConfig, spec: EnvSpec) -> None:
  """DQN's checks against the learner devices, rollout sizes and lag cap, before any thread
  starts (the discrete actions it needs are the registry's check)."""
  cfg = config.algo
  devices = config.learner.learner_devices
  if cfg.batch_size % devices:
    raise ConfigError("batch_size", cfg.batch_size,
                      f"must be divisible by --learner_devices={devices}")
  per_rollout = config.env_steps_per_rollout
  per_dispatch = cfg.batch_size * cfg.steps_per_dispatch
  need = 0.5 * (cfg.samples_per_insert * per_rollout + per_dispatch)
  buffer = cfg.spi_tolerance * max(cfg.min_replay_size, 1)
  if buffer < need:
    raise ConfigError(
        "spi_tolerance", cfg.spi_tolerance,
        f"gives an error buffer of spi_tolerance x min_replay_size = {buffer:g} sampled "
        f"transitions; it must be >= (samples_per_insert x rollout_len x num_envs + "
        f"batch_size x steps_per_dispatch) / 2 = {need:g}, or inserts and samples could "
        f"both be refused: raise "
        f"it to >= {need / max(cfg.min_replay_size, 1):.3g} or raise --min_replay_size")
  steps_per_rollout = cfg.samples_per_insert * per_rollout / cfg.batch_size
  if config.rate.capped and config.rate.max_policy_lag < steps_per_rollout:
    raise ConfigError(
        "max_policy_lag", config.rate.max_policy_lag,
        f"counts DQN gradient steps, and the learner takes about {steps_per_rollout:.3g} of "
        "them per inserted rollout, so nearly every rollout would arrive too stale and be "
        "dropped: set --free_running (the samples_per_insert limiter balances actors and "
        "learner) or a lag cap of several rollouts' steps")


def factory_args(config: TrainConfig) -> dict[str, Any]:
  """`make_dqn`'s arguments beyond the spec and axis name: the env rows over every actor
  spread the exploration; the replay stores rollout_len steps per column, sampled from seed."""
  return dict(cfg=config.algo, network=config.network, num_actors=config.actor.num_actors,
              rollout_len=config.actor.rollout_len, seed=config.run.seed)
