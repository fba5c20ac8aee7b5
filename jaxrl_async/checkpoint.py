"""Checkpoints on orbax's CheckpointManager: train state plus counters, controller state and the
resolved config, saved asynchronously and atomically; optionally the off-policy replay too.

Layout: RUN_DIR/checkpoints/<version>/{state, meta[, replay]}. `replay` (--checkpoint_replay)
is the device-resident ring buffer with its write position, fill and sampling key; its host
counters (the samples-per-insert limiter's) are in `meta["replay"]`. Orbax writes each step
into a temporary folder and renames it when complete, so a save interrupted by a crash or
kill -9 never hides the previous checkpoint; `latest_step()` only lists complete ones. Typed
PRNG keys are stored as their raw key data and re-wrapped on restore (orbax stores plain
arrays).

orbax is imported on first use: it costs over a second to import here, which a short run that
never checkpoints should not pay.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from jaxrl_async.config import ConfigError

# Fields a resumed run must share with its checkpoint: they shape the params or the data.
COMPATIBILITY_FIELDS = ("algo", "env_id", "network", "hidden_sizes", "activation", "shared_torso",
                        "frame_stack", "prng_impl", "normalize_obs")
# Fields a run restoring a checkpointed replay must share with it: they shape the buffer
# (capacity, column length and count, its split over devices) or what its stored values mean.
REPLAY_FIELDS = ("replay_size", "rollout_len", "num_envs", "learner_devices", "discount",
                 "n_step")


def _is_key(x: Any) -> bool:
  return hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jax.dtypes.prng_key)


def _to_savable(tree: Any) -> Any:
  return jax.tree.map(lambda x: jax.random.key_data(x) if _is_key(x) else x, tree)


def _abstract_savable(abstract: Any) -> Any:
  def convert(x):
    if _is_key(x):
      data = jax.eval_shape(jax.random.key_data, x)
      return jax.ShapeDtypeStruct(data.shape, data.dtype, sharding=x.sharding)
    return x
  return jax.tree.map(convert, abstract)


def _from_saved(tree: Any, abstract: Any) -> Any:
  def convert(x, a):
    if _is_key(a):
      # NOTE: the key type's impl is only reachable through the dtype for abstract keys.
      return jax.random.wrap_key_data(x, impl=a.dtype._impl)
    return x
  return jax.tree.map(convert, tree, abstract)


class Checkpointer:
  """Saves every `every_s` seconds and/or `every_updates` versions, keeps the last `keep`."""

  def __init__(self, run_dir: Path, keep: int = 3, every_s: float = 0.0,
               every_updates: int = 0, use_async: bool = True):
    self.directory = Path(run_dir).resolve() / "checkpoints"
    self.keep, self.every_s, self.every_updates = keep, every_s, every_updates
    self.use_async = use_async
    self._manager: Any = None
    self._last_save_t = time.time()
    self._last_save_version: int | None = None
    self.saves = 0
    self.save_s = 0.0  # time the caller (the learner) was blocked by saves

  @property
  def manager(self) -> Any:
    if self._manager is None:
      import orbax.checkpoint as ocp

      self.directory.mkdir(parents=True, exist_ok=True)
      options = ocp.CheckpointManagerOptions(
          max_to_keep=self.keep, enable_async_checkpointing=self.use_async, create=True)
      self._manager = ocp.CheckpointManager(self.directory, options=options)
    return self._manager

  def due(self, version: int) -> bool:
    if version == self._last_save_version:
      return False
    by_updates = self.every_updates and version % self.every_updates == 0
    by_time = self.every_s and time.time() - self._last_save_t >= self.every_s
    return bool(by_updates or by_time)

  def save(self, version: int, state: Any, meta: dict[str, Any], replay: Any = None) -> None:
    """Starts an asynchronous save; returns once the arrays are copied off the devices.

    `replay`, when given, is saved as a third item; its host counters belong in `meta`.
    """
    import orbax.checkpoint as ocp

    t0 = time.perf_counter()
    items = {"state": ocp.args.StandardSave(_to_savable(state)), "meta": ocp.args.JsonSave(meta)}
    if replay is not None:
      items["replay"] = ocp.args.StandardSave(_to_savable(replay))
    args = ocp.args.Composite(**items)
    self.manager.save(version, args=args, force=True)
    self._last_save_t, self._last_save_version = time.time(), version
    self.saves += 1
    self.save_s += time.perf_counter() - t0

  def has_checkpoints(self) -> bool:
    """Whether a complete checkpoint is here, without importing orbax (orbax names a complete
    step's folder by its number; unfinished ones carry a suffix)."""
    return self.directory.is_dir() and any(p.name.isdigit() for p in self.directory.iterdir())

  def latest_version(self) -> int | None:
    if not self.directory.exists():
      return None
    return self.manager.latest_step()

  def restore(self, abstract_state: Any, version: int | None = None
              ) -> tuple[Any, dict[str, Any]] | None:
    """The newest complete checkpoint (or `version`) as (state, meta), or None if none."""
    import orbax.checkpoint as ocp

    version = self.latest_version() if version is None else version
    if version is None:
      return None
    restored = self.manager.restore(version, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(_abstract_savable(abstract_state)),
        meta=ocp.args.JsonRestore()))
    return _from_saved(restored["state"], abstract_state), dict(restored["meta"])

  def restore_replay(self, abstract_replay: Any, version: int | None = None
                     ) -> tuple[Any, dict[str, Any]] | None:
    """(replay, its host counters) saved with the newest checkpoint (or `version`), restored
    onto `abstract_replay`'s shardings; None if that checkpoint holds no replay."""
    import orbax.checkpoint as ocp

    meta = self.read_meta(version)
    if meta is None or "replay" not in meta:
      return None
    version = int(meta["version"]) if version is None else version
    restored = self.manager.restore(version, args=ocp.args.Composite(
        replay=ocp.args.StandardRestore(_abstract_savable(abstract_replay))))
    return _from_saved(restored["replay"], abstract_replay), dict(meta["replay"])

  def read_meta(self, version: int | None = None) -> dict[str, Any] | None:
    """The meta (counters, config) of a checkpoint without restoring arrays."""
    version = self.latest_version() if version is None else version
    if version is None:
      return None
    path = self.directory / str(version) / "meta" / "metadata"
    if path.exists():
      return json.loads(path.read_text())
    import orbax.checkpoint as ocp

    restored = self.manager.restore(version, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
    return dict(restored["meta"])

  def wait(self) -> None:
    if self._manager is not None:
      self._manager.wait_until_finished()

  def close(self) -> None:
    if self._manager is not None:
      self._manager.wait_until_finished()
      self._manager.close()


def check_compatible(saved: dict[str, Any], current: dict[str, Any],
                     with_replay: bool = False) -> None:
  """Refuses to resume with a config that changes the params' shapes or the data, or, when
  `with_replay` (the checkpoint's replay is to be restored), the replay's."""
  for name in COMPATIBILITY_FIELDS:
    if name in saved and saved.get(name) != current.get(name):
      raise ConfigError(name, current.get(name),
                        f"differs from the checkpoint's {saved.get(name)!r}; --resume needs the "
                        "same value")
  for name in REPLAY_FIELDS if with_replay else ():
    if name in saved and saved.get(name) != current.get(name):
      raise ConfigError(name, current.get(name),
                        f"differs from the checkpoint's {saved.get(name)!r}; --resume with "
                        "--checkpoint_replay restores its replay and needs the same value (or "
                        "resume without --checkpoint_replay to start an empty replay)")
