"""The RL maths more than one algorithm uses, as pure functions of arrays and explicit scalars.

Time-major [T, B] with EnvPool's episode ends: discount_t = gamma (1 - terminated_t) stops
bootstrapping at a terminal state; lambda_t = lambda (1 - ended_t) cuts the trace at any
episode end, so a time-limit end bootstraps from V(final obs) and never mixes with the next
episode. Means are over every learner device's valid steps (`global_mean`, `device_share`).
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import rlax

from jaxrl_async.types import Array, PRNGKey


def gae_advantages(values: Array, r_t: Array, terminated_t: Array, truncated_t: Array,
                   discount: float, lambda_: float) -> Array:
  """rlax's truncated GAE over [T, B] with EnvPool's episode ends (Schulman et al., 2016).

  Args:
    values: V(obs) [T+1, B]. r_t, terminated_t, truncated_t: [T, B].
    discount, lambda_: gamma and the GAE lambda (1: the bootstrapped n-step return's advantage).
  Returns:
    Advantages [T, B]; the value targets are advantages + values[:-1].
  """
  chex.assert_rank([values, r_t, terminated_t, truncated_t], 2)
  chex.assert_equal_shape([values[:-1], r_t, terminated_t, truncated_t])
  ended_t = (terminated_t | truncated_t).astype(values.dtype)
  discount_t = discount * (1.0 - terminated_t.astype(values.dtype))
  lambda_t = lambda_ * (1.0 - ended_t)
  gae = jax.vmap(rlax.truncated_generalized_advantage_estimation, in_axes=1, out_axes=1)
  return gae(r_t, discount_t, lambda_t, values)


def clipped_surrogate(ratio_t: Array, adv_t: Array, clip_eps: Array | float) -> Array:
  """rlax's clipped surrogate loss per element: -min(r A, clip(r, 1 - eps, 1 + eps) A).

  rlax averages over a rank-1 sequence; mapping it over length-1 sequences keeps the
  per-element loss, which the caller masks and normalises over all devices.
  """
  per_element = jax.vmap(rlax.clipped_surrogate_pg_loss, in_axes=(0, 0, None))
  flat = per_element(ratio_t.reshape(-1, 1), adv_t.reshape(-1, 1), clip_eps)
  return flat.reshape(ratio_t.shape)


def global_mean(x: Array, mask: Array, axis_name: str) -> Array:
  """Mean of x over the `mask`ed entries of every device's shard."""
  count = jax.lax.psum(mask.sum(), axis_name)
  return jax.lax.psum((x * mask).sum(), axis_name) / jnp.maximum(count, 1.0)


def normalized_advantages(adv: Array, weights: Array, axis_name: str) -> Array:
  """`adv` less its mean, over its std: both over every device's entries, weighted by
  `weights` (the valid mask times lag weights), so a rollout of weight 0 has no influence."""
  mean = global_mean(adv, weights, axis_name)
  std = jnp.sqrt(global_mean((adv - mean) ** 2, weights, axis_name))
  return (adv - mean) / (std + 1e-8)


def device_share(x: Array, weights: Array, count: Array) -> Array:
  """This device's share of a global mean: its `weights`-weighted sum of x over `count`, the
  valid entries of every device. The caller psums gradients and metrics, which completes it."""
  return (x * weights).sum() / jnp.maximum(count, 1.0)


def categorical_terms(logits: Array, actions: Array) -> tuple[Array, Array]:
  """(log pi(actions) [...], entropy [...]) of the categorical policy `logits` [..., A]."""
  log_probs = jax.nn.log_softmax(logits)
  logp = jnp.take_along_axis(log_probs, actions[..., None], -1)[..., 0]
  return logp, -(jnp.exp(log_probs) * log_probs).sum(-1)


def sample_categorical(logits: Array, key: PRNGKey) -> tuple[Array, dict[str, Array]]:
  """An action [...] int32 from `logits` [..., A], and its behaviour log-prob {"logp": [...]}
  for the learner's importance ratios."""
  action = jax.random.categorical(key, logits)
  logp = jnp.take_along_axis(jax.nn.log_softmax(logits), action[..., None], -1)[..., 0]
  return action.astype(jnp.int32), {"logp": logp}
