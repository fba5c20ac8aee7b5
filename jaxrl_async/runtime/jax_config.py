"""Process-wide JAX settings, applied once before anything is compiled."""

from __future__ import annotations

import os
from pathlib import Path

from jaxrl_async.config import TrainConfig


def default_cache_dir() -> Path:
  return Path(os.environ.get("JAXRL_ASYNC_CACHE", Path.home() / ".cache" / "jaxrl_async" / "xla"))


def configure_jax(config: TrainConfig) -> None:
  """PRNG implementation and the persistent compilation cache (on by default: most of a short
  run is compilation here); then a warning when the host shows a GPU or TPU that JAX does not use
  (`accelerator.warn_if_cpu_fallback`)."""
  import jax

  # NOTE: must precede the first key; rbg's init and split compile faster than threefry's.
  jax.config.update("jax_default_prng_impl", config.run.prng_impl)
  if config.run.compilation_cache:
    path = Path(config.run.compilation_cache_dir or default_cache_dir())
    path.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(path))
    # Cache every compiled function, even fast ones: the run's few functions all matter.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  # Asking JAX for its backend initializes it, which must wait for `jax.distributed.initialize`:
  # a multi-process run checks after joining its cluster (experiments/train.py).
  if not config.distributed.enabled:
    from jaxrl_async.runtime.accelerator import warn_if_cpu_fallback

    warn_if_cpu_fallback()
