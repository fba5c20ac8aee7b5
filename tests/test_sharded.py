"""Data-parallel learner on 4 forced CPU devices, in a process of its own (XLA_FLAGS must be set
before JAX is imported)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_sharded_update_equals_single_device_and_trains(tmp_path):
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
             JAX_PLATFORMS="cpu")
  r = subprocess.run([sys.executable, "-m", "tests.sharded_main", str(tmp_path)], cwd=ROOT,
                     env=env, capture_output=True, text=True, timeout=240)
  assert r.returncode == 0 and "SHARDED_OK" in r.stdout, r.stdout[-2000:] + r.stderr[-4000:]
