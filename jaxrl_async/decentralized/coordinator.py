"""The process runtime's parent: hands out constants and the address book, watches, stops.

It binds a ROUTER (on 127.0.0.1 when it starts the nodes itself, or on `--coordinator=ADDR:PORT`
when a launcher starts them on other machines); each node (`python -m
jaxrl_async.decentralized.processes`) connects a DEALER, says hello with its node id, receives its
constants, initial state and the address to listen on, compiles the update, binds its data socket
and reports the port; when the parent has every port it sends each node the address book and that
node starts at once. Nodes report (activations, theta) every `report_every_s`; the parent stops
everyone when every node's latest relative error is below `tol`, or the wall budget is spent,
collects the final states, and kills any node it started that has not exited within a timeout.
Every blocking receive has a timeout, on both sides.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import zmq

from jaxrl_async.decentralized import transport
from jaxrl_async.decentralized.adaptive import back_off_scales
from jaxrl_async.decentralized.graphs import Graph
from jaxrl_async.decentralized.problem import Problem, relative_errors
from jaxrl_async.decentralized.results import DivergenceError, RunResult, consensus
from jaxrl_async.decentralized.transport import ProcessRuntimeError

SETUP_TIMEOUT_S = 120.0  # a node imports JAX and compiles before it reports its port
NODE_GRACE_S = 60.0  # a node gives up this long after the wall budget if never told to stop


class _Children:
  """The node processes this parent started on this machine; kills whatever is left on exit."""

  def __init__(self, n: int, control_addr: str, keys: dict | None):
    self.logs = [tempfile.TemporaryFile() for _ in range(n)]
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    env.pop(transport.KEYS_ENV, None)
    self.procs = []
    for i, log in enumerate(self.logs):
      # Node i's keys (its own client secret only) through its environment, which only this
      # user can read (/proc/PID/environ is 0400), never on a command line.
      child_env = env if keys is None else {
          **env, transport.KEYS_ENV: json.dumps(transport.node_keys(keys, i))}
      self.procs.append(subprocess.Popen(
          [sys.executable, "-m", "jaxrl_async.decentralized.processes", "--control",
           control_addr, "--node", str(i)], stdout=log, stderr=subprocess.STDOUT, env=child_env))

  def check(self) -> None:
    for i, p in enumerate(self.procs):
      if p.poll() not in (None, 0):
        raise ProcessRuntimeError(f"node {i} exited with status {p.returncode}:\n{self.log(i)}")

  def log(self, i: int) -> str:
    self.logs[i].seek(0)
    return self.logs[i].read().decode(errors="replace")[-3000:]

  def close(self, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    for p in self.procs:
      try:
        p.wait(timeout=max(0.0, deadline - time.monotonic()))
      except subprocess.TimeoutExpired:
        p.kill()
        p.wait(timeout=5)
    for log in self.logs:
      log.close()


class _Elsewhere:
  """Nodes started by a launcher on other machines: nothing to check or kill from here (each
  node exits on stop, when its launcher session ends, or NODE_GRACE_S after the budget)."""

  def check(self) -> None:
    pass

  def close(self) -> None:
    pass


class _Watch:
  """Every node's latest report; the error curve, per-node snapshots and threshold crossings."""

  def __init__(self, n: int, theta_star: np.ndarray, tol: float):
    self.theta_star, self.tol = theta_star, tol
    self.latest = np.zeros((n, theta_star.shape[0]))
    self.clocks = np.zeros(n, np.int64)
    self.seen = np.zeros(n, bool)
    self.curve, self.snaps, self.crossings = [], [], {}

  def report(self, i: int, stamp: int, theta: np.ndarray, elapsed: float) -> dict | None:
    """Takes node i's report; the network-wide record once every node has reported."""
    self.latest[i], self.clocks[i], self.seen[i] = theta, stamp, True
    if not self.seen.all():
      return None
    return self.record(self.latest, int(self.clocks.sum()), elapsed)

  def record(self, theta: np.ndarray, k: int, elapsed: float) -> dict:
    errs = relative_errors(theta, self.theta_star)
    worst = float(errs.max())
    cons = consensus(theta, self.theta_star)
    self.curve.append((k, elapsed, worst))
    self.snaps.append((k, elapsed, errs, cons))
    for t in (1e-4, 1e-6, 1e-8, 1e-10, self.tol):
      if worst < t and t not in self.crossings:
        self.crossings[t] = (k, elapsed)
    return {"k": k, "time": elapsed, "worst_rel_error": worst, "consensus_error": cons,
            "wall_s": elapsed}


