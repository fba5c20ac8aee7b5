"""DQN: double Q-learning (van Hasselt et al., 2016) with n-step returns and a target network.

Off-policy, so the learner samples from a replay (runtime/replay.py) instead of learning from
rollouts directly; this module gives that learner pure functions through `ReplayExtension`:
- `to_columns(rollout)`: what the replay stores per env column. The n-step returns are
  computed here, once, at insert time, with rlax's `n_step_bootstrapped_returns` and EnvPool's
  episode ends (discount_t = gamma (1 - terminated_t), lambda_t = 1 - ended_t, so a return stops
  at an episode end and a time-limit end still bootstraps from the final obs). A return also
  stops at the end of its rollout column, bootstrapping from the rollout's last obs after
  fewer than n steps (as rlax does at a sequence end). Stored per step: the return, the
  discount gamma^k (0 after a terminal) and k, the steps to the bootstrap observation.
- `gather(columns, t, c)`: the sampled transitions: obs t, action t, return, discount, obs t+k.
- `update(state, transitions)`: one double-Q step with a Huber loss; the target network is
  copied every `target_update_every` steps, or tracked by Polyak averaging when that is 0.

Exploration: Ape-X style per-env epsilons. Env row i of all N env rows (over every actor) acts
with epsilon(t) ** (1 + alpha i / (N - 1)), epsilon(t) decaying linearly over the env steps
inserted so far (published to the actors with the params), so every env starts fully random
and some stay near-greedy while others keep exploring.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import chex
import flax.struct
import jax
import jax.numpy as jnp
import optax
import rlax

from jaxrl_async.algos.base import Algorithm, Rollout, clipped_adam
from jaxrl_async.algos.ppo import unroll_loops
from jaxrl_async.config import ConfigError, TrainConfig
from jaxrl_async.envs import EnvSpec
from jaxrl_async.networks import QNetwork
from jaxrl_async.types import Array, Metrics, PRNGKey


@flax.struct.dataclass
class DQNState:
  params: Any
  target_params: Any
  opt_state: Any
  key: PRNGKey
  version: Array  # gradient steps applied so far
  env_steps: Array  # transitions inserted into the replay (drives the epsilon schedule)


@flax.struct.dataclass
class NStepColumns:
  """What the replay stores for a rollout, time-major [T(+1), B, ...]."""

  obs: Array  # [T+1, B, ...]
  actions: Array  # [T, B]
  returns: Array  # [T, B] discounted rewards up to the bootstrap (<= n steps)
  discounts: Array  # [T, B] gamma^k, or 0 if the episode terminated within the k steps
  boot: Array  # [T, B] int32 k in [1, n]: the bootstrap obs is obs[t + k]
  valid: Array  # [T, B]


@flax.struct.dataclass
class Transitions:
  """Sampled n-step transitions, [S, ...]."""

  obs_tm1: Array
  a_tm1: Array
  r_t: Array  # n-step return
  discount_t: Array
  obs_t: Array  # the bootstrap observation
  mask: Array  # 1 for real transitions (0 for EnvPool's reset steps)


class ReplayExtension(NamedTuple):
  """What runtime.offpolicy.OffPolicyLearner needs beyond `Algorithm`."""

  to_columns: Callable[[Rollout], NStepColumns]
  gather: Callable[[NStepColumns, Array, Array], Transitions]
  on_insert: Callable[[DQNState, int], DQNState]  # counts inserted env steps
  steps: int  # transitions per stored column (T)
  batch_size: int  # sampled transitions per gradient step, all devices together
  steps_per_dispatch: int  # gradient steps per compiled learner call
  unroll: bool  # unroll that loop (see ppo.unroll_loops)
  replay_size: int
  min_replay_size: int
  samples_per_insert: float
  error_buffer: float  # the limiter's, in sampled transitions
  seed: int


def n_step_columns(rollout: Rollout, discount: float, n: int) -> NStepColumns:
  """n-step returns, discounts and bootstrap offsets for every step of a [T, B] rollout."""
  chex.assert_rank([rollout.rewards, rollout.terminated, rollout.truncated], 2)
  f32 = jnp.float32
  ended_t = (rollout.terminated | rollout.truncated).astype(f32)
  discount_t = discount * (1.0 - rollout.terminated.astype(f32))
  lambda_t = 1.0 - ended_t  # cut at an episode end: bootstrap from the obs that ends it
  n_step = jax.vmap(lambda r, d, v, lam: rlax.n_step_bootstrapped_returns(r, d, v, n, lam),
                    in_axes=1, out_axes=1)
  zeros, ones = jnp.zeros_like(discount_t), jnp.ones_like(discount_t)
  # With v = 0 the recursion sums the discounted rewards up to the cut; with r = 0, v = 1 it
  # multiplies the discounts up to it; with r = 1, d = 1, v = 0 it counts the steps.
  returns = n_step(rollout.rewards.astype(f32), discount_t, zeros, lambda_t)
  discounts = n_step(zeros, discount_t, ones, lambda_t)
  boot = n_step(ones, ones, zeros, lambda_t)
  return NStepColumns(rollout.obs, rollout.actions, returns, discounts,
                      jnp.round(boot).astype(jnp.int32), rollout.valid)


def gather_transitions(columns: NStepColumns, t: Array, c: Array) -> Transitions:
  """Transitions at steps t [S] of columns c [S] (local indices into [T, C, ...] arrays)."""
  return Transitions(
      obs_tm1=columns.obs[t, c], a_tm1=columns.actions[t, c], r_t=columns.returns[t, c],
      discount_t=columns.discounts[t, c], obs_t=columns.obs[t + columns.boot[t, c], c],
      mask=columns.valid[t, c].astype(jnp.float32))


def double_q_td(q_tm1: Array, a_tm1: Array, r_t: Array, discount_t: Array, q_t_value: Array,
                q_t_selector: Array) -> Array:
  """rlax double-Q TD errors over a batch: r + d Q_target(s', argmax_a Q(s', a)) - Q(s, a).

  Args: q_tm1, q_t_value, q_t_selector [S, A]; a_tm1, r_t, discount_t [S]. Returns [S].
  """
  return jax.vmap(rlax.double_q_learning)(q_tm1, a_tm1, r_t, discount_t, q_t_value,
                                          q_t_selector)


def epsilon_at(cfg: Any, env_steps: Array) -> Array:
  frac = jnp.clip(env_steps.astype(jnp.float32) / cfg.epsilon_decay_steps, 0.0, 1.0)
  return cfg.epsilon_start + frac * (cfg.epsilon_end - cfg.epsilon_start)


def env_epsilons(eps: Array, actor_index: int, num_actors: int, rows: int, alpha: float
                 ) -> Array:
  """Ape-X epsilons for this actor's `rows` env rows: eps ** (1 + alpha i / (N - 1))."""
  n = num_actors * rows
  i = actor_index * rows + jnp.arange(rows, dtype=jnp.float32)
  return eps ** (1.0 + alpha * i / max(n - 1, 1))


