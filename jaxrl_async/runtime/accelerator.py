"""A start-up warning for a host whose accelerator JAX does not use.

`pip install -e .` installs a CPU-only JAX; on a GPU or TPU host the run would then train on the
CPU without a word. `visible_accelerators` asks the system (cheap file and environment checks, no
JAX) what accelerators it shows; `backend_mismatch` turns that and JAX's backend into one warning
line; `warn_if_cpu_fallback` does both at start-up (`setup.configure_jax`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from absl import logging

# PCI vendor id of Google's devices (TPU chips); what JAX itself reads to suggest libtpu.
_GOOGLE_PCI_VENDOR = "0x1ae0"
_TPU_ENV_VARS = ("TPU_ACCELERATOR_TYPE", "TPU_NAME")


def _count(root: Path, pattern: str) -> int:
  try:
    return sum(1 for _ in root.glob(pattern))
  except OSError:
    return 0


def _has_google_pci_device(root: Path) -> bool:
  try:
    vendors = list(root.glob("sys/bus/pci/devices/*/vendor"))
  except OSError:
    return False
  for vendor in vendors:
    try:
      if vendor.read_text().strip().lower() == _GOOGLE_PCI_VENDOR:
        return True
    except OSError:
      continue
  return False


def _devices(n: int) -> str:
  return f"{n} device" if n == 1 else f"{n} devices"


def visible_accelerators(root: Path = Path("/"),
                         environ: Mapping[str, str] | None = None) -> list[str]:
  """The accelerators this host shows, as human strings ("NVIDIA GPU (2 devices)", "TPU"),
  without importing JAX. NVIDIA GPUs: the driver's `/proc/driver/nvidia/gpus/*` entries, else
  `/dev/nvidia[0-9]*` device files. TPUs: `/dev/accel[0-9]*` (TPU v2-v4 VMs), `/dev/vfio/[0-9]*`
  beside a Google PCI device (v5e and later), or `TPU_ACCELERATOR_TYPE`/`TPU_NAME` set. `root` and
  `environ` are for tests. Never raises."""
  environ = os.environ if environ is None else environ
  root = Path(root)
  found = []
  gpus = _count(root, "proc/driver/nvidia/gpus/*") or _count(root, "dev/nvidia[0-9]*")
  if gpus:
    found.append(f"NVIDIA GPU ({_devices(gpus)})")
  accel = _count(root, "dev/accel[0-9]*")
  if accel:
    found.append(f"TPU ({_devices(accel)})")
  elif ((_count(root, "dev/vfio/[0-9]*") and _has_google_pci_device(root))
        or any(environ.get(name) for name in _TPU_ENV_VARS)):
    found.append("TPU")
  return found


def _cpu_on_purpose(environ: Mapping[str, str]) -> bool:
  """JAX_PLATFORMS names cpu first: the user asked for the CPU."""
  platforms = [p.strip().lower() for p in environ.get("JAX_PLATFORMS", "").split(",")]
  return platforms[0] == "cpu"


def backend_mismatch(backend: str, visible: list[str],
                     environ: Mapping[str, str] | None = None) -> str | None:
  """The warning line when the host shows an accelerator but JAX's backend is the CPU; None when
  nothing is visible, JAX uses an accelerator, or JAX_PLATFORMS=cpu asks for the CPU."""
  environ = os.environ if environ is None else environ
  if not visible or backend != "cpu" or _cpu_on_purpose(environ):
    return None
  extras = []
  if any(v.startswith("NVIDIA GPU") for v in visible):
    extras.append("pip install -e '.[cuda]'")
  if any(v.startswith("TPU") for v in visible):
    extras.append("pip install -e '.[tpu]'")
  return (f"this host shows {', '.join(visible)} but JAX runs on the backend '{backend}': "
          f"install JAX for it with {' or '.join(extras)} "
          "(JAX_PLATFORMS=cpu runs on the CPU on purpose and silences this)")


def warn_if_cpu_fallback(log: Callable[[str], object] = logging.warning) -> str | None:
  """Logs `backend_mismatch`'s warning, if any, and returns it. Asks JAX for its backend only when
  the host shows an accelerator, so a CPU host initializes nothing here. With absl's default
  `log` and absl filtering warnings out (--verbosity below -1), the line goes to stderr instead,
  so it always reaches the console once. Never raises."""
  try:
    visible = visible_accelerators()
    if not visible or _cpu_on_purpose(os.environ):
      return None
    import jax

    message = backend_mismatch(jax.default_backend(), visible)
  except Exception:  # a start-up hint must not stop a run
    return None
  if message is None:
    return None
  if log is logging.warning and not logging.level_warning():
    print(f"WARNING: {message}", file=sys.stderr)
  else:
    log(message)
  return message
