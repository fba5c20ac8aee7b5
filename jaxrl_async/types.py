"""Shared type aliases, so signatures read the same everywhere."""

from typing import Any

import jax
import numpy as np

Array = jax.Array
PRNGKey = jax.Array
Params = Any  # a pytree of arrays
Metrics = dict[str, Array]
HostArray = np.ndarray
