"""The real asynchronous network: one OS process per node, messages over ZeroMQ (pyzmq).

Why ZeroMQ: brokerless point-to-point sockets are exactly the directed peer-to-peer links the
method needs, PUSH/PULL queues never make a sender wait for a receiver (no rendezvous, unlike
MPI's matched send/receive), and it is already a dependency. Each node binds one PULL socket
(fan-in from its in-neighbours) and connects one PUSH socket per out-neighbour; sends are
non-blocking, so a node never waits for anyone: if a queue is full the message is dropped and
counted, which the push channel's running sums make harmless (the next message carries the
mass). There are no locks and no barriers between nodes.

This module is one node (`python -m jaxrl_async.decentralized.processes --control ADDR --node I`):
it connects to the coordinator's control socket, receives its constants and the address it
listens on, and activates back to back until told to stop. With CURVE keys (`--keys FILE|-`, or
from its parent through $JAXRL_DEC_CURVE_KEYS) every socket it opens is authenticated and
encrypted and its data socket admits only the run's nodes. The parent side, `run_processes`,
lives in `coordinator.py` (re-exported here); addresses and keys in `transport.py`.
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import struct
import sys
import time
from typing import Any

import numpy as np
import zmq

from jaxrl_async.decentralized import transport
from jaxrl_async.decentralized.coordinator import SETUP_TIMEOUT_S, run_processes
from jaxrl_async.decentralized.transport import ProcessRuntimeError

__all__ = ["ProcessRuntimeError", "main", "run_processes"]

_HEADER = struct.Struct("<iq")  # sender id, stamp

# ----------------------------------------------------------------------------------------------
# Child side.


def _node_main(control_addr: str, node_id: int, keys: dict | None) -> int:
  """One node: set up through the parent, then activate back to back until told to stop.
  `keys`: this node's CURVE keys (`transport.node_keys`), or None for no CURVE."""
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  import jax

  jax.config.update("jax_enable_x64", True)  # this process's own entry point
  # NOTE: one small program at a time; async dispatch only adds overhead here (~30 us a call).
  jax.config.update("jax_cpu_enable_async_dispatch", False)
  from jaxrl_async.decentralized import node as node_lib

  ctx = zmq.Context()
  auth = transport.start_authenticator(ctx, keys)
  control = ctx.socket(zmq.DEALER)
  control.setsockopt(zmq.IDENTITY, str(node_id).encode())
  control.setsockopt(zmq.LINGER, 1000)
  transport.as_client(control, keys, node_id)
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

    data, port = bind_data(ctx, setup["bind"], keys)
    control.send_pyobj(("port", node_id, port))
    peers = _recv_or_die(control, "peers")["peers"]
    pushes = []
    for j in out_nbr:
      sock = ctx.socket(zmq.PUSH)
      sock.setsockopt(zmq.LINGER, 0)
      sock.setsockopt(zmq.SNDHWM, 10_000)
      transport.as_client(sock, keys, node_id)
      sock.connect(peers[j])
      pushes.append(sock)
    give_up = time.monotonic() + setup["give_up_s"]
    links = Links(pushes, setup.get("faults") or {}, seed=setup.get("seed", 0) * 7919 + node_id)
    return _node_loop(node_lib, control, data, links, const, state, in_slot, node_id,
                      setup["slowdown"], setup["report_every_s"], give_up)
  finally:
    if auth is not None:
      auth.stop()
    ctx.destroy(linger=0)


def bind_data(ctx: zmq.Context, addr: str, keys: dict | None) -> tuple[zmq.Socket, int]:
  """A node's data socket: PULL on `addr` (a free port), a CURVE server when `keys` is given
  (admitted are the clients that the context's authenticator allows); returns (socket, port)."""
  data = ctx.socket(zmq.PULL)
  data.setsockopt(zmq.LINGER, 0)
  transport.as_server(data, keys)
  return data, data.bind_to_random_port(f"tcp://{addr}")


def _recv_or_die(sock: zmq.Socket, what: str) -> Any:
  if not sock.poll(int(SETUP_TIMEOUT_S * 1000)):
    raise ProcessRuntimeError(f"no {what} message from the coordinator within "
                              f"{SETUP_TIMEOUT_S}s (not reachable, or CURVE keys that do not "
                              "match: CURVE at one end only, or another run's keys)")
  kind, payload = transport.loads(sock.recv())
  if kind == "stop":
    raise SystemExit(0)
  return payload


