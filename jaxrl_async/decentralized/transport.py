"""Where the process runtime's nodes listen, and how their sockets are secured.

Hosts: `--hosts=ADDR,ADDR:COUNT,...` gives each node an IPv4 address (COUNT nodes on one
address, node ids in the order given); a node binds its data socket on that interface. Names are
not resolved (a bind needs an interface address), and 0.0.0.0, multicast and broadcast are
refused: every other node must be able to connect to the address a node listens on.

CURVE: whenever an address (a node's or the coordinator's) is not loopback, and on request on
loopback, every socket uses ZeroMQ's CURVE mechanism (authentication and encryption). The keys
are made per run: one server keypair, shared by every listening socket (the coordinator's control
ROUTER and each node's data PULL), and one client keypair per node. A listening side runs a ZAP
authenticator (zmq.auth.thread.ThreadAuthenticator) that admits only the run's client public keys;
a peer with any other key, or with no CURVE at all, never completes the handshake, so none of its
messages is delivered. Node i is handed the server pair, its own client pair and the run's client
public keys (`node_keys`); the coordinator needs no client secret (`coordinator_keys`).
"""

from __future__ import annotations

import ipaddress
import json
import os
import pickle
import stat
import sys
from pathlib import Path
from typing import Any

import zmq
from zmq.utils import z85

KEYS_ENV = "JAXRL_DEC_CURVE_KEYS"  # a node's keys as JSON, from a parent on the same machine
ADDRESS_HELP = "IPv4 addresses, ADDR or ADDR:COUNT, comma-separated (names are not resolved)"


class ProcessRuntimeError(RuntimeError):
  """A node process failed or did not answer in time."""


# ----------------------------------------------------------------------------------------------
# Control messages: pickles of builtins and numpy arrays only.

_NUMPY = {("numpy", "ndarray"), ("numpy", "dtype")} | {
    (module, name) for module in ("numpy.core.multiarray", "numpy._core.multiarray")
    for name in ("_reconstruct", "scalar")}


class _NumpyOnly(pickle.Unpickler):
  def find_class(self, module: str, name: str) -> Any:
    if (module, name) in _NUMPY:
      return super().find_class(module, name)
    raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a control message")


def loads(raw: bytes) -> Any:
  """Decodes a control message. Unlike pickle.loads, a message cannot name (and so run) any code
  but numpy's array constructors; pickle.UnpicklingError (or another error) for anything else."""
  import io

  return _NumpyOnly(io.BytesIO(raw)).load()


# ----------------------------------------------------------------------------------------------
# Addresses.


def check_address(addr: str) -> str:
  """`addr` if it is an IPv4 address another machine can connect to; ValueError otherwise."""
  try:
    ip = ipaddress.IPv4Address(addr)
  except ValueError:
    raise ValueError(f"{addr!r} is not an IPv4 address; give {ADDRESS_HELP}") from None
  if ip.is_unspecified or ip.is_multicast or ip == ipaddress.IPv4Address("255.255.255.255"):
    raise ValueError(f"{addr} cannot be connected to; give each node's own interface address")
  return addr


def host_list(spec: str) -> list[str]:
  """One address per node from 'ADDR,ADDR:COUNT,...', node ids in order; ValueError if bad."""
  addrs: list[str] = []
  for entry in spec.split(","):
    addr, sep, count = entry.strip().partition(":")
    if sep and not (count.isdigit() and int(count) >= 1):
      raise ValueError(f"count {count!r} in {entry!r} must be an integer >= 1")
    addrs += [check_address(addr)] * (int(count) if sep else 1)
  return addrs


def parse_hosts(spec: str, nodes: int) -> tuple[str, ...]:
  """`host_list(spec)`, checked to name `nodes` nodes; empty: every node on 127.0.0.1."""
  if not spec:
    return ("127.0.0.1",) * nodes
  addrs = host_list(spec)
  if len(addrs) != nodes:
    raise ValueError(f"names {len(addrs)} nodes; the counts must add up to --nodes={nodes}")
  return tuple(addrs)


def parse_endpoint(spec: str) -> tuple[str, int]:
  """'ADDR:PORT' -> (ADDR, PORT)."""
  addr, sep, port = spec.partition(":")
  if not (sep and port.isdigit() and 1 <= int(port) <= 65535):
    raise ValueError("must be ADDR:PORT, an IPv4 address and a port in [1, 65535]")
  return check_address(addr), int(port)


def is_loopback(addr: str) -> bool:
  return ipaddress.IPv4Address(addr).is_loopback


