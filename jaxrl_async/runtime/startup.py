"""A run's programs: the initial state (or a checkpoint's), one policy step per distinct
(policy, device) and the learner's step, all started at once from abstract shapes.

Start-up is most of a short run here, and XLA compiles outside the GIL, so the initial state and
the policies compile on two threads while the learner thread compiles the update. `Programs`
is the one place these are made: the trainer's run and `--compile_only` (runtime/precompile.py)
both go through it, so their cache keys are the same.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import time
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from jaxrl_async.metrics import EpisodeStats, wall_s
from jaxrl_async.runtime.build import Components, trace_init
from jaxrl_async.runtime.learners.global_step import GlobalStep, compile_global_update
from jaxrl_async.runtime.learners.on_policy import OnPolicyStep, batch_shapes, compile_update
from jaxrl_async.runtime.learners.replay_step import ReplayStep
from jaxrl_async.runtime.pipeline.policy_step import compile_policy_step

# XLA options for a program that runs once (the initial state).
RUN_ONCE_OPTIONS = {"xla_backend_optimization_level": 0}


@dataclasses.dataclass
class Start:
  """Where this session starts from: fresh (zeros) or a checkpoint's counters."""

  version: int = 0
  env_steps: int = 0
  episodes: int = 0
  wall_s_total: float = 0.0
  resumed_from: int | None = None
  rollouts_learned: int | None = None  # on-policy, restored (OnPolicyStep's budget)


@dataclasses.dataclass
class Startup:
  """The compiles start-up set going: the abstract state, the initial state's future, one
  policy per actor (kept alive: the keys use their ids), each actor's (policy, device) key and
  the compiled policy step per key, and the replay's restore for a resumed off-policy run."""

  abstract: Any
  state_future: Any
  policies: list[Any]
  policy_keys: list[tuple]
  policy_futures: dict[tuple, Any]
  replay_future: Any


