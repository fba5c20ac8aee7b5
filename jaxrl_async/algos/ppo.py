"""PPO: clipped-surrogate actor-critic (Schulman et al., 2017), synchronous or asynchronous.

With `max_policy_lag` K = 0 every rollout was acted by the params being updated: standard
synchronous PPO. With K >= 1 a rollout may come from params up to K versions old; the ratio is
always taken against the behaviour log-probs the actor recorded (`extras["logp"]`), so stale
data is importance-corrected and clipped around its own behaviour policy, not ignored.

GAE comes from rlax (losses.gae_advantages, with EnvPool's episode ends); EnvPool's reset
transition is masked out of every loss by `valid`.

Continuous actions: a diagonal Gaussian with a state-independent log-std. The actor samples
`raw ~ N(mean, std)` and sends `clip(raw, low, high)` to EnvPool (that is what `actions` holds);
the unclipped `raw` travels in `extras["raw_action"]` and the log-probs of both the behaviour
and the learner are taken on it, so the ratio is exact (the clipping is part of the env).

Observation normalisation (`normalize_obs`): running mean/var in the train state, published to
the actors with the params. The learner updates it from each batch *after* the gradient steps,
so the loss sees the same statistics the actors acted with (at K = 0, exactly). Rewards are
multiplied by `reward_scale` for learning only.

One update = GAE on the whole [T, B] batch with the params it starts from, then `num_epochs`
shuffles of its T x B transitions into `num_minibatches` gradient steps (`shuffled_epochs`): one
compile boundary.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxrl_async.algos.base import (
  UNWEIGHTED,
  Algorithm,
  LagWeighting,
  Rollout,
  loss_weights,
  psum_flat,
  shuffled_epochs,
  unroll_loops,
)
from jaxrl_async.algos.losses import (
  categorical_terms,
  clipped_surrogate,
  device_share,
  gae_advantages,
  normalized_advantages,
  sample_categorical,
)
from jaxrl_async.algos.ppo_config import PPOConfig
from jaxrl_async.algos.schedule import Progress, make_scheduled_adam, progress_init
from jaxrl_async.config import NetworkConfig
from jaxrl_async.envs import EnvSpec
from jaxrl_async.networks import ActorCritic
from jaxrl_async.types import Array, Metrics, PRNGKey

_OBS_CLIP = 10.0  # normalised observations are clipped to +-10, as gym's NormalizeObservation


@flax.struct.dataclass
class ObsNorm:
  """Running moments of the observations over every device's data (Chan et al.'s merge)."""

  mean: Array  # [*obs_shape]
  var: Array  # [*obs_shape]
  count: Array  # [] observations seen (starts at a tiny count so var = 1 until data arrives)


@flax.struct.dataclass
class PPOState:
  params: Any
  opt_state: Any
  key: PRNGKey
  version: Array  # learner updates applied so far
  obs_norm: ObsNorm | None  # None unless normalize_obs
  progress: Progress  # env steps learned from, which the schedules count (schedule.py)


def obs_norm_init(obs_shape: tuple[int, ...]) -> ObsNorm:
  return ObsNorm(jnp.zeros(obs_shape, jnp.float32), jnp.ones(obs_shape, jnp.float32),
                 jnp.asarray(1e-4, jnp.float32))


def normalize(norm: ObsNorm | None, obs: Array) -> Array:
  if norm is None:
    return obs
  return jnp.clip((obs - norm.mean) / jnp.sqrt(norm.var + 1e-8), -_OBS_CLIP, _OBS_CLIP)


def obs_norm_update(norm: ObsNorm, obs: Array, axis_name: str) -> ObsNorm:
  """Merges the moments of `obs` [N..., *obs_shape] from every device into `norm`.

  psum'd sums make every device compute the same statistics, so replicas stay identical.
  """
  feature_ndim = norm.mean.ndim
  x = obs.reshape((-1,) + obs.shape[obs.ndim - feature_ndim:]).astype(jnp.float32)
  n_b = jax.lax.psum(jnp.asarray(x.shape[0], jnp.float32), axis_name)
  mean_b = jax.lax.psum(x.sum(0), axis_name) / n_b
  m2_b = jax.lax.psum(((x - mean_b) ** 2).sum(0), axis_name)
  n = norm.count + n_b
  delta = mean_b - norm.mean
  mean = norm.mean + delta * n_b / n
  m2 = norm.var * norm.count + m2_b + delta**2 * norm.count * n_b / n
  return ObsNorm(mean, m2 / n, n)


def _dist_terms(net_out: Any, discrete: bool, actions: Array) -> tuple[Array, Array]:
  """(log pi(actions) [...], entropy [...]) for the policy head's output."""
  if discrete:
    return categorical_terms(net_out, actions)
  mean, log_std = net_out
  return gaussian_logp(mean, log_std, actions), (log_std + 0.5 * math.log(2 * math.pi * math.e)
                                                 ).sum(-1)


