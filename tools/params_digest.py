"""The SHA-256 of a deterministic run's final params, to check that a refactor kept the maths.

With max_policy_lag K = 0 and one actor, a CartPole run is deterministic: every rollout is acted
with the newest params and learned in order. Run this tool with each checkout first on the path
and compare the digests, e.g. against a44f5c3:

  git worktree add /tmp/old a44f5c3
  PYTHONPATH=/tmp/old python tools/params_digest.py --algos impala,ppo
  PYTHONPATH=. python tools/params_digest.py --algos impala,ppo

`--set anneal_lr=true,rollouts_per_update=2` overrides the run's flags (JSON values, else
strings), e.g. to digest the annealed schedules. Only `TrainConfig.from_flat`, `envs.env_spec`
and a Trainer's `run()` are used, so the tool runs on checkouts older than itself. Prints one
JSON line per algorithm.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import tempfile
from typing import Any

import jax
import numpy as np

BASE = dict(env_id="CartPole-v1", num_envs=8, num_actors=1, rollout_len=8, max_policy_lag=0,
            total_env_steps=3_000, stop_at_return=float("nan"), log_every_s=0.5,
            hidden_sizes="16,16", checkpoint_at_end=False, checkpoint_every_s=0.0)
PER_ALGO: dict[str, dict[str, Any]] = {"impala": {}, "ppo": {"num_minibatches": 2}}


def parse_sets(text: str) -> dict[str, Any]:
  """`k=v,k2=v2` -> {k: v}: each value read as JSON (numbers, true/false), else a string."""
  out: dict[str, Any] = {}
  for item in filter(None, text.split(",")):
    name, _, value = item.partition("=")
    try:
      out[name] = json.loads(value)
    except json.JSONDecodeError:
      out[name] = value
  return out


def digest(algo: str, seed: int, sets: dict[str, Any] | None = None) -> dict[str, Any]:
  from jaxrl_async import envs
  from jaxrl_async.config import TrainConfig
  from jaxrl_async.runtime.trainer import Trainer

  config = TrainConfig.from_flat(BASE | PER_ALGO.get(algo, {}) | {"algo": algo, "seed": seed}
                                  | (sets or {}))
  with tempfile.TemporaryDirectory() as run_dir:
    spec = envs.env_spec(config.env)
    if hasattr(Trainer, "from_config"):  # runtime/build.py's checkouts
      trainer = Trainer.from_config(config, spec, run_dir=run_dir, quiet=True)
    else:  # older checkouts built inside the Trainer
      trainer = Trainer(config, spec, run_dir=run_dir, quiet=True)
    result = trainer.run()
  h = hashlib.sha256()
  for leaf in jax.tree.leaves(jax.device_get(result.state.params)):
    h.update(np.ascontiguousarray(leaf).tobytes())
  return {"algo": algo, "seed": seed, "version": int(result.version),
          "params_sha256": h.hexdigest()[:16]}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--algos", default="impala,ppo")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--set", default="", help="flag overrides: k=v,k2=v2 (JSON values)")
  args = parser.parse_args()
  sets = parse_sets(args.set)
  for algo in args.algos.split(","):
    print(json.dumps(digest(algo, args.seed, sets) | ({"set": sets} if sets else {})),
          flush=True)


if __name__ == "__main__":
  main()
