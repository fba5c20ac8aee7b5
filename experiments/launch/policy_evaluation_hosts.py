#!/usr/bin/env python3
"""Decentralized policy evaluation with its nodes on several machines (--runtime=processes).

    experiments/launch/policy_evaluation_hosts.py --via=ssh --hosts=10.0.0.2,10.0.0.3:2 \\
        --coordinator=10.0.0.1:5555 -- --tol=1e-6 --run_dir=runs/pe_hosts
    # inside a SLURM allocation; --names are the SLURM node names, one per --hosts entry:
    experiments/launch/policy_evaluation_hosts.py --via=srun --hosts=10.0.0.2,10.0.0.3 \\
        --names=cn02,cn03 --coordinator=10.0.0.1:5555 -- --tol=1e-6
    experiments/launch/policy_evaluation_hosts.py --via=ssh ... --dry-run   # print the commands

This machine runs the coordinator (`python -m experiments.policy_evaluation` with --hosts and
--coordinator; flags after `--` go to it) and starts node i of each --hosts entry with `ssh NAME`
or `srun --nodelist=NAME` (`--via=local`: here, to try it on 127.0.0.x). Every node runs
`python -m jaxrl_async.decentralized.processes --control tcp://COORDINATOR --node I` in
--remote_dir (default: this checkout's path, as on a shared file system) with --python (default:
this interpreter's path). CURVE is always on: the launcher makes the run's keys, gives the
coordinator its part in a 0600 file in a 0700 temporary folder (removed at the end), and node i
its part (its own client secret only) on its stdin (`--keys -`; through ssh and srun), never on
a command line. Bad input exits 2 with one line naming the flag; otherwise the exit status is
the coordinator's.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KEYS_FILE = "<the run's keys, made at launch>"
sys.path.insert(0, str(ROOT))

from jaxrl_async.decentralized import transport  # noqa: E402


class _Refused(ValueError):
  def __init__(self, flag: str, value: str, why: str):
    super().__init__(f"--{flag}={value!r}: {why}")


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--via", choices=("ssh", "srun", "local"), required=True)
  ap.add_argument("--hosts", required=True, help="ADDR or ADDR:COUNT, comma-separated")
  ap.add_argument("--coordinator", default="", help="ADDR:PORT of this machine, reachable from "
                  "every node; default 127.0.0.1 and a free port (loopback --hosts only)")
  ap.add_argument("--names", default="", help="ssh/srun target per --hosts entry (default: "
                  "the entry's address)")
  ap.add_argument("--remote_dir", default=str(ROOT))
  ap.add_argument("--python", default=sys.executable)
  ap.add_argument("--dry-run", action="store_true", help="print the commands, start nothing")
  i = argv.index("--") if "--" in argv else len(argv)
  return ap.parse_args(argv[:i]), argv[i + 1:]


def plan(args: argparse.Namespace, rest: list[str]) -> tuple[str, list[str], list[list[str]]]:
  """(coordinator ADDR:PORT, its command, one command per node); _Refused on bad input."""
  entries = args.hosts.split(",")
  try:
    addrs = transport.host_list(args.hosts)
  except ValueError as e:
    raise _Refused("hosts", args.hosts, str(e)) from None
  names = args.names.split(",") if args.names else [e.partition(":")[0] for e in entries]
  if len(names) != len(entries):
    raise _Refused("names", args.names, f"must give one name per --hosts entry ({len(entries)})")
  targets = [name for e, name in zip(entries, names, strict=True)
             for _ in range(len(transport.host_list(e)))]
  coordinator = args.coordinator or f"127.0.0.1:{_free_port()}"
  try:
    addr, _ = transport.parse_endpoint(coordinator)
  except ValueError as e:
    raise _Refused("coordinator", coordinator, str(e)) from None
  remote = [a for a in addrs if not transport.is_loopback(a)]
  if transport.is_loopback(addr) and remote:
    raise _Refused("coordinator", coordinator, f"loopback, but node address {remote[0]} is not; "
                   "give an address of this machine that every node can reach")
  coord_cmd = [sys.executable, "-m", "experiments.policy_evaluation", "--runtime=processes",
               f"--nodes={len(addrs)}", f"--hosts={args.hosts}",
               f"--coordinator={coordinator}", "--curve", f"--curve_keys={KEYS_FILE}", *rest]
  node_cmds = []
  for i, target in enumerate(targets):
    shell = (f"cd {shlex.quote(args.remote_dir)} && JAX_PLATFORMS=cpu exec "
             f"{shlex.quote(args.python)} -m jaxrl_async.decentralized.processes "
             f"--control tcp://{coordinator} --node {i} --keys -")
    node_cmds.append({"ssh": ["ssh", "-o", "BatchMode=yes", target, shell],
                      "srun": ["srun", "--nodes=1", "--ntasks=1", f"--nodelist={target}",
                               "bash", "-c", shell],
                      "local": ["bash", "-c", shell]}[args.via])
  return coordinator, coord_cmd, node_cmds


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def launch(coord_cmd: list[str], node_cmds: list[list[str]]) -> int:
  """Makes the run's keys, starts the coordinator, then every node (its keys on its stdin);
  waits for the coordinator; cleans up."""
  keys = transport.make_keys(len(node_cmds))
  folder = Path(tempfile.mkdtemp(prefix="pe_curve_"))  # 0700
  procs: list[subprocess.Popen] = []
  try:
    transport.write_keys(folder / "keys.json", transport.coordinator_keys(keys))
    cmd = [f"--curve_keys={folder / 'keys.json'}" if c == f"--curve_keys={KEYS_FILE}" else c
           for c in coord_cmd]
    coord = subprocess.Popen(cmd, cwd=ROOT)
    procs.append(coord)
    for i, cmd in enumerate(node_cmds):
      procs.append(subprocess.Popen(cmd, stdin=subprocess.PIPE))
      procs[-1].stdin.write(json.dumps(transport.node_keys(keys, i)).encode())
      procs[-1].stdin.close()
    status = coord.wait()
    for p in procs[1:]:
      try:
        p.wait(timeout=30)
      except subprocess.TimeoutExpired:
        pass
    return status
  finally:
    for p in procs:
      if p.poll() is None:
        p.terminate()
    shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str]) -> int:
  args, rest = parse(argv)
  try:
    coordinator, coord_cmd, node_cmds = plan(args, rest)
  except _Refused as e:
    print(f"policy_evaluation_hosts: {e}", file=sys.stderr)
    return 2
  if args.dry_run:
    for cmd in (coord_cmd, *node_cmds):
      print(shlex.join(cmd))
    return 0
  try:
    transport.check_bindable(*transport.parse_endpoint(coordinator))
  except ValueError as e:
    print(f"policy_evaluation_hosts: --coordinator={coordinator!r}: {e}", file=sys.stderr)
    return 2
  return launch(coord_cmd, node_cmds)


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
