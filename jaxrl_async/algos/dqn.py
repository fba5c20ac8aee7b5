"""DQN: double Q-learning (van Hasselt et al., 2016) with n-step returns and a target network.

Off-policy, so the learner samples from a replay (runtime/learners/replay_buffer.py) instead
of learning from rollouts directly; this module gives that learner pure functions through
`ReplayExtension`:
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

import functools
from typing import Any

import chex
import flax.struct
import jax
import jax.numpy as jnp
import optax
import rlax

from jaxrl_async.algos.base import Algorithm, ReplayExtension, Rollout, clipped_adam, unroll_loops
from jaxrl_async.algos.dqn_config import DQNConfig
from jaxrl_async.algos.losses import device_share
from jaxrl_async.config import NetworkConfig
from jaxrl_async.config.checks import check_discrete_actions
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


def epsilon_at(env_steps: Array, start: float, end: float, decay_steps: int) -> Array:
  """Epsilon after `env_steps` inserted: linear from `start` to `end` over `decay_steps`."""
  frac = jnp.clip(env_steps.astype(jnp.float32) / decay_steps, 0.0, 1.0)
  return start + frac * (end - start)


def env_epsilons(eps: Array, actor_index: int, num_actors: int, rows: int, alpha: float
                 ) -> Array:
  """Ape-X epsilons for this actor's `rows` env rows: eps ** (1 + alpha i / (N - 1))."""
  n = num_actors * rows
  i = actor_index * rows + jnp.arange(rows, dtype=jnp.float32)
  return eps ** (1.0 + alpha * i / max(n - 1, 1))


def double_q_loss(net: QNetwork, params: Any, target_params: Any, batch: Transitions,
                  axis_name: str, *, double_q: bool, huber_delta: float
                  ) -> tuple[Array, Metrics]:
  """Huber loss of the (double) Q-learning TD errors on sampled transitions [S, ...],
  normalised over all devices' valid samples; returns (this device's share, metrics)."""
  # One online pass over both observations; rlax stops the gradient through the targets.
  q = net.apply(params, jnp.concatenate([batch.obs_tm1, batch.obs_t]))
  q_tm1, q_t_online = jnp.split(q, 2)
  q_t_target = net.apply(target_params, batch.obs_t)
  selector = q_t_online if double_q else q_t_target
  td = double_q_td(q_tm1, batch.a_tm1, batch.r_t, batch.discount_t, q_t_target, selector)
  count = jax.lax.psum(batch.mask.sum(), axis_name)
  local_mean = lambda x: device_share(x, batch.mask, count)
  loss = local_mean(rlax.huber_loss(td, huber_delta))
  q_taken = jnp.take_along_axis(q_tm1, batch.a_tm1[:, None], -1)[:, 0]
  return loss, {"td_loss": loss, "td_abs": local_mean(jnp.abs(td)), "q_mean": local_mean(q_taken)}


def epsilon_greedy(net: QNetwork, cfg: DQNConfig, actor_index: int, num_actors: int):
  """Actor `actor_index`'s policy over `actor_params` = {"params", "env_steps"}: each env row
  explores with its Ape-X epsilon (`env_epsilons`) at the published env-step count."""

  def policy(actor_params: Any, obs: Array, key: PRNGKey) -> tuple[Array, dict[str, Array]]:
    q = net.apply(actor_params["params"], obs)
    eps = epsilon_at(actor_params["env_steps"], cfg.epsilon_start, cfg.epsilon_end,
                     cfg.epsilon_decay_steps)
    eps = env_epsilons(eps, actor_index, num_actors, q.shape[0], cfg.epsilon_alpha)
    explore_key, action_key = jax.random.split(key)
    explore = jax.random.uniform(explore_key, (q.shape[0],)) < eps
    random_action = jax.random.randint(action_key, (q.shape[0],), 0, q.shape[-1])
    return jnp.where(explore, random_action, jnp.argmax(q, -1)).astype(jnp.int32), {}

  return policy


def make_dqn(cfg: DQNConfig, spec: EnvSpec, network: NetworkConfig, axis_name: str,
             num_actors: int, rollout_len: int, seed: int) -> Algorithm:
  """Double DQN for discrete actions, learning from a replay.

  Args:
    cfg: its settings. spec: the env's. network: the Q-network's torso.
    axis_name: the learner axis `update` runs under.
    num_actors: actors acting with it (their env rows share out the Ape-X epsilons).
    rollout_len: steps per rollout column, which the replay stores whole. seed: the replay's
      sampling seed.
  """
  check_discrete_actions("dqn", spec)
  net = QNetwork(network, spec.num_actions)
  optimizer = clipped_adam(cfg.learning_rate, cfg.max_grad_norm)
  loss_fn = functools.partial(double_q_loss, net, axis_name=axis_name, double_q=cfg.double_q,
                              huber_delta=cfg.huber_delta)

  def init(key: PRNGKey) -> DQNState:
    key, init_key = jax.random.split(key)
    params = net.init(init_key, jnp.zeros((1,) + spec.obs_shape, spec.obs_dtype))
    zero = jnp.zeros((), jnp.int32)
    return DQNState(params, params, optimizer.init(params), key, zero, zero)

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
    metrics["epsilon"] = epsilon_at(state.env_steps, cfg.epsilon_start, cfg.epsilon_end,
                                    cfg.epsilon_decay_steps)
    return DQNState(params, target, opt_state, state.key, version, state.env_steps), metrics

  def on_insert(state: DQNState, env_steps: int) -> DQNState:
    return state.replace(env_steps=state.env_steps + env_steps)

  extension = ReplayExtension(
      to_columns=lambda rollout: n_step_columns(rollout, cfg.discount, cfg.n_step),
      gather=gather_transitions, on_insert=on_insert, steps=rollout_len,
      batch_size=cfg.batch_size, steps_per_dispatch=cfg.steps_per_dispatch,
      unroll=unroll_loops(network.network, jax.default_backend()), replay_size=cfg.replay_size,
      min_replay_size=max(cfg.min_replay_size, 1), samples_per_insert=cfg.samples_per_insert,
      error_buffer=cfg.spi_tolerance * max(cfg.min_replay_size, 1), seed=seed)
  return Algorithm(
      name="dqn", init=init,
      make_policy=lambda actor_index: epsilon_greedy(net, cfg, actor_index, num_actors),
      update=update,
      actor_params=lambda state: {"params": state.params, "env_steps": state.env_steps},
      extras_spec={}, grad_steps_per_update=1, off_policy=True, extension=extension)