def check_bindable(addr: str, port: int = 0) -> None:
  """ValueError unless this machine can listen on addr:port (an address of one of its
  interfaces, and the port free)."""
  import socket

  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    try:
      s.bind((addr, port))
    except OSError as e:
      raise ValueError(f"cannot listen on {addr}:{port} on this machine ({e.strerror})") from None


# ----------------------------------------------------------------------------------------------
# CURVE keys.


def make_keys(nodes: int) -> dict[str, Any]:
  """A fresh key set for one run (z85 text)."""
  server_public, server_secret = zmq.curve_keypair()
  clients = [zmq.curve_keypair() for _ in range(nodes)]
  return {"server_public": server_public.decode(), "server_secret": server_secret.decode(),
          "client_public": [p.decode() for p, _ in clients],
          "client_secret": {str(i): s.decode() for i, (_, s) in enumerate(clients)}}


def node_keys(keys: dict[str, Any], node: int) -> dict[str, Any]:
  """What node `node` needs: the server pair, its own client pair, the run's client keys."""
  return {**keys, "client_secret": {str(node): keys["client_secret"][str(node)]}}


def coordinator_keys(keys: dict[str, Any]) -> dict[str, Any]:
  return {**keys, "client_secret": {}}


def write_keys(path: Path, keys: dict[str, Any]) -> None:
  """Writes `keys` to a new file that only its owner can read (0600)."""
  fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
  with os.fdopen(fd, "w") as f:
    json.dump(keys, f)


def read_keys(source: str, nodes: int | None = None, secrets_for: range = range(0)
              ) -> dict[str, Any]:
  """A key set from a file (refused unless only its owner can read it) or '-' (stdin).
  ValueError, one line, when it is unreadable, malformed, for another number of nodes, or lacks
  the client secret of a node in `secrets_for`."""
  if source == "-":
    text = sys.stdin.read()
  else:
    try:
      mode = os.stat(source).st_mode
      text = Path(source).read_text()
    except OSError as e:
      raise ValueError(f"cannot read it ({e.strerror})") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
      raise ValueError(f"others can read it (mode {stat.S_IMODE(mode):o}); chmod 600 it")
  try:
    keys = json.loads(text)
    publics, secrets = keys["client_public"], keys["client_secret"]
    for key in (keys["server_public"], keys["server_secret"], *publics, *secrets.values()):
      if len(key) != 40 or len(z85.decode(key.encode())) != 32:
        raise ValueError
  except (ValueError, KeyError, TypeError, AttributeError):
    raise ValueError("is not a CURVE key file made for this runtime") from None
  if nodes is not None and len(publics) != nodes:
    raise ValueError(f"holds keys for {len(publics)} nodes, not --nodes={nodes}")
  missing = [i for i in secrets_for if str(i) not in secrets]
  if missing:
    raise ValueError(f"holds no client secret for node {missing[0]}, which this process starts")
  return keys


# ----------------------------------------------------------------------------------------------
# Sockets.


class _AllowedKeys:
  """The ZAP credentials provider: admits exactly the run's client public keys."""

  def __init__(self, publics: list[str]):
    self.allowed = frozenset(p.encode() for p in publics)

  def callback(self, domain: str, key: bytes) -> bool:
    del domain
    return key in self.allowed


def start_authenticator(ctx: zmq.Context, keys: dict[str, Any] | None):
  """A ZAP authenticator on `ctx` admitting only the run's client keys; None without keys.
  Call `.stop()` on the result before destroying the context."""
  if keys is None:
    return None
  from zmq.auth.thread import ThreadAuthenticator

  auth = ThreadAuthenticator(ctx)
  auth.start()
  auth.configure_curve_callback("*", credentials_provider=_AllowedKeys(keys["client_public"]))
  return auth


def as_server(sock: zmq.Socket, keys: dict[str, Any] | None) -> None:
  """Makes `sock` (before bind) a CURVE server with the run's server pair; no-op without keys."""
  if keys is None:
    return
  sock.curve_secretkey = keys["server_secret"].encode()
  sock.curve_publickey = keys["server_public"].encode()
  sock.curve_server = True


def as_client(sock: zmq.Socket, keys: dict[str, Any] | None, node: int) -> None:
  """Makes `sock` (before connect) node `node`'s CURVE client; no-op without keys."""
  if keys is None:
    return
  sock.curve_secretkey = keys["client_secret"][str(node)].encode()
  sock.curve_publickey = keys["client_public"][node].encode()
  sock.curve_serverkey = keys["server_public"].encode()
