"""The real asynchronous network: one OS process per node, messages over ZeroMQ (pyzmq).

Why ZeroMQ: brokerless point-to-point sockets are exactly the directed peer-to-peer links the
method needs, PUSH/PULL queues never make a sender wait for a receiver (no rendezvous, unlike
MPI's matched send/receive), and it is already a dependency. Each node binds one PULL socket
(fan-in from its in-neighbours) and connects one PUSH socket per out-neighbour; sends are
non-blocking, so a node never waits for anyone: if a queue is full the message is dropped and
counted, which the push channel's running sums make harmless (the next message carries the
mass). There are no locks and no barriers between nodes.

Control: the parent binds a ROUTER; each child (`python -m jaxrl_async.decentralized.processes`)
connects a DEALER, says hello, receives its constants and initial state, compiles the update,
binds its data socket and reports the port; when the parent has every port it sends each child
the address book and that child starts at once. Children report (activations, theta) every
`report_every_s`; the parent stops everyone when every node's latest relative error is below
`tol`, or the wall budget is spent, collects the final states, and kills any child that has
not exited within a timeout. Every blocking receive has a timeout, on both sides.
"""

from __future__ import annotations

import argparse
import math
import os
import pickle
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from jaxrl_async.decentralized.graphs import Graph
from jaxrl_async.decentralized.problem import Problem, relative_errors

_HEADER = struct.Struct("<iq")  # sender id, stamp
_SETUP_TIMEOUT_S = 120.0  # a child imports JAX and compiles before it reports its port


class ProcessRuntimeError(RuntimeError):
  """A node process failed or did not answer in time."""


# ----------------------------------------------------------------------------------------------
# Child side.


def _node_main(control_addr: str, node_id: int) -> int:
  """One node: set up through the parent, then activate back to back until told to stop."""
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  import jax

  jax.config.update("jax_enable_x64", True)  # this process's own entry point
  # NOTE: one small program at a time; async dispatch only adds overhead here (~30 us a call).
  jax.config.update("jax_cpu_enable_async_dispatch", False)
  from jaxrl_async.decentralized import node as node_lib

  ctx = zmq.Context()
  control = ctx.socket(zmq.DEALER)
  control.setsockopt(zmq.IDENTITY, str(node_id).encode())
  control.setsockopt(zmq.LINGER, 1000)
  control.connect(control_addr)
  try:
    control.send_pyobj(("hello", node_id))
    setup = _recv_or_die(control, "setup")
    # NOTE: device arrays once, so an activation does not copy the node's rows again.
    const = node_lib.NodeConst(*(jax.device_put(np.asarray(x)) for x in setup["const"]))
    state = node_lib.NodeState(*(jax.device_put(np.asarray(x)) for x in setup["state"]))
    in_slot = {int(j): s for s, j in enumerate(setup["in_nbr"]) if j >= 0}
    out_nbr = [int(j) for j in setup["out_nbr"] if j >= 0]
    d_in, d = np.shape(state.theta_in)
    inbox = node_lib.Inbox(np.zeros((d_in, d)), np.zeros((d_in, d)), -np.ones(d_in, np.int64))
    node_lib.node_update_jit(const, state, inbox)  # compile before the clock starts

    data = ctx.socket(zmq.PULL)
    data.setsockopt(zmq.LINGER, 0)
    port = data.bind_to_random_port("tcp://127.0.0.1")
    control.send_pyobj(("port", node_id, port))
    peers = _recv_or_die(control, "peers")["peers"]
    pushes = []
    for j in out_nbr:
      sock = ctx.socket(zmq.PUSH)
      sock.setsockopt(zmq.LINGER, 0)
      sock.setsockopt(zmq.SNDHWM, 10_000)
      sock.connect(peers[j])
      pushes.append(sock)
    return _node_loop(node_lib, control, data, pushes, const, state, in_slot, node_id,
                      setup["slowdown"], setup["report_every_s"])
  finally:
    ctx.destroy(linger=0)


def _recv_or_die(sock: zmq.Socket, what: str) -> Any:
  if not sock.poll(int(_SETUP_TIMEOUT_S * 1000)):
    raise ProcessRuntimeError(f"no {what} message from the parent within {_SETUP_TIMEOUT_S}s")
  kind, payload = sock.recv_pyobj()
  if kind == "stop":
    raise SystemExit(0)
  return payload


