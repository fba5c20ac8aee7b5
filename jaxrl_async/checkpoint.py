"""Checkpoints on orbax's CheckpointManager: train state plus counters, controller state and the
resolved config, saved asynchronously and atomically; optionally the off-policy replay too.

Layout: RUN_DIR/checkpoints/<version>/{state, meta[, replay]}. `replay` (--checkpoint_replay)
is the device-resident ring buffer with its write position, fill and sampling key; its host
counters (the samples-per-insert limiter's) are in `meta["replay"]`. Orbax writes each step
into a temporary folder and renames it when complete, so a save interrupted by a crash or
kill -9 never hides the previous checkpoint; `latest_step()` only lists complete ones. Typed
PRNG keys are stored as their raw key data and re-wrapped on restore (orbax stores plain
arrays).

A checkpoint damaged after its save (zeroed or truncated by a full disk, a file lost in a copy)
is never resumed from: `newest_readable_version` (which `latest_version`, `read_meta` and
`restore` follow) passes over each one that does not read back on the host, with a warning
saying why, and `restore` moves those newer than the one it restores to
RUN_DIR/checkpoints_damaged/. With none readable, a ConfigError names the run dir.

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
from absl import logging

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


# Names of the JSON files orbax writes in a step's folder: damage (zeroed, truncated) shows
# as a parse error before anything slower is tried.
_JSON_NAMES = ("_CHECKPOINT_METADATA", "_METADATA", "_sharding", "metadata")
# Where `restore` moves the damaged checkpoints it skipped, beside RUN_DIR/checkpoints.
DAMAGED_DIR = "checkpoints_damaged"


def _why(e: BaseException) -> str:
  """An exception as one short line."""
  text = " ".join(str(e).split())
  return f"{type(e).__name__}: {text[:300]}"


def _problem(step: Path, version: int) -> str | None:
  """Why the checkpoint in folder `step` would not restore, or None (see Checkpointer.problem)."""
  meta_path = step / "meta" / "metadata"
  if not meta_path.is_file():
    return "meta/metadata is missing"
  for path in sorted(step.rglob("*")):
    if path.relative_to(step).parts[0] == "replay":
      continue  # restore_replay's to judge: a damaged replay costs only the replay
    if path.is_file() and (path.name in _JSON_NAMES or path.parent.name == "array_metadatas"):
      try:
        json.loads(path.read_text(errors="replace"))
      except ValueError as e:
        return f"{path.relative_to(step)}: {_why(e)}"
  meta = json.loads(meta_path.read_text())
  if not isinstance(meta, dict) or meta.get("version") != version:
    return f"meta/metadata is not version {version}'s"
  if not (step / "state").is_dir():
    return "state/ is missing"
  why = _problem_reading(step / "state")
  return None if why is None else f"state/: {why}"


def _problem_reading(item: Path) -> str | None:
  """Why the pytree saved in folder `item` does not read back on the host, or None."""
  try:
    read_on_host(item)
  except Exception as e:  # noqa: BLE001 - whatever the reason, it does not read back
    return _why(e)
  return None


def read_on_host(item: Path) -> Any:
  """The pytree saved in a checkpoint's item folder (RUN_DIR/checkpoints/<version>/state, say)
  as numpy arrays: every array read and decoded as a restore would, none placed on a device."""
  import numpy as np
  import orbax.checkpoint as ocp
  from etils import epath

  handler = ocp.PyTreeCheckpointHandler()
  try:
    tree = handler.metadata(epath.Path(item)).tree
    as_numpy = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
    return handler.restore(epath.Path(item), args=ocp.args.PyTreeRestore(restore_args=as_numpy))
  finally:
    handler.close()


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
    self._problems: dict[int, str | None] = {}  # version -> why it does not restore
    self.skipped: dict[int, str] = {}  # damaged versions newest_readable_version passed over
    self.save_s = 0.0  # time the caller (the learner) was blocked by saves

  @property
  def last_saved_version(self) -> int | None:
    """The version this session saved last (None before its first save)."""
    return self._last_save_version

  @property
  def manager(self) -> Any:
    if self._manager is None:
      import orbax.checkpoint as ocp

      self.directory.mkdir(parents=True, exist_ok=True)
      options = ocp.CheckpointManagerOptions(
          max_to_keep=self.keep, enable_async_checkpointing=self.use_async, create=True)
      self._manager = ocp.CheckpointManager(self.directory, options=options)
    return self._manager

  def due(self, version: int, agreed: bool = False) -> bool:
    """Whether to save `version`: by update count, by time, or `agreed` by every process."""
    if version == self._last_save_version:
      return False
    by_updates = self.every_updates and version % self.every_updates == 0
    by_time = self.every_s and time.time() - self._last_save_t >= self.every_s
    return bool(by_updates or by_time or agreed)

  def save(self, version: int, state: Any, meta: dict[str, Any], replay: Any = None) -> None:
    """Starts an asynchronous save; returns once the arrays are copied off the devices.

    `replay`, when given, is saved as a third item; its host counters belong in `meta`.
    """
    import orbax.checkpoint as ocp

    t0 = time.perf_counter()
    self._problems.pop(version, None)  # a version set aside as damaged can be saved anew
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

  def resume_candidates(self) -> list[int]:
    """The versions of the complete checkpoints here, newest first, from folder names alone
    (nothing is read: `problem` says whether one restores)."""
    if not self.directory.is_dir():
      return []
    return sorted((int(p.name) for p in self.directory.iterdir()
                   if p.name.isdigit() and p.is_dir()), reverse=True)

  def problem(self, version: int) -> str | None:
    """Why checkpoint `version` would not restore, or None when it reads back: its meta and
    orbax's JSON files parse and its state decodes on the host (every array read and
    decompressed, none placed on a device). Its replay is not read (a replay alone damaged
    costs the replay, not the checkpoint: see `restore_replay`). Checked once per version."""
    if version not in self._problems:
      self._problems[version] = _problem(self.directory / str(version), version)
    return self._problems[version]

  def newest_readable_version(self) -> int | None:
    """The version to resume from: the newest checkpoint without a `problem`; each newer one
    is skipped with a warning saying why. None when there is no complete checkpoint; a
    ConfigError (one line naming the run dir, exit status 2) when none of them reads back."""
    candidates = self.resume_candidates()
    for version in candidates:
      why = self.problem(version)
      if why is None:
        return version
      if version not in self.skipped:
        self.skipped[version] = why
        logging.warning("checkpoint %d in %s is skipped, it does not restore: %s", version,
                        self.directory, why)
    if candidates:
      newest = candidates[0]
      raise ConfigError("run_dir", str(self.directory.parent),
                        f"none of its {len(candidates)} checkpoints restores (the newest, "
                        f"{newest}: {self.skipped[newest]})")
    return None

  def latest_version(self) -> int | None:
    """The same as `newest_readable_version`: a damaged checkpoint is never the latest."""
    return self.newest_readable_version()

  def restore(self, abstract_state: Any, version: int | None = None
              ) -> tuple[Any, dict[str, Any]] | None:
    """Checkpoint `version`, or without one the `newest_readable_version`, as (state, meta),
    restored onto `abstract_state`'s shardings; None if there is no checkpoint.

    Without `version`, the newer checkpoints that were skipped as damaged are then moved to
    RUN_DIR/checkpoints_damaged/ (kept for a look, out of orbax's sight): the resumed run will
    save those versions again, and orbax refuses a step that exists. meta["version"] says which
    checkpoint was restored."""
    if version is None:
      version = self.newest_readable_version()
      if version is None:
        return None
      # NOTE: before orbax's manager lists the steps (it logs an error for each it cannot
      # parse); the skipped ones are damaged whether or not this restore succeeds.
      self._set_aside([v for v in self.skipped if v > version])
    return self._restore(abstract_state, version)

  def _restore(self, abstract_state: Any, version: int) -> tuple[Any, dict[str, Any]]:
    import orbax.checkpoint as ocp

    restored = self.manager.restore(version, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(_abstract_savable(abstract_state)),
        meta=ocp.args.JsonRestore()))
    return _from_saved(restored["state"], abstract_state), dict(restored["meta"])

  def _set_aside(self, versions: list[int]) -> None:
    if not versions:
      return
    aside = self.directory.parent / DAMAGED_DIR
    aside.mkdir(exist_ok=True)
    for version in versions:
      target, n = aside / str(version), 1
      while target.exists():
        n += 1
        target = aside / f"{version}-{n}"
      try:
        (self.directory / str(version)).rename(target)
      except FileNotFoundError:  # another process of a multi-process run moved it first
        pass
      else:
        logging.warning("damaged checkpoint %d moved to %s", version, target)
      self._problems.pop(version, None)
      self.skipped.pop(version)
    if self._manager is not None:
      self._manager.reload()  # its list of steps still names the moved ones

  def restore_replay(self, abstract_replay: Any, version: int | None = None
                     ) -> tuple[Any, dict[str, Any]] | None:
    """(replay, its host counters) saved with the newest readable checkpoint (or `version`),
    restored onto `abstract_replay`'s shardings; None if that checkpoint holds no replay, or
    (with a warning) if its replay is damaged: the run then starts an empty one."""
    import orbax.checkpoint as ocp

    meta = self.read_meta(version)
    if meta is None or "replay" not in meta:
      return None
    version = int(meta["version"])
    try:
      restored = self.manager.restore(version, args=ocp.args.Composite(
          replay=ocp.args.StandardRestore(_abstract_savable(abstract_replay))))
    except Exception:
      # NOTE: only damage the host can see too is forgiven; any other failure (a device out
      # of memory, say) is the caller's to see.
      why = _problem_reading(self.directory / str(version) / "replay")
      if why is None:
        raise
      logging.warning("the replay of checkpoint %d in %s does not restore (%s): starting an "
                      "empty replay", version, self.directory, why)
      return None
    return _from_saved(restored["replay"], abstract_replay), dict(meta["replay"])

  def read_meta(self, version: int | None = None) -> dict[str, Any] | None:
    """The meta (counters, config) of checkpoint `version`, or without one of the
    `newest_readable_version` (None if there is no checkpoint). A ConfigError names a
    `version` that does not restore."""
    if version is None:
      version = self.newest_readable_version()
      if version is None:
        return None
    elif (why := self.problem(version)) is not None:
      raise ConfigError("run_dir", str(self.directory.parent),
                        f"its checkpoint {version} does not restore: {why}")
    return json.loads((self.directory / str(version) / "meta" / "metadata").read_text())

  def wait(self) -> None:
    if self._manager is not None:
      self._manager.wait_until_finished()

  def close(self) -> None:
    if self._manager is not None:
      self._manager.wait_until_finished()
      self._manager.close()


def check_layout(meta: dict[str, Any], layout: int, flag: str = "resume", value: Any = True,
                 instead: str = "resume it with the version that wrote it, or start a new "
                 "--run_dir") -> None:
  """Refuses a checkpoint whose train state has another layout than `layout` (the algorithm's
  now, algos/registry.py): it would not restore. Checkpoints from before the field existed are
  layout 1. The ConfigError names `flag` (with `value`) and says what to do `instead`."""
  saved = meta.get("state_layout", 1)
  if saved != layout:
    raise ConfigError(flag, value,
                      f"checkpoint {meta.get('version')} holds a train state of layout {saved}, "
                      f"this version's --algo={meta['config'].get('algo')} has layout {layout} "
                      f"(algos/registry.py): {instead}")


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