def gaussian_logp(mean: Array, log_std: Array, x: Array) -> Array:
  """log N(x; mean, exp(log_std)^2) summed over the last (action) axis."""
  z = (x - mean) * jnp.exp(-log_std)
  return (-0.5 * z**2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)


@flax.struct.dataclass
class PPOBatch:
  """Transitions with what the epochs need, computed once per update: [..., N] leaves."""

  obs: Array  # [..., N, *obs_shape]
  actions: Array  # [..., N] taken (discrete), or [..., N, A] raw Gaussian samples (continuous)
  logp: Array  # behaviour log-probs
  adv: Array  # GAE advantages
  ret: Array  # value targets: adv + V(obs) at the start of the update
  value: Array  # V(obs) at the start of the update (for value clipping)
  valid: Array
  weight: Array | None = None  # lag weighting: the transition's rollout column's weight


def ppo_loss(net: ActorCritic, params: Any, obs_norm: ObsNorm | None, batch: PPOBatch,
             axis_name: str, *, discrete: bool, clip_eps: Array | float, clip_value: bool,
             value_coef: float, entropy_coef: float, normalize_advantages: bool
             ) -> tuple[Array, Metrics]:
  """Clipped surrogate, value and entropy losses on a minibatch [b, ...] of transitions,
  normalised over all devices' minibatches.

  Args:
    net: the actor-critic; params: its parameters; obs_norm: the observation statistics the
      actors acted with (None: raw observations).
    batch: this device's minibatch. discrete: a categorical policy, else a Gaussian.
    clip_eps: the ratio clip (also the value clip with `clip_value`).
    value_coef, entropy_coef: weights of the value loss and the entropy bonus.
    normalize_advantages: normalise the advantages over the minibatch.
  Returns:
    (loss, metrics): this device's share of the global mean loss, and its metrics' shares.
  """
  head, value = net.apply(params, normalize(obs_norm, batch.obs))
  logp, entropy = _dist_terms(head, discrete, batch.actions)
  log_ratio = logp - batch.logp
  ratio = jnp.exp(log_ratio)
  mask = batch.valid.astype(jnp.float32)
  loss_mask = loss_weights(batch.weight, mask)
  adv = batch.adv
  if normalize_advantages:
    adv = normalized_advantages(adv, loss_mask, axis_name)
  count = jax.lax.psum(mask.sum(), axis_name)
  local_mean = lambda x: device_share(x, mask, count)
  loss_mean = lambda x: device_share(x, loss_mask, count)
  pg_loss = loss_mean(clipped_surrogate(ratio, adv, clip_eps))
  v_err = (value - batch.ret) ** 2
  if clip_value:
    v_clipped = batch.value + jnp.clip(value - batch.value, -clip_eps, clip_eps)
    v_err = jnp.maximum(v_err, (v_clipped - batch.ret) ** 2)
  v_loss = 0.5 * loss_mean(v_err)
  ent = loss_mean(entropy)
  loss = pg_loss + value_coef * v_loss - entropy_coef * ent
  metrics = {
      "pg_loss": pg_loss, "value_loss": v_loss, "entropy": ent,
      # (r - 1) - log r >= 0 is the low-variance KL estimator (Schulman's blog, "approx kl").
      "approx_kl": local_mean((ratio - 1.0) - log_ratio),
      "clip_frac": local_mean((jnp.abs(ratio - 1.0) > clip_eps).astype(jnp.float32)),
  }
  return loss, metrics


def transitions(batch: Rollout, values: Array, adv: Array, discrete: bool) -> PPOBatch:
  """The [T, B] rollout as T x B independent transitions ([N, ...] leaves). The advantages are
  already computed, so minibatches need not keep trajectories whole (V-trace's do, which is
  why impala.py shuffles whole env columns instead)."""
  T, B = batch.rewards.shape
  flat = lambda x: x.reshape((T * B,) + x.shape[2:])
  actions = batch.actions if discrete else batch.extras["raw_action"]
  weight = (None if batch.weights is None
            else flat(jnp.broadcast_to(batch.weights, batch.rewards.shape)))
  return PPOBatch(obs=flat(batch.obs[:-1]), actions=flat(actions), logp=flat(batch.extras["logp"]),
                  adv=flat(adv), ret=flat(adv + values[:-1]), value=flat(values[:-1]),
                  valid=flat(batch.valid), weight=weight)


def make_policy_fn(net: ActorCritic, spec: EnvSpec):
  """The actors' policy over `actor_params(state)` = {"params", "obs_norm"}."""
  low = jnp.asarray(spec.action_low, jnp.float32) if not spec.discrete else None
  high = jnp.asarray(spec.action_high, jnp.float32) if not spec.discrete else None

  def policy(actor_params: Any, obs: Array, key: PRNGKey) -> tuple[Array, dict[str, Array]]:
    head, _ = net.apply(actor_params["params"], normalize(actor_params["obs_norm"], obs))
    if spec.discrete:
      return sample_categorical(head, key)
    mean, log_std = head
    raw = mean + jnp.exp(log_std) * jax.random.normal(key, mean.shape)
    return jnp.clip(raw, low, high), {"logp": gaussian_logp(mean, log_std, raw),
                                      "raw_action": raw}

  return policy


