"""The device-resident replay (ring buffer, sampling, sharding over 4 forced CPU devices) and
the samples-per-insert limiter (by hand, under threads, and in a run with injected delays)."""

import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from jaxrl_async import envs
from jaxrl_async.checkpoint import Checkpointer
from jaxrl_async.runtime.learners import replay_buffer as replay_lib
from jaxrl_async.runtime.learners import replay_step as offpolicy
from jaxrl_async.runtime.learners.spi_limiter import SampleToInsertRatio, min_error_buffer
from jaxrl_async.runtime.pipeline import actor as actor_mod
from jaxrl_async.runtime.sharding import LEARNER_AXIS, batch_sharding, learner_mesh, replicated
from jaxrl_async.runtime.trainer import Trainer
from tests.conftest import small_config

ROOT = Path(__file__).resolve().parent.parent
L = 2  # steps per column


def columns(k: int, envs_: int) -> dict:
  """Insert k: obs [L+1, E, 2] and x [L, E], every value 100 k + env (so a slot says whence)."""
  base = 100.0 * k + np.arange(envs_, dtype=np.float32)
  return {"obs": np.broadcast_to(base[None, :, None], (L + 1, envs_, 2)).copy(),
          "x": np.broadcast_to(base[None, :], (L, envs_)).copy()}


def insert_fn(mesh):
  rspecs = replay_lib.specs(mesh)
  return replay_lib.sharded(replay_lib.insert, mesh, (rspecs, batch_sharding(mesh).spec),
                            rspecs, donate_argnums=(0,))


def test_num_columns_rounds_up_to_whole_inserts():
  # 10 transitions of 2 steps = 5 columns, rounded up to inserts of 4 columns: 8.
  assert replay_lib.num_columns(10, 2, 4) == 8
  assert replay_lib.num_columns(16, 2, 4) == 8


def test_ring_buffer_wraps_around_overwriting_the_oldest():
  mesh = learner_mesh(jax.devices()[:1])
  replay = replay_lib.init(columns(0, 2), 6, mesh, seed=0)  # room for 3 inserts of 2 columns
  insert = insert_fn(mesh)
  for k in range(4):
    replay = insert(replay, jax.device_put(columns(k, 2), batch_sharding(mesh)))
  x = replay_lib.host_columns(replay)["x"]
  # Insert 3 wrapped onto columns 0, 1; inserts 1 and 2 survive in columns 2..5.
  np.testing.assert_array_equal(x[0], [300, 301, 100, 101, 200, 201])
  np.testing.assert_array_equal(replay_lib.host_columns(replay)["obs"][L, :, 1], x[0])
  assert int(replay.pos) == 2 and int(replay.filled) == 6
  assert replay_lib.size(replay, L, 1) == 12  # never more than its capacity


def test_sampling_is_uniform_over_the_filled_part():
  mesh = learner_mesh(jax.devices()[:1])
  replay = replay_lib.init(columns(0, 2), 6, mesh, seed=0)
  insert = insert_fn(mesh)
  for k in range(2):  # 4 of 6 columns filled
    replay = insert(replay, jax.device_put(columns(k, 2), batch_sharding(mesh)))
  rep = replicated(mesh).spec
  sample = replay_lib.sharded(
      lambda r: replay_lib.sample_indices(r, 40_000, L, LEARNER_AXIS), mesh,
      (replay_lib.specs(mesh),), (rep, rep, rep))
  t, c, key = sample(replay)
  t, c = np.asarray(t), np.asarray(c)
  assert t.min() == 0 and t.max() == L - 1 and c.min() == 0 and c.max() == 3
  counts = np.bincount(c * L + t, minlength=8) / len(t)
  np.testing.assert_allclose(counts, 1 / 8, atol=0.01)  # 8 (t, c) cells, 5000 each +- 2%
  t2, _, _ = sample(replay.replace(key=key))
  assert not np.array_equal(t, np.asarray(t2))  # the key advances


def test_sharded_replay_dqn_and_ppo_on_four_devices(tmp_path):
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
             JAX_PLATFORMS="cpu")
  r = subprocess.run([sys.executable, "-m", "tests.test_replay", str(tmp_path)], cwd=ROOT,
                     env=env, capture_output=True, text=True, timeout=240)
  ok = r.returncode == 0 and "REPLAY_SHARDED_OK" in r.stdout and "PPO_SHARDED_OK" in r.stdout
  assert ok, r.stdout[-2000:] + r.stderr[-4000:]


