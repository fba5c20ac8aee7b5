"""Named presets: flat {flag: value} overrides of the config defaults. Explicit flags win.

A preset holds an algorithm's settings. How many actor threads run, and on a bigger host how
many envs and EnvPool threads each has, is the layout's choice (jaxrl_async/layout.py,
`--layout`): the envs given here are the ones tuned on the 2-core CPU of BUILD_NOTES.md, and
stand there. Synchronous presets (K = 0) name their one actor: its envs are their batch.
"""

from __future__ import annotations

from typing import Any

PRESETS: dict[str, dict[str, Any]] = {
    "cartpole_impala": dict(
        # V-trace corrects both the lag and the reuse of 4 epochs x 2 minibatches; reuse makes
        # IMPALA about 4x more sample-efficient here, and APPO's ratio clip keeps the reuse
        # from collapsing the policy (BUILD_NOTES.md, "The spine on CartPole-v1").
        algo="impala", env_id="CartPole-v1", num_envs=16, rollout_len=16,
        max_policy_lag=1, learning_rate=1e-3, discount=0.99, vtrace_lambda=0.95,
        entropy_coef=0.01, hidden_sizes="64,64", num_epochs=4, num_minibatches=2,
        clip_eps=0.2, total_env_steps=1_000_000, stop_at_return=475.0),
    # RL-Zoo's CartPole PPO (PAPERS.md): synchronous (K = 0), 8 envs x 32 steps, one minibatch
    # of 256, 20 epochs, lr and clip annealed linearly, no entropy bonus. RL-Zoo anneals over
    # 100k steps; here over 200k (notes/algos.md: 100k left 1 seed of 3 unsolved).
    "cartpole_ppo": dict(
        algo="ppo", env_id="CartPole-v1", num_actors=1, num_envs=8, rollout_len=32,
        max_policy_lag=0, learning_rate=1e-3, anneal_lr=True, clip_eps=0.2, anneal_clip=True,
        discount=0.98, gae_lambda=0.8, entropy_coef=0.0, hidden_sizes="64,64", num_epochs=20,
        num_minibatches=1, total_env_steps=200_000, stop_at_return=475.0),
    # Double DQN, 3-step returns, Polyak target (tau 0.02: a period-100 hard copy diverged on
    # 1 seed of 3), 16 sampled per inserted transition (8 solved 22 seeds of 30, 16 solved 28:
    # BUILD_NOTES.md, "DQN's spread"), 4 gradient steps per compiled call.
    "cartpole_dqn": dict(
        algo="dqn", env_id="CartPole-v1", num_envs=8, rollout_len=16,
        free_running=True, learning_rate=1e-3, discount=0.99, n_step=3, batch_size=128,
        steps_per_dispatch=4, replay_size=50_000, min_replay_size=1_000,
        samples_per_insert=16.0, spi_tolerance=1.5, target_update_every=0, target_tau=0.02,
        epsilon_start=1.0, epsilon_end=0.05, epsilon_decay_steps=10_000,
        hidden_sizes="128,128", activation="relu", total_env_steps=200_000,
        stop_at_return=475.0),
    # CleanRL's MuJoCo PPO: 2048 steps per update (here 32 envs x 64 steps), 10 epochs of 32
    # shuffled minibatches of 64, lr 3e-4 annealed, obs normalisation. CleanRL normalises
    # rewards by a running std of the return; a constant scale of 0.1 does that job here
    # (notes/algos.md: without it the value loss swamps the clipped gradient).
    "hopper_ppo": dict(
        algo="ppo", env_id="Hopper-v4", num_actors=1, num_envs=32, rollout_len=64,
        max_policy_lag=0, learning_rate=3e-4, anneal_lr=True, discount=0.99, gae_lambda=0.95,
        clip_eps=0.2, entropy_coef=0.0, value_coef=0.5, max_grad_norm=0.5, num_epochs=10,
        num_minibatches=32, normalize_obs=True, reward_scale=0.1, hidden_sizes="64,64",
        activation="tanh", total_env_steps=1_000_000, stop_at_return=float("nan")),
    "halfcheetah_ppo": dict(
        algo="ppo", env_id="HalfCheetah-v4", num_actors=1, num_envs=32, rollout_len=64,
        max_policy_lag=0, learning_rate=3e-4, anneal_lr=True, discount=0.99, gae_lambda=0.95,
        clip_eps=0.2, entropy_coef=0.0, value_coef=0.5, max_grad_norm=0.5, num_epochs=10,
        num_minibatches=32, normalize_obs=True, reward_scale=0.1, hidden_sizes="64,64",
        activation="tanh", total_env_steps=1_000_000, stop_at_return=float("nan")),
    # Atari: EnvPool's standard settings (84x84 grey, frame stack 4, up to 30 no-op starts,
    # sticky actions off, rewards clipped to {-1, 0, 1} for learning; statistics keep the raw
    # whole-game return). Episodic life is on for Breakout (a lost life ends the *training*
    # episode, as in Cleanba/CleanRL), and off for Pong, which has no lives.
    "breakout_impala": dict(
        algo="impala", env_id="Breakout-v5", episodic_life=True, reward_clip=True,
        frame_stack=4, network="impala_resnet", num_envs=16, rollout_len=32,
        max_policy_lag=1, learning_rate=6e-4, anneal_lr=True, discount=0.99,
        vtrace_lambda=1.0, entropy_coef=0.01, value_coef=0.5, max_grad_norm=40.0,
        num_epochs=1, num_minibatches=1, total_env_steps=10_000_000,
        stop_at_return=float("nan")),
    "pong_impala": dict(
        algo="impala", env_id="Pong-v5", episodic_life=False, reward_clip=True, frame_stack=4,
        network="impala_resnet", num_envs=16, rollout_len=32, max_policy_lag=1,
        learning_rate=6e-4, anneal_lr=True, discount=0.99, vtrace_lambda=1.0,
        entropy_coef=0.01, value_coef=0.5, max_grad_norm=40.0, num_epochs=1,
        num_minibatches=1, total_env_steps=10_000_000, stop_at_return=12.0),
    # CleanRL's Atari PPO: 8 envs x 128 steps, 4 epochs of 4 minibatches, clip 0.1, lr 2.5e-4.
    "breakout_ppo": dict(
        algo="ppo", env_id="Breakout-v5", episodic_life=True, reward_clip=True, frame_stack=4,
        network="nature_cnn", num_actors=1, num_envs=8, rollout_len=128, max_policy_lag=0,
        learning_rate=2.5e-4, anneal_lr=True, discount=0.99, gae_lambda=0.95, clip_eps=0.1,
        entropy_coef=0.01, value_coef=0.5, max_grad_norm=0.5, num_epochs=4, num_minibatches=4,
        total_env_steps=10_000_000, stop_at_return=float("nan")),
    "pong_ppo": dict(
        algo="ppo", env_id="Pong-v5", episodic_life=False, reward_clip=True, frame_stack=4,
        network="nature_cnn", num_actors=1, num_envs=8, rollout_len=128, max_policy_lag=0,
        learning_rate=2.5e-4, anneal_lr=True, discount=0.99, gae_lambda=0.95, clip_eps=0.1,
        entropy_coef=0.01, value_coef=0.5, max_grad_norm=0.5, num_epochs=4, num_minibatches=4,
        total_env_steps=10_000_000, stop_at_return=12.0),
    # Nature-CNN double DQN with 3-step returns: one batch of 32 per 4 env steps (SPI 8),
    # epsilon to 0.01 over 250k env steps (1M frames), target copied every 2,000 steps.
    "pong_dqn": dict(
        algo="dqn", env_id="Pong-v5", episodic_life=False, reward_clip=True, frame_stack=4,
        network="nature_cnn", num_envs=8, rollout_len=32, free_running=True,
        learning_rate=1e-4, discount=0.99, n_step=3, batch_size=32, replay_size=100_000,
        min_replay_size=10_000, samples_per_insert=8.0, spi_tolerance=1.0,
        target_update_every=2_000, epsilon_start=1.0, epsilon_end=0.01,
        epsilon_decay_steps=250_000, max_grad_norm=10.0, total_env_steps=10_000_000,
        stop_at_return=12.0),
}


def preset(name: str) -> dict[str, Any]:
  if name not in PRESETS:
    from jaxrl_async.config import ConfigError

    raise ConfigError("preset", name, f"must be one of {', '.join(sorted(PRESETS))}")
  return dict(PRESETS[name])