def _recv(control: zmq.Socket) -> tuple[bytes, tuple]:
  """(sender, message) from the control socket; ("", ("?",)) for what no node sends (only a
  process without CURVE, on loopback, could send it; `transport.loads` runs no code)."""
  parts = control.recv_multipart()
  try:
    msg = transport.loads(parts[1])
  except Exception:  # whatever a malformed pickle raises
    return b"", ("?",)
  if len(parts) != 2 or not (isinstance(msg, tuple) and msg):
    return b"", ("?",)
  return parts[0], msg


def _set_up(control: zmq.Socket, children, setups: list[dict]) -> tuple[dict, dict]:
  """Hello -> setup, port -> collected, for every node; returns (identities, ports)."""
  n = len(setups)
  ident: dict[int, bytes] = {}
  ports: dict[int, int] = {}
  deadline = time.monotonic() + SETUP_TIMEOUT_S
  while len(ports) < n:
    children.check()
    if time.monotonic() > deadline:
      missing = sorted(set(range(n)) - set(ports))
      raise ProcessRuntimeError(f"only {len(ports)} of {n} nodes set up within "
                                f"{SETUP_TIMEOUT_S}s (missing: {missing})")
    if not control.poll(100):
      continue
    who, msg = _recv(control)
    if msg[0] == "hello":
      i = msg[1]
      if not (isinstance(i, int) and 0 <= i < n) or i in ident:
        raise ProcessRuntimeError(f"a node said hello as node {i!r}: node ids must be 0..{n - 1},"
                                  " each started once")
      ident[i] = who
      control.send_multipart([who, pickle.dumps(("setup", setups[i]))])
    elif msg[0] == "port":
      ports[msg[1]] = msg[2]
  return ident, ports


class Retuner:
  """The coordinator's side of measured weights and step back-off in the process runtime.

  Every node measures its own activation intervals (an exponentially weighted mean) and sends
  it with its reports. When the speeds they give have moved by more than `hysteresis` since the
  weights in use were set (at most once per `min_gap_s`), every node gets new pull/push weights
  in proportion to them, and the steps that go with its weights (`node.network_scalars`). When
  the worst error grows above `growth` times its lowest (or stops being finite), the steps are
  made smaller (`adaptive.back_off_scales`, at most `max_backoffs` times; the nodes cannot go
  back, they carry on from where they are), and the lowest is reset, so one blow-up is not
  counted twice in a row. Each retune is
  an event in `events`.
  """

  def __init__(self, graph: Graph, count: np.ndarray, held: np.ndarray, shards: int,
               rho: float, alpha: float, beta: float, sampling: str, seed: int,
               pull_lag: float, measured_weights: bool, max_backoffs: int,
               hysteresis: float = 1.5, growth: float = 10.0, min_gap_s: float = 2.0):
    self.graph, self.count, self.held, self.shards = graph, count, held, shards
    self.rho, self.alpha, self.beta = rho, alpha, beta
    self.sampling, self.seed, self.pull_lag = sampling, seed, pull_lag
    self.measured_weights, self.backoffs_left = measured_weights, max_backoffs
    self.hysteresis, self.growth, self.min_gap_s = hysteresis, growth, min_gap_s
    n = graph.n
    self.interval = np.full(n, np.nan)
    self.speeds = np.ones(n)
    self.backoffs, self.best, self.last_s = 0, math.inf, -math.inf
    self.events: list[dict] = []

  def fields(self) -> list[dict[str, np.ndarray]]:
    """Every node's new weights and steps."""
    from jaxrl_async.decentralized import node as node_lib

    slots = self.graph.with_speeds(self.speeds if self.measured_weights else None).slot_tables()
    alpha_scale, beta_scale = back_off_scales(self.backoffs)
    f = node_lib.network_scalars(slots, self.count, self.held, self.shards, self.rho,
                                 self.alpha * alpha_scale, self.beta * beta_scale,
                                 self.sampling, self.seed, pull_lag=self.pull_lag)
    keys = ("pull_self", "pull_in", "push_self", "push_out", "alpha", "beta")
    return [{k: np.asarray(f[k][i]) for k in keys} for i in range(self.graph.n)]

  def observe(self, i: int, interval: float, worst: float | None, elapsed: float
              ) -> dict | None:
    """Takes node i's measured interval and the network's worst error (None until every node
    has reported); an event when the nodes must be retuned, else None."""
    if isinstance(interval, float) and interval > 0:
      self.interval[i] = interval
    if worst is None:
      return None
    if self.backoffs_left and not (math.isfinite(worst) and worst <= self.growth * self.best):
      self.backoffs_left -= 1
      self.backoffs += 1
      self.best = worst if math.isfinite(worst) else math.inf
      alpha_scale, beta_scale = back_off_scales(self.backoffs)
      return self._event("step_backoff", elapsed, worst_rel_error=worst,
                         alpha_scale=alpha_scale, beta_scale=beta_scale)
    self.best = min(self.best, worst)
    if not self.measured_weights or np.isnan(self.interval).any():
      return None
    if elapsed - self.last_s < self.min_gap_s:
      return None
    speeds = (1.0 / self.interval) / (1.0 / self.interval).max()
    moved = speeds / self.speeds
    if moved.max() / moved.min() <= self.hysteresis:
      return None
    self.speeds = speeds
    return self._event("replan", elapsed, speeds=[round(float(v), 4) for v in speeds])

  def _event(self, why: str, elapsed: float, **info) -> dict:
    self.last_s = elapsed
    event = {"event": why, "time": elapsed, **info}
    self.events.append(event)
    return event


