"""Times one global learner update over 2 processes on this machine, against one process.

  python -m tools.multihost_step [--preset=cartpole_impala] [--steps=50]

Starts two worker processes on 127.0.0.1 (one CPU device each, gloo collectives) that run the
preset's global update (`learners.global_step.compile_global_update`) on a fixed random batch, and
a third, single process that runs `learners.on_policy.compile_update` on the same batch; prints
milliseconds per update for each. No actors: this isolates the cost of the collectives.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time


def _worker(preset: str, steps: int, mode: str, process_id: int, port: int) -> None:
  os.environ["JAX_PLATFORMS"] = "cpu"
  import jax
  import numpy as np

  from experiments.presets import preset as preset_values
  from jaxrl_async import envs
  from jaxrl_async.algos import make_algorithm
  from jaxrl_async.algos.base import Rollout
  from jaxrl_async.config import TrainConfig
  from jaxrl_async.runtime.sharding import LEARNER_AXIS, put_batch, replicated

  values = preset_values(preset)
  if mode == "multi":
    values.update(num_processes=2, process_id=process_id,
                  coordinator_address=f"127.0.0.1:{port}")
  cfg = TrainConfig.from_flat(values)
  if mode == "multi":
    from jaxrl_async.runtime.cluster import hosts

    hosts.initialize(cfg.distributed)
  from jaxrl_async.runtime.cluster.hosts import host_layout

  layout = host_layout(cfg)
  spec = envs.env_spec(cfg.env)
  algo = make_algorithm(cfg, spec, LEARNER_AXIS)
  state = jax.jit(algo.init, out_shardings=replicated(layout.learner_mesh))(jax.random.key(0))
  rng = np.random.default_rng(0)
  T, B = cfg.actor.rollout_len, cfg.env.num_envs
  batch = Rollout(
      obs=rng.normal(size=(T + 1, B) + spec.obs_shape).astype(spec.obs_dtype),
      actions=rng.integers(0, spec.num_actions, size=(T, B)).astype(np.int32),
      rewards=rng.normal(size=(T, B)).astype(np.float32),
      terminated=rng.random((T, B)) < 0.1, truncated=rng.random((T, B)) < 0.05,
      valid=rng.random((T, B)) > 0.1,
      extras={"logp": np.log(rng.uniform(0.2, 0.8, size=(T, B))).astype(np.float32)})
  if mode == "multi":
    from jaxrl_async.runtime.learners.global_step import compile_global_update
    from jaxrl_async.runtime.sharding import globalize, process_local

    step = compile_global_update(cfg, spec, algo, layout.learner_mesh, state, 2)

    def run(state):
      rows = process_local(np.zeros((1, 1, 4), np.int32), layout.learner_mesh, 2)
      rollouts = globalize((put_batch(batch, layout.local_mesh),), layout.learner_mesh, 2)
      state, (_, agreed) = step(state, (rollouts, rows))
      np.asarray(agreed)  # what the learner waits on every update
      return state
  else:
    from jaxrl_async.runtime.learners.on_policy import compile_update

    step = compile_update(cfg, spec, algo, layout.learner_mesh, state)

    def run(state):
      state, metrics = step(state, (put_batch(batch, layout.local_mesh),))
      bool(metrics["nonfinite"])
      return state

  state = run(state)  # warm-up
  t0 = time.perf_counter()
  for _ in range(steps):
    state = run(state)
  ms = (time.perf_counter() - t0) / steps * 1e3
  print(f"{mode} process {process_id}: {ms:.1f} ms per update", flush=True)


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--preset", default="cartpole_impala")
  parser.add_argument("--steps", type=int, default=50)
  parser.add_argument("--worker", nargs=3, metavar=("MODE", "PROCESS_ID", "PORT"))
  args = parser.parse_args()
  if args.worker:
    mode, process_id, port = args.worker
    _worker(args.preset, args.steps, mode, int(process_id), int(port))
    return 0
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  cmd = [sys.executable, "-m", "tools.multihost_step", "--preset", args.preset, "--steps",
         str(args.steps), "--worker"]
  workers = [subprocess.Popen(cmd + ["multi", str(i), str(port)]) for i in range(2)]
  codes = [w.wait(timeout=600) for w in workers]
  codes.append(subprocess.run(cmd + ["single", "0", "0"], timeout=600).returncode)
  return max(codes)


if __name__ == "__main__":
  sys.exit(main())
