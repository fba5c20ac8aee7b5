"""A2C's settings (`--algo=a2c`). Free of JAX: the launcher makes its flags from these fields."""

from __future__ import annotations

import dataclasses

from jaxrl_async.config.checks import _check, _f, _non_negative, _unit_interval


@dataclasses.dataclass(frozen=True)
class A2CConfig:
  learning_rate: float = _f(1e-3, "Adam learning rate.")
  anneal_lr: bool = _f(False, "Anneal the learning rate linearly to 0 over total_env_steps.")
  discount: float = _f(0.99, "Discount gamma.")
  gae_lambda: float = _f(1.0, "GAE lambda; 1 gives the n-step returns to the rollout's end.")
  entropy_coef: float = _f(0.01, "Entropy bonus coefficient.")
  value_coef: float = _f(0.5, "Value loss coefficient.")
  max_grad_norm: float = _f(0.5, "Global gradient-norm clip.")
  normalize_advantages: bool = _f(False, "Normalise advantages over each update's batch.")

  def __post_init__(self):
    _check(self.learning_rate > 0, "learning_rate", self.learning_rate, "must be > 0")
    _unit_interval(self, "discount", "gae_lambda")
    _non_negative(self, "entropy_coef", "value_coef")
    _check(self.max_grad_norm > 0, "max_grad_norm", self.max_grad_norm, "must be > 0")
