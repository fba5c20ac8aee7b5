"""Frozen, validated configuration: one dataclass per component, one `TrainConfig` over them.

Field names are the launcher's flag names, so every validation message can name the flag
(`--num_envs=0: must be >= 1`). Each field carries its help text in `metadata["help"]`; the
launcher builds its flags from these, so a field and its flag can never drift apart.
Derived sizes are properties, never written back. The rooms: `checks` (declaring and checking
a field), `components` (envs, actors, rate, network, learner, checkpoints, distributed, run),
and `TrainConfig` here, which joins them with the chosen algorithm's settings: those live with
the algorithms (jaxrl_async/algos/<name>_config.py), listed in jaxrl_async/algos/registry.py.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from jaxrl_async.config.checks import ConfigError, _check
from jaxrl_async.config.components import (
  CLUSTER_DETECTION,
  COMPONENTS,
  LAG_WEIGHTINGS,
  ActorConfig,
  CheckpointConfig,
  DistributedConfig,
  EnvConfig,
  LearnerConfig,
  NetworkConfig,
  RateConfig,
  RunConfig,
)

__all__ = ["CLUSTER_DETECTION", "COMPONENTS", "LAG_WEIGHTINGS", "ActorConfig", "CheckpointConfig",
           "ConfigError", "DistributedConfig", "EnvConfig", "LearnerConfig", "NetworkConfig",
           "RateConfig", "RunConfig", "TrainConfig", "algorithm_configs"]


def algorithm_configs() -> dict[str, type]:
  """`--algo` name -> its settings class, from jaxrl_async/algos/registry.py.

  NOTE: looked up when called, never at import: the algorithms' settings are declared with
  this package's checks, so importing the registry here would make a cycle.
  """
  from jaxrl_async.algos.registry import ALGORITHMS

  return {name: entry.config for name, entry in ALGORITHMS.items()}


def _on_policy() -> list[str]:
  from jaxrl_async.algos.registry import ALGORITHMS

  return [name for name, entry in ALGORITHMS.items() if not entry.off_policy]


def _default_algo_config() -> Any:
  return algorithm_configs()[LearnerConfig.algo]()


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """The whole run. Built from a flat {flag: value} mapping by `from_flat`."""

  env: EnvConfig = dataclasses.field(default_factory=EnvConfig)
  actor: ActorConfig = dataclasses.field(default_factory=ActorConfig)
  rate: RateConfig = dataclasses.field(default_factory=RateConfig)
  network: NetworkConfig = dataclasses.field(default_factory=NetworkConfig)
  learner: LearnerConfig = dataclasses.field(default_factory=LearnerConfig)
  algo: Any = dataclasses.field(default_factory=_default_algo_config)
  checkpoint: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)
  distributed: DistributedConfig = dataclasses.field(default_factory=DistributedConfig)
  run: RunConfig = dataclasses.field(default_factory=RunConfig)

  @property
  def num_minibatches(self) -> int:
    """The parts one update's batch is cut into along the envs (1 where the algorithm does not
    cut it): the envs per learner device of every U must divide into them."""
    return getattr(self.algo, "num_minibatches", 1)

  def __post_init__(self):
    expected = algorithm_configs().get(self.learner.algo)
    _check(expected is not None and isinstance(self.algo, expected), "algo", self.learner.algo,
           f"needs its config class {getattr(expected, '__name__', '?')}")
    per_device, rem = divmod(self.env.num_envs, self.learner.learner_devices)
    _check(rem == 0, "num_envs", self.env.num_envs,
           f"must be divisible by --learner_devices={self.learner.learner_devices}")
    local_envs = per_device * self.rate.rollouts_per_update
    _check(local_envs % self.num_minibatches == 0, "num_minibatches", self.num_minibatches,
           f"must divide the envs per learner device per update ({local_envs})")
    on_policy = _on_policy()
    # NOTE: DQN learns from a replay, where a sample's lag at the update is not one rollout's;
    # weighting it would need per-sample versions in the replay.
    _check(self.rate.lag_weighting == "off" or self.learner.algo in on_policy,
           "lag_weighting", self.rate.lag_weighting,
           f"is for the on-policy algorithms ({', '.join(on_policy)}), not "
           f"--algo={self.learner.algo}")
    if self.distributed.enabled:
      _check(self.learner.algo in on_policy, "algo", self.learner.algo,
             f"multi-process training supports the on-policy algorithms ({', '.join(on_policy)}) "
             "only")

  @property
  def env_steps_per_rollout(self) -> int:
    return self.actor.rollout_len * self.env.num_envs

  @property
  def env_steps_per_update(self) -> int:
    return self.env_steps_per_rollout * self.rate.rollouts_per_update

  @staticmethod
  def flag_fields(algo: str | None = None) -> dict[str, dataclasses.Field]:
    """Every flag-settable field by name (the algorithm's too, when `algo` is given)."""
    algos = algorithm_configs()
    classes = list(COMPONENTS) + ([algos[algo]] if algo else list(algos.values()))
    out: dict[str, dataclasses.Field] = {}
    for cls in classes:
      for f in dataclasses.fields(cls):
        out.setdefault(f.name, f)
    return out

  @classmethod
  def from_flat(cls, values: dict[str, Any]) -> TrainConfig:
    """Routes each {flag: value} to the component that owns it; unknown names are errors."""
    algo = values.get("algo", LearnerConfig.algo)
    algos = algorithm_configs()
    _check(algo in algos, "algo", algo, f"must be one of {', '.join(algos)}")
    parts: dict[str, dict[str, Any]] = {}
    owners = {f.name: key for key, c in _component_keys(algo) for f in dataclasses.fields(c)}
    for name, value in values.items():
      if name not in owners:
        raise ConfigError(name, value, f"is not a setting of algorithm {algo!r}")
      parts.setdefault(owners[name], {})[name] = value
    built = {key: c(**parts.get(key, {})) for key, c in _component_keys(algo)}
    return cls(**built)

  def to_flat(self) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, _ in _component_keys(self.learner.algo):
      out.update(dataclasses.asdict(getattr(self, key)))
    return out

  def to_json(self) -> str:
    return json.dumps(self.to_flat(), sort_keys=True)


def _component_keys(algo: str) -> list[tuple[str, type]]:
  return [("env", EnvConfig), ("actor", ActorConfig), ("rate", RateConfig),
          ("network", NetworkConfig), ("learner", LearnerConfig),
          ("algo", algorithm_configs()[algo]), ("checkpoint", CheckpointConfig),
          ("distributed", DistributedConfig), ("run", RunConfig)]
