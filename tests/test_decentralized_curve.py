"""ZeroMQ CURVE in the process runtime: keys per run, handed out safely; four nodes on
127.0.0.1-127.0.0.4 with CURVE forced on reach 1e-6; a sender without the run's key is never
heard by a node's data socket."""

import json
import os
import re

import numpy as np
import pytest
import zmq

from jaxrl_async.decentralized import graphs, transport
from jaxrl_async.decentralized import problem as problem_lib
from jaxrl_async.decentralized.config import ConfigError, PolicyEvalConfig
from jaxrl_async.decentralized.experiment import check_network, curve_keys
from jaxrl_async.decentralized.processes import bind_data, run_processes

HOSTS = ("127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4")


def test_four_nodes_on_four_addresses_with_curve_reach_1e_6():
  p = problem_lib.random_mdp(0, nodes=4, samples=160, features=6, states=15)
  result = run_processes(p, graphs.exponential(4), 20.0, 160.0, tol=1e-6, max_wall_s=90.0,
                         hosts=HOSTS, keys=transport.make_keys(4))
  assert result.stopped == "tol", result.stopped
  # Read after the stop, the error may sit a little above tol (see test_decentralized_hosts).
  assert result.final_rel_error < 2e-6 and result.extra["curve"] is True
  assert result.extra["hosts"] == list(HOSTS) and all(c > 0 for c in result.extra["clocks"])
  theta_star = p.theta_star()
  np.testing.assert_allclose(result.theta, np.broadcast_to(theta_star, result.theta.shape),
                             rtol=0, atol=2e-6 * np.linalg.norm(theta_star))


def _sender(ctx: zmq.Context, endpoint: str, keys: dict, kind: str) -> zmq.Socket:
  sock = ctx.socket(zmq.PUSH)
  sock.setsockopt(zmq.LINGER, 0)
  if kind == "run":
    transport.as_client(sock, keys, 0)
  elif kind == "foreign":  # knows the server's public key, but its own key is not the run's
    public, secret = zmq.curve_keypair()
    sock.curve_publickey, sock.curve_secretkey = public, secret
    sock.curve_serverkey = keys["server_public"].encode()
  sock.connect(endpoint)
  return sock


@pytest.mark.parametrize("kind", ["foreign", "plain"])
def test_a_sender_without_the_runs_key_is_never_received(kind):
  keys = transport.make_keys(2)
  node_ctx, other_ctx = zmq.Context(), zmq.Context()
  auth = transport.start_authenticator(node_ctx, keys)
  try:
    data, port = bind_data(node_ctx, "127.0.0.2", transport.node_keys(keys, 1))
    endpoint = f"tcp://127.0.0.2:{port}"
    intruder = _sender(other_ctx, endpoint, keys, kind)
    for _ in range(20):
      intruder.send_multipart([b"x" * 12, b"\0" * 48, b"\0" * 48], zmq.NOBLOCK)
    assert not data.poll(2000)  # rejected at the handshake: nothing ever arrives
    member = _sender(other_ctx, endpoint, keys, "run")  # the same socket hears the run's key
    member.send_multipart([b"member"])
    assert data.poll(10_000) and data.recv_multipart() == [b"member"]
    assert not data.poll(500)  # and still nothing from the intruder
  finally:
    other_ctx.destroy(linger=0)
    auth.stop()
    node_ctx.destroy(linger=0)


def test_keys_are_per_run_and_each_node_gets_only_its_own_secret(tmp_path):
  keys = transport.make_keys(3)
  assert keys["server_public"] != transport.make_keys(3)["server_public"]
  mine = transport.node_keys(keys, 1)
  assert mine["client_secret"] == {"1": keys["client_secret"]["1"]}
  assert mine["client_public"] == keys["client_public"]
  assert transport.coordinator_keys(keys)["client_secret"] == {}
  path = tmp_path / "keys.json"
  transport.write_keys(path, keys)
  assert (os.stat(path).st_mode & 0o777) == 0o600
  assert transport.read_keys(str(path), 3, range(3)) == keys


def test_bad_key_files_name_the_flag(tmp_path):
  good = tmp_path / "keys.json"
  transport.write_keys(good, transport.coordinator_keys(transport.make_keys(4)))
  loose = tmp_path / "loose.json"
  loose.write_text(good.read_text())
  os.chmod(loose, 0o644)
  junk = tmp_path / "junk.json"
  transport.write_keys(junk, {"server_public": "x"})
  cases = [(loose, {}, "others can read it (mode 644)"),
           (junk, {}, "is not a CURVE key file"),
           (tmp_path / "absent.json", {}, "cannot read it"),
           (good, {"nodes": 3, "hosts": ""}, "holds keys for 4 nodes, not --nodes=3"),
           (good, {}, "holds no client secret for node 0")]  # this process starts the nodes
  for path, extra, needle in cases:
    config = PolicyEvalConfig(**{"runtime": "processes", "nodes": 4, "curve_keys": str(path),
                                 **extra})
    with pytest.raises(ConfigError, match=re.escape(f"--curve_keys='{path}': {needle}")):
      check_network(config)
  config = PolicyEvalConfig(runtime="processes", nodes=4, curve_keys=str(good),
                            coordinator="127.0.0.1:5999")
  assert curve_keys(config)["client_secret"] == {}  # enough for a coordinator


def test_curve_is_on_off_loopback_and_on_request():
  assert not PolicyEvalConfig(runtime="processes", hosts="127.0.0.2:4").uses_curve
  assert PolicyEvalConfig(runtime="processes", curve=True).uses_curve
  assert PolicyEvalConfig(runtime="processes", hosts="10.1.2.3:4").uses_curve
  assert curve_keys(PolicyEvalConfig(runtime="processes")) is None
  assert len(curve_keys(PolicyEvalConfig(runtime="processes", curve=True))["client_public"]) == 4
  with pytest.raises(ConfigError, match="^--curve_keys='': must be given with --coordinator"):
    PolicyEvalConfig(runtime="processes", coordinator="10.1.2.3:5000")
  with pytest.raises(ConfigError, match="^--curve=True: needs --runtime=processes"):
    PolicyEvalConfig(curve=True)


def test_a_node_refuses_a_key_file_others_can_read(tmp_path):
  from jaxrl_async.decentralized.processes import main

  path = tmp_path / "keys.json"
  path.write_text(json.dumps(transport.make_keys(2)))
  os.chmod(path, 0o644)
  assert main(["--control", "tcp://127.0.0.1:1", "--node", "0", "--keys", str(path)]) == 2


def test_control_messages_carry_arrays_but_never_code():
  import pickle

  msg = ("final", 1, {"theta": np.arange(3.0), "clock": np.asarray(7)}, 0)
  back = transport.loads(pickle.dumps(msg))
  assert back[0] == "final" and back[2]["clock"] == 7
  np.testing.assert_array_equal(back[2]["theta"], np.arange(3.0))

  class Evil:
    def __reduce__(self):
      return (os.system, ("true",))

  with pytest.raises(pickle.UnpicklingError, match="not allowed in a control message"):
    transport.loads(pickle.dumps(("report", Evil())))
