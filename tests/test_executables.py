"""The executable cache (runtime/executables.py): keys, storing, loading, and a warm run that
loads every program and trains exactly as the cold run that stored them."""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_async.runtime.executables import ExecutableCache

from .conftest import small_config

ROOT = Path(__file__).resolve().parents[1]


def test_key_ignores_host_only_fields_and_follows_the_rest(tmp_path):
  dev = jax.devices()[:1]
  key = lambda **kw: ExecutableCache(tmp_path, small_config(**kw)).key("update", dev, None)
  assert key(seed=0, run_dir="a") == key(seed=7, run_dir="b")
  assert key() != key(learning_rate=3e-4)
  assert key() != key(num_envs=16)
  cache = ExecutableCache(tmp_path, small_config())
  assert cache.key("update", dev, None) != cache.key("init", dev, None)
  opt0 = {"xla_backend_optimization_level": 0}
  assert cache.key("init", dev, None) != cache.key("init", dev, opt0)


# Every host-only field changed at once (two variants: the cap and free running exclude each
# other). Values are arbitrary but valid.
_HOST_VARIANTS = (
    dict(seed=5, run_dir="/tmp/elsewhere", compilation_cache=False, compilation_cache_dir="/x",
         env_threads=1, max_policy_lag=3, queue_capacity=7, balance="auto", target_lag=1.5,
         target_idle=0.3, target_blocked=0.4, balance_every_s=3.0, checkpoint_every_s=5.0,
         checkpoint_every_updates=10, keep_checkpoints=2, checkpoint_at_end=True,
         stop_at_return=100.0, return_window=10, log_every_s=1.0, max_wall_s=9.0,
         logger="tensorboard", actor_restarts=2, max_nonfinite_updates=5),
    dict(free_running=True, resume=True, checkpoint_replay=True),
)


def _lowered_programs(config) -> dict[str, str]:
  """The text of every program the executable cache serves, lowered as the trainer does."""
  from jaxrl_async import envs
  from jaxrl_async.runtime.build import build, trace_init
  from jaxrl_async.runtime.learners.on_policy import lower_update
  from jaxrl_async.runtime.pipeline.policy_step import lower_policy_step

  spec = envs.env_spec(config.env)
  parts = build(config, spec)
  traced = trace_init(parts)
  abstract = traced.out_info
  programs = {"init": traced.lower().as_text()}
  for i in range(config.actor.num_actors):
    programs[f"policy-{i}"] = lower_policy_step(
        parts.algo.make_policy(i), parts.algo.actor_params(abstract), spec,
        config.env.batch_size, parts.actor_device).as_text()
  if not parts.algo.off_policy:  # DQN's update compiles in learners/replay_step.py, uncached
    programs["update"] = lower_update(config, spec, parts.algo, parts.mesh,
                                      abstract).as_text()
  return programs


@pytest.mark.parametrize("algo", ["impala", "ppo", "dqn"])
def test_host_only_fields_do_not_reach_any_program(algo):
  from jaxrl_async.runtime.executables import HOST_ONLY_FIELDS

  assert {k for v in _HOST_VARIANTS for k in v} == set(HOST_ONLY_FIELDS)
  base = dict(algo=algo, num_actors=2)
  if algo == "dqn":
    base.update(free_running=True, batch_size=8, min_replay_size=100, replay_size=1_000,
                spi_tolerance=40.0)
  reference = _lowered_programs(small_config(**base))
  for variant in _HOST_VARIANTS:
    if algo != "dqn":
      variant = {k: v for k, v in variant.items() if k != "checkpoint_replay"}
    if algo == "dqn":  # DQN runs free; the cap and the balancer are on-policy settings
      variant = {k: v for k, v in variant.items()
                 if k not in ("max_policy_lag", "balance", "target_lag")}
    changed = _lowered_programs(small_config(**{**base, **variant}))
    assert changed.keys() == reference.keys()
    for name in reference:
      assert changed[name] == reference[name], (name, variant)
  if algo == "impala":  # the comparison can fail: a field that reaches the update shows
    other = _lowered_programs(small_config(**base, learning_rate=1.234e-3))
    assert other["update"] != reference["update"] and other["init"] == reference["init"]


