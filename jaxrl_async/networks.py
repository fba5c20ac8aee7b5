"""Flax modules: torsos (MLP, Nature CNN, IMPALA ResNet) and the heads the algorithms use."""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from jaxrl_async.config import NetworkConfig
from jaxrl_async.types import Array

_ACTIVATIONS = {"tanh": nn.tanh, "relu": nn.relu}


def _ortho(scale: float = np.sqrt(2)) -> nn.initializers.Initializer:
  return nn.initializers.orthogonal(scale)


class MLP(nn.Module):
  sizes: Sequence[int]
  activation: str = "tanh"

  @nn.compact
  def __call__(self, x: Array) -> Array:
    act = _ACTIVATIONS[self.activation]
    for size in self.sizes:
      x = act(nn.Dense(size, kernel_init=_ortho())(x))
    return x


def _frames(x: Array) -> Array:
  """EnvPool Atari frames [..., C, H, W] uint8 -> [..., H, W, C] float in [0, 1]."""
  x = jnp.moveaxis(x, -3, -1)
  return x.astype(jnp.float32) / 255.0


class NatureCNN(nn.Module):
  """Mnih et al. (2015): three conv layers and a 512-unit dense layer."""

  @nn.compact
  def __call__(self, x: Array) -> Array:
    x = _frames(x)
    x = nn.relu(nn.Conv(32, (8, 8), (4, 4), padding="VALID", kernel_init=_ortho())(x))
    x = nn.relu(nn.Conv(64, (4, 4), (2, 2), padding="VALID", kernel_init=_ortho())(x))
    x = nn.relu(nn.Conv(64, (3, 3), (1, 1), padding="VALID", kernel_init=_ortho())(x))
    x = x.reshape(x.shape[:-3] + (-1,))
    return nn.relu(nn.Dense(512, kernel_init=_ortho())(x))


class _ResidualBlock(nn.Module):
  channels: int

  @nn.compact
  def __call__(self, x: Array) -> Array:
    y = nn.Conv(self.channels, (3, 3))(nn.relu(x))
    y = nn.Conv(self.channels, (3, 3))(nn.relu(y))
    return x + y


class ImpalaResNet(nn.Module):
  """Espeholt et al. (2018), the deep IMPALA torso: 3 stages of (conv, pool, 2 res blocks)."""

  channels: Sequence[int] = (16, 32, 32)

  @nn.compact
  def __call__(self, x: Array) -> Array:
    x = _frames(x)
    for ch in self.channels:
      x = nn.Conv(ch, (3, 3))(x)
      x = nn.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")
      x = _ResidualBlock(ch)(x)
      x = _ResidualBlock(ch)(x)
    x = nn.relu(x).reshape(x.shape[:-3] + (-1,))
    return nn.relu(nn.Dense(256)(x))


def make_torso(cfg: NetworkConfig) -> nn.Module:
  if cfg.network == "nature_cnn":
    return NatureCNN()
  if cfg.network == "impala_resnet":
    return ImpalaResNet()
  return MLP(cfg.layer_sizes, cfg.activation)


class ActorCritic(nn.Module):
  """Policy head (logits, or a Gaussian mean with state-independent log-std) and a value head.

  Returns (policy_params, value [...]): logits [..., A] for discrete actions, or (mean, log_std)
  each [..., A] for continuous ones.
  """

  cfg: NetworkConfig
  num_actions: int
  discrete: bool = True

  @nn.compact
  def __call__(self, obs: Array):
    shared = self.cfg.shared_torso or self.cfg.network != "mlp"
    x_pi = make_torso(self.cfg)(obs)
    x_v = x_pi if shared else make_torso(self.cfg)(obs)
    value = nn.Dense(1, kernel_init=_ortho(1.0))(x_v)[..., 0]
    head = nn.Dense(self.num_actions, kernel_init=_ortho(0.01))(x_pi)
    if self.discrete:
      return head, value
    log_std = self.param("log_std", nn.initializers.zeros, (self.num_actions,))
    return (head, jnp.broadcast_to(log_std, head.shape)), value


class QNetwork(nn.Module):
  """Q-values [..., A] over a torso."""

  cfg: NetworkConfig
  num_actions: int

  @nn.compact
  def __call__(self, obs: Array) -> Array:
    x = make_torso(self.cfg)(obs)
    return nn.Dense(self.num_actions)(x)
