"""The --logger sinks: TensorBoard event files decode to what was written; wandb is driven
through its public calls; bad kinds fail with a message that names --logger."""

import struct
import sys
import types

import pytest

from jaxrl_async import loggers
from jaxrl_async.config import ConfigError


def read_records(path):
  """TFRecord framing, with both CRCs checked."""
  data, i, out = path.read_bytes(), 0, []
  while i < len(data):
    (n,) = struct.unpack("<Q", data[i:i + 8])
    assert struct.unpack("<I", data[i + 8:i + 12])[0] == loggers.masked_crc32c(data[i:i + 8])
    body = data[i + 12:i + 12 + n]
    assert struct.unpack("<I", data[i + 12 + n:i + 16 + n])[0] == loggers.masked_crc32c(body)
    out.append(body)
    i += 16 + n
  assert i == len(data)
  return out


def fields(buf):
  """A protobuf message as [(field number, value)]: ints, bytes, or raw 4/8-byte numbers."""
  out, i = [], 0

  def varint():
    nonlocal i
    n = shift = 0
    while True:
      b = buf[i]
      i += 1
      n |= (b & 0x7F) << shift
      shift += 7
      if not b & 0x80:
        return n

  while i < len(buf):
    key = varint()
    number, wire = key >> 3, key & 7
    if wire == 0:
      out.append((number, varint()))
    elif wire == 1:
      out.append((number, struct.unpack("<d", buf[i:i + 8])[0]))
      i += 8
    elif wire == 5:
      out.append((number, struct.unpack("<f", buf[i:i + 4])[0]))
      i += 4
    elif wire == 2:
      n = varint()
      out.append((number, buf[i:i + n]))
      i += n
    else:
      raise AssertionError(f"unexpected wire type {wire}")
  return out


def summary_values(event):
  """{tag: Summary.Value fields} of an Event."""
  values = {}
  for number, summary in fields(event):
    if number == 5:
      for _, value in fields(summary):
        f = fields(value)
        values[dict(f)[1].decode()] = f
  return values


def test_crc32c_known_vector():
  assert loggers.crc32c(b"123456789") == 0xE3069283  # the standard CRC-32C check value


def test_tensorboard_writes_scalars_histogram_and_config(tmp_path):
  logger = loggers.make_logger("tensorboard", tmp_path, {"env_id": "CartPole-v1", "seed": 3})
  logger.write({"return_mean": 12.5, "sps": 1000, "solved": True, "skipped": None,
                "name": "x", "lag_hist": {"0": 3, "2": 1}}, step=1234)
  logger.write({"return_mean": float("nan"), "sps": 2000}, step=2000)
  logger.close()
  logger.close()  # idempotent
  (path,) = list(tmp_path.glob("events.out.tfevents.*"))
  events = [dict(fields(e)) for e in read_records(path)]
  assert events[0][3] == b"brain.Event:2"
  config = summary_values(read_records(path)[1])["config"]
  assert b'"env_id": "CartPole-v1"' in dict(fields(dict(config)[8]))[8]
  first = summary_values(read_records(path)[2])
  assert events[2][2] == 1234
  assert set(first) == {"return_mean", "sps", "solved", "lag_hist"}
  assert dict(first["return_mean"])[2] == 12.5 and dict(first["solved"])[2] == 1.0
  histo = fields(dict(first["lag_hist"])[5])
  packed = {n: v for n, v in histo if n in (6, 7)}
  assert struct.unpack("<3d", packed[7]) == (3.0, 0.0, 1.0)  # lags 0, 1, 2
  second = summary_values(read_records(path)[3])
  assert set(second) == {"sps"} and events[3][2] == 2000  # nan is left out


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
