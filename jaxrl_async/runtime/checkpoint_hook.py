"""When and what the learner checkpoints: the state, the counters and controller state that go
with it, and the replay its step holds (--checkpoint_replay)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import jax

from jaxrl_async.algos import state_layout
from jaxrl_async.checkpoint import Checkpointer
from jaxrl_async.metrics import EpisodeStats, wall_s


class CheckpointHook:
  """`hook(version, state)` runs in the learner thread after each update and saves when the
  checkpointer says one is due; `final(...)` saves the run's end. Both run in the learner thread
  or after it ended, so a step's replay snapshot and the state always agree.

  `start()` gives the session's start (a resume sets it while the learner compiles, so it is
  read at save time).
  """

  def __init__(self, checkpointer: Checkpointer, config: Any, step: Any, controller: Any,
               env_steps: Callable[[], int], stats: EpisodeStats, start: Callable[[], Any]):
    self.checkpointer, self.config, self.step = checkpointer, config, step
    self.controller, self.env_steps, self.stats, self.start = controller, env_steps, stats, start

  def __call__(self, version: int, state: Any) -> None:
    if self.checkpointer.due(version, self.step.save_agreed(version)):
      self._save(version, state, self._meta(version))

  def _meta(self, version: int) -> dict[str, Any]:
    return {
        "version": version,
        "counters": {"env_steps": self.env_steps(),
                     "episodes": self.start().episodes + self.stats.episodes,
                     "wall_s_total": self.start().wall_s_total + wall_s(),
                     **self.step.counters()},
        "controller": self.controller.state_dict(),
        "config": self.config.to_flat(),
        "state_layout": state_layout(self.config.learner.algo),
        "saved_at": time.time(),
    }

  def _save(self, version: int, state: Any, meta: dict[str, Any]) -> None:
    snapshot = self.step.snapshot() if self.config.checkpoint.checkpoint_replay else None
    if snapshot is None:
      self.checkpointer.save(version, state, meta)
    else:
      replay, counters = snapshot
      self.checkpointer.save(version, state, meta | {"replay": counters}, replay=replay)

  def final(self, version: int, state: Any, failed: bool) -> None:
    """The end-of-run checkpoint (--checkpoint_at_end), then waits for every save to finish."""
    ck = self.checkpointer
    state_ready = not any(isinstance(leaf, jax.ShapeDtypeStruct)
                          for leaf in jax.tree.leaves(state))
    if self.config.checkpoint.checkpoint_at_end and state_ready and version > 0:
      # After a failure the learner's state is still its last good one (non-finite updates
      # are skipped), so it is saved too. A resumed session that made no update leaves the
      # checkpoint it started from as it is: orbax never overwrites a step, and deleting it
      # first would open a window with no checkpoint at all.
      if version not in (ck.last_saved_version, self.start().resumed_from):
        self._save(version, state, self._meta(version) | {"failed": failed})
    ck.close()
