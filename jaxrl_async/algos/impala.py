"""IMPALA: an actor-critic learning from lagged behaviour data with V-trace (Espeholt et al., 2018).

V-trace comes from rlax. EnvPool's episode boundaries enter through per-step discounts and
trace-cutting lambdas: discount_t = gamma (1 - terminated_t) stops bootstrapping at a terminal
state; lambda_t = lambda (1 - ended_t) cuts the trace at any episode end, so the target of the
last real transition bootstraps from V(final obs) (right for a time limit) and never mixes with
the next episode; EnvPool's reset transition is masked out of every loss by `valid`.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
import rlax

from jaxrl_async.algos.base import (
  UNWEIGHTED,
  Algorithm,
  LagWeighting,
  Rollout,
  loss_weights,
  psum_flat,
  shuffled_epochs,
)
from jaxrl_async.algos.impala_config import ImpalaConfig
from jaxrl_async.algos.losses import (
  categorical_terms,
  clipped_surrogate,
  device_share,
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
class ImpalaState:
  params: Any
  opt_state: Any
  key: PRNGKey
  version: Array  # learner updates applied so far
  progress: Progress  # env steps learned from, which the learning rate's schedule counts


def vtrace_returns(values: Array, r_t: Array, terminated_t: Array, truncated_t: Array,
                   rho_tm1: Array, discount: float, lambda_: float, clip_rho: float = 1.0,
                   clip_pg_rho: float = 1.0) -> Any:
  """rlax V-trace over [T, B] with EnvPool's episode ends.

  Args:
    values: V(obs) [T+1, B]. r_t, terminated_t, truncated_t, rho_tm1: [T, B].
  Returns:
    rlax's VTraceOutput with errors (targets - v_tm1), pg_advantage, q_estimate, each [T, B].
  """
  ended_t = (terminated_t | truncated_t).astype(values.dtype)
  discount_t = discount * (1.0 - terminated_t.astype(values.dtype))
  lambda_t = lambda_ * (1.0 - ended_t)
  vtrace = jax.vmap(rlax.vtrace_td_error_and_advantage, in_axes=(1, 1, 1, 1, 1, 1, None, None),
                    out_axes=1)
  return vtrace(values[:-1], values[1:], r_t, discount_t, rho_tm1, lambda_t, clip_rho,
                clip_pg_rho)


def vtrace_loss(net: ActorCritic, params: Any, batch: Rollout, axis_name: str, *,
                discount: float, vtrace_lambda: float, clip_rho: float, clip_pg_rho: float,
                clip_eps: float, value_coef: float, entropy_coef: float,
                normalize_advantages: bool) -> tuple[Array, Metrics]:
  """Policy-gradient, value and entropy losses over a [T, B] batch, normalised over all devices.

  Args:
    net: the actor-critic; params: its parameters.
    batch: this device's [T, B] rollouts (behaviour log-probs in `extras["logp"]`).
    discount, vtrace_lambda, clip_rho, clip_pg_rho: V-trace's gamma, lambda and rho clips.
    clip_eps: APPO's ratio clip on the V-trace advantage; 0 is IMPALA's policy gradient.
    value_coef, entropy_coef: weights of the value loss and the entropy bonus.
    normalize_advantages: normalise the policy-gradient advantages over the batch.
  Returns:
    (loss, metrics): this device's share of the global mean loss, and its metrics' shares.
  """
  logits, values = net.apply(params, batch.obs)  # [T+1, B, A], [T+1, B]
  logp_tm1, entropy_tm1 = categorical_terms(logits[:-1], batch.actions)
  rho_tm1 = jnp.exp(logp_tm1 - batch.extras["logp"])
  out = vtrace_returns(values, batch.rewards, batch.terminated, batch.truncated,
                       jax.lax.stop_gradient(rho_tm1), discount, vtrace_lambda, clip_rho,
                       clip_pg_rho)
  mask = batch.valid.astype(jnp.float32)
  loss_mask = loss_weights(batch.weights, mask)
  pg_adv = jax.lax.stop_gradient(out.pg_advantage)
  if normalize_advantages:
    pg_adv = normalized_advantages(pg_adv, loss_mask, axis_name)
  count = jax.lax.psum(mask.sum(), axis_name)
  loss_mean = lambda x: device_share(x, loss_mask, count)
  if clip_eps > 0:
    # APPO (Sample Factory): PPO's clipped surrogate on the V-trace advantage. The ratio pi/mu
    # corrects for the behaviour policy and its clip stops the epochs of reuse from pushing
    # the policy far from it; plain V-trace with reuse sometimes collapsed to a deterministic
    # policy on CartPole (BUILD_NOTES.md, "The spine on CartPole-v1").
    adv = jax.lax.stop_gradient(out.q_estimate - values[:-1])
    pg_loss = loss_mean(clipped_surrogate(rho_tm1, adv, clip_eps))
  else:
    pg_loss = -loss_mean(logp_tm1 * pg_adv)
  v_loss = 0.5 * loss_mean(out.errors**2)
  entropy = loss_mean(entropy_tm1)
  loss = pg_loss + value_coef * v_loss - entropy_coef * entropy
  metrics = {"pg_loss": pg_loss, "value_loss": v_loss, "entropy": entropy,
             "rho_mean": device_share(rho_tm1, mask, count)}
  return loss, metrics


def impala_loss(net: ActorCritic, cfg: ImpalaConfig, axis_name: str):
  """`vtrace_loss(params, batch) -> (loss, metrics)` with `cfg`'s scalars bound."""
  return functools.partial(
      vtrace_loss, net, axis_name=axis_name, discount=cfg.discount,
      vtrace_lambda=cfg.vtrace_lambda, clip_rho=cfg.clip_rho, clip_pg_rho=cfg.clip_pg_rho,
      clip_eps=cfg.clip_eps, value_coef=cfg.value_coef, entropy_coef=cfg.entropy_coef,
      normalize_advantages=cfg.normalize_advantages)


