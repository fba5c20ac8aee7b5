"""The start-up warning for a GPU or TPU host whose JAX runs on the CPU (issue 16, item 8)."""

from pathlib import Path

import pytest
from absl import logging

from jaxrl_async.runtime import accelerator
from jaxrl_async.runtime.accelerator import backend_mismatch, visible_accelerators
from tests.conftest import small_config


def _touch(root: Path, *paths: str) -> None:
  for p in paths:
    (root / p).parent.mkdir(parents=True, exist_ok=True)
    (root / p).touch()


def test_empty_root_shows_nothing(tmp_path):
  assert visible_accelerators(tmp_path, environ={}) == []


def test_nvidia_driver_entries_are_counted(tmp_path):
  for bus in ("0000:01:00.0", "0000:02:00.0"):
    (tmp_path / "proc/driver/nvidia/gpus" / bus).mkdir(parents=True)
  _touch(tmp_path, "dev/nvidia0", "dev/nvidiactl")  # the driver's entries win
  assert visible_accelerators(tmp_path, environ={}) == ["NVIDIA GPU (2 devices)"]


def test_nvidia_device_files_without_proc(tmp_path):
  # nvidiactl and nvidia-uvm exist with or without GPUs: only numbered files count.
  _touch(tmp_path, "dev/nvidia0", "dev/nvidiactl", "dev/nvidia-uvm")
  assert visible_accelerators(tmp_path, environ={}) == ["NVIDIA GPU (1 device)"]
  _touch(tmp_path / "only_ctl", "dev/nvidiactl", "dev/nvidia-uvm")
  assert visible_accelerators(tmp_path / "only_ctl", environ={}) == []


def test_tpu_device_files(tmp_path):
  _touch(tmp_path, "dev/accel0", "dev/accel1", "dev/accel2", "dev/accel3")
  assert visible_accelerators(tmp_path, environ={}) == ["TPU (4 devices)"]


def test_vfio_counts_as_tpu_only_beside_a_google_pci_device(tmp_path):
  _touch(tmp_path, "dev/vfio/0", "dev/vfio/vfio")
  pci = tmp_path / "sys/bus/pci/devices/0000:00:04.0"
  pci.mkdir(parents=True)
  (pci / "vendor").write_text("0x8086\n")
  assert visible_accelerators(tmp_path, environ={}) == []  # some other passthrough device
  (pci / "vendor").write_text("0x1ae0\n")
  assert visible_accelerators(tmp_path, environ={}) == ["TPU"]


def test_tpu_environment_variables(tmp_path):
  assert visible_accelerators(tmp_path, environ={"TPU_ACCELERATOR_TYPE": "v5litepod-8"}) == ["TPU"]
  assert visible_accelerators(tmp_path, environ={"TPU_NAME": "my-tpu"}) == ["TPU"]
  assert visible_accelerators(tmp_path, environ={"TPU_NAME": ""}) == []


def test_gpu_and_tpu_together(tmp_path):
  _touch(tmp_path, "dev/nvidia0", "dev/accel0")
  assert visible_accelerators(tmp_path, environ={}) == ["NVIDIA GPU (1 device)", "TPU (1 device)"]


def test_unreadable_root_does_not_raise(tmp_path, monkeypatch):
  def boom(self, pattern):
    raise OSError("no access")

  monkeypatch.setattr(Path, "glob", boom)
  assert visible_accelerators(tmp_path, environ={}) == []


def test_mismatch_names_what_is_visible_the_backend_and_the_extra(monkeypatch):
  monkeypatch.delenv("JAX_PLATFORMS", raising=False)  # conftest sets cpu for the suite
  gpu = backend_mismatch("cpu", ["NVIDIA GPU (2 devices)"])
  assert gpu is not None
  assert "NVIDIA GPU (2 devices)" in gpu and "'cpu'" in gpu
  assert "pip install -e '.[cuda]'" in gpu and "[tpu]" not in gpu
  assert "JAX_PLATFORMS=cpu" in gpu and "\n" not in gpu
  tpu = backend_mismatch("cpu", ["TPU"], environ={})
  assert tpu is not None and "pip install -e '.[tpu]'" in tpu and "[cuda]" not in tpu


