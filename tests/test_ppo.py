"""PPO: GAE and the loss against values worked out by hand, the policies, observation
normalisation, and short learning runs (sync and async). The sharded update is checked in
tests/test_replay.py's 4-device process (`sharded_check` here)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_async import algos, envs
from jaxrl_async.algos.base import Rollout
from jaxrl_async.algos.losses import clipped_surrogate, gae_advantages
from jaxrl_async.algos.ppo import (
  PPOBatch,
  gaussian_logp,
  make_policy_fn,
  normalize,
  obs_norm_init,
  obs_norm_update,
  ppo_loss,
)
from jaxrl_async.config import ConfigError, NetworkConfig
from jaxrl_async.envs import EnvSpec
from jaxrl_async.networks import ActorCritic
from jaxrl_async.runtime.trainer import Trainer
from tests.conftest import random_batch, small_config

# One env, T = 3, V(obs_0..3) = 1, 2, 3, 4, rewards 1, gamma 0.9, lambda 0.5 (gamma lambda = 0.45).
# TD errors: d_0 = 1 + 0.9 * 2 - 1 = 1.8, d_1 = 1 + 0.9 * 3 - 2 = 1.7, d_2 = 1 + 0.9 * 4 - 3 = 1.6.
VALUES = jnp.array([[1.0], [2.0], [3.0], [4.0]])
REWARDS = jnp.ones((3, 1))
NO = jnp.zeros((3, 1), bool)


def at(t):
  return NO.at[t, 0].set(True)


@pytest.mark.parametrize("jit", [False, True])
def test_gae_without_episode_end(jit):
  # A_2 = 1.6; A_1 = 1.7 + 0.45 * 1.6 = 2.42; A_0 = 1.8 + 0.45 * 2.42 = 2.889
  fn = jax.jit(gae_advantages, static_argnums=(4, 5)) if jit else gae_advantages
  adv = fn(VALUES, REWARDS, NO, NO, 0.9, 0.5)
  np.testing.assert_allclose(adv[:, 0], [2.889, 2.42, 1.6], rtol=1e-6)


def test_gae_termination_neither_bootstraps_nor_continues():
  # obs_2 is terminal: d_1 = 1 + 0 - 2 = -1 and the trace stops there: A_1 = -1,
  # A_0 = 1.8 + 0.45 * (-1) = 1.35.
  adv = gae_advantages(VALUES, REWARDS, at(1), NO, 0.9, 0.5)
  np.testing.assert_allclose(adv[:2, 0], [1.35, -1.0], rtol=1e-6)


def test_gae_truncation_bootstraps_from_the_final_obs_and_cuts_the_trace():
  # obs_2 ends by time limit: d_1 = 1.7 (bootstraps V(obs_2) = 3), A_1 = 1.7 alone,
  # A_0 = 1.8 + 0.45 * 1.7 = 2.565.
  adv = gae_advantages(VALUES, REWARDS, NO, at(1), 0.9, 0.5)
  np.testing.assert_allclose(adv[:2, 0], [2.565, 1.7], rtol=1e-6)


def test_clipped_surrogate_is_pessimistic_on_both_sides():
  # eps 0.2: r 1.5, A 2 -> -min(3, 2.4) = -2.4; r 0.5, A 1 -> -min(0.5, 0.8) = -0.5;
  # r 1.5, A -1 -> -min(-1.5, -1.2) = 1.5; r 0.5, A -1 -> -min(-0.5, -0.8) = 0.8.
  loss = clipped_surrogate(jnp.array([1.5, 0.5, 1.5, 0.5]), jnp.array([2.0, 1.0, -1.0, -1.0]),
                           0.2)
  np.testing.assert_allclose(loss, [-2.4, -0.5, 1.5, 0.8], rtol=1e-6)


class FixedNet:
  """A 'network' whose outputs are its params: logits [2] and a value, for every obs."""

  def apply(self, params, obs):
    lead = obs.shape[:-1]
    return jnp.broadcast_to(params["logits"], lead + (2,)), jnp.broadcast_to(params["v"], lead)


def _loss_batch(valid=(True, True), old_value=(1.0, 1.0)):
  # Two transitions; behaviour logp = log 0.5 for both actions taken (1, then 0).
  return PPOBatch(obs=jnp.zeros((2, 1)), actions=jnp.array([1, 0], jnp.int32),
                  logp=jnp.full((2,), math.log(0.5)), adv=jnp.array([2.0, 1.0]),
                  ret=jnp.array([3.0, 0.0]), value=jnp.array(old_value), valid=jnp.array(valid))


def _run_loss(batch, value_coef=0.5, entropy_coef=0.0, clip_value=False):
  # logits (0, ln 3): pi = (0.25, 0.75); V = 1 everywhere. The loss psums over an axis, so
  # it runs under a vmap that names one.
  params = {"logits": jnp.array([0.0, math.log(3.0)]), "v": jnp.array(1.0)}
  fn = lambda b: ppo_loss(FixedNet(), params, None, b, "i", discrete=True,
                          clip_eps=jnp.asarray(0.2), clip_value=clip_value,
                          value_coef=value_coef, entropy_coef=entropy_coef,
                          normalize_advantages=False)
  loss, metrics = jax.vmap(fn, axis_name="i")(jax.tree.map(lambda x: x[None], batch))
  return float(loss[0]), {k: float(v[0]) for k, v in metrics.items()}


def test_ppo_loss_by_hand():
  # ratios: 0.75 / 0.5 = 1.5 (A = 2), 0.25 / 0.5 = 0.5 (A = 1) -> pg = mean(-2.4, -0.5) = -1.45
  # value: 0.5 * mean((1 - 3)^2, (1 - 0)^2) = 1.25
  # entropy: -(0.25 ln 0.25 + 0.75 ln 0.75) = 0.562335
  # loss = -1.45 + 0.5 * 1.25 - 0.01 * 0.562335 = -0.830623
  # approx kl: mean(0.5 - ln 1.5, -0.5 - ln 0.5) = mean(0.094535, 0.193147) = 0.143841
  loss, m = _run_loss(_loss_batch(), value_coef=0.5, entropy_coef=0.01)
  assert loss == pytest.approx(-0.830623, abs=1e-5)
  assert m["pg_loss"] == pytest.approx(-1.45, abs=1e-6)
  assert m["value_loss"] == pytest.approx(1.25, abs=1e-6)
  assert m["entropy"] == pytest.approx(0.562335, abs=1e-5)
  assert m["approx_kl"] == pytest.approx(0.143841, abs=1e-5)
  assert m["clip_frac"] == pytest.approx(1.0)


def test_ppo_loss_masks_invalid_steps_and_clips_the_value():
  # Step 1 invalid: pg = -2.4, and with value clipping around the old value 2.5
  # (V_clip = 2.5 + clip(1 - 2.5, -0.2, 0.2) = 2.3): max((1 - 3)^2, (2.3 - 3)^2) = 4 -> 2.0.
  loss, m = _run_loss(_loss_batch(valid=(True, False), old_value=(2.5, 2.5)), clip_value=True)
  assert m["pg_loss"] == pytest.approx(-2.4, abs=1e-6)
  assert m["value_loss"] == pytest.approx(2.0, abs=1e-6)
  # Both valid: step 1 has (1 - 0)^2 = 1 vs (2.3 - 0)^2 = 5.29 -> 0.5 * (4 + 5.29) / 2 = 2.3225
  _, m = _run_loss(_loss_batch(old_value=(2.5, 2.5)), clip_value=True)
  assert m["value_loss"] == pytest.approx(2.3225, abs=1e-5)


def test_gaussian_logp_by_hand():
  # log N(x; 0, 1) = -x^2 / 2 - 0.918939 per dim: x = (1, -1) -> -2.837877;
  # std 2, x 2: -0.5 - ln 2 - 0.918939 = -2.112086.
  assert float(gaussian_logp(jnp.zeros(2), jnp.zeros(2), jnp.array([1.0, -1.0]))) == (
      pytest.approx(-2.837877, abs=1e-5))
  assert float(gaussian_logp(jnp.zeros(1), jnp.log(jnp.array([2.0])), jnp.array([2.0]))) == (
      pytest.approx(-2.112086, abs=1e-5))


def test_continuous_policy_clips_what_it_sends_and_scores_the_raw_sample():
  spec = EnvSpec("Fake-v0", (3,), np.dtype(np.float32), False, 2, (-1.0, -0.5), (1.0, 0.5))
  net = ActorCritic(NetworkConfig(hidden_sizes="8"), 2, discrete=False)
  params = net.init(jax.random.key(0), jnp.zeros((1, 3)))
  params = jax.tree_util.tree_map_with_path(
      lambda path, x: jnp.full_like(x, math.log(5.0)) if "log_std" in str(path) else x, params)
  obs = jax.random.normal(jax.random.key(1), (256, 3))
  action, extras = jax.jit(make_policy_fn(net, spec))({"params": params, "obs_norm": None},
                                                      obs, jax.random.key(2))
  raw = extras["raw_action"]
  assert float(jnp.abs(raw).max()) > 1.0  # std 5: many samples leave the bounds...
  np.testing.assert_array_equal(action, jnp.clip(raw, jnp.array([-1.0, -0.5]),
                                                 jnp.array([1.0, 0.5])))  # ...and are clipped
  (mean, log_std), _ = net.apply(params, obs)
  np.testing.assert_allclose(extras["logp"], gaussian_logp(mean, log_std, raw), rtol=1e-5)


def test_obs_norm_merges_batches_like_numpy():
  rng = np.random.default_rng(0)
  x1 = rng.normal(3.0, 2.0, size=(50, 4, 3)).astype(np.float32)
  x2 = rng.normal(-1.0, 0.5, size=(30, 4, 3)).astype(np.float32)
  update = jax.vmap(lambda n, x: obs_norm_update(n, x, "i"), axis_name="i")
  norm = jax.tree.map(lambda a: a[None], obs_norm_init((3,)))
  norm = update(norm, x1[None])
  norm = update(norm, x2[None])
  both = np.concatenate([x1.reshape(-1, 3), x2.reshape(-1, 3)])
  np.testing.assert_allclose(norm.mean[0], both.mean(0), rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(norm.var[0], both.var(0), rtol=1e-3)
  assert float(norm.count[0]) == pytest.approx(len(both), abs=1e-3)
  z = normalize(jax.tree.map(lambda a: a[0], norm), jnp.asarray(both))
  np.testing.assert_allclose(np.asarray(z).mean(0), 0.0, atol=1e-3)


def test_obs_norm_is_refused_for_image_observations():
  config = small_config(algo="ppo", env_id="Pong-v5", network="nature_cnn", normalize_obs=True)
  atari = EnvSpec("Pong-v5", (4, 84, 84), np.dtype(np.uint8), True, 6)
  with pytest.raises(ConfigError, match="--normalize_obs="):
    algos.check(config, atari)


def run(config, tmp_path):
  return Trainer.from_config(config, envs.env_spec(config.env), run_dir=tmp_path, quiet=True).run()


PPO_CARTPOLE = dict(algo="ppo", num_envs=8, rollout_len=32, learning_rate=1e-3,
                    anneal_lr=True, anneal_clip=True, discount=0.98, gae_lambda=0.8,
                    entropy_coef=0.0, hidden_sizes="64,64", num_epochs=20, num_minibatches=1,
                    total_env_steps=200_000)


def test_sync_ppo_learns_cartpole(tmp_path):
  # Random play scores ~22; the preset reaches 475 in 24k-61k steps on 12 of 12 seeds.
  config = small_config(**PPO_CARTPOLE, num_actors=1, max_policy_lag=0, stop_at_return=150.0)
  s = run(config, tmp_path).summary
  assert s["solved"], f"return_mean only {s['final_return_mean']} after {s['env_steps']} steps"
  assert s["env_steps"] < 80_000 and s["max_policy_lag_seen"] == 0


def test_async_ppo_learns_cartpole_within_the_lag_cap(tmp_path):
  config = small_config(**PPO_CARTPOLE, num_actors=2, max_policy_lag=1, stop_at_return=150.0)
  s = run(config, tmp_path).summary
  assert s["solved"], f"return_mean only {s['final_return_mean']} after {s['env_steps']} steps"
  assert s["max_policy_lag_seen"] <= 1 and "1" in s["lag_hist"]  # it did learn from lag 1


def test_continuous_update_learns_obs_norm_and_scores_raw_actions():
  # Hopper-like spec (no EnvPool needed): one update of 2 epochs on a random [T=8, B=4] batch.
  spec = EnvSpec("Fake-v0", (11,), np.dtype(np.float32), False, 3, (-1.0,) * 3, (1.0,) * 3)
  config = small_config(algo="ppo", num_envs=4, rollout_len=8, normalize_obs=True,
                        num_epochs=2, num_minibatches=2)
  algo = algos.make_algorithm(config, spec, "i")
  assert set(algo.extras_spec) == {"logp", "raw_action"}
  rng = np.random.default_rng(0)
  raw = rng.normal(size=(8, 4, 3)).astype(np.float32)
  batch = Rollout(obs=(5.0 + 2.0 * rng.normal(size=(9, 4, 11))).astype(np.float32),
                  actions=np.clip(raw, -1, 1), rewards=rng.normal(size=(8, 4)).astype(np.float32),
                  terminated=np.zeros((8, 4), bool), truncated=np.zeros((8, 4), bool),
                  valid=np.ones((8, 4), bool),
                  extras={"logp": np.full((8, 4), -3.0, np.float32), "raw_action": raw})
  state = jax.tree.map(lambda x: x[None], jax.jit(algo.init)(jax.random.key(0)))
  new, metrics = jax.jit(jax.vmap(algo.update, axis_name="i"))(
      state, jax.tree.map(lambda x: jnp.asarray(x)[None], batch))
  # The statistics merged the 8 x 4 observations the loss used (the bootstrap row is next
  # rollout's first): count 1e-4 + 32, mean ~5.
  assert float(new.obs_norm.count[0]) == pytest.approx(32.0, abs=1e-3)
  np.testing.assert_allclose(new.obs_norm.mean[0], batch.obs[:-1].reshape(-1, 11).mean(0),
                             rtol=1e-4)
  assert np.isfinite(float(metrics["pg_loss"][0])) and int(new.version[0]) == 1
  assert not np.allclose(jax.tree.leaves(new.params)[0], jax.tree.leaves(state.params)[0])


def sharded_check():
  """Called in a process with 4 CPU devices (tests/test_replay.py runs it): one PPO update
  (epochs, obs normalisation, advantage normalisation) on 4 devices equals the same update on
  1, and replicas stay identical."""
  from jaxrl_async.algos import make_algorithm
  from jaxrl_async.runtime.learners.on_policy import compile_update
  from jaxrl_async.runtime.sharding import (
    LEARNER_AXIS,
    check_replicated,
    learner_mesh,
    put_batch,
    replicate,
  )

  assert jax.device_count() == 4, jax.devices()
  T, B = 8, 8
  batch = random_batch(T, B, np.random.default_rng(0))
  config = small_config(algo="ppo", num_envs=B, rollout_len=T, learner_devices=4,
                        normalize_obs=True, num_epochs=2, num_minibatches=1)
  spec = envs.env_spec(config.env)
  out = []
  for devices in (jax.devices()[:1], jax.devices()):
    algo = make_algorithm(config, spec, LEARNER_AXIS)
    mesh = learner_mesh(devices)
    state = replicate(jax.jit(algo.init)(jax.random.key(0)), mesh)
    step = compile_update(config, spec, algo, mesh, state)
    new_state, metrics = step(state, (put_batch(batch, mesh),))
    out.append((new_state, metrics, state))
  (single, m1, init), (sharded, m4, _) = out
  check_replicated(sharded.params)
  check_replicated(sharded.obs_norm)
  for a, b in zip(jax.tree.leaves(jax.device_get((single.params, single.obs_norm))),
                  jax.tree.leaves(jax.device_get((sharded.params, sharded.obs_norm))),
                  strict=True):
    np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)
  np.testing.assert_allclose(float(m1["pg_loss"]), float(m4["pg_loss"]), rtol=1e-4, atol=1e-6)
  assert not np.allclose(jax.tree.leaves(single.params)[0], jax.tree.leaves(init.params)[0])
  print("PPO_SHARDED_OK")
