"""The algorithm bundle and the data it learns from. Pure functions only: no threads, no queues.

An algorithm is `Algorithm(init, make_policy, update, actor_params, extras_spec)`:
- `init(key) -> state`: the learner's named train state (params, optimiser state, version...).
- `make_policy(actor_index) -> policy(actor_params, obs [B, ...], key) -> (action [B, ...],
  extras)`: what an actor runs; `extras` (e.g. behaviour log-probs) travel in the rollout.
- `update(state, batch) -> (state, metrics)`: one learner step on a `Rollout` batch. It runs
  inside `shard_map` over the learner axis `axis_name`: `batch` is this device's slice of the
  env axis, and every cross-device reduction (gradients, counts) is done here with `lax.psum`.
- `actor_params(state)`: what the learner publishes to actors (params, and normaliser state
  or schedule step where the algorithm has them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import flax.struct
import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import optax

from jaxrl_async.types import Array, Metrics, PRNGKey


@flax.struct.dataclass
class Rollout:
  """T steps x B envs, time-major. Transition t goes from obs[t] with actions[t] to obs[t+1].

  obs [T+1, B, ...]; actions [T, B, ...]; rewards [T, B] (as learned from, e.g. clipped);
  terminated [T, B]: obs[t+1] is terminal (no bootstrap); truncated [T, B]: obs[t+1] ends the
  episode by a time limit (bootstrap from it, but cut the trace there); valid [T, B]: transition
  t is real (false for EnvPool's reset step after an episode end); extras: per-step arrays
  [T, B, ...] the behaviour policy recorded (e.g. "logp"); weights [1, B] float32 or None: how
  much each env column's loss terms count, None counting all 1 (the update fills them from the
  lags with `--lag_weighting`, `with_lag_weights`); behaviour_version [1, B] int32 or None: the
  params version each column was acted with, stamped by the actor.
  """

  obs: Array
  actions: Array
  rewards: Array
  terminated: Array
  truncated: Array
  valid: Array
  extras: dict[str, Array]
  weights: Array | None = None
  behaviour_version: Array | None = None


class Algorithm(NamedTuple):
  name: str
  init: Callable[[PRNGKey], Any]
  make_policy: Callable[[int], Callable[[Any, Array, PRNGKey], tuple[Array, dict[str, Array]]]]
  update: Callable[[Any, Rollout], tuple[Any, Metrics]]
  actor_params: Callable[[Any], Any]
  extras_spec: dict[str, tuple[tuple[int, ...], np.dtype]]
  grad_steps_per_update: int = 1
  # Off-policy algorithms (DQN) learn from a replay between the queue and the update; the
  # trainer then runs `runtime.offpolicy.OffPolicyLearner`, and `extension` carries whatever
  # extra pure functions that learner needs (replay insert and sample).
  off_policy: bool = False
  extension: Any = None
  # greedy_policy(actor_params, obs) -> action: the evaluation policy (argmax, Gaussian mean).
  greedy_policy: Callable[[Any, Array], Array] | None = None


def clipped_adam(learning_rate: float | optax.Schedule, max_grad_norm: float
                 ) -> optax.GradientTransformation:
  """Adam after global-norm clipping, run on one flat vector of every parameter.

  `optax.flatten` gives the same maths with one fused op per step instead of several per
  parameter leaf: on the CPU the update's compile time falls by about a quarter, and start-up is
  most of a short run (BUILD_NOTES.md, "Start-up").
  """
  return optax.flatten(optax.chain(optax.clip_by_global_norm(max_grad_norm),
                                   optax.adam(learning_rate, eps=1e-5)))


def concat_rollouts(rollouts: tuple[Rollout, ...]) -> Rollout:
  """Joins rollouts along the env axis (axis 1)."""
  if len(rollouts) == 1:
    return rollouts[0]
  return jax.tree.map(lambda *xs: jnp.concatenate(xs, axis=1), *rollouts)


def psum_flat(tree: Any, axis_name: str) -> Any:
  """`lax.psum` of a float pytree as one flat vector: one collective instead of one per leaf.

  XLA fuses a tree's all-reduces into one tuple all-reduce, but across processes on the CPU (gloo)
  each tuple element is still its own rendezvous, a few ms apiece (BUILD_NOTES.md, "Multi-host").
  """
  flat, unravel = jax.flatten_util.ravel_pytree(tree)
  return unravel(jax.lax.psum(flat, axis_name))


def global_mean(x: Array, mask: Array, axis_name: str) -> Array:
  """Mean of x over the `mask`ed entries of every device's shard."""
  count = jax.lax.psum(mask.sum(), axis_name)
  return jax.lax.psum((x * mask).sum(), axis_name) / jnp.maximum(count, 1.0)


