"""`python -m tools.soak_child [experiments.train flags]`: the training process of a soak
(tools/soak.py), which is experiments.train with three additions made from outside the runtime:

- SOAK_FAULT_AFTER_S=S: one actor raises once, S seconds after the run's first rollout (as a
  bad env step or a driver error would); the run's --actor_restarts has to recover it.
- SOAK_EVENTS=PATH: JSON lines for the soak to check: the fault, the checkpoint the session
  restored (version, counters), whether its replay came back, and each checkpoint save.
- SOAK_SAMPLE_S=S: device memory (`memory_stats()` of the first local device) every S seconds
  into SOAK_EVENTS; null where the device reports none (the CPU backend does not).
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

_LOCK = threading.Lock()


def event(kind: str, **fields: Any) -> None:
  path = os.environ.get("SOAK_EVENTS")
  if not path:
    return
  line = json.dumps({"event": kind, "t": time.time(), "pid": os.getpid(), **fields})
  with _LOCK, open(path, "a") as f:
    f.write(line + "\n")


def _actor_class() -> Any:
  try:  # the runtime is being reorganised: the actor has lived in both places
    from jaxrl_async.runtime.pipeline.actor import Actor
  except ImportError:
    from jaxrl_async.runtime.actor import Actor
  return Actor


def inject_actor_fault(after_s: float) -> None:
  """The first actor to emit a rollout `after_s` seconds after the first one raises, once."""
  actor_cls = _actor_class()
  emit, state = actor_cls._emit, {"t0": None, "done": False}

  def faulty_emit(self, *args: Any, **kwargs: Any) -> Any:
    with _LOCK:
      now = time.time()
      state["t0"] = state["t0"] or now
      fire = not state["done"] and now - state["t0"] >= after_s
      state["done"] = state["done"] or fire
    if fire:
      event("fault", actor=self.index)
      raise RuntimeError(f"soak: injected fault in actor {self.index}")
    return emit(self, *args, **kwargs)

  actor_cls._emit = faulty_emit


def record_checkpoints() -> None:
  """Events for what the session restored (the checkpoint's version and counters, the replay)
  and for each save it started."""
  from jaxrl_async.checkpoint import Checkpointer

  save, restore, restore_replay = Checkpointer.save, Checkpointer.restore, \
      Checkpointer.restore_replay

  def recorded_save(self, version: int, *args: Any, **kwargs: Any) -> Any:
    event("saved", version=int(version))
    return save(self, version, *args, **kwargs)

  def recorded_restore(self, *args: Any, **kwargs: Any) -> Any:
    out = restore(self, *args, **kwargs)
    if out is not None:
      meta = out[1]
      event("restored", version=int(meta["version"]), counters=meta.get("counters"))
    return out

  def recorded_restore_replay(self, *args: Any, **kwargs: Any) -> Any:
    out = restore_replay(self, *args, **kwargs)
    event("replay_restored", ok=out is not None)
    return out

  Checkpointer.save, Checkpointer.restore = recorded_save, recorded_restore
  Checkpointer.restore_replay = recorded_restore_replay


def sample_device_memory(every_s: float) -> None:
  """A daemon thread: device memory in use every `every_s` seconds, once JAX has a backend
  (asking earlier would start one before the launcher configures JAX)."""
  from jax._src import xla_bridge

  def loop() -> None:
    while not xla_bridge.backends_are_initialized():
      time.sleep(every_s)
    import jax

    while True:
      stats = jax.local_devices()[0].memory_stats()
      stats = stats or {}  # None on CPU
      event("device_memory", bytes_in_use=stats.get("bytes_in_use"),
            peak_bytes_in_use=stats.get("peak_bytes_in_use"))
      time.sleep(every_s)

  threading.Thread(target=loop, name="soak-device-memory", daemon=True).start()


def main() -> None:
  from absl import app

  from experiments import train
  from experiments.cli import parse_flags

  if os.environ.get("SOAK_FAULT_AFTER_S"):
    inject_actor_fault(float(os.environ["SOAK_FAULT_AFTER_S"]))
  record_checkpoints()
  if os.environ.get("SOAK_SAMPLE_S"):
    sample_device_memory(float(os.environ["SOAK_SAMPLE_S"]))
  app.run(train.main, flags_parser=parse_flags)


if __name__ == "__main__":
  main()
