"""Each algorithm's settings (`--algo` picks one): IMPALA/APPO, PPO, DQN."""

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


ALGO_CONFIGS: dict[str, type] = {"impala": ImpalaConfig, "ppo": PPOConfig, "dqn": DQNConfig}
