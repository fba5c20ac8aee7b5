"""Wiring, supervision and shutdown: builds the components from a validated config, runs the
threads, stops at the budget or the return target, and always shuts down cleanly.

An exception in the learner ends the run; a failed actor is restarted up to --actor_restarts
times (its in-flight rollout is lost and counted), then it too ends the run. The main thread
re-raises the error with its traceback. Ctrl-C, SIGTERM or `request_stop` end it cleanly, with a
final checkpoint.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import threading
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np
from absl import logging

from jaxrl_async import envs
from jaxrl_async.config import TrainConfig
from jaxrl_async.metrics import EpisodeStats, wall_s
from jaxrl_async.runtime.build import Components, build, trace_init
from jaxrl_async.runtime.checkpoint_hook import CheckpointHook
from jaxrl_async.runtime.learners.global_step import GlobalStep, compile_global_update
from jaxrl_async.runtime.learners.loop import LearnerLoop
from jaxrl_async.runtime.learners.on_policy import OnPolicyStep, batch_shapes, compile_update
from jaxrl_async.runtime.learners.replay_step import ReplayStep
from jaxrl_async.runtime.monitor import make_monitor
from jaxrl_async.runtime.pipeline.actor import Actor, ActorTimers
from jaxrl_async.runtime.pipeline.balancer import ActorGate, make_bounds, queue_capacity
from jaxrl_async.runtime.pipeline.params import ParamStore
from jaxrl_async.runtime.pipeline.policy_step import compile_policy_step
from jaxrl_async.runtime.pipeline.queue import RolloutQueue
from jaxrl_async.runtime.pipeline.rate import RateController
from jaxrl_async.runtime.summary import write_summary
from jaxrl_async.runtime.supervision import (
    Supervised,
    ThreadFailed,
    join_all,
    stop_phase,
    uninterruptible,
)
from jaxrl_async.runtime.validation import check_devices, check_run_dir, validate

__all__ = ["RunResult", "ThreadFailed", "Trainer", "check_devices", "check_run_dir", "validate"]

# XLA options for a program that runs once (the initial state).
_RUN_ONCE_OPTIONS = {"xla_backend_optimization_level": 0}


@dataclasses.dataclass
class RunResult:
  summary: dict[str, Any]
  state: Any
  version: int


@dataclasses.dataclass
class _Startup:
  """The compiles start-up set going: the abstract state, the initial state's future, one
  policy per actor (kept alive: the keys use their ids), each actor's (policy, device) key and
  the compiled policy step per key, and the replay's restore for a resumed off-policy run."""

  abstract: Any
  state_future: Any
  policies: list[Any]
  policy_keys: list[tuple]
  policy_futures: dict[tuple, Any]
  replay_future: Any


@dataclasses.dataclass
class _Start:
  """Where this session starts from: fresh (zeros) or a checkpoint's counters."""

  version: int = 0
  env_steps: int = 0
  episodes: int = 0
  wall_s_total: float = 0.0
  resumed_from: int | None = None