def lag_weight(lag: Array, scheme: str, tau: float) -> Array:
  """The loss weight of a rollout learned at policy lag `lag` (`--lag_weighting`); 1 at lag 0.

  Unnormalised on purpose: Adam divides each step by the RMS of recent gradients, so a steady
  down-weighting does not shrink the step size; what remains is how much a stale batch counts
  against fresher ones. Normalising over the update's rollouts would instead make the weights all
  1 whenever they share a lag, as every update with --rollouts_per_update=1 does.
  """
  lag = jnp.asarray(lag, jnp.float32)
  if scheme == "inverse":
    return 1.0 / (1.0 + lag)
  if scheme == "exp":
    return jnp.exp(-lag / tau)
  return jnp.ones_like(lag)


def with_lag_weights(batch: Rollout, version: Array, scheme: str, tau: float) -> Rollout:
  """`batch` with each column's weight from its lag at this update (`version` - its behaviour
  version), inside the compiled update. Off, or weights already given, it is `batch` itself."""
  if scheme == "off" or batch.weights is not None:
    return batch
  if batch.behaviour_version is None:
    raise ValueError("lag weighting needs the rollouts' behaviour_version")
  return batch.replace(weights=lag_weight(version - batch.behaviour_version, scheme, tau))


def loss_weights(weights: Array | None, mask: Array) -> Array:
  """`mask` [T, B] times the per-column `weights` [1, B] (lag weighting), or `mask` if None.

  Loss terms are averaged over this but still divided by the *valid count*, not by the weights'
  sum, so a down-weighted rollout counts less in absolute terms, not only relative to the
  others in its batch (see `lag_weight`). Advantage statistics use it too, so a
  rollout of weight 0 has no influence at all.
  """
  return mask if weights is None else mask * weights


def minibatch_epochs(key: PRNGKey, batch: Rollout, num_epochs: int, num_minibatches: int,
                     step: Callable[[Any, Rollout], tuple[Any, Metrics]], carry: Any
                     ) -> tuple[Any, Metrics]:
  """Runs `step` over `num_epochs` shuffles of `num_minibatches` env-axis slices of `batch`.

  One `lax.scan` over epochs of a `lax.scan` over minibatches, so the whole update is one compile
  boundary. Minibatches split whole env columns, which keeps each trajectory intact for V-trace
  and GAE. Returns the final carry and the metrics of the last minibatch step.
  """
  num_envs = batch.rewards.shape[1]
  if num_epochs == 1 and num_minibatches == 1:
    return step(carry, batch)

  def epoch(carry, key):
    perm = jax.random.permutation(key, num_envs)
    shuffled = jax.tree.map(lambda x: jnp.take(x, perm, axis=1), batch)
    split = jax.tree.map(
        lambda x: jnp.swapaxes(
            x.reshape(x.shape[:1] + (num_minibatches, -1) + x.shape[2:]), 0, 1), shuffled)
    return jax.lax.scan(step, carry, split)

  carry, metrics = jax.lax.scan(epoch, carry, jax.random.split(key, num_epochs))
  return carry, jax.tree.map(lambda m: m[-1, -1], metrics)
