"""One process of the two-process test (test_multihost.py), or its single-process reference.

  python -m tests.multihost_main reference OUT_DIR
      one process, 4 forced CPU devices: one IMPALA update on a fixed batch of 8 envs.
  python -m tests.multihost_main worker PROCESS_ID PORT RUN_DIR OUT_DIR
      one of 2 processes on 127.0.0.1, 2 forced CPU devices each: the same update as one global
      step (each process feeds its 4 envs), then two short training runs (the second resumes
      the first's checkpoint and is stopped by process 1 alone); prints one RESULT line.

XLA_FLAGS must be set before JAX is imported, so this module sets them itself.
"""

import json
import os
import sys
import time

MODE = sys.argv[1]
os.environ["XLA_FLAGS"] = ("--xla_force_host_platform_device_count="
                           f"{4 if MODE == 'reference' else 2}")
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from jaxrl_async import envs  # noqa: E402
from jaxrl_async.algos import make_algorithm  # noqa: E402
from jaxrl_async.runtime.sharding import (  # noqa: E402
  LEARNER_AXIS,
  fingerprint,
  learner_mesh,
  put_batch,
  replicate,
)
from tests.conftest import random_batch, small_config  # noqa: E402

T, B = 8, 8  # the fixed batch: B envs in all, B / 2 per process


def fixed_batch():
  return random_batch(T, B, np.random.default_rng(7))


def save_params(params, path):
  leaves = jax.tree.leaves(jax.device_get(params))
  np.savez(path, *leaves)


def reference(out_dir):
  """The update as one process with 4 devices computes it: what the 2 x 2 run must match."""
  from jaxrl_async.runtime.learners.on_policy import compile_update

  config = small_config(num_envs=B, rollout_len=T, learner_devices=4)
  spec = envs.env_spec(config.env)
  algo = make_algorithm(config, spec, LEARNER_AXIS)
  mesh = learner_mesh(jax.devices())
  state = replicate(jax.jit(algo.init)(jax.random.key(0)), mesh)
  step = compile_update(config, spec, algo, mesh, state)
  state, _ = step(state, (put_batch(fixed_batch(), mesh),))
  assert int(state.progress.count) == 1  # one update of the configured batch (schedule.py)
  save_params(state.params, os.path.join(out_dir, "reference.npz"))
  print("REFERENCE_OK")


def worker_config(pid, port, **overrides):
  values = dict(num_envs=B // 2, rollout_len=T, learner_devices=2, num_processes=2,
                process_id=pid, coordinator_address=f"127.0.0.1:{port}", peer_timeout_s=20.0)
  values.update(overrides)
  return small_config(**values)


def check_globalize(layout):
  """Host p's envs must land at block p of the global env axis, in order."""
  from jaxrl_async.runtime.sharding import globalize, replicated

  full = np.arange(2 * B, dtype=np.float32).reshape(2, B)
  p = layout.process_index
  part = put_batch(full[:, p * B // 2:(p + 1) * B // 2], layout.local_mesh)
  whole = globalize(part, layout.learner_mesh, layout.num_processes)
  weigh = jax.jit(lambda x: (x * jnp.arange(B)).sum() + 1e3 * (x * jnp.arange(2)[:, None]).sum(),
                  out_shardings=replicated(layout.learner_mesh))
  expected = (full * np.arange(B)).sum() + 1e3 * (full * np.arange(2)[:, None]).sum()
  assert float(weigh(whole)) == expected, (float(weigh(whole)), expected)


def global_step(config, layout, out_dir):
  """The fixed batch's update as one global step over 2 processes x 2 devices."""
  from jaxrl_async.runtime.learners.global_step import compile_global_update
  from jaxrl_async.runtime.sharding import globalize, process_local, replicated

  spec = envs.env_spec(config.env)
  algo = make_algorithm(config, spec, LEARNER_AXIS)
  mesh, p = layout.learner_mesh, layout.process_index
  state = jax.jit(algo.init, out_shardings=replicated(mesh))(jax.random.key(0))
  step = compile_global_update(config, spec, algo, mesh, state, layout.num_processes)
  mine = jax.tree.map(lambda x: x[:, p * B // 2:(p + 1) * B // 2], fixed_batch())
  rows = np.zeros((1, 2, 4), np.int32)
  rows[0, 0, 2] = 10 * (p + 1)  # env steps: the step sums them over processes
  rows[0, :, 0] = p + 1  # stop: the step takes the max
  batch = (globalize((put_batch(mine, layout.local_mesh),), mesh, layout.num_processes),
           process_local(rows, mesh, layout.num_processes))
  state, (metrics, agreed) = step(state, batch)
  assert list(np.asarray(agreed)) == [2, 0, 30, 0], np.asarray(agreed)
  assert not bool(metrics["nonfinite"])
  # Each process's --num_envs is half the batch: the schedules count it as two configured
  # updates, so they end with the run, whose budget counts every host's env steps.
  assert int(state.progress.count) == layout.num_processes, int(state.progress.count)
  save_params(state.params, os.path.join(out_dir, f"global_step_{p}.npz"))
  return fingerprint(state.params)


def train(config, run_dir):
  from jaxrl_async.runtime.sharding import check_replicated
  from jaxrl_async.runtime.trainer import Trainer

  result = Trainer.from_config(config, envs.env_spec(config.env), run_dir=run_dir, quiet=True).run()
  check_replicated(result.state.params)
  s = result.summary
  return {"version": result.version, "params": fingerprint(result.state.params)[0],
          "stop_reason": s["stop_reason"], "resumed_from": s["resumed_from_version"],
          "checkpoints_saved": s["checkpoints_saved"], "env_steps": s["env_steps"],
          "distributed": s["distributed"]}


def worker(pid, port, run_dir, out_dir):
  from jaxrl_async.runtime.cluster import hosts

  # The global step and both runs compile the same update: after process 0 compiled it once,
  # the persistent cache serves the other two (a cold compile takes ~20 s on 2 busy cores).
  jax.config.update("jax_compilation_cache_dir", os.path.join(out_dir, "xla_cache"))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  t0 = time.time()
  config = worker_config(pid, port)
  hosts.initialize(config.distributed)
  assert jax.process_count() == 2 and jax.device_count() == 4, jax.devices()
  layout = hosts.check_cluster(config)
  check_globalize(layout)
  out = {"process": pid, "global_step": global_step(config, layout, out_dir)}
  out["global_step_s"] = time.time() - t0
  # A short run to its budget: 10 updates of 2 x 4 envs x 8 steps, checkpointed at the end.
  first = worker_config(pid, port, total_env_steps=10 * B * T, checkpoint_at_end=True)
  out["first"] = train(first, run_dir)
  out["first_s"] = time.time() - t0
  # Resume it with a large budget; only process 1 has a wall-clock limit, and every process
  # must stop with it, at the same version.
  second = worker_config(pid, port, total_env_steps=10**7, checkpoint_at_end=True, resume=True,
                         max_wall_s=3.0 if pid == 1 else 0.0, log_every_s=0.3)
  out["second"] = train(second, run_dir)
  out["second_s"] = time.time() - t0
  hosts.mark_done()
  print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
  if MODE == "reference":
    reference(sys.argv[2])
  else:
    worker(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
