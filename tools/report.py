"""One Markdown report from a `python -m tools.benchmark all --out DIR` run (BUILD_NOTES.md's
results section is this output, with the commentary written around it).

  python -m tools.report DIR [--level 4] > report.md

For each suite folder in DIR (in the suite order of tools/benchmark.py): its tables from
results.md but the per-run ones, headings moved down under `--level`; a table of every suite's
wall time, row count and the range of the 1-minute load average over its rows. The header names
the command, the machine and the library versions, from the suites' results.json.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from tools.benchmark import SUITES


def _load_range(rows: list[dict[str, Any]]) -> str:
  loads = [r["loadavg_1m"] for r in rows if isinstance(r.get("loadavg_1m"), (int, float))]
  return f"{min(loads):.1f}-{max(loads):.1f}" if loads else "not recorded"


def _tables(md: str, level: int) -> str:
  """results.md without its title, its command line, its images and its "Every run" tables
  (results.json has every run); headings moved down under a suite heading at `level`."""
  out, skipping = [], False
  for line in md.splitlines()[1:]:
    heading = re.match(r"^(#+) (.*)", line)
    if heading:
      skipping = heading.group(2).startswith("Every run")
      if not skipping:
        out.append(f"{'#' * (level + len(heading.group(1)) - 1)} {heading.group(2)}")
      continue
    if skipping or line.startswith(("`python -m tools.benchmark", "![")):
      continue
    out.append(line)
  return re.sub(r"\n{3,}", "\n\n", "\n".join(out)).strip()


def report(out_dir: Path, level: int = 4) -> str:
  found = [(name, json.loads((out_dir / name / "results.json").read_text()),
            (out_dir / name / "results.md").read_text())
           for name in SUITES if (out_dir / name / "results.json").exists()]
  if not found:
    raise SystemExit(f"no results.json under {out_dir}/<suite>/")
  first = found[0][1]
  m, v = first["machine"], first["versions"]
  revs = sorted({r["git_rev"][:7] for _, r, _ in found})
  parts = [
      f"`{first.get('command', 'python -m tools.benchmark')}`, commit {', '.join(revs)}; "
      f"{m['cpu_model']}, {m['cores']} cores, devices {m['device_kinds']} x "
      f"{m['device_count']}; " + ", ".join(f"{k} {val}" for k, val in v.items()) + ".",
      "",
      "| suite | wall time (s) | rows | load average (1 min) |",
      "|---|---|---|---|",
  ]
  parts += [f"| {name} | {r['config'].get('suite_wall_s', float('nan')):.0f} | {len(r['rows'])} "
            f"| {_load_range(r['rows'])} |" for name, r, _ in found]
  for name, _, md in found:
    parts += ["", f"{'#' * level} {name}", "", _tables(md, level)]
  return "\n".join(parts) + "\n"


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("out_dir", type=Path)
  parser.add_argument("--level", type=int, default=4, help="heading level of a suite")
  args = parser.parse_args()
  print(report(args.out_dir, args.level), end="")


if __name__ == "__main__":
  main()