def _sharded_main(run_dir: str):
  """With 4 CPU devices: each device keeps its own env columns and wraps on its own; sampling
  stays on the device; a DQN run keeps its replicas identical; and (one process start for
  both) PPO's sharded update equals its single-device one."""
  from jaxrl_async.runtime.sharding import check_replicated
  from tests.test_ppo import sharded_check

  assert jax.device_count() == 4, jax.devices()
  mesh = learner_mesh(jax.devices())
  replay = replay_lib.init(columns(0, 8), 16, mesh, seed=0)  # 4 local columns per device
  insert = insert_fn(mesh)
  for k in range(3):  # 2 local columns per insert: the third wraps onto local slots 0, 1
    replay = insert(replay, jax.device_put(columns(k, 8), batch_sharding(mesh)))
  for shard in replay.data["x"].addressable_shards:
    d = shard.device.id
    mine = [2 * d, 2 * d + 1]  # env columns 2d, 2d + 1 were placed on device d by the actor
    np.testing.assert_array_equal(np.asarray(shard.data)[0],
                                  [200 + mine[0], 200 + mine[1], 100 + mine[0], 100 + mine[1]])
  assert int(replay.pos) == 2 and int(replay.filled) == 4

  # --checkpoint_replay: a sharded replay restores shard for shard onto the same mesh.
  ck = Checkpointer(Path(run_dir) / "replay_checkpoint", use_async=False)
  ck.save(1, {"step": np.zeros((), np.int32)}, {"version": 1, "replay": {"n": 3}}, replay=replay)
  ck.wait()
  restored, counters = ck.restore_replay(
      jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), replay))
  ck.close()
  assert counters == {"n": 3} and int(restored.pos) == 2 and int(restored.filled) == 4
  for mine, back in zip(replay.data["x"].addressable_shards,
                        restored.data["x"].addressable_shards, strict=True):
    assert mine.device == back.device
    np.testing.assert_array_equal(np.asarray(mine.data), np.asarray(back.data))
  np.testing.assert_array_equal(jax.random.key_data(restored.key), jax.random.key_data(replay.key))

  def sample_values(r):
    t, c, _ = replay_lib.sample_indices(r, 64, L, LEARNER_AXIS)
    return r.data["x"][t, c]

  values = replay_lib.sharded(sample_values, mesh, (replay_lib.specs(mesh),),
                              jax.sharding.PartitionSpec(LEARNER_AXIS))(replay)
  for shard in values.addressable_shards:
    env_ids = np.asarray(shard.data) % 100
    assert set(env_ids.astype(int)) <= {2 * shard.device.id, 2 * shard.device.id + 1}

  config = small_config(algo="dqn", learner_devices=4, free_running=True, batch_size=32,
                        replay_size=2_000, min_replay_size=256, samples_per_insert=2.0,
                        spi_tolerance=1.0, total_env_steps=3_000)
  result = Trainer.from_config(config, envs.env_spec(config.env), run_dir=run_dir, quiet=True).run()
  check_replicated(result.state.params)
  check_replicated(result.state.target_params)
  assert result.summary["updates"] > 50, result.summary
  print("REPLAY_SHARDED_OK", result.summary["updates"])
  sharded_check()


# -- the limiter -------------------------------------------------------------------------------


def test_limiter_refuses_a_buffer_too_small_for_one_chunk_of_each():
  # spi 2, inserts of 10, samples of 8: the buffer must be >= (2 x 10 + 8) / 2 = 14.
  assert min_error_buffer(2.0, 10, 8) == 14.0
  with pytest.raises(ValueError, match="error_buffer"):
    SampleToInsertRatio(2.0, 100, 13.0, insert_chunk=10, sample_chunk=8)


def test_limiter_by_hand():
  lim = SampleToInsertRatio(2.0, 100, 20.0, insert_chunk=10, sample_chunk=8)
  for _ in range(9):  # warm-up: inserts always allowed, samples never
    assert lim.can_insert() and not lim.can_sample()
    lim.record_insert()
  lim.record_insert()  # 100 in: the warm-up ends, SPI x I - S = 0
  assert lim.can_sample()
  lim.record_sample()
  lim.record_sample()  # diff = -16: a third sample would reach -24 < -20
  assert not lim.can_sample() and lim.can_insert()
  lim.record_insert()  # diff = -16 + 20 = 4: another insert would reach 24 > 20
  assert not lim.can_insert() and lim.can_sample()
  assert lim.ratio() == pytest.approx(16 / 10)


