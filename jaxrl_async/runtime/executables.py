"""Compiled programs kept on disk between runs, so a warm start skips tracing and lowering.

JAX's persistent compilation cache skips XLA's compile, but its key is the lowered program, so a
warm run still traces and lowers every function first: for `cartpole_impala` on this 2-core
machine 0.61 s for the three programs, against 0.14 s to load them serialised
(`python -m tools.compile_time --cache_dir=DIR`, run twice; BUILD_NOTES.md, issue 3). This
cache keys an executable by what determines it without tracing: the package's source, the
library versions, the devices, the resolved config (less the fields that never reach a
program) and the program's name.

It lives beside XLA's cache (`<its directory>/executables`), is on where that cache is
configured (`runtime/jax_config.py`; `--compilation_cache=false` turns both off), and serves
single-process runs only (a multi-process program also depends on the other hosts).
A file that fails to load is removed and the program compiled again. Like any pickle, the files
are trusted: they are this user's own cache.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import pickle
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
from absl import logging

from jaxrl_async.config import TrainConfig

# Fields that only the host reads (threads, rate control, checkpoints, logging, stopping): runs
# that differ only in them run the same programs and share one entry, e.g. every cap K of a lag
# sweep. tests/test_executables.py checks that changing all of them leaves the lowered init,
# policy and update of IMPALA, PPO and DQN unchanged. The seed reaches the initial state as an
# argument, and the actors' keys are made in numpy.
HOST_ONLY_FIELDS = (
    "seed", "run_dir", "resume", "compilation_cache", "compilation_cache_dir", "env_threads",
    "max_policy_lag", "free_running", "queue_capacity", "balance", "target_lag", "target_idle",
    "target_blocked",
    "balance_every_s", "checkpoint_every_s", "checkpoint_every_updates", "keep_checkpoints",
    "checkpoint_at_end", "checkpoint_replay", "stop_at_return", "return_window", "log_every_s",
    "max_wall_s", "logger", "actor_restarts", "max_nonfinite_updates")
_PACKAGE_ROOT = Path(__file__).resolve().parents[1]
_LIBRARIES = ("jax", "jaxlib", "flax", "optax", "rlax", "chex", "numpy")


@functools.cache
def _environment_digest() -> str:
  """The package's source and the library versions: any change makes every key new."""
  h = hashlib.sha256()
  for path in sorted(_PACKAGE_ROOT.rglob("*.py")):
    h.update(str(path.relative_to(_PACKAGE_ROOT)).encode())
    h.update(path.read_bytes())
  for name in _LIBRARIES:
    try:
      h.update(f"{name}={importlib.metadata.version(name)}".encode())
    except importlib.metadata.PackageNotFoundError:
      h.update(f"{name}=absent".encode())
  return h.hexdigest()


_local = threading.local()


@functools.cache
def _watch_persistent_cache() -> None:
  """Counts, per thread, the programs JAX's persistent cache served (JAX records the event in
  the compiling thread)."""

  def listener(event: str, **kwargs: Any) -> None:
    if event == "/jax/compilation_cache/cache_hits":
      _local.xla_cache_hits = getattr(_local, "xla_cache_hits", 0) + 1

  jax.monitoring.register_event_listener(listener)


def _initialize_lapack() -> None:
  """JAX sets up its LAPACK kernels while lowering a program that uses one; a loaded program
  was never lowered here, so without this its first QR (the orthogonal initialiser in the
  initial state) calls through a null pointer and the process dies."""
  from jax._src.lax import linalg

  linalg.initialize_lapack()


class ExecutableCache:
  """`compile(name, devices, lower)`: the cached executable, or `lower().compile()` stored."""

  def __init__(self, directory: Path | None, config: TrainConfig):
    self.directory = directory
    flat = {k: v for k, v in config.to_flat().items() if k not in HOST_ONLY_FIELDS}
    self._config_key = json.dumps(flat, sort_keys=True, default=str)
    self.loaded: list[str] = []  # names served from the cache in this run

  @classmethod
  def for_config(cls, config: TrainConfig) -> ExecutableCache:
    """On where JAX's persistent cache is (`setup.configure_jax`), in one process only."""
    xla_dir = jax.config.jax_compilation_cache_dir
    # NOTE: not jax.process_count(): it would start the backend before jax.distributed does.
    on = bool(xla_dir) and config.run.compilation_cache and not config.distributed.enabled
    return cls(Path(xla_dir) / "executables" if on else None, config)

  def key(self, name: str, devices: Sequence[jax.Device], options: dict | None) -> str:
    h = hashlib.sha256(_environment_digest().encode())
    h.update(self._config_key.encode())
    h.update(json.dumps([name, sorted((options or {}).items())], default=str).encode())
    h.update(repr([(d.platform, d.device_kind, d.id) for d in devices]).encode())
    h.update(str(jax.devices()[0].client.platform_version).encode())
    h.update(os.environ.get("XLA_FLAGS", "").encode())  # code generation options
    return h.hexdigest()[:32]

  def compile(self, name: str, devices: Sequence[jax.Device], lower: Callable[[], Any],
              options: dict | None = None) -> Any:
    """The executable of `lower()` (a thunk, so a hit never traces) on `devices`."""
    if self.directory is None:
      return lower().compile(options)
    from jax.experimental import serialize_executable

    path = self.directory / f"{name}-{self.key(name, devices, options)}.pkl"
    if path.exists():
      try:
        _initialize_lapack()
        payload, in_tree, out_tree = pickle.loads(path.read_bytes())
        compiled = serialize_executable.deserialize_and_load(
            payload, in_tree, out_tree, execution_devices=list(devices))
        self.loaded.append(name)
        return compiled
      except Exception as e:  # noqa: BLE001 - a bad cache file costs a compile, nothing more
        logging.warning("executable cache: %s did not load (%s); compiling", path.name, e)
        path.unlink(missing_ok=True)
    _watch_persistent_cache()
    hits_before = getattr(_local, "xla_cache_hits", 0)
    compiled = lower().compile(options)
    if getattr(_local, "xla_cache_hits", 0) != hits_before:
      # NOTE: an executable that JAX's persistent cache served serialises without its kernels:
      # it loads, then fails when called ("Function ... not found"). Only a program compiled
      # here is stored. (Turning that cache off around this compile does not work: JAX decides
      # once per process whether it uses the cache.)
      return compiled
    try:
      self._store(path, pickle.dumps(serialize_executable.serialize(compiled)))
    except Exception as e:  # noqa: BLE001 - not every executable serialises; it still runs
      logging.warning("executable cache: %s not stored (%s)", name, e)
    return compiled

  def _store(self, path: Path, blob: bytes) -> None:
    # Written under a temporary name and renamed: concurrent runs never read half a file.
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "wb") as f:
      f.write(blob)
    os.replace(tmp, path)