class Links:
  """A node's out-links with faults injected on the way to the socket, to measure what loss,
  delay and reordering do over real sockets.

  Faults (a dict, `experiment.make_faults`): drop_prob, each message lost with this
  probability before it reaches the socket; delay_s, each message held back for a delay drawn
  from delay_dist ('constant', 'uniform' on [0, 2 delay_s], 'exponential' capped at 5x) and
  sent when due, so later messages overtake earlier ones; slow_from_s / slow_until_s, the
  wall-clock window (seconds after the node starts) in which its slowdown holds.
  """

  def __init__(self, socks: list[zmq.Socket], faults: dict, seed: int = 0):
    self.socks = socks
    self.drop_prob = float(faults.get("drop_prob", 0.0))
    self.delay_s = float(faults.get("delay_s", 0.0))
    self.delay_dist = faults.get("delay_dist", "uniform")
    self.slow_from_s = float(faults.get("slow_from_s", 0.0))
    self.slow_until_s = float(faults.get("slow_until_s", float("inf")))
    self._rng = np.random.default_rng(seed)
    self._held: list[tuple[float, int, int, list[bytes]]] = []  # heap: (due, seq, out-slot, parts)
    self._seq = 0
    self.dropped = 0  # full queues (ZeroMQ HWM)
    self.injected_drops = 0

  def _delay(self) -> float:
    if self.delay_dist == "constant":
      return self.delay_s
    if self.delay_dist == "uniform":
      return self.delay_s * self._rng.uniform(0.0, 2.0)
    return self.delay_s * min(self._rng.exponential(1.0), 5.0)

  def send(self, o: int, parts: list[bytes], now: float) -> None:
    if self.drop_prob and self._rng.uniform() < self.drop_prob:
      self.injected_drops += 1
      return
    if self.delay_s:
      heapq.heappush(self._held, (now + self._delay(), self._seq, o, parts))
      self._seq += 1
      return
    self._put(o, parts)

  def flush(self, now: float) -> None:
    """Sends every held message that is due."""
    while self._held and self._held[0][0] <= now:
      _, _, o, parts = heapq.heappop(self._held)
      self._put(o, parts)

  def _put(self, o: int, parts: list[bytes]) -> None:
    try:
      self.socks[o].send_multipart(parts, zmq.NOBLOCK)
    except zmq.Again:
      self.dropped += 1  # harmless: the next message's running sum carries this mass

  def slow(self, elapsed: float) -> bool:
    return self.slow_from_s <= elapsed < self.slow_until_s


def _retune(node_lib, const, state, fields: dict):
  """New weights and steps from the coordinator (`retune.Retuner`), applied between two
  activations. The tracker is rescaled so that the mass the node holds, b_ii y, is unchanged:
  the push-pull invariant needs exactly that (see `adaptive.migrate`)."""
  import jax

  push_self_old = float(np.asarray(const.push_self))
  const = const._replace(**{k: jax.device_put(np.asarray(v)) for k, v in fields.items()})
  ratio = push_self_old / float(np.asarray(const.push_self))
  return const, state._replace(y=state.y * ratio)


def _hand_over(node_lib, control, node_id, state, give_up):
  """Shards move (`retune`'s docstring): this node's state goes to the coordinator, and its
  new rows and state come back; (const, state) on device, or None if told to stop meanwhile.
  Data messages that arrive in between wait in the socket."""
  import jax

  control.send_pyobj(("state", node_id, {k: np.asarray(v)
                                         for k, v in state._asdict().items()}))
  while time.monotonic() < give_up:
    if not control.poll(100):
      continue
    kind, payload = transport.loads(control.recv())
    if kind == "stop":
      return None
    if kind == "resume":
      const = node_lib.NodeConst(*(jax.device_put(np.asarray(x)) for x in payload["const"]))
      state = node_lib.NodeState(*(jax.device_put(np.asarray(x)) for x in payload["state"]))
      d_in, d = np.shape(state.theta_in)
      empty = node_lib.Inbox(np.zeros((d_in, d)), np.zeros((d_in, d)), -np.ones(d_in, np.int64))
      node_lib.node_update_jit(const, state, empty)  # new row count: compile before resuming
      return const, state
  return None


