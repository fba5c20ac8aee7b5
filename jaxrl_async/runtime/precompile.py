"""`--compile_only`: a run's programs compiled into the compilation cache, and nothing run.

A run on a cold cache compiles its programs at start-up, and --balance=auto compiles each new
rollouts-per-update (U) in the background while the run goes on. On this 2-core host that
background compile takes a core from the actors: a CartPole run at K = 1 made 16k env steps/s
instead of 29k for the 2 s it lasted, inside a 4-s solve (BUILD_NOTES.md, "Warm programs").
Compiling them first (on a login node before a cluster job, or before a benchmark's measured
runs) makes every later run of the config start warm, whatever its seed, cap or balance mode:
those never reach a program (runtime/executables.py's HOST_ONLY_FIELDS).
"""

from __future__ import annotations

import time
from typing import Any

from jaxrl_async.runtime.pipeline.balancer import make_bounds


def _other_us(trainer: Any) -> list[int]:
  """Under --balance=auto, the U values other than the configured one it may choose."""
  cfg, parts = trainer.config, trainer.parts
  if cfg.rate.balance != "auto":
    return []
  bounds = make_bounds(cfg, parts.algo, parts.cluster is not None)
  return [u for u in bounds.u_choices if u != cfg.rate.rollouts_per_update]


def precompile(trainer: Any) -> dict[str, Any]:
  """Compiles (or loads) every program a run of `trainer`'s config compiles at start-up, by the
  run's own paths (`Trainer.compile_programs`, so the cache keys are the run's), and auto's
  other U values; returns the seconds taken and the names the executable cache served rather
  than compiled."""
  t0 = time.perf_counter()
  programs = trainer.compile_programs(_other_us(trainer))
  return {"seconds": time.perf_counter() - t0, "programs": programs,
          "loaded": sorted(trainer.parts.executables.loaded)}
