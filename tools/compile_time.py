"""Compile time of a preset's three programs (initial state, policy step, update).

  python -m tools.compile_time [--preset=cartpole_impala] [--flags='{"num_epochs": 1}']
  python -m tools.compile_time --cache_dir=/tmp/ct   # twice: the second run is the warm start

Each program is lowered with the trainer's own functions (`build.trace_init`,
`actor.lower_policy_step`, `learner.lower_update`) and compiled with the trainer's options, one
after the other; prints seconds for tracing + lowering and for the compile, and the number of
fusions (a proxy for XLA:CPU's codegen work). Without --cache_dir JAX's persistent cache is off
(cold compiles). With it, the persistent cache is on in that folder and a first line takes the
three programs through the executable cache (runtime/executables.py), as the trainer does: the
first run compiles and stores them, a second loads them; the per-program lines that follow are
then served by XLA's persistent cache (a warm start without the executable cache).
"""

from __future__ import annotations

import argparse
import json
import time


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--preset", default="cartpole_impala")
  parser.add_argument("--flags", default="{}", help="JSON dict of settings over the preset")
  parser.add_argument("--cache_dir", default="", help="persistent cache folder (warm starts)")
  parser.add_argument("--default_init_options", action="store_true",
                      help="compile init with XLA's default options, not the trainer's")
  args = parser.parse_args()

  from experiments.presets import preset
  from jaxrl_async.config import TrainConfig

  cache = ({"compilation_cache_dir": args.cache_dir} if args.cache_dir
           else {"compilation_cache": False})
  config = TrainConfig.from_flat({**preset(args.preset), **json.loads(args.flags), **cache})
  from jaxrl_async.runtime import jax_config

  jax_config.configure_jax(config)
  from jaxrl_async.runtime.build import build, trace_init
  from jaxrl_async.runtime.learners.on_policy import lower_update
  from jaxrl_async.runtime.pipeline.policy_step import lower_policy_step
  from jaxrl_async.runtime.startup import RUN_ONCE_OPTIONS

  parts = build(config)
  spec = parts.spec
  traced = trace_init(parts)
  abstract = traced.out_info
  programs = {  # name -> (lower, compile options, devices)
      "init": (traced.lower, None if args.default_init_options else RUN_ONCE_OPTIONS,
               parts.hosts.learner_devices),
      "policy-0": (lambda: lower_policy_step(
          parts.algo.make_policy(0), parts.algo.actor_params(abstract), spec,
          config.env.batch_size, parts.actor_device), None, [parts.actor_device]),
      "update": (lambda: lower_update(config, spec, parts.algo, parts.mesh, abstract), None,
                 list(parts.mesh.devices.flat)),
  }
  if args.cache_dir:  # first: a miss here must compile (not be served by XLA's cache) to store
    t0 = time.perf_counter()
    for name, (lower, options, devices) in programs.items():
      parts.executables.compile(name, devices, lower, options)
    print(f"executable cache: {time.perf_counter() - t0:.2f} s for all three, loaded "
          f"{parts.executables.loaded or 'none (compiled and stored; run again)'}")
  for name, (lower, options, _) in programs.items():
    t0 = time.perf_counter()
    lowered = lower()
    t1 = time.perf_counter()
    compiled = lowered.compile(options)
    t2 = time.perf_counter()
    print(f"{name}: trace+lower {t1 - t0:.2f} s, compile {t2 - t1:.2f} s, "
          f"{compiled.as_text().count('fusion(')} fusions")

if __name__ == "__main__":
  main()
