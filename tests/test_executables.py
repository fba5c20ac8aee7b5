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
from jaxrl_async.runtime import setup
from jaxrl_async.runtime.trainer import Trainer
from tests.conftest import small_config
run_dir, cache_dir = sys.argv[1:]
config = small_config(max_policy_lag=0, num_actors=1, total_env_steps=3_000,
                      compilation_cache_dir=cache_dir)
setup.configure_jax(config)
result = Trainer(config, envs.env_spec(config.env), run_dir=run_dir, quiet=True).run()
leaves = jax.tree.leaves(jax.device_get(result.state.params))
np.savez(run_dir + "/params.npz", *leaves)
"""


def _train(run_dir: Path, cache_dir: Path) -> tuple[dict, list[np.ndarray]]:
  run_dir.mkdir()
  proc = subprocess.run([sys.executable, "-c", _DRIVER, str(run_dir), str(cache_dir)], cwd=ROOT,
                        env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True,
                        text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  params = np.load(run_dir / "params.npz")
  return (json.loads((run_dir / "summary.json").read_text()),
          [params[k] for k in sorted(params.files, key=lambda k: int(k.split("_")[1]))])


def test_warm_run_loads_every_program_and_trains_the_same(tmp_path):
  cold, cold_params = _train(tmp_path / "cold", tmp_path / "cache")
  warm, warm_params = _train(tmp_path / "warm", tmp_path / "cache")
  assert cold["timings"]["executables_loaded"] == []
  assert warm["timings"]["executables_loaded"] == ["init", "policy-0", "update"]
  assert len(list((tmp_path / "cache" / "executables").glob("*.pkl"))) == 3
  # K = 0 with one actor is deterministic for a seed: the loaded programs must compute
  # exactly what the compiled ones did.
  assert warm["version"] == cold["version"] > 5
  for x, y in zip(cold_params, warm_params, strict=True):
    np.testing.assert_array_equal(x, y)
  # An executable that JAX's persistent cache served serialises without its kernels: with only
  # that cache warm, nothing is stored (a stored one would load, then fail when called).
  for path in (tmp_path / "cache" / "executables").glob("*.pkl"):
    path.unlink()
  xla_warm, _ = _train(tmp_path / "xla_warm", tmp_path / "cache")
  assert xla_warm["timings"]["executables_loaded"] == []
  assert list((tmp_path / "cache" / "executables").glob("*.pkl")) == []
