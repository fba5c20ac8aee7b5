"""Algorithms as pure bundles (see base.py). `make_algorithm` picks one by `config.learner.algo`.

Kept free of module-level imports so that importing a config never pays for JAX.
"""

from __future__ import annotations

import importlib
from typing import Any

# name -> (module, factory); each factory is make(config, env_spec, axis_name) -> Algorithm.
_FACTORIES = {
    "impala": ("jaxrl_async.algos.impala", "make_impala"),
    "ppo": ("jaxrl_async.algos.ppo", "make_ppo"),
    "dqn": ("jaxrl_async.algos.dqn", "make_dqn"),
}


def make_algorithm(config: Any, spec: Any, axis_name: str) -> Any:
  module, factory = _FACTORIES[config.learner.algo]
  return getattr(importlib.import_module(module), factory)(config, spec, axis_name)