def _node_loop(node_lib, control, data, pushes, const, state, in_slot, node_id, slowdown,
               report_every_s) -> int:
  d_in, d = np.shape(state.theta_in)
  theta_buf, sigma_buf = np.zeros((d_in, d)), np.zeros((d_in, d))
  stamp_buf = -np.ones(d_in, np.int64)
  dropped, last_report, parent = 0, 0.0, os.getppid()
  while True:
    now = time.monotonic()
    if control.poll(0):
      kind, _ = control.recv_pyobj()
      if kind == "stop":
        break
    if os.getppid() != parent:  # the parent died (we were re-parented): do not linger
      return 3
    # Drain every arrived message; keep the newest per in-neighbour (timestamps).
    while True:
      try:
        head, theta_b, sigma_b = data.recv_multipart(zmq.NOBLOCK)
      except zmq.Again:
        break
      sender, stamp = _HEADER.unpack(head)
      s = in_slot[sender]
      if stamp > stamp_buf[s]:
        stamp_buf[s] = stamp
        theta_buf[s] = np.frombuffer(theta_b, np.float64)
        sigma_buf[s] = np.frombuffer(sigma_b, np.float64)
    t_update = time.perf_counter()
    state, out = node_lib.node_update_jit(const, state,
                                          node_lib.Inbox(theta_buf, sigma_buf, stamp_buf))
    theta, sigma, stamp = np.asarray(out.theta), np.asarray(out.sigma), int(out.stamp)
    stamp_buf = -np.ones(d_in, np.int64)
    head = _HEADER.pack(node_id, stamp)
    for o, sock in enumerate(pushes):
      try:
        sock.send_multipart([head, theta.tobytes(), sigma[o].tobytes()], zmq.NOBLOCK)
      except zmq.Again:
        dropped += 1  # harmless: the next message's running sum carries this mass
    if slowdown > 1:
      time.sleep((slowdown - 1) * (time.perf_counter() - t_update))
    if now - last_report >= report_every_s:
      control.send_pyobj(("report", node_id, stamp, theta))
      last_report = now
  final = {k: np.asarray(v) for k, v in state._asdict().items() if k != "table"}
  control.send_pyobj(("final", node_id, final, dropped))
  return 0


# ----------------------------------------------------------------------------------------------
# Parent side.


class _Children:
  """The node processes; kills whatever is left on exit."""

  def __init__(self, n: int, control_addr: str):
    self.logs = [tempfile.TemporaryFile() for _ in range(n)]
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    self.procs = [
        subprocess.Popen([sys.executable, "-m", "jaxrl_async.decentralized.processes",
                          "--control", control_addr, "--node", str(i)],
                         stdout=log, stderr=subprocess.STDOUT, env=env)
        for i, log in enumerate(self.logs)]

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