class Trainer:
  """One training run on this host. `run()` returns a RunResult or raises ThreadFailed."""

  def __init__(self, parts: Components, quiet: bool = False, timings: dict | None = None,
               pool_factory: Any = None, started_at: float | None = None):
    """A run of `parts` (runtime/build.py); `timings` are start-up times measured before it
    (imports), for summary.json; `pool_factory` makes the actors' env pools (tests: fakes);
    `started_at` is the time.time() --max_wall_s counts from (the launcher passes the process's
    start, so the cap covers imports and start-up; default: now)."""
    self.parts = parts
    self.started_at = time.time() if started_at is None else started_at
    self.config = parts.config
    self.quiet = quiet
    self.timings = dict(timings or {})
    self.stop = threading.Event()
    self._stop_reason: str | None = None
    self.pool_factory = pool_factory or envs.make_pool
    self.start = _Start()
    self.replay_restored = False  # a resumed off-policy run continued its saved replay

  @classmethod
  def from_config(cls, config: TrainConfig, spec: envs.EnvSpec | None = None,
                  run_dir: Path | None = None, **kwargs: Any) -> Trainer:
    """`Trainer(build(config, spec, run_dir), **kwargs)`: validates `config` first."""
    return cls(build(config, spec, run_dir), **kwargs)

  def request_stop(self, reason: str) -> None:
    """Asks the run to end cleanly (from a signal handler or another thread)."""
    self._stop_reason = self._stop_reason or reason

  # -- start-up: state, compiled functions ----------------------------------------------------

  def _trace_init(self) -> Any:
    return trace_init(self.parts, self.timings)

  def _init_state(self, traced: Any = None) -> Any:
    traced = traced if traced is not None else self._trace_init()
    t0 = time.perf_counter()
    # Init runs once, so its speed does not matter but its compile does: LLVM's optimisation
    # off cuts that compile by a quarter here (`python -m tools.compile_time`, BUILD_NOTES.md).
    compiled = self.parts.executables.compile("init", self.parts.hosts.learner_devices,
                                              traced.lower, _RUN_ONCE_OPTIONS)
    state = compiled(np.int32(self.config.run.seed))
    jax.block_until_ready(state)
    self.timings["compile_init_s"] = time.perf_counter() - t0 + self.timings["trace_init_s"]
    return state

  def _restore_state(self, abstract: Any) -> Any:
    t0 = time.perf_counter()
    state, meta = self.parts.checkpointer.restore(abstract)
    c = meta["counters"]
    self.start = _Start(int(meta["version"]), int(c["env_steps"]), int(c["episodes"]),
                        float(c["wall_s_total"]), int(meta["version"]))
    self.timings["restore_s"] = time.perf_counter() - t0
    return state

  def _abstract_replay(self) -> Any:
    from jaxrl_async.runtime.learners.replay_step import abstract_replay

    return abstract_replay(self.config, self.parts.spec, self.parts.algo, self.parts.mesh)

  def _restore_replay(self, abstract: Any, after: Any) -> Any:
    """The checkpoint's (replay, host counters), or None if it holds none (the learner then
    starts an empty one). Runs after the state's restore (`after`), never beside it."""
    after.result()
    t0 = time.perf_counter()
    restored = self.parts.checkpointer.restore_replay(abstract, self.start.resumed_from)
    self.timings["restore_replay_s"] = time.perf_counter() - t0
    self.replay_restored = restored is not None
    return restored

  def _policy_step(self, params: Any, device: jax.Device | None = None, policy: Any = None,
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

  # -- the run ------------------------------------------------------------------------------

  def run(self) -> RunResult:
    """Starts, supervises and stops the run. A stop is honoured in every phase: start-up waits
    look for it every 50 ms, and a thread in a call nothing can wake is left to end on its own
    (listed in summary.json's `abandoned_threads`)."""
    cfg = self.config
    ck = self.parts.checkpointer
    stopped_before = "setup" if self._stop_reason else None
    # Read once: it reads each checkpoint's meta, newest first, past any damaged ones.
    newest = ck.newest_readable_version() if cfg.checkpoint.resume and ck is not None else None
    resume = newest is not None
    if resume:
      self.start.version = int(newest)
    startup = self._start_compiles(resume, compile_=stopped_before is None)
    version = self.start.version
    store = self.parts.cluster.param_store() if self.parts.cluster else ParamStore()
    auto = cfg.rate.balance == "auto"
    bounds = make_bounds(cfg, self.parts.algo, self.parts.cluster is not None) if auto else None
    queue = RolloutQueue(queue_capacity(cfg, bounds))
    controller = RateController(cfg.rate, version)
    # The actors' counters exist before the actors, so everything that counts env steps is
    # built with them in hand: nothing is wired after construction.
    actor_timers = [ActorTimers() for _ in range(cfg.actor.num_actors)]
    # `self.start` is read at call time: a resume sets it while the learner compiles.
    session_steps = lambda: sum(t.env_steps for t in actor_timers)
    env_steps = lambda: self.start.env_steps + session_steps()
    stats = EpisodeStats(cfg.run.return_window, cfg.run.stop_at_return, env_steps)
    step = self._make_step(startup, version, session_steps, stats,
                           current_u=(lambda: controller.rollouts_per_update) if auto else None)
    hook = (CheckpointHook(self.parts.checkpointer, cfg, step, controller, env_steps, stats,
                           lambda: self.start)
            if self.parts.checkpointer is not None else None)
    learner = LearnerLoop(
        step, queue, controller, lambda s, v: store.publish(self.parts.algo.actor_params(s), v),
        self.stop, wall_s, cfg.run.max_nonfinite_updates, startup.abstract, version,
        state_future=startup.state_future, after_update=hook)
    threads = [Supervised("learner", learner.run, self.stop)]
    if stopped_before is None:
      threads[0].start()  # compiles the update, then waits for the initial state
    actors: list[Actor] = []
    writer = monitor = None
    try:
      reason = stopped_before and self._stop_reason
      reason = reason or self._await_startup([startup.state_future], threads)
      if reason is None:
        store.publish(self.parts.algo.actor_params(startup.state_future.result()), version)
        reason = self._await_startup(list(startup.policy_futures.values()), threads)
      gate = ActorGate(cfg.actor.num_actors) if auto else None
      if reason is None:
        actors = self._make_actors(startup, version, queue, store, controller, stats, gate,
                                   actor_timers)
        reason = self._start_actors(actors, threads)
      writer, monitor = make_monitor(self.parts, self.quiet, resume, self.start, actors,
                                     learner, controller, queue, stats, gate)
      reason = reason or self._supervise(threads, learner, stats, monitor)
    except KeyboardInterrupt:
      reason = "interrupted"
    finally:
      phase = stopped_before or stop_phase(learner, actors, self.start.version)
      for f in startup.policy_futures.values():
        f.cancel()  # a compile not yet begun is not begun after a stop
      self.stop.set()
      queue.close()
      controller.close()
      alive = join_all(threads, stuck=uninterruptible(learner, actors))
      if monitor is not None:
        monitor.log(final={"actor_restarts": sum(t.restarts for t in threads)})
      if writer is not None:
        writer.close()
    errors = [t.error for t in threads if t.error]
    if hook is not None:
      self._final_checkpoint(hook, learner, failed=bool(errors),
                             learner_done=not threads[0].is_alive())
    if alive:
      logging.warning("left to end on their own after the stop: %s (in a call nothing can "
                      "wake: an XLA compile or EnvPool's construction)", ", ".join(alive))
    summary = write_summary(self, reason, actors, learner, controller, stats, monitor, threads,
                            phase=phase, abandoned=alive)
    if errors:
      raise ThreadFailed(errors[0])
    return RunResult(summary, learner.state, learner.version)

  def _final_checkpoint(self, hook: CheckpointHook, learner: LearnerLoop, failed: bool,
                        learner_done: bool) -> None:
    """The end-of-run checkpoint, timed (summary.json's timings.final_checkpoint_s). A learner
    still in its compile holds no state worth saving: the checkpointer only closes."""
    t0 = time.perf_counter()
    if learner_done:
      hook.final(learner.version, learner.state, failed=failed)
    else:
      hook.checkpointer.close()
    self.timings["final_checkpoint_s"] = time.perf_counter() - t0

  def _start_actors(self, actors: list[Actor], threads: list[Supervised]) -> str | None:
    """Starts the actors' threads (added to `threads`); a reason to stop that came first."""
    threads += [Supervised(f"actor-{a.index}", a.run, self.stop,
                           restarts=self.config.run.actor_restarts, on_restart=a.on_restart)
                for a in actors]
    # EnvPool builds its pool holding the GIL (seconds for Atari), so each start waits on the
    # one before: the stop is looked at between them, not after the last.
    for i, t in enumerate(threads[1:], 1):
      if reason := self._await_startup([], threads[:i]):
        return reason
      t.start()
    self.timings["train_start_wall_s"] = wall_s()
    return None

  # -- stops ----------------------------------------------------------------------------------

  def _past_wall(self) -> bool:
    cap = self.config.run.max_wall_s
    return bool(cap) and time.time() - self.started_at >= cap

  def _await_startup(self, futures: list[Any], threads: list[Supervised]) -> str | None:
    """Waits for start-up work (a compile, a restore) in slices of 50 ms; returns a reason to
    stop as soon as there is one, None once the work is done. Several processes wait it out:
    their wish to stop is agreed through the global step, once it runs."""
    pending = set(futures)
    while True:
      if self.stop.is_set() or not all(t.is_alive() for t in threads):
        return "error" if any(t.error for t in threads) else "stopped"
      if self.parts.cluster is None and self._stop_reason:
        return self._stop_reason
      if self.parts.cluster is None and self._past_wall():
        return "max_wall_s"
      if not pending:
        return None
      _, pending = concurrent.futures.wait(pending, timeout=0.05)

  def _start_compiles(self, resume: bool, compile_: bool = True) -> _Startup:
    """Start-up is most of a short run here: the initial state, the policies and (in the learner
    thread) the update compile at the same time, each from abstract shapes (XLA compiles
    outside the GIL). Without `compile_` (a stop came first) only the shapes are traced."""
    cfg, p = self.config, self.parts
    traced_init = self._trace_init()
    abstract = traced_init.out_info
    if not compile_:
      never: concurrent.futures.Future = concurrent.futures.Future()
      never.cancel()
      return _Startup(abstract, never, [], [], {}, None)
    pool = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="startup")
    state_future = pool.submit(self._restore_state if resume else self._init_state,
                               abstract if resume else traced_init)
    # One compile per distinct (policy, device): IMPALA and PPO share one policy; DQN's
    # differ per actor (their exploration epsilons).
    actor_devices = p.hosts.actor_devices
    policies = [p.algo.make_policy(i) for i in range(cfg.actor.num_actors)]  # kept alive
    keys = [(id(policies[i]), i % len(actor_devices)) for i in range(cfg.actor.num_actors)]
    policy_futures: dict[tuple, Any] = {}
    for i, key in enumerate(keys):
      if key not in policy_futures:
        policy_futures[key] = pool.submit(self._policy_step, p.algo.actor_params(abstract),
                                          actor_devices[key[1]], policies[i], i)
    replay_future = None
    if resume and p.algo.off_policy and cfg.checkpoint.checkpoint_replay:
      replay_future = pool.submit(self._restore_replay, self._abstract_replay(), state_future)
    pool.shutdown(wait=False)
    return _Startup(abstract, state_future, policies, keys, policy_futures, replay_future)

  def _make_step(self, startup: _Startup, version: int, session_steps: Any,
                 stats: EpisodeStats, current_u: Any = None) -> Any:
    """The learner's step (learners/loop.py): replay, global (several processes) or on-policy
    (whose U follows `current_u`, the rate controller's, under --balance=auto)."""
    cfg, p = self.config, self.parts
    if p.algo.off_policy:
      rollout = batch_shapes(cfg, p.spec, p.algo, p.mesh)[0]
      return ReplayStep(p.algo, p.mesh, rollout, self._abstract_replay(), cfg.env.num_envs,
                        cfg.run.total_env_steps, startup.replay_future)
    hosts = p.cluster.num_processes if p.cluster else 1
    per_update = cfg.env_steps_per_update * hosts  # --total_env_steps counts every host's
    target = -(-cfg.run.total_env_steps // per_update)
    consumed = cfg.env_steps_per_rollout * max(p.algo.epochs_per_update, 1)
    if p.cluster is None:
      compile_fn = functools.partial(compile_update, cfg, p.spec, p.algo, p.mesh,
                                     executables=p.executables)
      return OnPolicyStep(compile_fn, cfg.rate.rollouts_per_update, target, consumed, current_u)
    # This host's counts this session (stats count this session's episodes only).
    counts = lambda: {"env_steps": session_steps(), "episodes": stats.episodes}
    compile_fn = functools.partial(compile_global_update, cfg, p.spec, p.algo, p.mesh,
                                   num_processes=hosts)
    return GlobalStep(compile_fn, cfg.rate.rollouts_per_update, target, consumed, p.mesh,
                      p.cluster, counts, wall_s)

  def _make_actors(self, startup: _Startup, version: int, queue: RolloutQueue, store: Any,
                   controller: RateController, stats: EpisodeStats, gate: Any,
                   timers: list[ActorTimers]) -> list[Actor]:
    p = self.parts
    steps = {key: f.result() for key, f in startup.policy_futures.items()}
    return [Actor(i, self.config, p.spec, p.algo, steps[key], p.hosts.actor_devices[key[1]],
                  p.hosts.local_mesh, queue, store, controller, stats, self.stop,
                  pool_factory=self.pool_factory, start_version=version, gate=gate,
                  global_index=p.hosts.global_actor_index(i), timers=timers[i])
            for i, key in enumerate(startup.policy_keys)]

  def _supervise(self, threads, learner, stats, monitor) -> str:
    cfg = self.config.run
    next_log = time.time() + cfg.log_every_s
    balancer = monitor.balancer
    next_balance = time.time() + (balancer.every_s if balancer else float("inf"))
    while True:
      stats.solved.wait(0.02)
      if stats.solved.is_set() and self._agreed("solved"):
        return "solved"
      if self._stop_reason and self._agreed(self._stop_reason):
        return self._stop_reason
      if learner.finished.is_set():
        return self.parts.cluster.stop_reason(learner.step) if self.parts.cluster else "budget"
      if self.stop.is_set() or not all(t.is_alive() for t in threads):
        return "error" if any(t.error for t in threads) else "stopped"
      if self._past_wall() and self._agreed("max_wall_s"):
        return "max_wall_s"
      if time.time() >= next_balance:
        balancer.step(wall_s())
        next_balance += balancer.every_s
      if time.time() >= next_log:
        monitor.log()
        next_log += cfg.log_every_s

  def _agreed(self, reason: str) -> bool:
    """Whether to stop now. One process: yes. Several must stop at the same version (each
    launches every global step): the wish rides in the learner's step to every process, and the
    run ends when the learner finishes there (runtime/cluster/lockstep.py)."""
    if self.parts.cluster is None:
      return True
    self.parts.cluster.request_stop(reason)
    time.sleep(0.02)  # `solved.wait` returns at once once solved
    return False
