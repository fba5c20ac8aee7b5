"""PPO's settings (`--algo=ppo`) and its checks against the rest of the run. Free of JAX: the
launcher makes its flags from these fields."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

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


def check_run(config: TrainConfig, spec: EnvSpec) -> None:
  """PPO's checks against the network and the env, before any thread starts."""
  if config.algo.normalize_obs and (config.network.network != "mlp" or len(spec.obs_shape) != 1):
    raise ConfigError("normalize_obs", True, "is for vector observations with --network=mlp "
                      "(MuJoCo); image torsos scale pixels themselves")
