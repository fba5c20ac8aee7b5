"""Where the process runtime's nodes listen.

Hosts: `--hosts=ADDR,ADDR:COUNT,...` gives each node an IPv4 address (COUNT nodes on one
address, node ids in the order given); a node binds its data socket on that interface. Names are
not resolved (a bind needs an interface address), and 0.0.0.0, multicast and broadcast are
refused: every other node must be able to connect to the address a node listens on.
"""

from __future__ import annotations

import ipaddress

ADDRESS_HELP = "IPv4 addresses, ADDR or ADDR:COUNT, comma-separated (names are not resolved)"


class ProcessRuntimeError(RuntimeError):
  """A node process failed or did not answer in time."""


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
