"""The --logger sinks: TensorBoard event files (written by tensorboardX) read back, through an
independent TFRecord reader and tensorboardX's `Event` protos, to what was written; wandb is
driven through its public calls; bad kinds fail with a message that names --logger."""

import os
import re
import socket
import struct
import subprocess
import sys
import time
import types

import pytest

from jaxrl_async import loggers
from jaxrl_async.config import ConfigError


def crc32c(data):
  """CRC-32C (Castagnoli), bitwise: independent of the writer's own table."""
  crc = 0xFFFFFFFF
  for b in data:
    crc ^= b
    for _ in range(8):
      crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
  return crc ^ 0xFFFFFFFF


def masked_crc32c(data):
  crc = crc32c(data)
  return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def read_events(path):
  """The file's TFRecords (length, masked CRC, data, masked CRC; both CRCs checked), each parsed
  as a tensorboardX `Event`."""
  from tensorboardX.proto.event_pb2 import Event

  data, i, out = path.read_bytes(), 0, []
  while i < len(data):
    (n,) = struct.unpack("<Q", data[i:i + 8])
    assert struct.unpack("<I", data[i + 8:i + 12])[0] == masked_crc32c(data[i:i + 8])
    body = data[i + 12:i + 12 + n]
    assert struct.unpack("<I", data[i + 12 + n:i + 16 + n])[0] == masked_crc32c(body)
    out.append(Event.FromString(body))
    i += 16 + n
  assert i == len(data)
  return out


def summary_values(events):
  """{(tag, step): Summary.Value} over the events."""
  return {(v.tag, e.step): v for e in events if e.HasField("summary") for v in e.summary.value}


def test_crc32c_known_vector():
  assert crc32c(b"123456789") == 0xE3069283  # the standard CRC-32C check value


def test_tensorboard_writes_scalars_histogram_and_config(tmp_path):
  logger = loggers.make_logger("tensorboard", tmp_path, {"env_id": "CartPole-v1", "seed": 3})
  logger.write({"return_mean": 12.5, "sps": 1000, "solved": True, "skipped": None,
                "name": "x", "lag_hist": {"0": 3, "2": 1}}, step=1234)
  logger.write({"return_mean": float("nan"), "sps": 2000}, step=2000)
  logger.close()
  logger.close()  # idempotent
  (path,) = list(tmp_path.iterdir())
  host = re.escape(socket.gethostname())
  # Where the hand-written writer put it: events.out.tfevents.<time>.<host>.<pid> in run_dir.
  pattern = rf"events\.out\.tfevents\.\d{{10}}\.{host}\.{os.getpid()}"
  assert re.fullmatch(pattern, path.name), path.name
  events = read_events(path)
  assert events[0].file_version == "brain.Event:2"
  values = summary_values(events)
  config = values.pop(("config/text_summary", 0))
  assert config.metadata.plugin_data.plugin_name == "text"
  (text,) = config.tensor.string_val
  assert text.startswith(b"```\n") and b'"env_id": "CartPole-v1"' in text and b'"seed": 3' in text
  histo = values.pop(("lag_hist", 1234)).histo
  assert list(histo.bucket) == [3.0, 0.0, 1.0]  # lags 0, 1, 2
  assert list(histo.bucket_limit) == [0.5, 1.5, 2.5]
  assert (histo.min, histo.max, histo.num, histo.sum, histo.sum_squares) == (0, 2, 4, 2, 4)
  # Every finite number, bools as 0/1; None, strings and the nan return are left out.
  assert {key: v.simple_value for key, v in values.items()} == {
      ("return_mean", 1234): 12.5, ("sps", 1234): 1000.0, ("solved", 1234): 1.0,
      ("sps", 2000): 2000.0}


def test_tensorboard_record_reaches_disk_before_close(tmp_path):
  """A live TensorBoard sees a record within seconds, not at close."""
  logger = loggers.make_logger("tensorboard", tmp_path, {})
  logger.write({"sps": 7}, step=5)
  (path,) = list(tmp_path.iterdir())
  deadline = time.monotonic() + 10
  while ("sps", 5) not in summary_values(read_events(path)) and time.monotonic() < deadline:
    time.sleep(0.1)
  seen = ("sps", 5) in summary_values(read_events(path))
  logger.close()
  assert seen


def test_none_never_imports_tensorboardx(tmp_path):
  code = ("import sys; from jaxrl_async import loggers; "
          f"loggers.make_logger('none', {str(tmp_path)!r}, {{}}).close(); "
          "print(sorted(m for m in sys.modules if m.startswith('tensorboardX')))")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "[]"


def test_tensorboardx_missing_is_a_clear_error(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, "tensorboardX", None)  # find_spec answers None
  with pytest.raises(ConfigError, match=r"--logger='tensorboard'.*pip install tensorboardX"):
    loggers.make_logger("tensorboard", tmp_path, {})
  assert list(tmp_path.iterdir()) == []


def test_none_discards(tmp_path):
  logger = loggers.make_logger("none", tmp_path, {})
  logger.write({"sps": 1.0}, step=1)
  logger.close()
  assert list(tmp_path.iterdir()) == []


def test_unknown_kind_names_the_flag(tmp_path):
  with pytest.raises(ConfigError, match="--logger='csv'"):
    loggers.make_logger("csv", tmp_path, {})


def test_wandb_missing_is_a_clear_error(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, "wandb", None)  # makes `import wandb` raise ImportError
  with pytest.raises(ValueError, match=r"--logger='wandb'.*pip install wandb"):
    loggers.make_logger("wandb", tmp_path, {})


def test_wandb_logs_scalars_and_finishes(tmp_path, monkeypatch):
  calls = []

  class Run:
    def log(self, data, step):
      calls.append(("log", data, step))

    def finish(self):
      calls.append(("finish",))

  def init(**kwargs):
    calls.append(("init", kwargs))
    return Run()

  monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init))
  logger = loggers.make_logger("wandb", tmp_path / "run-7", {"seed": 7})
  logger.write({"sps": 5, "lag_hist": {"0": 1}, "return_mean": None}, step=42)
  logger.close()
  logger.close()
  assert calls[0][1]["config"] == {"seed": 7} and calls[0][1]["name"] == "run-7"
  assert calls[1] == ("log", {"sps": 5.0}, 42)
  assert calls[2:] == [("finish",)]