def _node_loop(node_lib, control, data, links, const, state, in_slot, node_id, slowdown,
               report_every_s, give_up) -> int:
  d_in, d = np.shape(state.theta_in)
  theta_buf, sigma_buf = np.zeros((d_in, d)), np.zeros((d_in, d))
  stamp_buf = -np.ones(d_in, np.int64)
  ignored, last_report, parent = 0, 0.0, os.getppid()
  start = time.monotonic()
  while True:
    now = time.monotonic()
    stop = False
    while not stop and control.poll(0):
      kind, payload = transport.loads(control.recv())
      stop = kind == "stop"
      if kind == "retune":
        const, state = _retune(node_lib, const, state, payload)
      elif kind == "handover":
        handed = _hand_over(node_lib, control, node_id, state, give_up)
        stop = handed is None
        const, state = handed or (const, state)
    if stop:
      break
    if os.getppid() != parent:  # the parent died (we were re-parented): do not linger
      return 3
    if now > give_up:  # the coordinator never said stop (it died, or its machine is gone)
      print(f"node {node_id}: no stop from the coordinator; giving up", file=sys.stderr)
      return 3
    # Drain every arrived message; keep the newest per in-neighbour (timestamps).
    while True:
      try:
        parts = data.recv_multipart(zmq.NOBLOCK)
      except zmq.Again:
        break
      s, stamp = _slot_of(parts, in_slot, d)
      if s is None:
        ignored += 1  # not a message of this run's protocol from an in-neighbour
      elif stamp > stamp_buf[s]:
        stamp_buf[s] = stamp
        theta_buf[s] = np.frombuffer(parts[1], np.float64)
        sigma_buf[s] = np.frombuffer(parts[2], np.float64)
    t_update = time.perf_counter()
    state, out = node_lib.node_update_jit(const, state,
                                          node_lib.Inbox(theta_buf, sigma_buf, stamp_buf))
    theta, sigma, stamp = np.asarray(out.theta), np.asarray(out.sigma), int(out.stamp)
    stamp_buf = -np.ones(d_in, np.int64)
    head = _HEADER.pack(node_id, stamp)
    sent_at = time.monotonic()
    for o in range(len(links.socks)):
      links.send(o, [head, theta.tobytes(), sigma[o].tobytes()], sent_at)
    links.flush(sent_at)
    if slowdown > 1 and links.slow(now - start):
      time.sleep((slowdown - 1) * (time.perf_counter() - t_update))
    if now - last_report >= report_every_s:
      control.send_pyobj(("report", node_id, stamp, theta))
      last_report = now
  final = {k: np.asarray(v) for k, v in state._asdict().items() if k != "table"}
  control.send_pyobj(("final", node_id, final, links.dropped, links.injected_drops))
  if ignored:
    print(f"node {node_id}: ignored {ignored} malformed or unexpected messages", file=sys.stderr)
  return 0


def _slot_of(parts: list[bytes], in_slot: dict[int, int], d: int) -> tuple[int | None, int]:
  """(in-neighbour slot, stamp) of a data message; (None, 0) for anything else."""
  if [len(x) for x in parts] != [_HEADER.size, 8 * d, 8 * d]:
    return None, 0
  sender, stamp = _HEADER.unpack(parts[0])
  return in_slot.get(sender), stamp


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description="One node of the ZeroMQ policy-evaluation network "
                                   "(started by run_processes or a launcher).")
  parser.add_argument("--control", required=True, help="tcp://ADDR:PORT of the coordinator")
  parser.add_argument("--node", type=int, required=True)
  parser.add_argument("--keys", default="", help=f"CURVE keys: a file only its owner can read, "
                      f"or - for stdin; default: ${transport.KEYS_ENV} if set, else no CURVE")
  args = parser.parse_args(argv)
  from_env = os.environ.pop(transport.KEYS_ENV, "")
  try:
    if args.keys:
      keys = transport.read_keys(args.keys, secrets_for=range(args.node, args.node + 1))
    else:
      keys = transport.node_keys(json.loads(from_env), args.node) if from_env else None
  except (ValueError, KeyError) as e:
    print(f"node {args.node}: --keys: {e}", file=sys.stderr)
    return 2
  return _node_main(args.control, args.node, keys)


if __name__ == "__main__":
  sys.exit(main())
