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
from jaxrl_async.decentralized.adaptive import Adapter, Plan, migrate
from jaxrl_async.decentralized.graphs import Graph
from jaxrl_async.decentralized.problem import Problem, relative_errors
from jaxrl_async.decentralized.results import DivergenceError, RunResult, consensus
from jaxrl_async.decentralized.retune import Retuner, join_states
from jaxrl_async.decentralized.transport import ProcessRuntimeError

SETUP_TIMEOUT_S = 120.0  # a node imports JAX and compiles before it reports its port
HANDOVER_TIMEOUT_S = 30.0  # every node's state at an activation boundary, for moving shards
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
    if msg[0] != "report" or len(msg) != 4:
      continue
    _, i, stamp, theta = msg
    record = watch.report(i, stamp, theta, elapsed)
    event = retuner.observe(i, stamp, None if record is None else
                            record["worst_rel_error"], elapsed)
    if event is not None:
      event["k"] = int(watch.clocks.sum())
      if event.get("moves_shards"):
        event["handover_s"] = _hand_over(control, children, retuner, ident)
      else:
        retuner.take_layout()
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


def _hand_over(control: zmq.Socket, children, retuner: Retuner, ident: dict[int, bytes]
               ) -> float:
  """Moves shards: every node's state at an activation boundary, carried to the new layout
  (`adaptive.migrate`), each node's new rows and state handed back (`retune`'s docstring).
  Returns the seconds the network paused."""
  t0, n = time.monotonic(), len(ident)
  for i in range(n):
    control.send_multipart([ident[i], pickle.dumps(("handover", None))])
  states: dict[int, dict] = {}
  while len(states) < n:
    children.check()
    if time.monotonic() - t0 > HANDOVER_TIMEOUT_S:
      raise ProcessRuntimeError(f"only {len(states)} of {n} nodes handed their state over "
                                f"within {HANDOVER_TIMEOUT_S}s")
    if control.poll(50):
      msg = _recv(control)[1]
      if msg[0] == "state" and len(msg) == 3:  # reports sent before the hand-over are stale
        states[msg[1]] = msg[2]
  old, new = retuner.take_layout()
  carried = migrate(retuner.adapter.rows, old, new, join_states([states[i] for i in range(n)]))
  for i in range(n):
    const, state = retuner.node(i, carried)
    control.send_multipart([ident[i], pickle.dumps(("resume", {"const": tuple(const),
                                                               "state": tuple(state)}))])
  return time.monotonic() - t0


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


def _adapter(problem: Problem, graph: Graph, alpha: float, beta: float, plan: Plan | None,
             sampling: str, seed: int, pull_lag: float) -> Adapter:
  """The pooled layout the simulator re-plans with; each node runs its own slice of it. No
  plan: as given, the problem's allocation and the graph's own weights, fixed."""
  from jaxrl_async.decentralized import node as node_lib

  if plan is None:
    declared = graph.speeds or ()
    plan = Plan("speed", "speed" if declared else "uniform", declared)
  return Adapter(node_lib.pool(problem), graph, problem.rho, alpha, beta, plan, sampling, seed,
                 pull_lag=pull_lag,
                 held=None if plan.allocation == "measured" else problem.shards_per_node())


def run_processes(problem: Problem, graph: Graph, alpha: float, beta: float,
                  sampling: str = "uniform", seed: int = 0, tol: float = 1e-10,
                  max_wall_s: float = 120.0, slowdowns: tuple[float, ...] = (),
                  report_every_s: float = 0.02, divergence: float = 1e6,
                  on_record=None, pull_lag: float = 0.0, hosts: tuple[str, ...] = (),
                  coordinator: tuple[str, int] | None = None, keys: dict | None = None,
                  faults: dict | None = None, plan: Plan | None = None,
                  max_backoffs: int = 0):
  """Run the asynchronous method with one process per node; returns a `simulator.RunResult`
  whose `time` is wall seconds since the nodes started and whose k is the sum of activations.

  `hosts`: the address each node listens on (default 127.0.0.1 for all). `coordinator`: None to
  start every node here; (ADDR, PORT) to listen there for nodes a launcher starts elsewhere
  (`python -m jaxrl_async.decentralized.processes --control tcp://ADDR:PORT --node I`).
  `keys`: the run's CURVE keys (`transport.make_keys`) to authenticate and encrypt every socket,
  or None for none; the nodes started here get theirs through their environment, nodes started
  elsewhere from their launcher. `faults`: what the nodes inject into their links and when
  they are slow (`processes.Links`). `plan`: what the allocation and weights follow
  (`adaptive.Plan`; None: the problem's allocation and the graph's weights, fixed);
  `max_backoffs`: see `retune.Retuner`.

  Raises:
    ProcessRuntimeError: a node failed (its output is in the message) or timed out.
    simulator.DivergenceError: the error grew past `divergence` or became non-finite.
  """
  from jaxrl_async.decentralized import node as node_lib

  retuner = Retuner(_adapter(problem, graph, alpha, beta, plan, sampling, seed, pull_lag),
                    max_backoffs)
  init = node_lib.pooled_init(retuner.in_force, problem.shards)
  nodes = [retuner.node(i, init) for i in range(graph.n)]
  slots = graph.slot_tables()
  n = graph.n
  slow = slowdowns or (1.0,) * n
  hosts = hosts or ("127.0.0.1",) * n
  setups = [{"const": tuple(nodes[i][0]), "state": tuple(nodes[i][1]),
             "in_nbr": slots["in_nbr"][i], "out_nbr": slots["out_nbr"][i], "bind": hosts[i],
             "slowdown": float(slow[i]), "report_every_s": report_every_s,
             "faults": faults or {}, "seed": seed,
             "give_up_s": max_wall_s + SETUP_TIMEOUT_S + NODE_GRACE_S} for i in range(n)]
  watch = _Watch(n, problem.theta_star(), tol)

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