def test_limiter_waits_time_out_are_measured_and_close_wakes_them():
  lim = SampleToInsertRatio(2.0, 100, 20.0, insert_chunk=10, sample_chunk=8)
  t0 = time.perf_counter()
  assert not lim.await_sample(0.05)  # still warming up
  assert time.perf_counter() - t0 >= 0.05 and lim.sample_blocked_s >= 0.05
  woke = []
  waiter = threading.Thread(target=lambda: woke.append(lim.await_sample(30.0)))
  waiter.start()
  time.sleep(0.05)
  lim.close()
  waiter.join(2.0)
  assert not waiter.is_alive() and woke == [False]


@pytest.mark.parametrize("seed", [0, 1])
def test_limiter_holds_the_ratio_between_threads_with_random_delays(seed):
  spi, chunk_in, chunk_s, min_size, tol = 4.0, 10, 16, 200, 0.5
  buffer = tol * min_size  # 100 >= (40 + 16) / 2
  lim = SampleToInsertRatio(spi, min_size, buffer, chunk_in, chunk_s)
  stop = threading.Event()
  diffs: list[float] = []
  rng = random.Random(seed)
  # Phases: the sampler slow, then the inserter slow, then both fast.
  delays = {"insert": [0.0, 0.002, 0.0], "sample": [0.002, 0.0, 0.0]}
  phase = [0]

  def worker(kind):
    wait = lim.await_insert if kind == "insert" else lim.await_sample
    record = lim.record_insert if kind == "insert" else lim.record_sample
    while not stop.is_set():
      if wait(0.05):
        record()
        with lim._cond:
          if lim.warm_inserted is not None:
            diffs.append(lim._diff())
      time.sleep(delays[kind][phase[0]] * rng.random())

  threads = [threading.Thread(target=worker, args=(k,)) for k in ("insert", "sample")]
  for t in threads:
    t.start()
  for p in range(3):
    phase[0] = p
    time.sleep(0.4)
  stop.set()
  lim.close()
  for t in threads:
    t.join(2.0)
  assert lim.inserted - lim.warm_inserted >= min_size  # enough inserts for the bound to bite
  assert max(abs(d) for d in diffs) <= buffer
  assert lim.ratio() == pytest.approx(spi, abs=tol)
  assert lim.insert_blocked_s > 0 and lim.sample_blocked_s > 0  # each side was held back


def test_run_holds_the_reuse_ratio_with_slow_actors_then_a_slow_learner(tmp_path, monkeypatch):
  rng = random.Random(0)
  t_start = time.time()
  slow_actor = lambda: time.time() - t_start < 4.0  # then the learner is the slow one
  emit, call = actor_mod.Actor._emit, offpolicy.ReplayStep.call

  def slow_emit(self, seg, k):
    time.sleep(rng.choice([0.0, 0.01, 0.03]) if slow_actor() else 0.0)
    return emit(self, seg, k)

  def slow_call(self, state, version):
    time.sleep(0.0 if slow_actor() else rng.choice([0.0, 0.002, 0.005]))
    return call(self, state, version)

  monkeypatch.setattr(actor_mod.Actor, "_emit", slow_emit)
  monkeypatch.setattr(offpolicy.ReplayStep, "call", slow_call)
  # Rollouts of 8 x 8 = 64; error buffer 0.5 x 500 = 250 >= (2 x 64 + 32) / 2 = 80.
  config = small_config(algo="dqn", num_actors=2, free_running=True, batch_size=32,
                        replay_size=5_000, min_replay_size=500, samples_per_insert=2.0,
                        spi_tolerance=0.5, total_env_steps=12_000, log_every_s=0.25)
  result = Trainer.from_config(config, run_dir=tmp_path, quiet=True).run()
  records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  # The warm-up ends at 512 (whole rollouts); 512 inserts later the bound 250 / I' is <= 0.5.
  measured = [r["spi"] for r in records if "spi" in r and r["inserted"] >= 1_024]
  assert measured, records[-1]
  assert all(abs(m - 2.0) <= 0.5 for m in measured), measured
  last = records[-1]
  assert last["insert_blocked_s"] > 0 and last["sample_blocked_s"] > 0, last
  assert last["replay_size"] <= last["replay_capacity"]
  assert result.summary["updates"] * 32 == last["sampled"]


if __name__ == "__main__":
  _sharded_main(sys.argv[1])
