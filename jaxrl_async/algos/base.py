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
Off-policy algorithms add a `ReplayExtension`: the pure functions a replay learner needs.
Shared pieces: the optimiser, lag weighting, the epoch scanner and the loops' unrolling choice
here; the RL maths several algorithms use in losses.py.
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


class ReplayExtension(NamedTuple):
  """What an off-policy algorithm gives the replay learner (runtime) beyond `Algorithm`.

  `to_columns(rollout)` is what the replay stores per env column, `gather(columns, t, c)` the
  sampled transitions at steps t [S] of columns c [S], and `on_insert(state, env_steps)` counts
  the inserted env steps into the train state; the rest sizes the replay and its limiter.
  """

  to_columns: Callable[[Rollout], Any]
  gather: Callable[[Any, Array, Array], Any]
  on_insert: Callable[[Any, int], Any]
  steps: int  # transitions per stored column (T)
  batch_size: int  # sampled transitions per gradient step, all devices together
  steps_per_dispatch: int  # gradient steps per compiled learner call
  unroll: bool  # unroll that loop (see `unroll_loops`)
  replay_size: int
  min_replay_size: int
  samples_per_insert: float
  error_buffer: float  # the limiter's, in sampled transitions
  seed: int


class Algorithm(NamedTuple):
  name: str
  init: Callable[[PRNGKey], Any]
  make_policy: Callable[[int], Callable[[Any, Array, PRNGKey], tuple[Array, dict[str, Array]]]]
  update: Callable[[Any, Rollout], tuple[Any, Metrics]]
  actor_params: Callable[[Any], Any]
  extras_spec: dict[str, tuple[tuple[int, ...], np.dtype]]
  grad_steps_per_update: int = 1
  # Off-policy algorithms (DQN) learn from a replay between the queue and the update; the
  # runtime then runs its replay learner, and `extension` carries the pure functions that
  # learner needs (replay insert and sample).
  off_policy: bool = False
  extension: ReplayExtension | None = None
  # greedy_policy(actor_params, obs) -> action: the evaluation policy (argmax, Gaussian mean).
  greedy_policy: Callable[[Any, Array], Array] | None = None
  # Passes each transition gets in one update (PPO's and APPO's epochs): the reuse ratio of
  # on-policy training.
  epochs_per_update: int = 1


def clipped_adam(learning_rate: float, max_grad_norm: float) -> optax.GradientTransformation:
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


class LagWeighting(NamedTuple):
  """`--lag_weighting` and its tau: how much a rollout learned at policy lag L counts."""

  scheme: str = "off"  # off, inverse or exp (see `lag_weight`)
  tau: float = 2.0

  def apply(self, batch: Rollout, version: Array) -> Rollout:
    return with_lag_weights(batch, version, self.scheme, self.tau)


UNWEIGHTED = LagWeighting()  # every rollout counts 1, whatever its lag


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


def shuffled_epochs(key: PRNGKey, data: Any, num_epochs: int, num_minibatches: int,
                    step: Callable[[Any, Any], tuple[Any, Metrics]], carry: Any, axis: int = 0,
                    unroll: bool = False) -> tuple[Any, Metrics]:
  """Runs `step` over `num_epochs` shuffles of `data`, each cut into `num_minibatches` along
  `axis` (0: independent transitions [N, ...]; 1: whole env columns of a [T, B, ...] rollout,
  which keeps each trajectory intact for V-trace).

  One `lax.scan` over epochs of a `lax.scan` over minibatches (both unrolled if `unroll`), so
  the whole update is one compile boundary. Returns the final carry and the metrics of the last
  minibatch step.
  """
  n = jax.tree.leaves(data)[0].shape[axis]

  def cut(x: Array) -> Array:  # [..., n, ...] -> [num_minibatches, ..., n / num_minibatches, ...]
    parts = x.reshape(x.shape[:axis] + (num_minibatches, -1) + x.shape[axis + 1:])
    return parts if axis == 0 else jnp.swapaxes(parts, 0, axis)

  def epoch(carry, key):
    perm = jax.random.permutation(key, n)
    split = jax.tree.map(lambda x: cut(jnp.take(x, perm, axis=axis)), data)
    return jax.lax.scan(step, carry, split, unroll=unroll)

  carry, metrics = jax.lax.scan(epoch, carry, jax.random.split(key, num_epochs), unroll=unroll)
  return carry, jax.tree.map(lambda m: m[-1, -1], metrics)


def unroll_loops(network: str, backend: str) -> bool:
  """Whether to unroll the learner's loops over gradient steps, for torso `network` on JAX
  backend `backend` (`jax.default_backend()`).

  NOTE: on XLA:CPU a convolution inside a loop (`lax.scan`) ran 20-35x slower than the same
  convolution unrolled (notes/algos.md has the measurement), while an MLP was as fast or
  faster in the loop. So CNN torsos on a CPU get unrolled loops (longer compiles); everything
  else keeps `lax.scan`.
  """
  return network != "mlp" and backend == "cpu"
