"""Algorithms as pure bundles (see base.py). `make_algorithm` picks one by `config.learner.algo`."""

from __future__ import annotations

from jaxrl_async.algos.base import Algorithm, Rollout
from jaxrl_async.config import TrainConfig
from jaxrl_async.envs import EnvSpec


def make_algorithm(config: TrainConfig, spec: EnvSpec, axis_name: str) -> Algorithm:
  name = config.learner.algo
  if name == "impala":
    from jaxrl_async.algos.impala import make_impala

    return make_impala(config, spec, axis_name)
  raise ValueError(f"unknown algorithm {name!r}")


__all__ = ["Algorithm", "Rollout", "make_algorithm"]
