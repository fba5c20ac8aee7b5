"""Named presets: flat {flag: value} overrides of the config defaults. Explicit flags win."""

from __future__ import annotations

from typing import Any

PRESETS: dict[str, dict[str, Any]] = {
    "cartpole_impala": dict(
        algo="impala", env_id="CartPole-v1", num_actors=2, num_envs=16, rollout_len=32,
        max_policy_lag=1, learning_rate=1e-3, discount=0.99, vtrace_lambda=0.95,
        entropy_coef=0.01, hidden_sizes="64,64", num_epochs=1, num_minibatches=1,
        total_env_steps=1_000_000, stop_at_return=475.0),
}


def preset(name: str) -> dict[str, Any]:
  if name not in PRESETS:
    from jaxrl_async.config import ConfigError

    raise ConfigError("preset", name, f"must be one of {', '.join(sorted(PRESETS))}")
  return dict(PRESETS[name])
