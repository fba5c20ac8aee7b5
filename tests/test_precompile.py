"""`--compile_only` (runtime/precompile.py): every program a run compiles, and under
--balance=auto the update at each U it may choose, lands in the cache, so the next process loads
all of them; and nothing else is written or started."""

from .test_cli import train


def test_compile_only_fills_the_cache_with_every_program_auto_may_use(tmp_path):
  cache, run_dir = tmp_path / "cache", tmp_path / "run"
  args = ("--preset=cartpole_impala", "--balance=auto", "--max_policy_lag=1", "--num_actors=2",
          "--compile_only", f"--compilation_cache_dir={cache}", f"--run_dir={run_dir}")
  cold = train(*args)
  assert cold.returncode == 0, cold.stderr[-2000:]
  assert "compiled: init, policy-0, update, update-u2 " in cold.stdout, cold.stdout
  assert "served by the executable cache: none" in cold.stdout
  stored = sorted(p.name.rsplit("-", 1)[0] for p in (cache / "executables").glob("*.pkl"))
  assert stored == ["init", "policy-0", "update", "update-u2"]
  assert not run_dir.exists()  # no run: no run dir, metrics or checkpoint
  # A second process traces nothing: every program is served (a cap or a seed changes none).
  warm = train(*args[:-1], "--max_policy_lag=2", "--seed=3")
  assert warm.returncode == 0, warm.stderr[-2000:]
  assert "served by the executable cache: init, policy-0, update, update-u2)" in warm.stdout


def test_compile_only_without_auto_compiles_the_configured_update_only(tmp_path):
  r = train("--preset=cartpole_impala", "--compile_only", "--num_actors=2",
            f"--compilation_cache_dir={tmp_path}")
  assert r.returncode == 0, r.stderr[-2000:]
  assert "compiled: init, policy-0, update in" in r.stdout


def test_compile_only_compiles_each_dqn_actors_policy_and_the_replay_update(tmp_path):
  # DQN's policies differ per actor (their epsilons); its update is not cached as a whole
  # executable, only by JAX's own cache, so it is compiled but never listed as served.
  r = train("--preset=cartpole_dqn", "--compile_only", "--num_actors=2",
            f"--compilation_cache_dir={tmp_path}")
  assert r.returncode == 0, r.stderr[-2000:]
  assert "compiled: init, policy-0, policy-1, update in" in r.stdout, r.stdout


def test_compile_only_stores_programs_that_jaxs_own_cache_already_holds(tmp_path):
  """After a source change the whole-executable keys are new while JAX's cache still holds the
  lowered programs: --compile_only must compile and store them, not take JAX's copies (which
  are never stored), or every later run traces and lowers them again."""
  cache, auto = tmp_path / "cache", ("--balance=auto", "--max_policy_lag=1", "--num_actors=2")
  run = train("--preset=cartpole_impala", *auto, "--total_env_steps=2000", "--quiet",
              "--checkpoint_at_end=false", "--checkpoint_every_s=0", f"--run_dir={tmp_path / 'r'}",
              f"--compilation_cache_dir={cache}", timeout=300)
  assert run.returncode == 0, run.stderr[-2000:]
  for stored in (cache / "executables").glob("*.pkl"):
    stored.unlink()  # as a source change leaves it: JAX's entries only
  assert any(p.is_file() for p in cache.iterdir())
  r = train("--preset=cartpole_impala", *auto, "--compile_only", f"--compilation_cache_dir={cache}")
  assert r.returncode == 0, r.stderr[-2000:]
  stored = sorted(p.name.rsplit("-", 1)[0] for p in (cache / "executables").glob("*.pkl"))
  assert stored == ["init", "policy-0", "update", "update-u2"]
