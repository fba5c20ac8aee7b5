"""Files small enough to read in one sitting: no Python file in jaxrl_async/, experiments/ or
tools/ over 400 lines, no function over 80. OVER and OVER_FUNCTIONS hold
known exceptions while a file is being split (empty now: every file was split); an entry may
shrink but not grow, and a new exception fails the test."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_FILE_LINES, MAX_FUNCTION_LINES = 400, 80
# path -> the most lines (file) or {function: lines} it may have until it is split.
OVER: dict[str, int] = {}
OVER_FUNCTIONS: dict[tuple[str, str], int] = {}


def python_files():
  for folder in ("jaxrl_async", "experiments", "tools"):
    yield from sorted((ROOT / folder).rglob("*.py"))


def test_no_file_over_400_lines():
  over = {}
  for path in python_files():
    name = str(path.relative_to(ROOT))
    lines = path.read_text().count("\n")
    if lines > OVER.get(name, MAX_FILE_LINES):
      over[name] = lines
  assert not over, f"over {MAX_FILE_LINES} lines (or over their listed size): {over}"


def test_no_function_over_80_lines():
  over = {}
  for path in python_files():
    name = str(path.relative_to(ROOT))
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        lines = node.end_lineno - node.lineno + 1
        if lines > OVER_FUNCTIONS.get((name, node.name), MAX_FUNCTION_LINES):
          over[f"{name}:{node.name}"] = lines
  assert not over, f"functions over {MAX_FUNCTION_LINES} lines: {over}"
