"""Compile time of a preset's three programs (initial state, policy step, update), cold.

  python -m tools.compile_time [--preset=cartpole_impala] [--flags='{"num_epochs": 1}']

Each program is traced, lowered and compiled ahead of time from shapes, one after the other,
with the persistent compilation cache off; prints seconds for tracing + lowering and for XLA's
compile, and the number of fusions in the compiled program (a proxy for XLA:CPU's codegen work).
"""

from __future__ import annotations

import argparse
import json
import time


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--preset", default="cartpole_impala")
  parser.add_argument("--flags", default="{}", help="JSON dict of settings over the preset")
  args = parser.parse_args()

  from experiments.presets import preset
  from jaxrl_async.config import TrainConfig

  values = {**preset(args.preset), **json.loads(args.flags), "compilation_cache": False}
  config = TrainConfig.from_flat(values)
  from jaxrl_async.runtime import setup

  setup.configure_jax(config)
  import jax
  import numpy as np

  from jaxrl_async.algos.base import concat_rollouts
  from jaxrl_async.runtime.actor import compile_policy_step
  from jaxrl_async.runtime.learner import batch_shapes, skip_nonfinite
  from jaxrl_async.runtime.sharding import data_parallel, replicated
  from jaxrl_async.runtime.trainer import Trainer, validate

  spec = validate(config, None)
  trainer = Trainer(config, spec, None)
  abstract = trainer._abstract_state()
  update = skip_nonfinite(lambda s, r: trainer.algo.update(s, concat_rollouts(r)))
  programs = {
      "init": lambda: jax.jit(trainer._init_from_seed, out_shardings=replicated(trainer.mesh))
      .lower(np.int32(0)),
      "update": lambda: data_parallel(update, trainer.mesh).lower(
          abstract, batch_shapes(config, spec, trainer.algo, trainer.mesh)),
  }
  for name, lower in programs.items():
    t0 = time.perf_counter()
    lowered = lower()
    t1 = time.perf_counter()
    compiled = lowered.compile()
    t2 = time.perf_counter()
    print(f"{name}: trace+lower {t1 - t0:.2f} s, compile {t2 - t1:.2f} s, "
          f"{compiled.as_text().count('fusion(')} fusions")
  t0 = time.perf_counter()
  compiled = compile_policy_step(trainer.algo.make_policy(0), trainer.algo.actor_params(abstract),
                                 spec, config.env.batch_size, trainer.actor_device)
  print(f"policy: trace+lower+compile {time.perf_counter() - t0:.2f} s, "
        f"{compiled.as_text().count('fusion(')} fusions")


if __name__ == "__main__":
  main()