def check_config(config: TrainConfig, spec: EnvSpec) -> None:
  """DQN's cross-component checks, before any thread starts; raises ConfigError."""
  cfg = config.algo
  if not spec.discrete:
    raise ConfigError("algo", "dqn", f"needs discrete actions, but {spec.env_id} has "
                      "continuous ones (use --algo=ppo)")
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


def make_dqn(config: TrainConfig, spec: EnvSpec, axis_name: str) -> Algorithm:
  check_config(config, spec)
  cfg = config.algo
  net = QNetwork(config.network, spec.num_actions)
  optimizer = clipped_adam(cfg.learning_rate, cfg.max_grad_norm)

  def init(key: PRNGKey) -> DQNState:
    key, init_key = jax.random.split(key)
    params = net.init(init_key, jnp.zeros((1,) + spec.obs_shape, spec.obs_dtype))
    zero = jnp.zeros((), jnp.int32)
    return DQNState(params, params, optimizer.init(params), key, zero, zero)

  def loss_fn(params: Any, target_params: Any, batch: Transitions) -> tuple[Array, Metrics]:
    # One online pass over both observations; rlax stops the gradient through the targets.
    q = net.apply(params, jnp.concatenate([batch.obs_tm1, batch.obs_t]))
    q_tm1, q_t_online = jnp.split(q, 2)
    q_t_target = net.apply(target_params, batch.obs_t)
    selector = q_t_online if cfg.double_q else q_t_target
    td = double_q_td(q_tm1, batch.a_tm1, batch.r_t, batch.discount_t, q_t_target, selector)
    count = jax.lax.psum(batch.mask.sum(), axis_name)
    # Each device returns its share of the global mean; the caller psums the gradients.
    local_mean = lambda x: (x * batch.mask).sum() / jnp.maximum(count, 1.0)
    loss = local_mean(rlax.huber_loss(td, cfg.huber_delta))
    q_taken = jnp.take_along_axis(q_tm1, batch.a_tm1[:, None], -1)[:, 0]
    return loss, {"td_loss": loss, "td_abs": local_mean(jnp.abs(td)), "q_mean": local_mean(q_taken)}

  def update(state: DQNState, batch: Transitions) -> tuple[DQNState, Metrics]:
    grads, metrics = jax.grad(loss_fn, has_aux=True)(state.params, state.target_params, batch)
    grads = jax.lax.psum(grads, axis_name)
    metrics = jax.tree.map(lambda m: jax.lax.psum(m, axis_name), metrics)
    metrics["grad_norm"] = optax.global_norm(grads)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    version = state.version + 1
    if cfg.target_update_every > 0:
      target = optax.periodic_update(params, state.target_params, version,
                                     cfg.target_update_every)
    else:
      target = optax.incremental_update(params, state.target_params, cfg.target_tau)
    metrics["epsilon"] = epsilon_at(cfg, state.env_steps)
    return DQNState(params, target, opt_state, state.key, version, state.env_steps), metrics

  num_actors = config.actor.num_actors

  def make_policy(actor_index: int):
    def policy(actor_params: Any, obs: Array, key: PRNGKey) -> tuple[Array, dict[str, Array]]:
      q = net.apply(actor_params["params"], obs)
      eps = env_epsilons(epsilon_at(cfg, actor_params["env_steps"]), actor_index, num_actors,
                         q.shape[0], cfg.epsilon_alpha)
      explore_key, action_key = jax.random.split(key)
      explore = jax.random.uniform(explore_key, (q.shape[0],)) < eps
      random_action = jax.random.randint(action_key, (q.shape[0],), 0, q.shape[-1])
      return jnp.where(explore, random_action, jnp.argmax(q, -1)).astype(jnp.int32), {}

    return policy

  def on_insert(state: DQNState, env_steps: int) -> DQNState:
    return state.replace(env_steps=state.env_steps + env_steps)

  extension = ReplayExtension(
      to_columns=lambda rollout: n_step_columns(rollout, cfg.discount, cfg.n_step),
      gather=gather_transitions, on_insert=on_insert, steps=config.actor.rollout_len,
      batch_size=cfg.batch_size, steps_per_dispatch=cfg.steps_per_dispatch,
      unroll=unroll_loops(config),
      replay_size=cfg.replay_size,
      min_replay_size=max(cfg.min_replay_size, 1), samples_per_insert=cfg.samples_per_insert,
      error_buffer=cfg.spi_tolerance * max(cfg.min_replay_size, 1), seed=config.run.seed)
  return Algorithm(
      name="dqn", init=init, make_policy=make_policy, update=update,
      actor_params=lambda state: {"params": state.params, "env_steps": state.env_steps},
      extras_spec={}, grad_steps_per_update=1, off_policy=True, extension=extension)