class Programs:
  """Compiles (or loads from the executable cache) what a run of `parts` runs. A restore fills
  `start` in place (the trainer and its checkpoint hook hold the same object) and `timings`
  gets each compile's seconds, for summary.json."""

  def __init__(self, parts: Components, timings: dict, start: Start):
    self.parts, self.config, self.timings, self.start = parts, parts.config, timings, start
    self.replay_restored = False  # a resumed off-policy run continued its saved replay

  def trace_init(self) -> Any:
    return trace_init(self.parts, self.timings)

  def init_state(self, traced: Any = None) -> Any:
    traced = traced if traced is not None else self.trace_init()
    t0 = time.perf_counter()
    # Init runs once, so its speed does not matter but its compile does: LLVM's optimisation
    # off cuts that compile by a quarter here (`python -m tools.compile_time`, BUILD_NOTES.md).
    compiled = self.parts.executables.compile("init", self.parts.hosts.learner_devices,
                                              traced.lower, RUN_ONCE_OPTIONS)
    state = compiled(np.int32(self.config.run.seed))
    jax.block_until_ready(state)
    self.timings["compile_init_s"] = time.perf_counter() - t0 + self.timings["trace_init_s"]
    return state

  def restore_state(self, abstract: Any) -> Any:
    t0 = time.perf_counter()
    state, meta = self.parts.checkpointer.restore(abstract)
    c, s = meta["counters"], self.start
    s.version, s.resumed_from = int(meta["version"]), int(meta["version"])
    s.env_steps, s.episodes = int(c["env_steps"]), int(c["episodes"])
    s.wall_s_total = float(c["wall_s_total"])
    s.rollouts_learned = c.get("rollouts_learned")
    self.timings["restore_s"] = time.perf_counter() - t0
    return state

  def abstract_replay(self) -> Any:
    from jaxrl_async.runtime.learners.replay_step import abstract_replay

    return abstract_replay(self.config, self.parts.spec, self.parts.algo, self.parts.mesh)

  def restore_replay(self, abstract: Any, after: Any) -> Any:
    """The checkpoint's (replay, host counters), or None if it holds none (the learner then
    starts an empty one). Runs after the state's restore (`after`), never beside it."""
    after.result()
    t0 = time.perf_counter()
    restored = self.parts.checkpointer.restore_replay(abstract, self.start.resumed_from)
    self.timings["restore_replay_s"] = time.perf_counter() - t0
    self.replay_restored = restored is not None
    return restored

  def policy_step(self, params: Any, device: jax.Device | None = None, policy: Any = None,
                  actor_index: int = 0) -> Any:
    """The compiled policy step (`compile_policy_step`) for `device`; `policy` is actor
    `actor_index`'s (`make_policy` is a function of the config and the index)."""
    t0 = time.perf_counter()
    p = self.parts
    compiled = compile_policy_step(policy or p.algo.make_policy(actor_index), params, p.spec,
                                   self.config.env.batch_size, device or p.actor_device,
                                   p.executables, f"policy-{actor_index}")
    self.timings["compile_policy_s"] = time.perf_counter() - t0
    return compiled

  def start_compiles(self, resume: bool, compile_: bool = True) -> Startup:
    """Sets the initial state (or its restore) and the policies compiling on two threads, from
    abstract shapes. Without `compile_` (a stop came first) only the shapes are traced."""
    cfg, p = self.config, self.parts
    traced_init = self.trace_init()
    abstract = traced_init.out_info
    if not compile_:
      never: concurrent.futures.Future = concurrent.futures.Future()
      never.cancel()
      return Startup(abstract, never, [], [], {}, None)
    pool = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="startup")
    state_future = pool.submit(self.restore_state if resume else self.init_state,
                               abstract if resume else traced_init)
    # One compile per distinct (policy, device): IMPALA and PPO share one policy; DQN's
    # differ per actor (their exploration epsilons).
    actor_devices = p.hosts.actor_devices
    policies = [p.algo.make_policy(i) for i in range(cfg.actor.num_actors)]  # kept alive
    keys = [(id(policies[i]), i % len(actor_devices)) for i in range(cfg.actor.num_actors)]
    policy_futures: dict[tuple, Any] = {}
    for i, key in enumerate(keys):
      if key not in policy_futures:
        policy_futures[key] = pool.submit(self.policy_step, p.algo.actor_params(abstract),
                                          actor_devices[key[1]], policies[i], i)
    replay_future = None
    if resume and p.algo.off_policy and cfg.checkpoint.checkpoint_replay:
      replay_future = pool.submit(self.restore_replay, self.abstract_replay(), state_future)
    pool.shutdown(wait=False)
    return Startup(abstract, state_future, policies, keys, policy_futures, replay_future)

  def make_step(self, startup: Startup, session_steps: Any, stats: EpisodeStats | None,
                current_u: Any = None) -> Any:
    """The learner's step (learners/loop.py): replay, global (several processes) or on-policy
    (whose U follows `current_u`, the rate controller's, under --balance=auto)."""
    cfg, p = self.config, self.parts
    if p.algo.off_policy:
      rollout = batch_shapes(cfg, p.spec, p.algo, p.mesh)[0]
      return ReplayStep(p.algo, p.mesh, rollout, self.abstract_replay(), cfg.env.num_envs,
                        cfg.run.total_env_steps, startup.replay_future)
    hosts = p.cluster.num_processes if p.cluster else 1
    per_update = cfg.env_steps_per_update * hosts  # --total_env_steps counts every host's
    target = -(-cfg.run.total_env_steps // per_update)
    consumed = cfg.env_steps_per_rollout * max(p.algo.epochs_per_update, 1)
    if p.cluster is None:
      compile_fn = functools.partial(compile_update, cfg, p.spec, p.algo, p.mesh,
                                     executables=p.executables)
      return OnPolicyStep(compile_fn, cfg.rate.rollouts_per_update, target, consumed, current_u,
                          learned_before=lambda: self.start.rollouts_learned)
    # This host's counts this session (stats count this session's episodes only).
    counts = lambda: {"env_steps": session_steps(), "episodes": stats.episodes}
    compile_fn = functools.partial(compile_global_update, cfg, p.spec, p.algo, p.mesh,
                                   num_processes=hosts)
    return GlobalStep(compile_fn, cfg.rate.rollouts_per_update, target, consumed, p.mesh,
                      p.cluster, counts, wall_s)

  def compile_all(self, other_us: Sequence[int] = ()) -> list[str]:
    """Compiles (or loads) every program a fresh run compiles at start-up, and the update at
    each rollouts-per-update in `other_us` (those --balance=auto may switch to), waiting for
    all; returns their names. Nothing runs but the initial state's program."""
    startup = self.start_compiles(resume=False)
    step = self.make_step(startup, lambda: 0, None)
    step.compile(startup.abstract)
    for u in other_us:
      step.compile_fn(startup.abstract, rollouts_per_update=u)
    startup.state_future.result()
    for future in startup.policy_futures.values():
      future.result()
    # One policy step per distinct (policy, device), named by its first actor, as the run does.
    policies = sorted({startup.policy_keys.index(key) for key in startup.policy_keys})
    return ["init", *(f"policy-{i}" for i in policies), "update",
            *(f"update-u{u}" for u in other_us)]
