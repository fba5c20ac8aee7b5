"""Algorithms as pure bundles (see base.py), chosen by name (`--algo`) in registry.py.

Free of JAX at import: the registry and each algorithm's settings are read by the config
layer and the launcher's flags; a factory and JAX are imported when an algorithm is built.
"""

from jaxrl_async.algos.registry import (
  ALGORITHMS,
  check,
  is_off_policy,
  make_algorithm,
  state_layout,
)

__all__ = ["ALGORITHMS", "check", "is_off_policy", "make_algorithm", "state_layout"]
