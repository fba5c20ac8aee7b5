"""Named presets: flat {flag: value} overrides of the config defaults. Explicit flags win."""

from __future__ import annotations

from typing import Any

PRESETS: dict[str, dict[str, Any]] = {
    "cartpole_impala": dict(
        # V-trace corrects both the lag and the reuse of 4 epochs x 2 minibatches; reuse makes
        # IMPALA about 4x more sample-efficient here (BUILD_NOTES.md, "CartPole defaults").
        algo="impala", env_id="CartPole-v1", num_actors=2, num_envs=16, rollout_len=16,
        max_policy_lag=1, learning_rate=1e-3, discount=0.99, vtrace_lambda=0.95,
        entropy_coef=0.01, hidden_sizes="64,64", num_epochs=4, num_minibatches=2,
        total_env_steps=1_000_000, stop_at_return=475.0),
    # RL-Zoo's CartPole PPO (PAPERS.md): synchronous (K = 0), 8 envs x 32 steps, one minibatch
    # of 256, 20 epochs, lr and clip annealed to 0 over 100k steps, no entropy bonus.
    "cartpole_ppo": dict(
        algo="ppo", env_id="CartPole-v1", num_actors=1, num_envs=8, rollout_len=32,
        max_policy_lag=0, learning_rate=1e-3, anneal_lr=True, clip_eps=0.2, anneal_clip=True,
        discount=0.98, gae_lambda=0.8, entropy_coef=0.0, hidden_sizes="64,64", num_epochs=20,
        num_minibatches=1, total_env_steps=100_000, stop_at_return=475.0),
}


def preset(name: str) -> dict[str, Any]:
  if name not in PRESETS:
    from jaxrl_async.config import ConfigError

    raise ConfigError("preset", name, f"must be one of {', '.join(sorted(PRESETS))}")
  return dict(PRESETS[name])
