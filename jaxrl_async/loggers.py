"""Where metrics go besides metrics.jsonl: TensorBoard event files or Weights & Biases.

`make_logger(kind, run_dir, config_flat)` returns a `Logger` with `write(record, step)` and
`close()`; kinds are "none", "tensorboard" and "wandb" (`--logger`). The JSONL log is always
written by `metrics.MetricsWriter`; a logger only mirrors its records.

TensorBoard event files are written by tensorboardX (`SummaryWriter`), TensorBoard's maintained
standalone writer: it owns the TFRecord framing, the CRC-32C checks and the `Event` protobufs.
An earlier version encoded those by hand to stay free of protobuf, but orbax-checkpoint already
installs protobuf, so the hand encoder saved nothing. tensorboardX is imported only when a
TensorBoard logger is made, so `--logger=none` runs never load it.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
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
  if kind == "tensorboard" and importlib.util.find_spec("tensorboardX") is None:
    raise ConfigError("logger", kind, "needs the tensorboardX package (pip install tensorboardX), "
                      "a dependency of jaxrl_async")
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
  """Writes `events.out.tfevents.<time>.<host>.<pid>` into `run_dir` through tensorboardX's
  `SummaryWriter`: one scalar per numeric field, a histogram per {value: count} field (the lag
  histogram), and the config once, as text (tag `config/text_summary`, tensorboardX's naming)."""

  def __init__(self, run_dir: Path, config_flat: dict[str, Any]):
    from tensorboardX import SummaryWriter  # here, so --logger=none never imports it

    run_dir.mkdir(parents=True, exist_ok=True)
    # NOTE: tensorboardX queues events to a writer thread that writes them as they come and
    # flushes the file every flush_secs; with 1 s a live TensorBoard sees a record (one every
    # --log_every_s) within a second, and a killed run loses at most that second. close()
    # drains the queue.
    self._writer: Any = SummaryWriter(logdir=str(run_dir), flush_secs=1,
                                      filename_suffix=f".{os.getpid()}")
    text = "```\n" + json.dumps(config_flat, indent=1, sort_keys=True, default=str) + "\n```"
    self._writer.add_text("config", text, global_step=0)

  def write(self, record: dict[str, Any], step: int) -> None:
    if self._writer is None:
      return
    for name, value in scalars(record).items():
      self._writer.add_scalar(name, value, global_step=step)
    for name, counts in count_histograms(record).items():
      # One bucket per integer value v, with right edge v + 0.5.
      keys = range(min(counts), max(counts) + 1)
      self._writer.add_histogram_raw(
          name, min=min(counts), max=max(counts), num=sum(counts.values()),
          sum=sum(k * c for k, c in counts.items()),
          sum_squares=sum(k * k * c for k, c in counts.items()),
          bucket_limits=[k + 0.5 for k in keys], bucket_counts=[counts.get(k, 0) for k in keys],
          global_step=step)
    self._writer.flush()

  def close(self) -> None:
    if self._writer is not None:
      self._writer.close()
      self._writer = None


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