def _watch(control: zmq.Socket, children, watch: _Watch, t0: float, max_wall_s: float,
           divergence: float, on_record, retuner: Retuner,
           ident: dict[int, bytes]) -> tuple[str, float | None]:
  """Takes reports until tolerance, budget or divergence; returns (stopped, diverged)."""
  while True:
    children.check()
    elapsed = time.monotonic() - t0
    if elapsed > max_wall_s:
      return "wall", None
    if not control.poll(50):
      continue
    msg = _recv(control)[1]
    if msg[0] != "report" or len(msg) != 5:
      continue
    _, i, stamp, theta, interval = msg
    record = watch.report(i, stamp, theta, elapsed)
    event = retuner.observe(i, interval, None if record is None else
                            record["worst_rel_error"], elapsed)
    if event is not None:
      event["k"] = int(watch.clocks.sum())
      for j, fields in enumerate(retuner.fields()):
        control.send_multipart([ident[j], pickle.dumps(("retune", fields))])
      if on_record is not None:
        on_record(event)
    if record is None:
      continue
    if on_record is not None:
      on_record(record)
    worst = record["worst_rel_error"]
    if (not math.isfinite(worst) or worst > divergence) and not retuner.backoffs_left:
      return "diverged", worst
    if worst < watch.tol:
      return "tol", None


def _collect(control: zmq.Socket, children, ident: dict[int, bytes]
             ) -> tuple[dict, int, int]:
  """Stops every node and collects its final state; returns (finals, sends dropped by full
  queues, messages dropped by injection)."""
  n = len(ident)
  for i in range(n):
    control.send_multipart([ident[i], pickle.dumps(("stop", None))])
  finals: dict[int, dict[str, np.ndarray]] = {}
  dropped = injected = 0
  deadline = time.monotonic() + 30.0
  while len(finals) < n and time.monotonic() < deadline:
    children.check()
    if not control.poll(100):
      continue
    msg = _recv(control)[1]
    if msg[0] == "final" and len(msg) == 5:
      finals[msg[1]] = msg[2]
      dropped += msg[3]
      injected += msg[4]
  if len(finals) < n:
    raise ProcessRuntimeError(f"only {len(finals)} of {n} nodes sent a final state")
  return finals, dropped, injected


