"""IMPALA: an actor-critic learning from lagged behaviour data with V-trace (Espeholt et al., 2018).

V-trace comes from rlax. EnvPool's episode boundaries enter through per-step discounts and
trace-cutting lambdas: discount_t = gamma (1 - terminated_t) stops bootstrapping at a terminal
state; lambda_t = lambda (1 - ended_t) cuts the trace at any episode end, so the target of the
last real transition bootstraps from V(final obs) (right for a time limit) and never mixes with
the next episode; EnvPool's reset transition is masked out of every loss by `valid`.
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
import rlax

from jaxrl_async.algos.base import (
  Algorithm,
  Rollout,
  clipped_adam,
  global_mean,
  loss_weights,
  minibatch_epochs,
  psum_flat,
  with_lag_weights,
)
from jaxrl_async.algos.ppo import clipped_surrogate
from jaxrl_async.config import TrainConfig
from jaxrl_async.envs import EnvSpec
from jaxrl_async.networks import ActorCritic
from jaxrl_async.types import Array, Metrics, PRNGKey


@flax.struct.dataclass
class ImpalaState:
  params: Any
  opt_state: Any
  key: PRNGKey
  version: Array  # learner updates applied so far


def make_optimizer(cfg: Any, total_grad_steps: int) -> optax.GradientTransformation:
  lr = (optax.linear_schedule(cfg.learning_rate, 0.0, max(total_grad_steps, 1))
        if cfg.anneal_lr else cfg.learning_rate)
  return clipped_adam(lr, cfg.max_grad_norm)


def categorical_policy(net: ActorCritic):
  """Samples actions from the logits head; records behaviour log-probs for the ratios."""

  def policy(params: Any, obs: Array, key: PRNGKey) -> tuple[Array, dict[str, Array]]:
    logits, _ = net.apply(params, obs)
    action = jax.random.categorical(key, logits)
    logp = jnp.take_along_axis(jax.nn.log_softmax(logits), action[..., None], -1)[..., 0]
    return action.astype(jnp.int32), {"logp": logp}

  return policy


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


def vtrace_loss(net: ActorCritic, cfg: Any, params: Any, batch: Rollout, axis_name: str
                ) -> tuple[Array, Metrics]:
  """Policy-gradient, value and entropy losses over a [T, B] batch, normalised over all devices."""
  logits, values = net.apply(params, batch.obs)  # [T+1, B, A], [T+1, B]
  logits_tm1 = logits[:-1]
  log_probs = jax.nn.log_softmax(logits_tm1)
  logp_tm1 = jnp.take_along_axis(log_probs, batch.actions[..., None], -1)[..., 0]
  rho_tm1 = jnp.exp(logp_tm1 - batch.extras["logp"])
  out = vtrace_returns(values, batch.rewards, batch.terminated, batch.truncated,
                       jax.lax.stop_gradient(rho_tm1), cfg.discount, cfg.vtrace_lambda,
                       cfg.clip_rho, cfg.clip_pg_rho)
  mask = batch.valid.astype(jnp.float32)
  loss_mask = loss_weights(batch.weights, mask)
  pg_adv = jax.lax.stop_gradient(out.pg_advantage)
  if cfg.normalize_advantages:
    mean = global_mean(pg_adv, loss_mask, axis_name)
    std = jnp.sqrt(global_mean((pg_adv - mean) ** 2, loss_mask, axis_name))
    pg_adv = (pg_adv - mean) / (std + 1e-8)
  count = jax.lax.psum(mask.sum(), axis_name)
  # Each device returns its share of the global mean; the caller psums the gradients.
  local_mean = lambda x: (x * mask).sum() / jnp.maximum(count, 1.0)
  loss_mean = lambda x: (x * loss_mask).sum() / jnp.maximum(count, 1.0)
  if cfg.clip_eps > 0:
    # APPO (Sample Factory): PPO's clipped surrogate on the V-trace advantage. The ratio pi/mu
    # corrects for the behaviour policy and its clip stops the epochs of reuse from pushing
    # the policy far from it; plain V-trace with reuse sometimes collapsed to a deterministic
    # policy on CartPole (BUILD_NOTES.md, "The spine on CartPole-v1").
    adv = jax.lax.stop_gradient(out.q_estimate - values[:-1])
    pg_loss = loss_mean(clipped_surrogate(rho_tm1, adv, cfg.clip_eps))
  else:
    pg_loss = -loss_mean(logp_tm1 * pg_adv)
  v_loss = 0.5 * loss_mean(out.errors**2)
  entropy = loss_mean(-(jnp.exp(log_probs) * log_probs).sum(-1))
  loss = pg_loss + cfg.value_coef * v_loss - cfg.entropy_coef * entropy
  metrics = {"pg_loss": pg_loss, "value_loss": v_loss, "entropy": entropy,
             "rho_mean": local_mean(rho_tm1)}
  return loss, metrics


def make_impala(config: TrainConfig, spec: EnvSpec, axis_name: str) -> Algorithm:
  if not spec.discrete:
    raise ValueError("IMPALA here supports discrete actions; use --algo=ppo for continuous ones")
  cfg = config.algo
  net = ActorCritic(config.network, spec.num_actions, discrete=True)
  grad_steps = cfg.num_epochs * cfg.num_minibatches
  total = config.run.total_env_steps // config.env_steps_per_update * grad_steps
  optimizer = make_optimizer(cfg, total)

  def init(key: PRNGKey) -> ImpalaState:
    key, init_key = jax.random.split(key)
    dummy = jnp.zeros((1,) + spec.obs_shape, spec.obs_dtype)
    params = net.init(init_key, dummy)
    return ImpalaState(params, optimizer.init(params), key, jnp.zeros((), jnp.int32))

  def sgd_step(carry, batch: Rollout):
    params, opt_state = carry
    grads, metrics = jax.grad(
        lambda p: vtrace_loss(net, cfg, p, batch, axis_name), has_aux=True)(params)
    grads, metrics = psum_flat((grads, metrics), axis_name)
    metrics["grad_norm"] = optax.tree.norm(grads)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), metrics

  lag_weighting, lag_tau = config.rate.lag_weighting, config.rate.lag_weighting_tau

  def update(state: ImpalaState, batch: Rollout) -> tuple[ImpalaState, Metrics]:
    batch = with_lag_weights(batch, state.version, lag_weighting, lag_tau)
    key, epoch_key = jax.random.split(state.key)
    (params, opt_state), metrics = minibatch_epochs(
        epoch_key, batch, cfg.num_epochs, cfg.num_minibatches, sgd_step,
        (state.params, state.opt_state))
    return ImpalaState(params, opt_state, key, state.version + 1), metrics

  policy = categorical_policy(net)
  greedy = lambda params, obs: jnp.argmax(net.apply(params, obs)[0], -1).astype(jnp.int32)
  return Algorithm(
      name="impala", init=init, make_policy=lambda actor_index: policy, update=update,
      actor_params=lambda state: state.params,
      extras_spec={"logp": ((), np.dtype(np.float32))}, grad_steps_per_update=grad_steps,
      greedy_policy=greedy)