@pytest.mark.parametrize("backend", ["gpu", "tpu"])
def test_no_mismatch_on_an_accelerator_backend(backend):
  assert backend_mismatch(backend, ["NVIDIA GPU (1 device)", "TPU"], environ={}) is None


def test_no_mismatch_when_nothing_is_visible():
  assert backend_mismatch("cpu", [], environ={}) is None


@pytest.mark.parametrize("platforms", ["cpu", "CPU", "cpu,cuda"])
def test_jax_platforms_cpu_silences_it(monkeypatch, platforms):
  monkeypatch.setenv("JAX_PLATFORMS", platforms)
  assert backend_mismatch("cpu", ["NVIDIA GPU (1 device)"]) is None


def test_jax_platforms_naming_an_accelerator_first_does_not_silence_it(monkeypatch):
  monkeypatch.setenv("JAX_PLATFORMS", "cuda,cpu")
  assert backend_mismatch("cpu", ["NVIDIA GPU (1 device)"]) is not None


def test_warn_if_cpu_fallback_logs_on_a_gpu_host_running_on_cpu(monkeypatch):
  # This machine's JAX is the CPU one; fake the GPU the system would show.
  monkeypatch.delenv("JAX_PLATFORMS", raising=False)
  monkeypatch.setattr(accelerator, "visible_accelerators", lambda: ["NVIDIA GPU (1 device)"])
  logged = []
  message = accelerator.warn_if_cpu_fallback(log=logged.append)
  assert message is not None and "[cuda]" in message
  assert logged == [message]


def test_warn_if_cpu_fallback_prints_when_absl_filters_warnings(monkeypatch, capsys):
  monkeypatch.delenv("JAX_PLATFORMS", raising=False)
  monkeypatch.setattr(accelerator, "visible_accelerators", lambda: ["TPU"])
  before = logging.get_verbosity()
  logging.set_verbosity(logging.ERROR)
  try:
    message = accelerator.warn_if_cpu_fallback()
  finally:
    logging.set_verbosity(before)
  assert message is not None
  assert message in capsys.readouterr().err


def test_warn_if_cpu_fallback_is_quiet_without_accelerators_or_with_jax_platforms(monkeypatch):
  import jax

  # Without an accelerator to name, JAX's backend is not even asked for (a CPU host, or a
  # JAX_PLATFORMS=cpu run, initializes nothing here).
  monkeypatch.setattr(jax, "default_backend", lambda: pytest.fail("asked JAX for its backend"))
  logged = []
  monkeypatch.setattr(accelerator, "visible_accelerators", lambda: [])
  monkeypatch.delenv("JAX_PLATFORMS", raising=False)
  assert accelerator.warn_if_cpu_fallback(log=logged.append) is None
  monkeypatch.setattr(accelerator, "visible_accelerators", lambda: ["TPU"])
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  assert accelerator.warn_if_cpu_fallback(log=logged.append) is None
  assert logged == []


def test_warn_if_cpu_fallback_never_raises(monkeypatch):
  def boom():
    raise RuntimeError("probe failed")

  monkeypatch.setattr(accelerator, "visible_accelerators", boom)
  assert accelerator.warn_if_cpu_fallback(log=pytest.fail) is None


def test_configure_jax_runs_the_check_except_before_joining_a_cluster(monkeypatch):
  import jax

  from jaxrl_async.runtime import jax_config

  monkeypatch.setattr(jax.config, "update", lambda *args: None)  # keep the suite's settings
  calls = []
  monkeypatch.setattr(accelerator, "warn_if_cpu_fallback", lambda: calls.append(1))
  jax_config.configure_jax(small_config(compilation_cache=False))
  assert calls == [1]
  jax_config.configure_jax(small_config(compilation_cache=False, coordinator_address="127.0.0.1:1"))
  assert calls == [1]  # a multi-process run's backend must wait for jax.distributed.initialize
