"""A2C, the fourth algorithm: added as algos/a2c.py, algos/a2c_config.py and one line of
algos/registry.py; its loss worked out by hand, its flags and its learning on CartPole."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import pytest

from jaxrl_async import algos
from jaxrl_async.algos.a2c import a2c_loss
from jaxrl_async.algos.base import Rollout
from jaxrl_async.config import ConfigError, TrainConfig
from jaxrl_async.envs import EnvSpec
from jaxrl_async.runtime.trainer import Trainer
from tests.conftest import small_config
from tests.test_ppo import FixedNet


def _batch(valid=(True, True)):
  # T = 1, B = 2: column 0 takes action 1 and ends (terminated, reward 1), column 1 takes
  # action 0 and goes on (reward 0); V = 1 everywhere.
  return Rollout(obs=jnp.zeros((2, 2, 1)), actions=jnp.array([[1, 0]], jnp.int32),
                 rewards=jnp.array([[1.0, 0.0]]), terminated=jnp.array([[True, False]]),
                 truncated=jnp.array([[False, False]]), valid=jnp.array([valid]), extras={})


def _loss(batch):
  params = {"logits": jnp.array([0.0, math.log(3.0)]), "v": jnp.array(1.0)}
  fn = lambda b: a2c_loss(FixedNet(), params, b, "i", discount=0.9, gae_lambda=1.0,
                          value_coef=0.5, entropy_coef=0.01, normalize_advantages=False)
  loss, metrics = jax.vmap(fn, axis_name="i")(jax.tree.map(lambda x: x[None], batch))
  return float(loss[0]), {k: float(v[0]) for k, v in metrics.items()}


def test_a2c_loss_by_hand():
  # pi = (0.25, 0.75). Advantages: column 0, 1 + 0 - 1 = 0 (terminal: no bootstrap); column 1,
  # 0 + 0.9 * 1 - 1 = -0.1. pg = -mean(ln 0.75 * 0, ln 0.25 * -0.1) = -0.0693147;
  # value = 0.5 mean(0, 0.01) = 0.0025; entropy 0.562335;
  # loss = -0.0693147 + 0.5 * 0.0025 - 0.01 * 0.562335 = -0.0736880.
  loss, m = _loss(_batch())
  assert m["pg_loss"] == pytest.approx(-0.0693147, abs=1e-6)
  assert m["value_loss"] == pytest.approx(0.0025, abs=1e-7)
  assert m["entropy"] == pytest.approx(0.562335, abs=1e-6)
  assert loss == pytest.approx(-0.0736880, abs=1e-6)
  # Column 1's step invalid (EnvPool's reset step): only column 0 counts, whose advantage is 0.
  loss, m = _loss(_batch(valid=(True, False)))
  assert m["pg_loss"] == pytest.approx(0.0, abs=1e-7) and m["value_loss"] == pytest.approx(0.0)
  assert m["entropy"] == pytest.approx(0.562335, abs=1e-6)


def test_a2c_is_in_the_registry_with_its_flags():
  assert "a2c" in algos.ALGORITHMS and not algos.is_off_policy("a2c")
  assert "gae_lambda" in TrainConfig.flag_fields("a2c")
  with pytest.raises(ConfigError, match="--gae_lambda=1.5"):
    small_config(algo="a2c", gae_lambda=1.5)
  continuous = EnvSpec("Fake-v0", (3,), jnp.float32, False, 2, (-1.0,) * 2, (1.0,) * 2)
  with pytest.raises(ConfigError, match="continuous"):
    algos.check(small_config(algo="a2c"), continuous)


def test_a2c_learns_cartpole(tmp_path):
  # Random play scores ~22; with its default settings it reached 150 in 26k-35k env steps on
  # 3 of 3 seeds (K = 0, one actor, 16 envs x 16 steps).
  config = small_config(algo="a2c", num_actors=1, max_policy_lag=0, num_envs=16,
                        rollout_len=16, hidden_sizes="64,64", total_env_steps=100_000,
                        stop_at_return=150.0)
  s = Trainer.from_config(config, run_dir=tmp_path, quiet=True).run().summary
  assert s["solved"], f"return_mean only {s['final_return_mean']} after {s['env_steps']} steps"
  assert s["max_policy_lag_seen"] == 0