def test_stores_then_loads_and_replaces_a_bad_file(tmp_path):
  cache = ExecutableCache(tmp_path, small_config())
  x = jnp.arange(5.0)
  # A function no other test compiles: JAX's persistent cache (if on) cannot have served it,
  # and only an executable compiled here is stored.
  lower = lambda: jax.jit(lambda v: jnp.cumsum(v) * 3.25 - 1.5).lower(x)
  expected = np.cumsum(np.arange(5.0)) * 3.25 - 1.5
  np.testing.assert_allclose(cache.compile("toy", jax.devices()[:1], lower)(x), expected)
  [stored] = tmp_path.glob("toy-*.pkl")
  assert cache.loaded == []

  def must_not_lower():
    raise AssertionError("a cache hit must not trace or lower")

  again = ExecutableCache(tmp_path, small_config())
  np.testing.assert_allclose(again.compile("toy", jax.devices()[:1], must_not_lower)(x), expected)
  assert again.loaded == ["toy"]

  stored.write_bytes(b"not a pickle")
  third = ExecutableCache(tmp_path, small_config())
  np.testing.assert_allclose(third.compile("toy", jax.devices()[:1], lower)(x), expected)
  assert third.loaded == [] and stored.read_bytes() != b"not a pickle"


def test_off_without_a_persistent_cache(tmp_path):
  assert jax.config.jax_compilation_cache_dir is None  # tests never configure one
  cache = ExecutableCache.for_config(small_config())
  assert cache.directory is None
  x = jnp.ones(3)
  assert float(cache.compile("toy", jax.devices()[:1], lambda: jax.jit(jnp.sum).lower(x))(x)) == 3


# Runs one training in a fresh process (the case that matters: nothing traced or lowered there)
# and saves the learned params.
_DRIVER = """
import sys
import jax, numpy as np
from jaxrl_async import envs
from jaxrl_async.runtime import jax_config
from jaxrl_async.runtime.trainer import Trainer
from tests.conftest import small_config
from jaxrl_async.runtime.executables import ExecutableCache
run_dir, cache_dir, mode = sys.argv[1:]
if mode == "xla_only":  # JAX's persistent cache on, the executable cache off
  ExecutableCache.for_config = classmethod(lambda cls, config: cls(None, config))
config = small_config(max_policy_lag=0, num_actors=1, total_env_steps=3_000,
                      compilation_cache_dir=cache_dir)
jax_config.configure_jax(config)
result = Trainer.from_config(config, envs.env_spec(config.env), run_dir=run_dir, quiet=True).run()
leaves = jax.tree.leaves(jax.device_get(result.state.params))
np.savez(run_dir + "/params.npz", *leaves)
"""


def _train(run_dir: Path, cache_dir: Path, mode: str = "both") -> tuple[dict, list[np.ndarray]]:
  run_dir.mkdir()
  proc = subprocess.run([sys.executable, "-c", _DRIVER, str(run_dir), str(cache_dir), mode],
                        cwd=ROOT,
                        env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True,
                        text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  params = np.load(run_dir / "params.npz")
  return (json.loads((run_dir / "summary.json").read_text()),
          [params[k] for k in sorted(params.files, key=lambda k: int(k.split("_")[1]))])


def test_warm_run_loads_every_program_and_trains_the_same(tmp_path):
  cache = tmp_path / "cache"
  # An executable that JAX's persistent cache served serialises without its kernels (it would
  # load, then fail when called), so with only that cache warm nothing is stored.
  xla_only, xla_params = _train(tmp_path / "xla_only", cache, "xla_only")
  served, _ = _train(tmp_path / "served", cache)
  assert served["timings"]["executables_loaded"] == []
  assert list((cache / "executables").glob("*.pkl")) == []
  for path in cache.glob("*"):  # JAX's entries; the next run compiles and stores
    if path.is_file():
      path.unlink()
  cold, cold_params = _train(tmp_path / "cold", cache)
  warm, warm_params = _train(tmp_path / "warm", cache)
  assert cold["timings"]["executables_loaded"] == []
  assert warm["timings"]["executables_loaded"] == ["init", "policy-0", "update"]
  assert len(list((cache / "executables").glob("*.pkl"))) == 3
  # K = 0 with one actor is deterministic for a seed: the loaded programs must compute
  # exactly what the compiled ones did.
  assert warm["version"] == cold["version"] == xla_only["version"] > 5
  for x, y, z in zip(xla_params, cold_params, warm_params, strict=True):
    np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(x, z)
