"""Mountain Car transitions from EnvPool under a fixed policy, with 300 tile-coding features.

The policy pumps energy: push in the direction of the velocity (action 2 if v >= 0 else 0), and
with probability `epsilon` a uniformly random action, so the visited states form a band rather
than one curve. Features: tile coding, 3 tilings of a 10 x 10 grid over the observation box,
each offset by a third of a tile, value 1/sqrt(3) on the active tile of each tiling (unit norm).
NOTE: tiles, not RBFs. 300 overlapping Gaussians are so collinear on the visited band that
C_i's smallest non-zero eigenvalues are ~1e-10 (measured), and the dual ascent, whose rate is
beta * lambda_min(C_i), would never get near 1e-10; tiles give ~3e-5 at 1000 rows. A tile no
sampled state touches is exactly zero in every row, so it drops out of C_i^+ and of theta*.

EnvPool's gymnasium API returns 5-tuples and auto-resets: the step after a terminal or truncated
one returns the first observation of a new episode (info["elapsed_step"] == 0); that
"transition" is dropped. Terminal transitions (the car reached the flag) bootstrap from 0.
"""

from __future__ import annotations

import warnings

import numpy as np

from jaxrl_async.decentralized.problem import Problem, split_rows

LOW = np.array([-1.2, -0.07])
HIGH = np.array([0.6, 0.07])
TILINGS, GRID = 3, 10  # 3 * 10 * 10 = 300 features


def tile_features(obs: np.ndarray) -> np.ndarray:
  """[B, 300] tile-coding features of observations [B, 2] (position, velocity)."""
  unit = (np.asarray(obs, np.float64) - LOW) / (HIGH - LOW)  # [B, 2] in [0, 1]
  out = np.zeros((len(unit), TILINGS * GRID * GRID))
  rows = np.arange(len(unit))
  for t in range(TILINGS):
    offset = t / TILINGS / (GRID - 1)
    ij = np.clip(np.floor((unit + offset) * (GRID - 1)).astype(int), 0, GRID - 1)
    out[rows, t * GRID * GRID + ij[:, 0] * GRID + ij[:, 1]] = 1.0 / np.sqrt(TILINGS)
  return out


def collect(samples: int, seed: int, num_envs: int = 8, epsilon: float = 0.1
            ) -> dict[str, np.ndarray]:
  """`samples` on-policy transitions, grouped by environment (so contiguous rows are trajectories).

  Returns dict with obs, next_obs: [samples, 2]; reward, terminal: [samples].
  """
  import envpool  # NOTE: imported here so the rest of the package never pays for it

  env = envpool.make("MountainCar-v0", env_type="gymnasium", num_envs=num_envs, seed=seed)
  rng = np.random.default_rng(seed)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # gymnasium's float32 warnings when the obs box is built
    obs, _ = env.reset()
  per_env: list[list[tuple]] = [[] for _ in range(num_envs)]
  while sum(len(t) for t in per_env) < samples:
    pump = np.where(obs[:, 1] >= 0, 2, 0)
    action = np.where(rng.uniform(size=num_envs) < epsilon,
                      rng.integers(0, 3, num_envs), pump).astype(np.int32)
    next_obs, reward, term, _trunc, info = env.step(action)
    for e in range(num_envs):
      if info["elapsed_step"][e] > 0:  # otherwise this step was the auto-reset
        per_env[e].append((obs[e].copy(), next_obs[e].copy(), float(reward[e]), bool(term[e])))
    obs = next_obs
  env.close()
  rows = [t for traj in per_env for t in traj][:samples]
  return {"obs": np.array([r[0] for r in rows], np.float64),
          "next_obs": np.array([r[1] for r in rows], np.float64),
          "reward": np.array([r[2] for r in rows]),
          "terminal": np.array([r[3] for r in rows])}


def mountain_car(seed: int, nodes: int, samples: int, gamma: float = 0.9, rho: float = 0.01,
                 split: str = "parallel", shards: int = 0, speeds: np.ndarray | None = None
                 ) -> Problem:
  """The Mountain Car problem: d = 300, split over `nodes` (see `problem.split_rows`).

  'multi_agent' shares the states and gives node i the local reward r + u_i (position + 0.5),
  u_i ~ U(-1, 1): a synthetic team whose rewards differ per agent but share the dynamics.
  """
  data = collect(samples, seed)
  phi = tile_features(data["obs"])
  phi_next = tile_features(data["next_obs"]) * (~data["terminal"])[:, None]
  psi = phi - gamma * phi_next
  local_r = None
  if split == "multi_agent":
    u = np.random.default_rng(seed + 1).uniform(-1.0, 1.0, size=(nodes, 1))
    local_r = data["reward"][None, :] + u * (data["obs"][None, :, 0] + 0.5)
  sharded = f", K={shards}" if shards not in (0, nodes) else ""
  name = f"mountain_car(tiles d=300, M={samples}, {split}{sharded}, seed={seed})"
  return split_rows(phi, psi, data["reward"], nodes, split, rho, name, local_r=local_r,
                    shards=shards, speeds=speeds)
