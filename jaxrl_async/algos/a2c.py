"""A2C: advantage actor-critic (Mnih et al., 2016, in its synchronous form) for discrete actions.

One gradient step per update on the whole [T, B] batch: the policy gradient of log pi(a_t)
times the advantage, a value regression to the bootstrapped return, and an entropy bonus. The
advantages are rlax's truncated GAE with EnvPool's episode ends (losses.gae_advantages); with
`gae_lambda` = 1 they are the n-step returns to the rollout's end less V. No importance ratio
and no clip: at `max_policy_lag` K = 0 every rollout is on-policy, which is what A2C assumes;
with K >= 1 it learns from slightly stale rollouts uncorrected (`--lag_weighting` can discount
them). EnvPool's reset transition is masked out of every loss by `valid`.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax

from jaxrl_async.algos.a2c_config import A2CConfig
from jaxrl_async.algos.base import (
  UNWEIGHTED,
  Algorithm,
  LagWeighting,
  Rollout,
  loss_weights,
  psum_flat,
)
from jaxrl_async.algos.losses import (
  categorical_terms,
  device_share,
  gae_advantages,
  normalized_advantages,
  sample_categorical,
)
from jaxrl_async.algos.schedule import Progress, make_scheduled_adam, progress_init
from jaxrl_async.config import NetworkConfig
from jaxrl_async.config.checks import check_discrete_actions
from jaxrl_async.envs import EnvSpec
from jaxrl_async.networks import ActorCritic
from jaxrl_async.types import Array, Metrics, PRNGKey


@flax.struct.dataclass
class A2CState:
  params: Any
  opt_state: Any
  version: Array  # learner updates applied so far
  progress: Progress  # env steps learned from, which the learning rate's schedule counts


def a2c_loss(net: ActorCritic, params: Any, batch: Rollout, axis_name: str, *, discount: float,
             gae_lambda: float, value_coef: float, entropy_coef: float,
             normalize_advantages: bool) -> tuple[Array, Metrics]:
  """Policy-gradient, value and entropy losses over a [T, B] batch, normalised over all devices.

  Args:
    net: the actor-critic; params: its parameters. batch: this device's [T, B] rollouts.
    discount, gae_lambda: gamma and GAE's lambda for the advantages.
    value_coef, entropy_coef: weights of the value loss and the entropy bonus.
    normalize_advantages: normalise the advantages over the batch.
  Returns:
    (loss, metrics): this device's share of the global mean loss, and its metrics' shares.
  """
  logits, values = net.apply(params, batch.obs)  # [T+1, B, A], [T+1, B]
  v_tm1 = values[:-1]
  # The targets are fixed points of this step: no gradient through the bootstrap values.
  adv_tm1 = gae_advantages(jax.lax.stop_gradient(values), batch.rewards, batch.terminated,
                           batch.truncated, discount, gae_lambda)
  target_tm1 = adv_tm1 + jax.lax.stop_gradient(v_tm1)
  logp_tm1, entropy_tm1 = categorical_terms(logits[:-1], batch.actions)
  mask = batch.valid.astype(jnp.float32)
  loss_mask = loss_weights(batch.weights, mask)
  if normalize_advantages:
    adv_tm1 = normalized_advantages(adv_tm1, loss_mask, axis_name)
  count = jax.lax.psum(mask.sum(), axis_name)
  loss_mean = lambda x: device_share(x, loss_mask, count)
  pg_loss = -loss_mean(logp_tm1 * adv_tm1)
  v_loss = 0.5 * loss_mean((target_tm1 - v_tm1) ** 2)
  entropy = loss_mean(entropy_tm1)
  loss = pg_loss + value_coef * v_loss - entropy_coef * entropy
  metrics = {"pg_loss": pg_loss, "value_loss": v_loss, "entropy": entropy,
             "adv_mean": device_share(adv_tm1, mask, count)}
  return loss, metrics


def make_a2c(cfg: A2CConfig, spec: EnvSpec, network: NetworkConfig, axis_name: str,
             num_updates: int, columns_per_update: int,
             lag: LagWeighting = UNWEIGHTED) -> Algorithm:
  """A2C for discrete actions.

  Args:
    cfg: its settings. spec: the env's. network: the actor-critic's torso.
    axis_name: the learner axis `update` runs under. num_updates, columns_per_update: the
      updates the run makes and the env columns each takes at the configured rollouts per update
      (one process's); the learning rate anneals (`cfg.anneal_lr`) over the env steps they hold
      (schedule.py). lag: how rollouts are weighted by their lag.
  """
  check_discrete_actions("a2c", spec)
  net = ActorCritic(network, spec.num_actions, discrete=True)
  optimizer = make_scheduled_adam(cfg.learning_rate, cfg.anneal_lr, cfg.max_grad_norm,
                                  num_updates, 1, columns_per_update, axis_name)
  loss_fn = functools.partial(
      a2c_loss, net, axis_name=axis_name, discount=cfg.discount, gae_lambda=cfg.gae_lambda,
      value_coef=cfg.value_coef, entropy_coef=cfg.entropy_coef,
      normalize_advantages=cfg.normalize_advantages)

  def init(key: PRNGKey) -> A2CState:
    params = net.init(key, jnp.zeros((1,) + spec.obs_shape, spec.obs_dtype))
    return A2CState(params, optimizer.init(params), jnp.zeros((), jnp.int32), progress_init())

  def update(state: A2CState, batch: Rollout) -> tuple[A2CState, Metrics]:
    batch = lag.apply(batch, state.version)
    grads, metrics = jax.grad(lambda p: loss_fn(p, batch), has_aux=True)(state.params)
    grads, metrics = psum_flat((grads, metrics), axis_name)
    metrics["grad_norm"] = optax.global_norm(grads)
    columns = batch.rewards.shape[1]
    params, opt_state, metrics["learning_rate"] = optimizer.step(
        grads, state.opt_state, state.params, state.progress, 0, columns)
    return A2CState(params, opt_state, state.version + 1,
                    optimizer.clock.advance(state.progress, columns)), metrics

  greedy = lambda params, obs: jnp.argmax(net.apply(params, obs)[0], -1).astype(jnp.int32)

  def policy(params: Any, obs: Array, key: PRNGKey) -> tuple[Array, dict[str, Array]]:
    action, _ = sample_categorical(net.apply(params, obs)[0], key)
    return action, {}  # no importance ratio: the behaviour log-probs are not needed

  return Algorithm(
      name="a2c", init=init, make_policy=lambda actor_index: policy, update=update,
      actor_params=lambda state: state.params, extras_spec={}, greedy_policy=greedy)
