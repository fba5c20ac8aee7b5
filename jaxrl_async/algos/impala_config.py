"""IMPALA's settings (`--algo=impala`; APPO with --clip_eps > 0). Free of JAX: the launcher
makes its flags from these fields."""

from __future__ import annotations

import dataclasses

from jaxrl_async.config.checks import _check, _f, _non_negative, _positive, _unit_interval


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