def make_impala(cfg: ImpalaConfig, spec: EnvSpec, network: NetworkConfig, axis_name: str,
                num_updates: int, columns_per_update: int,
                lag: LagWeighting = UNWEIGHTED) -> Algorithm:
  """IMPALA (APPO with `cfg.clip_eps` > 0) for discrete actions.

  Args:
    cfg: its settings. spec: the env's. network: the actor-critic's torso.
    axis_name: the learner axis `update` runs under. num_updates, columns_per_update: the
      updates the run makes and the env columns each takes at the configured rollouts per update
      (one process's); the learning rate anneals (`cfg.anneal_lr`) over the env steps they hold
      (schedule.py). lag: how rollouts are weighted by their lag.
  """
  check_discrete_actions("impala", spec)
  net = ActorCritic(network, spec.num_actions, discrete=True)
  grad_steps = cfg.num_epochs * cfg.num_minibatches
  optimizer = make_scheduled_adam(cfg.learning_rate, cfg.anneal_lr, cfg.max_grad_norm,
                                  num_updates, grad_steps, columns_per_update, axis_name)
  loss_fn = impala_loss(net, cfg, axis_name)

  def init(key: PRNGKey) -> ImpalaState:
    key, init_key = jax.random.split(key)
    dummy = jnp.zeros((1,) + spec.obs_shape, spec.obs_dtype)
    params = net.init(init_key, dummy)
    return ImpalaState(params, optimizer.init(params), key, jnp.zeros((), jnp.int32),
                       progress_init())

  def update(state: ImpalaState, batch: Rollout) -> tuple[ImpalaState, Metrics]:
    batch = lag.apply(batch, state.version)
    key, epoch_key = jax.random.split(state.key)
    columns = batch.rewards.shape[1]

    def sgd_step(carry, minibatch: Rollout):
      params, opt_state, step = carry
      grads, metrics = jax.grad(lambda p: loss_fn(p, minibatch), has_aux=True)(params)
      grads, metrics = psum_flat((grads, metrics), axis_name)
      metrics["grad_norm"] = optax.tree.norm(grads)
      params, opt_state, metrics["learning_rate"] = optimizer.step(
          grads, opt_state, params, state.progress, step, columns)
      return (params, opt_state, step + 1), metrics

    carry = (state.params, state.opt_state, jnp.zeros((), jnp.int32))
    if grad_steps == 1:  # one pass over the whole batch: nothing to shuffle
      (params, opt_state, _), metrics = sgd_step(carry, batch)
    else:  # minibatches of whole env columns keep each trajectory intact for V-trace
      (params, opt_state, _), metrics = shuffled_epochs(
          epoch_key, batch, cfg.num_epochs, cfg.num_minibatches, sgd_step, carry, axis=1)
    return ImpalaState(params, opt_state, key, state.version + 1,
                       optimizer.clock.advance(state.progress, columns)), metrics

  greedy = lambda params, obs: jnp.argmax(net.apply(params, obs)[0], -1).astype(jnp.int32)
  policy = lambda params, obs, key: sample_categorical(net.apply(params, obs)[0], key)
  return Algorithm(
      name="impala", init=init, make_policy=lambda actor_index: policy, update=update,
      actor_params=lambda state: state.params,
      extras_spec={"logp": ((), np.dtype(np.float32))}, grad_steps_per_update=grad_steps,
      greedy_policy=greedy, epochs_per_update=cfg.num_epochs)
