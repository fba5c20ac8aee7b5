"""Where metrics go besides metrics.jsonl: TensorBoard event files or Weights & Biases.

`make_logger(kind, run_dir, config_flat)` returns a `Logger` with `write(record, step)` and
`close()`; kinds are "none", "tensorboard" and "wandb" (`--logger`). The JSONL log is always
written by `metrics.MetricsWriter`; a logger only mirrors its records.

The TensorBoard writer is built in: TensorBoard's event file is a TFRecord stream of `Event`
protobufs, and the few messages needed here (scalars, a lag histogram, the config as text) are
encoded by hand below. That keeps the package free of tensorboardX and protobuf, whose generated
code is tied to protobuf's major version; the format is frozen (TensorBoard still reads files
written in 2016), and tests decode what is written.
"""

from __future__ import annotations

import json
import math
import os
import socket
import struct
import time
from pathlib import Path
from typing import Any

from jaxrl_async.config import ConfigError

KINDS = ("none", "tensorboard", "wandb")


class Logger:
  """Mirrors metrics records somewhere. The base class discards them (`--logger=none`)."""

  def write(self, record: dict[str, Any], step: int) -> None:
    """Logs one metrics record at `step` (env steps)."""

  def close(self) -> None:
    """Flushes and releases whatever the logger holds; idempotent."""

  def __enter__(self) -> Logger:
    return self

  def __exit__(self, *exc: Any) -> None:
    self.close()


def check_kind(kind: str) -> None:
  """Raises ConfigError (a ValueError naming --logger) for a kind that cannot work here.

  Cheap and free of side effects, so a launcher can call it before any thread starts.
  """
  if kind not in KINDS:
    raise ConfigError("logger", kind, f"must be one of {', '.join(KINDS)}")
  if kind == "wandb":
    try:
      import wandb  # noqa: F401
    except ImportError as e:
      raise ConfigError("logger", kind, "needs the wandb package (pip install wandb); "
                        "--logger=tensorboard needs nothing extra") from e


def make_logger(kind: str, run_dir: Path, config_flat: dict[str, Any]) -> Logger:
  """The logger for `--logger=kind`, writing under `run_dir`; `config_flat` is recorded with it."""
  check_kind(kind)
  if kind == "tensorboard":
    return TensorBoardLogger(Path(run_dir), config_flat)
  if kind == "wandb":
    return WandbLogger(Path(run_dir), config_flat)
  return Logger()


def scalars(record: dict[str, Any]) -> dict[str, float]:
  """The record's finite numbers (bools as 0/1); None, strings and nested values are left out."""
  out = {}
  for name, value in record.items():
    if isinstance(value, bool):
      value = int(value)
    if isinstance(value, int | float) and math.isfinite(value):
      out[name] = float(value)
  return out


def count_histograms(record: dict[str, Any]) -> dict[str, dict[int, int]]:
  """Fields that are {integer value: count} maps, e.g. `lag_hist`."""
  out = {}
  for name, value in record.items():
    if isinstance(value, dict) and value:
      try:
        out[name] = {int(k): int(v) for k, v in value.items()}
      except (TypeError, ValueError):
        continue
  return out


# -- TensorBoard --------------------------------------------------------------------------------


class TensorBoardLogger(Logger):
  """Writes `events.out.tfevents.*` into `run_dir`: one scalar per numeric field, a histogram
  per {value: count} field (the lag histogram), and the config once, as text."""

  def __init__(self, run_dir: Path, config_flat: dict[str, Any]):
    run_dir.mkdir(parents=True, exist_ok=True)
    name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}"
    self.path = run_dir / name
    self._file: Any = self.path.open("wb")
    self._write_event(_field_bytes(3, b"brain.Event:2"), step=0)
    text = "```\n" + json.dumps(config_flat, indent=1, sort_keys=True, default=str) + "\n```"
    self._write_event(_summary([_text_value("config", text)]), step=0)

  def write(self, record: dict[str, Any], step: int) -> None:
    if self._file is None:
      return
    values = [_scalar_value(k, v) for k, v in scalars(record).items()]
    values += [_histogram_value(k, h) for k, h in count_histograms(record).items()]
    if values:
      self._write_event(_summary(values), step)

  def close(self) -> None:
    if self._file is not None:
      self._file.close()
      self._file = None

  def _write_event(self, body: bytes, step: int) -> None:
    event = _field_fixed64(1, time.time()) + _field_varint(2, step) + body
    self._file.write(tfrecord(event))
    # NOTE: flushed per record (one every --log_every_s), so a live TensorBoard sees it and a
    # killed run loses nothing.
    self._file.flush()


