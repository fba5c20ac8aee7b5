"""The algorithms by name (`--algo`): each one's settings, factory, arguments and checks.

Adding an algorithm: its maths and factory in algos/<name>.py, its settings (a frozen
dataclass of `_f` fields, which become the launcher's flags) in algos/<name>_config.py, and
one line in `ALGORITHMS`. Factories take what they use, explicitly; `make_algorithm` is the one
place that reads those arguments out of a whole `TrainConfig`.

Free of JAX at import: the config layer and the launcher read the settings classes from here.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from jaxrl_async.algos import dqn_config, ppo_config
from jaxrl_async.algos.a2c_config import A2CConfig
from jaxrl_async.algos.dqn_config import DQNConfig
from jaxrl_async.algos.impala_config import ImpalaConfig
from jaxrl_async.algos.ppo_config import PPOConfig
from jaxrl_async.config.checks import check_discrete_actions

if TYPE_CHECKING:
  from jaxrl_async.algos.base import Algorithm
  from jaxrl_async.config import TrainConfig
  from jaxrl_async.envs import EnvSpec


def on_policy_args(config: TrainConfig) -> dict[str, Any]:
  """A learner-on-rollouts factory's arguments: its settings, the network, the updates the run
  makes and the env columns each takes at the configured U (its schedules anneal over the env
  steps they hold) and the lag weighting."""
  from jaxrl_async.algos.base import LagWeighting  # JAX: only when an algorithm is built

  return dict(cfg=config.algo, network=config.network,
              num_updates=-(-config.run.total_env_steps // config.env_steps_per_update),
              columns_per_update=config.env.num_envs * config.rate.rollouts_per_update,
              lag=LagWeighting(config.rate.lag_weighting, config.rate.lag_weighting_tau))


def impala_args(config: TrainConfig) -> dict[str, Any]:
  # NOTE: IMPALA has always annealed its learning rate over the whole updates in the budget
  # (rounded down), one short of the updates the learner runs when the budget is not a
  # multiple of env_steps_per_update; kept so that its runs stay bit-identical.
  return on_policy_args(config) | dict(
      num_updates=config.run.total_env_steps // config.env_steps_per_update)


@dataclasses.dataclass(frozen=True)
class Entry:
  config: type  # its settings: TrainConfig.algo is one of these
  factory: str  # "module:function", imported when first built (it imports JAX)
  args: Callable[[TrainConfig], dict[str, Any]]  # the factory's arguments besides spec, axis
  check: Callable[[TrainConfig, EnvSpec], None] | None = None  # against the rest of the run
  discrete_only: bool = False
  off_policy: bool = False  # learns from a replay (the runtime's replay learner)
  # Its train state's layout, which checkpoints record: a resume refuses another one, since it
  # would not restore (2: `progress`, the env steps its schedules count, algos/schedule.py).
  state_layout: int = 1


ALGORITHMS: dict[str, Entry] = {
    "impala": Entry(ImpalaConfig, "jaxrl_async.algos.impala:make_impala", impala_args,
                    discrete_only=True, state_layout=2),
    "ppo": Entry(PPOConfig, "jaxrl_async.algos.ppo:make_ppo", on_policy_args,
                 check=ppo_config.check_run, state_layout=2),
    "dqn": Entry(DQNConfig, "jaxrl_async.algos.dqn:make_dqn", dqn_config.factory_args,
                 check=dqn_config.check_run, discrete_only=True, off_policy=True),
    "a2c": Entry(A2CConfig, "jaxrl_async.algos.a2c:make_a2c", on_policy_args, discrete_only=True,
                 state_layout=2),
}


def is_off_policy(name: str) -> bool:
  """Whether `--algo=name` learns from a replay (which --checkpoint_replay saves)."""
  return ALGORITHMS[name].off_policy


def state_layout(name: str) -> int:
  """The layout of `--algo=name`'s train state, which its checkpoints record."""
  return ALGORITHMS[name].state_layout


def check(config: TrainConfig, spec: EnvSpec) -> None:
  """The algorithm's checks against the env and the rest of the run, before any thread
  starts; raises ConfigError naming the flag."""
  entry = ALGORITHMS[config.learner.algo]
  if entry.discrete_only:
    check_discrete_actions(config.learner.algo, spec)
  if entry.check is not None:
    entry.check(config, spec)


def make_algorithm(config: TrainConfig, spec: EnvSpec, axis_name: str) -> Algorithm:
  """The checked algorithm `config.learner.algo`, its factory given its arguments from
  `config`; `update` runs inside `shard_map` over `axis_name`."""
  check(config, spec)
  entry = ALGORITHMS[config.learner.algo]
  module, function = entry.factory.split(":")
  factory = getattr(importlib.import_module(module), function)
  return factory(spec=spec, axis_name=axis_name, **entry.args(config))