def run_processes(problem: Problem, graph: Graph, alpha: float, beta: float,
                  sampling: str = "uniform", seed: int = 0, tol: float = 1e-10,
                  max_wall_s: float = 120.0, slowdowns: tuple[float, ...] = (),
                  report_every_s: float = 0.02, divergence: float = 1e6,
                  on_record=None, pull_lag: float = 0.0):
  """Run the asynchronous method with one process per node; returns a `simulator.RunResult`
  whose `time` is wall seconds since the nodes started and whose k is the sum of activations.

  Raises:
    ProcessRuntimeError: a node failed (its output is in the message) or timed out.
    simulator.DivergenceError: the error grew past `divergence` or became non-finite.
  """
  from jaxrl_async.decentralized import node as node_lib
  from jaxrl_async.decentralized.simulator import DivergenceError, RunResult

  theta_star = problem.theta_star()
  consts = node_lib.network_consts(problem, graph, alpha, beta, sampling, seed,
                                   pull_lag=pull_lag)
  init = node_lib.init_state(consts)
  slots = graph.slot_tables()
  n = graph.n
  slow = slowdowns or (1.0,) * n

  ctx = zmq.Context()
  control = ctx.socket(zmq.ROUTER)
  control.setsockopt(zmq.LINGER, 0)
  port = control.bind_to_random_port("tcp://127.0.0.1")
  children = _Children(n, f"tcp://127.0.0.1:{port}")
  ident: dict[int, bytes] = {}
  try:
    # Set-up: constants out, ports back, address book out; each node starts on receipt.
    ports: dict[int, int] = {}
    deadline = time.monotonic() + _SETUP_TIMEOUT_S
    while len(ports) < n:
      children.check()
      if time.monotonic() > deadline:
        raise ProcessRuntimeError(f"only {len(ports)} of {n} nodes set up within "
                                  f"{_SETUP_TIMEOUT_S}s")
      if not control.poll(100):
        continue
      who, raw = control.recv_multipart()
      msg = pickle.loads(raw)
      if msg[0] == "hello":
        i = msg[1]
        ident[i] = who
        setup = {"const": tuple(np.asarray(x)[i] for x in consts),
                 "state": tuple(np.asarray(x)[i] for x in init),
                 "in_nbr": slots["in_nbr"][i], "out_nbr": slots["out_nbr"][i],
                 "slowdown": float(slow[i]), "report_every_s": report_every_s}
        control.send_multipart([who, pickle.dumps(("setup", setup))])
      elif msg[0] == "port":
        ports[msg[1]] = msg[2]
    book = {i: f"tcp://127.0.0.1:{p}" for i, p in ports.items()}
    t0 = time.monotonic()
    for i in range(n):
      control.send_multipart([ident[i], pickle.dumps(("peers", {"peers": book}))])

    # Watch: latest report per node; stop on tolerance, budget or divergence.
    latest = np.zeros((n, problem.dim))
    clocks = np.zeros(n, np.int64)
    seen = np.zeros(n, bool)
    curve, snaps, crossings = [], [], {}
    stopped, diverged = "wall", None
    while True:
      children.check()
      elapsed = time.monotonic() - t0
      if elapsed > max_wall_s:
        break
      if not control.poll(50):
        continue
      who, raw = control.recv_multipart()
      kind, i, stamp, theta = pickle.loads(raw)
      if kind != "report":
        continue
      latest[i], clocks[i], seen[i] = theta, stamp, True
      if not seen.all():
        continue
      errs = relative_errors(latest, theta_star)
      k, worst = int(clocks.sum()), float(errs.max())
      curve.append((k, elapsed, worst))
      cons = float(np.max(np.linalg.norm(latest - latest.mean(0), axis=1))
                   / np.linalg.norm(theta_star))
      snaps.append((k, elapsed, errs, cons))
      for t in (1e-4, 1e-6, 1e-8, 1e-10, tol):
        if worst < t and t not in crossings:
          crossings[t] = (k, elapsed)
      if on_record is not None:
        on_record({"k": k, "time": elapsed, "worst_rel_error": worst,
                   "consensus_error": cons, "wall_s": elapsed})
      if not math.isfinite(worst) or worst > divergence:
        diverged = worst
        break
      if worst < tol:
        stopped = "tol"
        break
    wall = time.monotonic() - t0

    # Stop everyone and collect the final states.
    for i in range(n):
      control.send_multipart([ident[i], pickle.dumps(("stop", None))])
    finals: dict[int, dict[str, np.ndarray]] = {}
    dropped = 0
    deadline = time.monotonic() + 30.0
    while len(finals) < n and time.monotonic() < deadline:
      children.check()
      if not control.poll(100):
        continue
      msg = pickle.loads(control.recv_multipart()[1])
      if msg[0] == "final":
        finals[msg[1]] = msg[2]
        dropped += msg[3]
    if len(finals) < n:
      raise ProcessRuntimeError(f"only {len(finals)} of {n} nodes sent a final state")
  finally:
    children.close()
    ctx.destroy(linger=0)

  if diverged is not None:
    raise DivergenceError(f"diverged (worst relative error {diverged:.3g}): the step sizes are "
                          "too large for this problem and network; lower --alpha and/or --beta")
  theta = np.stack([finals[i]["theta"] for i in range(n)])
  errs = relative_errors(theta, theta_star)
  k_final = int(sum(int(finals[i]["clock"]) for i in range(n)))
  cons = float(np.max(np.linalg.norm(theta - theta.mean(0), axis=1)) / np.linalg.norm(theta_star))
  snaps.append((k_final, wall, errs, cons))
  curve.append((k_final, wall, float(errs.max())))
  return RunResult(
      k=np.array([c[0] for c in curve]), time=np.array([c[1] for c in curve]),
      worst=np.array([c[2] for c in curve]),
      node_k=np.array([s[0] for s in snaps]), node_time=np.array([s[1] for s in snaps]),
      node_err=np.stack([s[2] for s in snaps]), consensus=np.array([s[3] for s in snaps]),
      theta=theta, theta_star=theta_star, crossings=crossings, updates=k_final, elapsed=wall,
      wall_s=wall, stopped=stopped,
      extra={"dropped_sends": dropped, "clocks": [int(finals[i]["clock"]) for i in range(n)]})


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description="One node of the ZeroMQ policy-evaluation network "
                                   "(started by run_processes).")
  parser.add_argument("--control", required=True)
  parser.add_argument("--node", type=int, required=True)
  args = parser.parse_args(argv)
  return _node_main(args.control, args.node)


if __name__ == "__main__":
  sys.exit(main())
