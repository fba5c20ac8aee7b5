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
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from absl import logging

from jaxrl_async import envs
from jaxrl_async.config import TrainConfig
from jaxrl_async.metrics import EpisodeStats, wall_s
from jaxrl_async.runtime.build import Components, build
from jaxrl_async.runtime.checkpoint_hook import CheckpointHook
from jaxrl_async.runtime.learners.loop import LearnerLoop
from jaxrl_async.runtime.monitor import make_monitor
from jaxrl_async.runtime.pipeline.actor import Actor, ActorTimers
from jaxrl_async.runtime.pipeline.balancer import ActorGate, make_bounds, queue_capacity
from jaxrl_async.runtime.pipeline.params import ParamStore
from jaxrl_async.runtime.pipeline.queue import RolloutQueue
from jaxrl_async.runtime.pipeline.rate import RateController
from jaxrl_async.runtime.startup import Programs, Start, Startup
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


@dataclasses.dataclass
class RunResult:
  summary: dict[str, Any]
  state: Any
  version: int


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
    self.start = Start()
    self.programs = Programs(parts, self.timings, self.start)

  @classmethod
  def from_config(cls, config: TrainConfig, spec: envs.EnvSpec | None = None,
                  run_dir: Path | None = None, **kwargs: Any) -> Trainer:
    """`Trainer(build(config, spec, run_dir), **kwargs)`: validates `config` first."""
    return cls(build(config, spec, run_dir), **kwargs)

  @property
  def replay_restored(self) -> bool:
    """Whether a resumed off-policy run continued its saved replay."""
    return self.programs.replay_restored

  def compile_programs(self, other_us: Sequence[int] = ()) -> list[str]:
    """Compiles (or loads) every program a fresh run of this config compiles at start-up, and
    the update at each rollouts-per-update in `other_us`, and runs nothing; returns their names
    (`Programs.compile_all`: the run's own paths, so the cache keys are the run's)."""
    return self.programs.compile_all(other_us)

  def request_stop(self, reason: str) -> None:
    """Asks the run to end cleanly (from a signal handler or another thread)."""
    self._stop_reason = self._stop_reason or reason

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
    startup = self.programs.start_compiles(resume, compile_=stopped_before is None)
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
    current_u = (lambda: controller.rollouts_per_update) if auto else None
    step = self.programs.make_step(startup, session_steps, stats, current_u)
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

  def _make_actors(self, startup: Startup, version: int, queue: RolloutQueue, store: Any,
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
