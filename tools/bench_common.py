"""What every benchmark suite shares: the machine record and the results files.

A suite is a module in `tools/suites/` with `run(out_dir: Path, quick: bool) -> SuiteResult`.
`write_results` turns that into `results.json` (machine, versions, git revision, rows),
`results.md` (the tables) and leaves the PNGs the suite drew where they are.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

_PACKAGES = ("jax", "jaxlib", "flax", "optax", "envpool", "numpy", "orbax-checkpoint", "rlax",
             "pyzmq")


def seed_list(text: str) -> list[int]:
  """"0-3,7" -> [0, 1, 2, 3, 7] (an argparse type: a bad list is a usage error, exit 2)."""
  out: list[int] = []
  try:
    for part in text.split(","):
      lo, _, hi = part.partition("-")
      out += list(range(int(lo), int(hi or lo) + 1))
  except ValueError:
    raise argparse.ArgumentTypeError(
        f"{text!r}: want ranges and numbers, e.g. 0-9 or 0,3,5") from None
  if not out:
    raise argparse.ArgumentTypeError(f"{text!r}: no seeds (a range is low-high, low <= high)")
  return out


def choice_list(allowed) -> Any:
  """An argparse type: "a,b" -> ["a", "b"], each one of `allowed` (else a usage error, exit 2,
  naming what is allowed)."""
  allowed = tuple(allowed)

  def parse(text: str) -> list[str]:
    items = text.split(",")
    bad = [x for x in items if x not in allowed]
    if bad:
      raise argparse.ArgumentTypeError(f"{text!r}: {', '.join(bad)} not one of "
                                       f"{', '.join(allowed)}")
    return items

  return parse


@dataclasses.dataclass
class SuiteResult:
  """Rows (one JSON object each) plus the Markdown tables a person reads."""

  rows: list[dict[str, Any]]
  tables_md: str
  config: dict[str, Any] = dataclasses.field(default_factory=dict)
  plots: list[str] = dataclasses.field(default_factory=list)


def git_rev() -> str:
  try:
    return subprocess.run(
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
        cwd=Path(__file__).resolve().parent.parent).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return "unknown"


def cpu_model() -> str:
  try:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
      if line.startswith("model name"):
        return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or "unknown"


def machine() -> dict[str, Any]:
  info: dict[str, Any] = {
      "cpu_model": cpu_model(),
      "cores": os.cpu_count(),
      "platform": platform.platform(),
      "python": sys.version.split()[0],
  }
  if "jax" in sys.modules:  # only report devices when the suite already paid for importing JAX
    import jax
    info["device_kinds"] = sorted({d.device_kind for d in jax.devices()})
    info["device_count"] = jax.device_count()
  return info


def versions() -> dict[str, str]:
  out = {}
  for name in _PACKAGES:
    try:
      out[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      out[name] = "not installed"
  return out


def write_results(out_dir: Path, suite: str, result: SuiteResult, command: str) -> Path:
  out_dir.mkdir(parents=True, exist_ok=True)
  record = {
      "suite": suite,
      "git_rev": git_rev(),
      "machine": machine(),
      "versions": versions(),
      "command": command,
      "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
      "config": result.config,
      "rows": result.rows,
  }
  (out_dir / "results.json").write_text(json.dumps(record, indent=1, default=str))
  header = (f"# {suite}\n\n`{command}` at `{record['git_rev'][:12]}` on "
            f"{record['machine']['cpu_model']} ({record['machine']['cores']} cores)\n\n")
  plots = "".join(f"\n![{p}]({p})\n" for p in result.plots)
  (out_dir / "results.md").write_text(header + result.tables_md + plots)
  return out_dir / "results.json"


def md_table(rows: list[dict[str, Any]], columns: list[str]) -> str:
  """A Markdown table of `columns` from `rows`; floats printed with 3 significant digits."""

  def fmt(v: Any) -> str:
    if isinstance(v, float):
      return f"{v:.3g}"
    return "" if v is None else str(v)

  lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
  lines += ["| " + " | ".join(fmt(r.get(c)) for c in columns) + " |" for r in rows]
  return "\n".join(lines) + "\n"


class Progress:
  """One console line per step of a suite, so a long run shows where it is."""

  def __init__(self, total: int, label: str):
    self.total, self.label, self.done, self.t0 = total, label, 0, time.time()

  def step(self, what: str) -> None:
    self.done += 1
    print(f"[{self.label} {self.done}/{self.total} {time.time() - self.t0:6.1f}s] {what}",
          flush=True)
