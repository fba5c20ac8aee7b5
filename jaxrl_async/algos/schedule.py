"""Schedules that count the env steps learned from, not the updates made.

An annealed learning rate (and PPO's annealed clip) falls linearly to 0 over the run's env
steps. Counted in updates, it would be tied to the batch size: under --balance=auto the rollouts
per update (U) move during a run, and a schedule over updates would end early (a larger U) or
late. `Progress`, part of the train state, counts the env steps learned from instead, in the unit
the configured run's optimiser counts: a gradient step of an update at the configured U is 1. A
gradient step of a batch of `c` env columns (all learner devices together) advances it by
c / `columns`, the configured update's columns; the fraction is carried exactly, as an integer
and a remainder, and the schedule reads the whole part. At the configured U, then, every count is
the integer optax's own count of gradient steps would be, and runs stay bit-identical to the
update-counting schedules this replaced (tools/params_digest.py, BUILD_NOTES.md).

Several processes: `columns` is one process's (--num_envs is per host) while a batch spans every
host's, so each gradient step advances by the process count, and the schedule ends with the run,
whose --total_env_steps counts every host's.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax

from jaxrl_async.algos.base import clipped_adam
from jaxrl_async.types import Array


@flax.struct.dataclass
class Progress:
  """Env steps learned from, in gradient steps of the configured batch: `count` whole ones and
  `rem` / columns of the next (`EnvStepClock`). Integers, so a non-finite update's rollback
  (runtime's skip_nonfinite restores floats only) still counts its data as consumed."""

  count: Array  # int32
  rem: Array  # int32, in [0, columns)


def progress_init() -> Progress:
  return Progress(jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))


@dataclasses.dataclass(frozen=True)
class EnvStepClock:
  """Reads and advances `Progress` for one algorithm.

  grad_steps: gradient steps per update (epochs x minibatches). columns: env columns one update
  at the configured U takes on one process (--num_envs x U); the batch's own columns are read
  from its shape inside the update. axis_name: the learner axis, over which a batch is split.
  """

  grad_steps: int
  columns: int
  axis_name: str

  def __post_init__(self):
    if self.grad_steps < 1 or self.columns < 1:
      raise ValueError(f"grad_steps and columns must be >= 1, not {self.grad_steps}, "
                       f"{self.columns}")

  def batch_columns(self, local_columns: int) -> int:
    """The env columns of a batch whose slice on this device has `local_columns`."""
    return local_columns * jax.lax.axis_size(self.axis_name)

  def count_at(self, progress: Progress, step: Array, local_columns: int) -> Array:
    """The count at gradient step `step` (0-based) of an update of this batch."""
    c = self.batch_columns(local_columns)
    return progress.count + (progress.rem + step * c) // self.columns

  def advance(self, progress: Progress, local_columns: int) -> Progress:
    """`progress` after one whole update of this batch."""
    total = progress.rem + self.grad_steps * self.batch_columns(local_columns)
    return Progress(progress.count + total // self.columns, total % self.columns)

  def updates(self, progress: Progress) -> Array:
    """Whole configured updates learned so far: the update count an annealed clip reads."""
    return progress.count // self.grad_steps


@dataclasses.dataclass(frozen=True)
class ScheduledAdam:
  """The on-policy algorithms' optimiser: `clipped_adam` at rate 1, then times the learning rate
  read at the `Progress` count of each gradient step (`scale_updates`). `clock` reads and
  advances that count; `make_scheduled_adam` builds one from an algorithm's settings."""

  clock: EnvStepClock
  lr: optax.Schedule
  adam: optax.GradientTransformation

  def init(self, params: Any) -> Any:
    return self.adam.init(params)

  def step(self, grads: Any, opt_state: Any, params: Any, progress: Progress, step: Array,
           local_columns: int) -> tuple[Any, Any, Array]:
    """(params, opt_state, learning rate) after gradient step `step` (0-based) of an update
    from progress `progress` on a batch whose slice here has `local_columns` env columns."""
    updates, opt_state = self.adam.update(grads, opt_state, params)
    lr = self.lr(self.clock.count_at(progress, step, local_columns))
    return optax.apply_updates(params, scale_updates(updates, lr)), opt_state, lr


def make_scheduled_adam(learning_rate: float, anneal: bool, max_grad_norm: float,
                        num_updates: int, grad_steps: int, columns_per_update: int,
                        axis_name: str) -> ScheduledAdam:
  """An algorithm's optimiser: its rate constant or annealed over the run's `num_updates`
  updates of `grad_steps` gradient steps, each taking `columns_per_update` env columns at the
  configured U (one process's), counted over `axis_name`."""
  return ScheduledAdam(EnvStepClock(grad_steps, columns_per_update, axis_name),
                       rate_schedule(learning_rate, anneal, num_updates * grad_steps),
                       clipped_adam(1.0, max_grad_norm))


def rate_schedule(value: float, anneal: bool, total_grad_steps: int) -> optax.Schedule:
  """The learning rate at a `Progress` count: `value` throughout, or annealed linearly to 0
  over `total_grad_steps` counts (the run's updates x gradient steps per update)."""
  if anneal:
    return optax.linear_schedule(value, 0.0, max(total_grad_steps, 1))
  return lambda count: jnp.asarray(value, jnp.float32)


def scale_updates(updates: object, lr: Array) -> object:
  """`updates` (the optimiser's, at learning rate 1) times `lr`.

  The optimiser runs with a constant learning rate of 1 (`clipped_adam(1.0, ...)`), a sign flip,
  and the rate multiplies after it: (-g) x lr is bit for bit -lr x g, what optax's
  scale_by_schedule computes, so the maths is the same while the count is ours."""
  return jax.tree.map(lambda u: jnp.asarray(lr, u.dtype) * u, updates)
