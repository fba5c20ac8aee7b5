"""Checkpoints, resume and faults: exact restore, kill -9, SIGTERM, non-finite updates."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.presets import preset
from jaxrl_async import envs
from jaxrl_async.checkpoint import Checkpointer
from jaxrl_async.config import ConfigError, TrainConfig
from jaxrl_async.runtime import build as build_mod
from jaxrl_async.runtime.build import abstract_state, build
from jaxrl_async.runtime.learners.replay_step import abstract_replay
from jaxrl_async.runtime.trainer import ThreadFailed, Trainer, validate
from tests.conftest import small_config


def replay_shapes(parts):
  return abstract_replay(parts.config, parts.spec, parts.algo, parts.mesh)


ROOT = Path(__file__).resolve().parent.parent
ENV = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")


def run(config, run_dir):
  return Trainer.from_config(config, envs.env_spec(config.env), run_dir=run_dir, quiet=True).run()


def assert_trees_equal(a, b):
  a, b = jax.device_get(a), jax.device_get(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    if jnp.issubdtype(getattr(x, "dtype", np.float32), jax.dtypes.prng_key):
      x, y = jax.random.key_data(x), jax.random.key_data(y)
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_save_then_resume_is_exact_and_continues(tmp_path):
  config = small_config(total_env_steps=3_000, checkpoint_at_end=True)
  first = run(config, tmp_path)
  parts = build(config, envs.env_spec(config.env), tmp_path)
  state, meta = Checkpointer(tmp_path).restore(abstract_state(parts))
  assert meta["version"] == first.version
  assert_trees_equal(state, first.state)  # params, optimiser state, RNG key, version
  assert meta["counters"]["env_steps"] == first.summary["env_steps"]
  lines_before = (tmp_path / "metrics.jsonl").read_text().count("\n")

  resumed = run(small_config(total_env_steps=6_000, checkpoint_at_end=True, resume=True),
                tmp_path)
  s = resumed.summary
  assert s["resumed_from_version"] == first.version
  assert resumed.version == -(-6_000 // 64)  # the budget counts the first session's updates
  assert s["env_steps"] > first.summary["env_steps"]
  assert (tmp_path / "metrics.jsonl").read_text().count("\n") > lines_before  # appended


def test_a_resumed_run_keeps_learning_on_cartpole(tmp_path):
  # The cartpole_impala preset: 4,096 env steps (16 updates) reach a return of ~30-60, then
  # the resumed run, to 32,768, reaches ~150-500 (16 runs over 8 seeds: 2.9x to 12x the
  # return at the checkpoint). Longer runs are not steadier: without the 475 stop, IMPALA with
  # 4 epochs of reuse sometimes collapses after ~50k steps, fresh or resumed.
  def config(total_env_steps, **flags):
    return TrainConfig.from_flat(preset("cartpole_impala") | dict(
        total_env_steps=total_env_steps, checkpoint_at_end=True, checkpoint_every_s=0.0,
        log_every_s=0.5, **flags))

  first = run(config(4_096), tmp_path)
  metrics = tmp_path / "metrics.jsonl"
  before = metrics.read_text().splitlines()
  at_checkpoint = json.loads(before[-1])["return_mean"]
  assert first.version == 16 and at_checkpoint is not None

  resumed = run(config(32_768, resume=True), tmp_path)
  after = metrics.read_text().splitlines()
  assert after[:len(before)] == before and len(after) > len(before)  # appended
  assert resumed.summary["resumed_from_version"] == 16
  final = json.loads(after[-1])["return_mean"]
  assert json.loads(after[-1])["version"] == resumed.version > 16
  assert final >= max(2 * at_checkpoint, at_checkpoint + 50), (at_checkpoint, final)


def test_resume_with_another_network_or_an_older_state_layout_is_refused(tmp_path):
  first = run(small_config(total_env_steps=1_000, checkpoint_at_end=True), tmp_path)
  resume = lambda *flags: subprocess.run(
      [sys.executable, "-m", "experiments.train", f"--run_dir={tmp_path}", "--resume", *flags],
      cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
  r = resume("--hidden_sizes=32,32")
  assert r.returncode == 2
  assert "--hidden_sizes" in r.stderr and "checkpoint" in r.stderr
  # A checkpoint written before the train state held `progress` (algos/schedule.py) records no
  # layout: it would not restore, and is refused before anything starts.
  meta_file = tmp_path / "checkpoints" / str(first.version) / "meta" / "metadata"
  meta = json.loads(meta_file.read_text())
  assert meta.pop("state_layout") == 2
  meta_file.write_text(json.dumps(meta))
  r = resume("--hidden_sizes=16,16")
  assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
  assert "--resume" in r.stderr and "layout 1" in r.stderr and "layout 2" in r.stderr
  r = subprocess.run([sys.executable, "-m", "experiments.evaluate", f"--run_dir={tmp_path}"],
                     cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
  assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
  assert "--run_dir" in r.stderr and "layout 1" in r.stderr


def test_interrupted_save_never_hides_the_previous_checkpoint(tmp_path):
  config = small_config(total_env_steps=2_000, checkpoint_at_end=True)
  first = run(config, tmp_path)
  # What a kill during a save leaves: orbax's temporary folder for a newer step.
  partial = tmp_path / "checkpoints" / f"{first.version + 10}.orbax-checkpoint-tmp-1234"
  (partial / "state").mkdir(parents=True)
  (partial / "state" / "garbage").write_bytes(b"\0" * 100)
  ck = Checkpointer(tmp_path)
  assert ck.latest_version() == first.version
  parts = build(config, envs.env_spec(config.env), tmp_path)
  state, _ = ck.restore(abstract_state(parts))
  assert_trees_equal(state.params, first.state.params)


def _train_proc(run_dir, *flags):
  return subprocess.Popen(
      [sys.executable, "-m", "experiments.train", f"--run_dir={run_dir}", "--quiet",
       "--total_env_steps=100000000", "--stop_at_return=nan", "--num_envs=8",
       "--rollout_len=8", *flags], cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True)


def _wait_for_checkpoints(run_dir, n, proc, timeout=120):
  deadline = time.time() + timeout
  while True:
    ck = run_dir / "checkpoints"
    done = [p for p in ck.glob("*") if p.name.isdigit()] if ck.exists() else []
    if len(done) >= n:
      return
    assert proc.poll() is None, proc.stderr.read()[-3000:]
    assert time.time() < deadline, "no checkpoint appeared"
    time.sleep(0.1)


def test_kill_9_then_resume_from_the_last_complete_checkpoint(tmp_path):
  proc = _train_proc(tmp_path, "--checkpoint_every_updates=20", "--checkpoint_every_s=0")
  _wait_for_checkpoints(tmp_path, 2, proc)
  proc.send_signal(signal.SIGKILL)
  proc.wait(10)
  latest = Checkpointer(tmp_path).latest_version()
  assert latest is not None and latest % 20 == 0
  r = subprocess.run([sys.executable, "-m", "experiments.train", f"--run_dir={tmp_path}",
                      "--quiet", "--resume", "--num_envs=8", "--rollout_len=8",
                      f"--total_env_steps={(latest + 5) * 64}", "--stop_at_return=nan"],
                     cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, r.stderr[-3000:]
  summary = json.loads((tmp_path / "summary.json").read_text())
  assert summary["resumed_from_version"] >= latest
  assert summary["version"] == latest + 5 or summary["version"] > summary["resumed_from_version"]


def _last_version(metrics: Path) -> int:
  lines = metrics.read_text().splitlines() if metrics.exists() else []
  return json.loads(lines[-1])["version"] if lines else -1


def test_sigterm_exits_0_with_a_final_checkpoint(tmp_path):
  proc = _train_proc(tmp_path, "--checkpoint_every_s=0", "--log_every_s=0.5")
  deadline = time.time() + 90
  while _last_version(tmp_path / "metrics.jsonl") < 1:
    assert proc.poll() is None and time.time() < deadline, proc.stderr.read()[-3000:]
    time.sleep(0.1)
  t0 = time.time()
  proc.send_signal(signal.SIGTERM)
  _, err = proc.communicate(timeout=30)
  assert proc.returncode == 0, err[-3000:]
  assert time.time() - t0 < 30
  summary = json.loads((tmp_path / "summary.json").read_text())
  assert summary["stop_reason"] == "terminated"
  assert Checkpointer(tmp_path).latest_version() == summary["version"] > 0


def _poison_updates(monkeypatch, from_version):
  """Makes every update from `from_version` on produce NaN gradients (hence NaN params)."""
  make = build_mod.make_algorithm

  def make_poisoned(config, spec, axis_name):
    algo = make(config, spec, axis_name)

    def update(state, batch):
      new, metrics = algo.update(state, batch)
      bad = state.version >= from_version
      poison = lambda x: jnp.where(bad, jnp.nan, x) if jnp.issubdtype(x.dtype, jnp.floating) \
          else x
      return new.replace(params=jax.tree.map(poison, new.params)), metrics

    return algo._replace(update=update)

  monkeypatch.setattr(build_mod, "make_algorithm", make_poisoned)


def test_nonfinite_updates_are_skipped_then_stop_the_run(tmp_path, monkeypatch):
  _poison_updates(monkeypatch, from_version=5)
  config = small_config(total_env_steps=10**8, max_nonfinite_updates=4, checkpoint_at_end=True)
  with pytest.raises(ThreadFailed, match="non-finite"):
    run(config, tmp_path)
  parts = build(config, envs.env_spec(config.env), tmp_path)
  state, meta = Checkpointer(tmp_path).restore(abstract_state(parts))
  leaves = jax.tree.leaves(jax.device_get(state.params))
  assert all(np.isfinite(x).all() for x in leaves)  # the last good params were kept and saved
  assert meta["version"] >= 5


def test_isolated_nonfinite_updates_are_skipped_and_counted(tmp_path, monkeypatch):
  make = build_mod.make_algorithm

  def make_flaky(config, spec, axis_name):
    algo = make(config, spec, axis_name)

    def update(state, batch):
      new, metrics = algo.update(state, batch)
      bad = state.version % 7 == 3
      return new, dict(metrics, pg_loss=jnp.where(bad, jnp.nan, metrics["pg_loss"]))

    return algo._replace(update=update)

  monkeypatch.setattr(build_mod, "make_algorithm", make_flaky)
  s = run(small_config(total_env_steps=3_000, max_nonfinite_updates=2), tmp_path).summary
  assert s["stop_reason"] == "budget"
  assert s["nonfinite_skipped"] >= 3


def test_restore_into_an_empty_dir_is_none(tmp_path):
  assert Checkpointer(tmp_path).latest_version() is None
  shutil.rmtree(tmp_path)
  assert Checkpointer(tmp_path).read_meta() is None


# -- --checkpoint_replay (DQN) ------------------------------------------------------------------

# 64 transitions per rollout; learning starts after 4 rollouts (256), 2 samples per insert.
DQN_SMALL = dict(algo="dqn", free_running=True, batch_size=32, replay_size=2_000,
                 min_replay_size=256, samples_per_insert=2.0, spi_tolerance=1.0,
                 checkpoint_at_end=True)


def _capture_saves(monkeypatch) -> list:
  """Records (version, meta, host copy of the replay or None) at every checkpoint save."""
  saves = []
  save = Checkpointer.save

  def recording(self, version, state, meta, replay=None):
    saves.append((version, meta, None if replay is None else jax.device_get(replay)))
    return save(self, version, state, meta, replay=replay)

  monkeypatch.setattr(Checkpointer, "save", recording)
  return saves


def test_checkpoint_replay_restores_the_replay_exactly_and_resumes_without_warm_up(
    tmp_path, monkeypatch):
  saves = _capture_saves(monkeypatch)
  config = small_config(total_env_steps=1_500, checkpoint_replay=True, **DQN_SMALL)
  first = run(config, tmp_path)
  version, saved_meta, saved_replay = saves[-1]
  assert version == first.version and saved_replay is not None
  assert (tmp_path / "checkpoints" / str(version) / "replay").is_dir()

  parts = build(config, envs.env_spec(config.env), tmp_path)
  replay, counters = Checkpointer(tmp_path).restore_replay(replay_shapes(parts))
  assert_trees_equal(replay, saved_replay)  # contents, write position, fill, sampling key
  assert counters == saved_meta["replay"]
  filled = int(replay.filled)
  assert filled == 1_536 // 8 == counters["transitions"] // 8  # 24 rollouts x 8 columns
  assert counters["limiter"]["warm_inserted"] == 256  # the warm-up was over

  # A replay restored into a differently sized buffer is refused before anything starts.
  with pytest.raises(ConfigError, match="--replay_size="):
    validate(small_config(total_env_steps=3_000, checkpoint_replay=True, resume=True,
                          **(DQN_SMALL | {"replay_size": 4_000})), tmp_path)

  # Six more rollouts. The restored limiter is past its warm-up with SPI x I - S = -128: it
  # lets 3 rollouts in (+128 each, up to the buffer of 256), then holds the 6th until >= 12
  # batches of 32 were sampled from the restored replay. A fresh limiter would instead be
  # warming up again (4 rollouts) and could insert all 6 without one update.
  resumed = run(small_config(total_env_steps=1_536 + 6 * 64, checkpoint_replay=True,
                             resume=True, **DQN_SMALL), tmp_path)
  s = resumed.summary
  assert s["resumed_from_version"] == first.version and s["replay_restored"]
  assert s["updates"] >= 12 and resumed.version == first.version + s["updates"]
  _, end_meta, end_replay = saves[-1]
  assert int(end_replay.filled) >= filled
  limiter = end_meta["replay"]["limiter"]
  assert limiter["warm_inserted"] == 256  # the limiter continued: no second warm-up
  assert limiter["inserted"] == counters["limiter"]["inserted"] + 6 * 64
  assert limiter["sampled"] == counters["limiter"]["sampled"] + 32 * s["updates"]


def test_without_checkpoint_replay_the_checkpoint_has_no_replay_and_resume_refills(
    tmp_path, monkeypatch):
  saves = _capture_saves(monkeypatch)
  config = small_config(total_env_steps=1_500, **DQN_SMALL)
  first = run(config, tmp_path)
  assert saves[-1][2] is None and "replay" not in saves[-1][1]
  assert not (tmp_path / "checkpoints" / str(first.version) / "replay").exists()
  parts = build(config, envs.env_spec(config.env), tmp_path)
  assert Checkpointer(tmp_path).restore_replay(replay_shapes(parts)) is None

  # Asking for the replay on resume from a checkpoint without one starts an empty replay,
  # which three rollouts do not warm up: no update (and the checkpoint stays as it was).
  resumed = run(small_config(total_env_steps=1_536 + 3 * 64, checkpoint_replay=True,
                             resume=True, **DQN_SMALL), tmp_path)
  assert resumed.summary["resumed_from_version"] == first.version
  assert not resumed.summary["replay_restored"] and resumed.summary["updates"] == 0
  assert Checkpointer(tmp_path).latest_version() == first.version


def test_checkpoint_replay_is_refused_for_on_policy_algorithms(tmp_path):
  with pytest.raises(ConfigError, match="--checkpoint_replay=True: needs an off-policy"):
    validate(small_config(checkpoint_replay=True))
  r = subprocess.run([sys.executable, "-m", "experiments.train", f"--run_dir={tmp_path}",
                      "--preset=cartpole_ppo", "--checkpoint_replay"], cwd=ROOT, env=ENV,
                     capture_output=True, text=True, timeout=120)
  assert r.returncode == 2
  lines = r.stderr.strip().splitlines()
  assert len(lines) == 1 and "--checkpoint_replay" in lines[0] and "ppo" in lines[0], r.stderr
  assert not (tmp_path / "metrics.jsonl").exists()


# -- damaged checkpoints ------------------------------------------------------------------------


def _three_checkpoints(run_dir: Path) -> tuple[object, dict]:
  """Checkpoints 10, 20, 30 of a small IMPALA state, params shifted by the version so that each
  is told apart; returns the abstract state and the saved states by version."""
  config = small_config()
  trainer = Trainer.from_config(config, envs.env_spec(config.env), run_dir=run_dir, quiet=True)
  initial = trainer.programs.init_state()
  ck = Checkpointer(run_dir, use_async=False)
  saved = {}
  for v in (10, 20, 30):
    saved[v] = initial.replace(params=jax.tree.map(lambda x, v=v: x + v, initial.params))
    ck.save(v, saved[v], {"version": v, "counters": {"env_steps": 64 * v},
                          "config": config.to_flat()})
  ck.close()
  return abstract_state(trainer.parts), saved


def _files(step: Path) -> list[Path]:
  return sorted(p for p in step.rglob("*") if p.is_file())


def _zero_all(step: Path) -> None:  # what a full disk or a bad copy leaves
  for p in _files(step):
    p.write_bytes(b"\0" * p.stat().st_size)


def _truncate_all(step: Path) -> None:
  for p in _files(step):
    p.write_bytes(p.read_bytes()[:p.stat().st_size // 2])


def _truncate_array_data(step: Path) -> None:  # the JSON files stay whole: only decoding fails
  for p in _files(step / "state"):
    if p.parent.name == "d":
      p.write_bytes(p.read_bytes()[:p.stat().st_size // 2])


def _remove_array_files(step: Path) -> None:
  # Every one: removing only the largest failed CI once (the checkpoint still read back; a
  # data file no array refers to is one explanation, not confirmed); all of them is unambiguous.
  for p in _files(step / "state"):
    if p.parent.name == "d":
      p.unlink()


def _remove_meta(step: Path) -> None:
  (step / "meta" / "metadata").unlink()


@pytest.mark.parametrize("damage", [_zero_all, _truncate_all, _truncate_array_data,
                                    _remove_array_files, _remove_meta])
def test_a_damaged_newest_checkpoint_is_skipped_for_the_one_before_it(tmp_path, damage, caplog):
  abstract, saved = _three_checkpoints(tmp_path)
  damage(tmp_path / "checkpoints" / "30")
  ck = Checkpointer(tmp_path, use_async=False)
  assert ck.resume_candidates() == [30, 20, 10]
  assert ck.newest_readable_version() == ck.latest_version() == 20
  assert ck.read_meta()["version"] == 20  # what validate checks compatibility against
  assert "checkpoint 30" in caplog.text and "does not restore" in caplog.text
  assert list(ck.skipped) == [30] and ck.problem(20) is None

  state, meta = ck.restore(abstract)
  assert meta["version"] == 20 and meta["counters"]["env_steps"] == 64 * 20
  assert_trees_equal(state, saved[20])
  # The damaged one is set aside, so the resumed run can save version 30 again.
  assert (tmp_path / "checkpoints_damaged" / "30").is_dir()
  assert ck.resume_candidates() == [20, 10]
  ck.save(30, saved[30], {"version": 30, "counters": {"env_steps": 64 * 30}})
  ck.wait()
  assert ck.restore(abstract)[1]["version"] == 30
  ck.close()


def test_with_no_checkpoint_that_restores_the_error_names_the_run_dir(tmp_path):
  abstract, _ = _three_checkpoints(tmp_path)
  for v in (10, 20, 30):
    _zero_all(tmp_path / "checkpoints" / str(v))
  ck = Checkpointer(tmp_path)
  for call in (ck.newest_readable_version, ck.read_meta, lambda: ck.restore(abstract)):
    with pytest.raises(ConfigError, match=f"--run_dir='{tmp_path}': none of its 3 checkpoints "
                       "restores \\(the newest, 30: "):
      call()
  assert not (tmp_path / "checkpoints_damaged").exists()  # nothing is moved without a resume
  assert ck.resume_candidates() == [30, 20, 10]


def test_an_explicit_damaged_version_is_refused_not_replaced(tmp_path):
  abstract, _ = _three_checkpoints(tmp_path)
  _remove_meta(tmp_path / "checkpoints" / "20")
  ck = Checkpointer(tmp_path)
  with pytest.raises(ConfigError, match="its checkpoint 20 does not restore: meta/metadata is"):
    ck.read_meta(20)
  assert ck.read_meta()["version"] == 30 and ck.read_meta(10)["version"] == 10


def test_resume_from_a_run_whose_newest_checkpoint_is_zeroed(tmp_path):
  # Three checkpoints (20, 40, 60) of a real run; the newest zeroed as a full disk leaves it.
  # (Both sessions through the launcher: it sets the PRNG the keys are saved with.)
  train = [sys.executable, "-m", "experiments.train", f"--run_dir={tmp_path}", "--quiet",
           "--num_envs=8", "--rollout_len=8", "--hidden_sizes=16,16", "--stop_at_return=nan",
           "--checkpoint_every_s=0", "--checkpoint_every_updates=20", "--checkpoint_at_end"]
  r = subprocess.run([*train, f"--total_env_steps={60 * 64}"], cwd=ROOT, env=ENV,
                     capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, r.stderr[-3000:]
  assert Checkpointer(tmp_path).resume_candidates() == [60, 40, 20]
  _zero_all(tmp_path / "checkpoints" / "60")
  resume = [*train, "--resume", f"--total_env_steps={70 * 64}"]
  r = subprocess.run(resume, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, r.stderr[-3000:]
  assert "checkpoint 60" in r.stderr and "skipped" in r.stderr
  summary = json.loads((tmp_path / "summary.json").read_text())
  assert summary["resumed_from_version"] == 40 and summary["version"] == 70
  assert Checkpointer(tmp_path).resume_candidates()[0] == 70

  # With every checkpoint damaged: one line naming the run dir, exit status 2.
  for step in (tmp_path / "checkpoints").iterdir():
    _zero_all(step)
  r = subprocess.run(resume, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
  assert r.returncode == 2, r.stderr[-3000:]
  last = r.stderr.strip().splitlines()[-1]
  assert last.startswith(f"train: --run_dir='{tmp_path}': none of its") and "restores" in last
  assert "Traceback" not in r.stderr


def test_a_damaged_replay_alone_restores_as_an_empty_one(tmp_path, caplog):
  ck = Checkpointer(tmp_path, use_async=False)
  replay = {"data": jnp.arange(64.0).reshape(16, 4), "pos": jnp.int32(3)}
  ck.save(5, {"w": jnp.ones(3)}, {"version": 5, "replay": {"inserted": 48}}, replay=replay)
  ck.wait()
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                          replay)
  restored, counters = ck.restore_replay(abstract)
  assert counters == {"inserted": 48} and int(restored["pos"]) == 3
  _zero_all(tmp_path / "checkpoints" / "5" / "replay")
  fresh = Checkpointer(tmp_path, use_async=False)
  assert fresh.newest_readable_version() == 5  # the state still restores
  assert fresh.restore_replay(abstract) is None
  assert "replay of checkpoint 5" in caplog.text and "empty replay" in caplog.text
  ck.close()
  fresh.close()