def _varint(n: int) -> bytes:
  n &= (1 << 64) - 1  # int64 fields: negatives are ten-byte two's complement
  out = bytearray()
  while True:
    low, n = n & 0x7F, n >> 7
    out.append(low | (0x80 if n else 0))
    if not n:
      return bytes(out)


def _field_varint(field: int, n: int) -> bytes:
  return _varint(field << 3) + _varint(n)


def _field_fixed64(field: int, x: float) -> bytes:
  return _varint(field << 3 | 1) + struct.pack("<d", x)


def _field_fixed32(field: int, x: float) -> bytes:
  return _varint(field << 3 | 5) + struct.pack("<f", x)


def _field_bytes(field: int, data: bytes | str) -> bytes:
  data = data.encode() if isinstance(data, str) else data
  return _varint(field << 3 | 2) + _varint(len(data)) + data


def _summary(values: list[bytes]) -> bytes:
  # Event.summary = 5; Summary.value = 1 (repeated).
  return _field_bytes(5, b"".join(_field_bytes(1, v) for v in values))


def _scalar_value(tag: str, x: float) -> bytes:
  # Summary.Value: tag = 1, simple_value = 2.
  return _field_bytes(1, tag) + _field_fixed32(2, x)


def _histogram_value(tag: str, counts: dict[int, int]) -> bytes:
  # HistogramProto: min 1, max 2, num 3, sum 4, sum_squares 5, bucket_limit 6, bucket 7 (packed
  # doubles). One bucket per integer value v, with right edge v + 0.5.
  keys = range(min(counts), max(counts) + 1)
  num = sum(counts.values())
  hist = (_field_fixed64(1, min(counts)) + _field_fixed64(2, max(counts))
          + _field_fixed64(3, num) + _field_fixed64(4, sum(k * c for k, c in counts.items()))
          + _field_fixed64(5, sum(k * k * c for k, c in counts.items()))
          + _field_bytes(6, struct.pack(f"<{len(keys)}d", *(k + 0.5 for k in keys)))
          + _field_bytes(7, struct.pack(f"<{len(keys)}d", *(counts.get(k, 0) for k in keys))))
  return _field_bytes(1, tag) + _field_bytes(5, hist)  # Summary.Value.histo = 5


def _text_value(tag: str, text: str) -> bytes:
  # Summary.Value: tag 1, tensor 8 (TensorProto: dtype 1 = DT_STRING (7), tensor_shape 2 (empty:
  # a scalar), string_val 8), metadata 9 (SummaryMetadata.plugin_data 1: plugin_name 1 = "text").
  tensor = _field_varint(1, 7) + _field_bytes(2, b"") + _field_bytes(8, text)
  metadata = _field_bytes(1, _field_bytes(1, "text"))
  return _field_bytes(1, tag) + _field_bytes(8, tensor) + _field_bytes(9, metadata)


def tfrecord(data: bytes) -> bytes:
  """One TFRecord: length, its masked CRC32C, the data, its masked CRC32C."""
  header = struct.pack("<Q", len(data))
  return (header + struct.pack("<I", masked_crc32c(header)) + data
          + struct.pack("<I", masked_crc32c(data)))


def _crc32c_table() -> list[int]:
  table = []
  for i in range(256):
    crc = i
    for _ in range(8):
      crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    table.append(crc)
  return table


_CRC32C_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
  """CRC-32C (Castagnoli), as TFRecord uses; a record is small, so bytewise Python suffices."""
  crc = 0xFFFFFFFF
  for b in data:
    crc = _CRC32C_TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
  return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
  crc = crc32c(data)
  return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


# -- Weights & Biases ---------------------------------------------------------------------------


class WandbLogger(Logger):
  """One wandb run per training run, named after `run_dir`; the project comes from
  $WANDB_PROJECT (default "jaxrl_async"), everything else from wandb's own environment."""

  def __init__(self, run_dir: Path, config_flat: dict[str, Any]):
    import wandb

    run_dir.mkdir(parents=True, exist_ok=True)
    self._run = wandb.init(project=os.environ.get("WANDB_PROJECT", "jaxrl_async"),
                           name=run_dir.name, dir=str(run_dir), config=dict(config_flat))

  def write(self, record: dict[str, Any], step: int) -> None:
    if self._run is not None:
      self._run.log(scalars(record), step=int(step))

  def close(self) -> None:
    if self._run is not None:
      self._run.finish()
      self._run = None
