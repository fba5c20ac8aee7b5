"""Staged placement through pinned host memory (`sharding.put_batch(staged=...)`,
`pinned_host_supported`) and the transfer suite's rows for it, on the CPU backend: 1 device in
this process, 2 forced CPU devices in a process of their own (XLA_FLAGS must be set before JAX is
imported)."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from jaxrl_async.runtime.sharding import (
  PINNED_HOST,
  batch_sharding,
  host_buffer,
  learner_mesh,
  memory_kinds,
  pinned_host_supported,
  put_batch,
)
from tools.suites import transfer

ROOT = Path(__file__).resolve().parent.parent


def _host_tree(B: int) -> dict:
  """A rollout-shaped pytree of host arrays [T, B, ...]: aligned buffers and a plain numpy one."""
  rng = np.random.default_rng(B)
  obs = host_buffer((5, B, 3, 4), np.uint8)
  obs[...] = rng.integers(0, 255, obs.shape)
  rewards = host_buffer((4, B), np.float32)
  rewards[...] = rng.normal(size=rewards.shape)
  return {"obs": obs, "rewards": rewards, "valid": rng.random((4, B)) > 0.3}


def _check_placed(placed: dict, tree: dict, mesh) -> None:
  want = batch_sharding(mesh)
  for k, x in tree.items():
    y = placed[k]
    np.testing.assert_array_equal(np.asarray(y), x, err_msg=k)
    assert y.dtype == x.dtype and y.shape == x.shape, k
    assert y.sharding.is_equivalent_to(want, x.ndim), (k, y.sharding)
    assert y.sharding.memory_kind == "device", (k, y.sharding)
    assert {s.device for s in y.addressable_shards} == set(mesh.devices.flat), k


def check_put_batch(num_devices: int) -> list[str]:
  """Every check on the first `num_devices` devices; returns the memory kinds they report."""
  devices = jax.devices()[:num_devices]
  assert len(devices) == num_devices, jax.devices()
  mesh = learner_mesh(devices)
  assert devices[0].platform == "cpu"
  assert not pinned_host_supported(mesh)  # on the CPU backend staging is never the default
  assert pinned_host_supported(mesh) is pinned_host_supported(learner_mesh(devices))  # cached
  tree = _host_tree(B=4 * num_devices)
  for staged in (False, None):
    _check_placed(put_batch(tree, mesh, staged=staged), tree, mesh)
  _check_placed(put_batch(tree, mesh), tree, mesh)  # the callers' two-argument form
  kinds = sorted(memory_kinds(mesh))
  if PINNED_HOST in kinds:  # the explicit staged path still lands equal values in device memory
    _check_placed(put_batch(tree, mesh, staged=True), tree, mesh)
  else:
    with pytest.raises(ValueError, match=PINNED_HOST):
      put_batch(tree, mesh, staged=True)
  return kinds


def test_put_batch_direct_auto_and_staged_on_one_cpu_device():
  kinds = check_put_batch(1)
  assert "device" in kinds
  assert jax.devices()[0].default_memory().kind == "device"


def test_put_batch_on_two_forced_cpu_devices():
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS="--xla_force_host_platform_device_count=2")
  code = ("import json, jax; from tests.test_transfer_staged import check_put_batch; "
          "print('RESULT', json.dumps([check_put_batch(2), jax.device_count()]))")
  r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                     text=True, timeout=180)
  assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
  line = next(ln for ln in r.stdout.splitlines() if ln.startswith("RESULT "))
  kinds, count = json.loads(line[len("RESULT "):])
  assert count == 2 and "device" in kinds


def test_transfer_suite_skips_pinned_rows_on_cpu_with_the_reason():
  mesh = learner_mesh(jax.devices()[:1])
  rows = transfer.measure_payload("cartpole_rollout", transfer.TINY_PAYLOADS["cartpole_rollout"],
                                  mesh, tiny=True)
  transfer.add_ratios(rows)
  by = {r["method"]: r for r in rows}
  assert list(by) == ["put_batch", "put_batch_unaligned", "put_batch_direct", "put_batch_staged",
                      "pinned_copy", "memcpy", "memcpy_alloc"]
  for m in ("put_batch_direct", "put_batch_staged", "pinned_copy"):
    assert by[m]["gb_per_s"] is None and not by[m].get("error"), by[m]
    assert "cpu backend" in by[m]["skipped"], by[m]
    assert by[m]["vs_memcpy"] is None and by[m]["vs_pinned_copy"] is None
  assert by["put_batch"]["staged"] is False and by["put_batch"]["gb_per_s"] > 0
  assert by["put_batch"]["vs_memcpy"] > 0 and by["put_batch"]["vs_pinned_copy"] is None
  md = transfer.tables(rows)
  assert "vs_pinned_copy" in md and "put_batch against the goals" in md


def test_transfer_suite_pinned_rows_when_forced():
  """The accelerator-only rows' code path, forced on a CPU device that reports pinned memory."""
  mesh = learner_mesh(jax.devices()[:1])
  if PINNED_HOST not in memory_kinds(mesh):
    # Where the device has no pinned memory, asking to stage is refused with the kinds it has.
    with pytest.raises(ValueError, match=PINNED_HOST):
      put_batch({"x": np.zeros((2, 2), np.float32)}, mesh, staged=True)
    return
  rows = transfer.measure_payload("small_block", transfer.TINY_PAYLOADS["small_block"], mesh,
                                  tiny=True, pinned_rows=True)
  transfer.add_ratios(rows)
  by = {r["method"]: r for r in rows}
  for m in ("put_batch_direct", "put_batch_staged", "pinned_copy"):
    assert by[m]["gb_per_s"] > 0 and "skipped" not in by[m], by[m]
  assert by["put_batch_staged"]["staged"] is True and by["put_batch_direct"]["staged"] is False
  assert math.isclose(by["pinned_copy"]["vs_pinned_copy"], 1.0)
  assert by["put_batch"]["vs_pinned_copy"] == pytest.approx(
      by["put_batch"]["gb_per_s"] / by["pinned_copy"]["gb_per_s"])


def test_transfer_suite_tiny_end_to_end(tmp_path):
  """The CLI at test sizes: exit 0 (skipped rows are no failures), the new rows in both files."""
  r = subprocess.run([sys.executable, "-m", "tools.benchmark", "transfer", "--tiny", "--out",
                      str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=300,
                     env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
  record = json.loads((tmp_path / "results.json").read_text())
  methods = {(row["devices"], row["method"]) for row in record["rows"]}
  for devices in (1, 2):
    assert {(devices, "put_batch"), (devices, "pinned_copy"),
            (devices, "put_batch_staged")} <= methods
  assert not any(row.get("error") for row in record["rows"])
  assert record["config"]["put_batch_staged_by_default"] is False
  assert "device" in record["config"]["memory_kinds"]
  md = (tmp_path / "results.md").read_text()
  assert "pinned_copy" in md and "vs_pinned_copy" in md and (tmp_path / "transfer.png").exists()