def run_processes(problem: Problem, graph: Graph, alpha: float, beta: float,
                  sampling: str = "uniform", seed: int = 0, tol: float = 1e-10,
                  max_wall_s: float = 120.0, slowdowns: tuple[float, ...] = (),
                  report_every_s: float = 0.02, divergence: float = 1e6,
                  on_record=None, pull_lag: float = 0.0, hosts: tuple[str, ...] = (),
                  coordinator: tuple[str, int] | None = None, keys: dict | None = None,
                  faults: dict | None = None, measured_weights: bool = False,
                  max_backoffs: int = 0):
  """Run the asynchronous method with one process per node; returns a `simulator.RunResult`
  whose `time` is wall seconds since the nodes started and whose k is the sum of activations.

  `hosts`: the address each node listens on (default 127.0.0.1 for all). `coordinator`: None to
  start every node here; (ADDR, PORT) to listen there for nodes a launcher starts elsewhere
  (`python -m jaxrl_async.decentralized.processes --control tcp://ADDR:PORT --node I`).
  `keys`: the run's CURVE keys (`transport.make_keys`) to authenticate and encrypt every socket,
  or None for none; the nodes started here get theirs through their environment, nodes started
  elsewhere from their launcher. `faults`: what the nodes inject into their links and when
  they are slow (`processes.Links`). `measured_weights`, `max_backoffs`: see `Retuner`.

  Raises:
    ProcessRuntimeError: a node failed (its output is in the message) or timed out.
    simulator.DivergenceError: the error grew past `divergence` or became non-finite.
  """
  from jaxrl_async.decentralized import node as node_lib

  consts = node_lib.network_consts(problem, graph, alpha, beta, sampling, seed,
                                   pull_lag=pull_lag)
  init = node_lib.init_state(consts)
  slots = graph.slot_tables()
  n = graph.n
  slow = slowdowns or (1.0,) * n
  hosts = hosts or ("127.0.0.1",) * n
  setups = [{"const": tuple(np.asarray(x)[i] for x in consts),
             "state": tuple(np.asarray(x)[i] for x in init),
             "in_nbr": slots["in_nbr"][i], "out_nbr": slots["out_nbr"][i], "bind": hosts[i],
             "slowdown": float(slow[i]), "report_every_s": report_every_s,
             "faults": faults or {}, "seed": seed,
             "give_up_s": max_wall_s + SETUP_TIMEOUT_S + NODE_GRACE_S} for i in range(n)]
  watch = _Watch(n, problem.theta_star(), tol)
  retuner = Retuner(graph, problem.count, problem.shards_per_node(), problem.shards,
                    problem.rho, alpha, beta, sampling, seed, pull_lag, measured_weights,
                    max_backoffs)

  ctx = zmq.Context()
  auth = transport.start_authenticator(ctx, keys)
  control = ctx.socket(zmq.ROUTER)
  control.setsockopt(zmq.LINGER, 0)
  transport.as_server(control, keys)
  children = _Elsewhere()
  try:
    if coordinator is None:
      port = control.bind_to_random_port("tcp://127.0.0.1")
      children = _Children(n, f"tcp://127.0.0.1:{port}", keys)
    else:
      control.bind(f"tcp://{coordinator[0]}:{coordinator[1]}")
    ident, ports = _set_up(control, children, setups)
    book = {i: f"tcp://{hosts[i]}:{p}" for i, p in ports.items()}
    t0 = time.monotonic()
    for i in range(n):
      control.send_multipart([ident[i], pickle.dumps(("peers", {"peers": book}))])
    stopped, diverged = _watch(control, children, watch, t0, max_wall_s, divergence, on_record,
                               retuner, ident)
    wall = time.monotonic() - t0
    finals, dropped, injected = _collect(control, children, ident)
  finally:
    children.close()
    if auth is not None:
      auth.stop()
    ctx.destroy(linger=0)

  if stopped == "diverged":
    raise DivergenceError(f"diverged (worst relative error {diverged:.3g}): the step sizes are "
                          "too large for this problem and network; lower --alpha and/or --beta")
  result = _result(watch, finals, wall, stopped, dropped, hosts)
  result.extra.update(curve=keys is not None, injected_drops=injected, events=retuner.events,
                      step_backoffs=sum(e["event"] == "step_backoff" for e in retuner.events),
                      replans=sum(e["event"] == "replan" for e in retuner.events))
  return result


def _result(watch: _Watch, finals: dict, wall: float, stopped: str, dropped: int,
            hosts: tuple[str, ...]):
  n = len(finals)
  theta = np.stack([finals[i]["theta"] for i in range(n)])
  k_final = int(sum(int(finals[i]["clock"]) for i in range(n)))
  watch.record(theta, k_final, wall)
  return RunResult.from_records(
      watch.curve, watch.snaps, theta=theta, theta_star=watch.theta_star,
      crossings=watch.crossings, updates=k_final, elapsed=wall, wall_s=wall, stopped=stopped,
      extra={"dropped_sends": dropped, "clocks": [int(finals[i]["clock"]) for i in range(n)],
             "hosts": list(hosts)})