def make_ppo(cfg: PPOConfig, spec: EnvSpec, network: NetworkConfig, axis_name: str,
             num_updates: int, columns_per_update: int,
             lag: LagWeighting = UNWEIGHTED) -> Algorithm:
  """PPO for discrete or continuous actions.

  Args:
    cfg: its settings. spec: the env's. network: the actor-critic's torso.
    axis_name: the learner axis `update` runs under. num_updates, columns_per_update: the
      updates the run makes and the env columns each takes at the configured rollouts per update
      (one process's); the learning rate (`cfg.anneal_lr`) and the clip (`cfg.anneal_clip`)
      anneal over the env steps they hold (schedule.py). lag: how rollouts are weighted by
      their lag.
  """
  net = ActorCritic(network, spec.num_actions, discrete=spec.discrete)
  grad_steps = cfg.num_epochs * cfg.num_minibatches
  optimizer = make_scheduled_adam(cfg.learning_rate, cfg.anneal_lr, cfg.max_grad_norm,
                                  num_updates, grad_steps, columns_per_update, axis_name)
  unroll = unroll_loops(network.network, jax.default_backend())
  loss_fn = functools.partial(
      ppo_loss, net, axis_name=axis_name, discrete=spec.discrete, clip_value=cfg.clip_value,
      value_coef=cfg.value_coef, entropy_coef=cfg.entropy_coef,
      normalize_advantages=cfg.normalize_advantages)

  def init(key: PRNGKey) -> PPOState:
    key, init_key = jax.random.split(key)
    params = net.init(init_key, jnp.zeros((1,) + spec.obs_shape, spec.obs_dtype))
    obs_norm = obs_norm_init(spec.obs_shape) if cfg.normalize_obs else None
    return PPOState(params, optimizer.init(params), key, jnp.zeros((), jnp.int32), obs_norm,
                    progress_init())

  def update(state: PPOState, batch: Rollout) -> tuple[PPOState, Metrics]:
    batch = lag.apply(batch, state.version)
    # Advantages and value targets once per batch, with the params the epochs start from.
    _, values = net.apply(state.params, normalize(state.obs_norm, batch.obs))  # [T+1, B]
    adv = gae_advantages(values, batch.rewards * cfg.reward_scale, batch.terminated,
                         batch.truncated, cfg.discount, cfg.gae_lambda)
    data = transitions(batch, values, adv, spec.discrete)
    frac = 1.0 - optimizer.clock.updates(state.progress).astype(jnp.float32) / num_updates
    clip_eps = cfg.clip_eps * jnp.maximum(frac, 0.0) if cfg.anneal_clip else cfg.clip_eps
    # NOTE: a zero clip (the end of an annealed run) would freeze the policy; keep it positive.
    clip_eps = jnp.maximum(clip_eps, 1e-3)

    columns = batch.rewards.shape[1]

    def sgd_step(carry, minibatch: PPOBatch):
      params, opt_state, step = carry
      grads, metrics = jax.grad(
          lambda p: loss_fn(p, state.obs_norm, minibatch, clip_eps=clip_eps),
          has_aux=True)(params)
      grads, metrics = psum_flat((grads, metrics), axis_name)
      metrics["grad_norm"] = optax.global_norm(grads)
      params, opt_state, metrics["learning_rate"] = optimizer.step(
          grads, opt_state, params, state.progress, step, columns)
      return (params, opt_state, step + 1), metrics

    key, epoch_key = jax.random.split(state.key)
    (params, opt_state, _), metrics = shuffled_epochs(
        epoch_key, data, cfg.num_epochs, cfg.num_minibatches, sgd_step,
        (state.params, state.opt_state, jnp.zeros((), jnp.int32)), unroll=unroll)
    obs_norm = state.obs_norm
    if obs_norm is not None:
      obs_norm = obs_norm_update(obs_norm, batch.obs[:-1], axis_name)
    metrics["clip_eps"] = clip_eps
    return PPOState(params, opt_state, key, state.version + 1, obs_norm,
                    optimizer.clock.advance(state.progress, columns)), metrics

  extras_spec = {"logp": ((), np.dtype(np.float32))}
  if not spec.discrete:
    extras_spec["raw_action"] = (spec.action_shape, np.dtype(np.float32))
  policy = make_policy_fn(net, spec)
  return Algorithm(
      name="ppo", init=init, make_policy=lambda actor_index: policy, update=update,
      actor_params=lambda state: {"params": state.params, "obs_norm": state.obs_norm},
      extras_spec=extras_spec, grad_steps_per_update=grad_steps,
      epochs_per_update=cfg.num_epochs)
