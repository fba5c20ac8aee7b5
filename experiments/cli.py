"""What every launcher shares: absl flag parsing where a bad value exits 2 with one line."""

from __future__ import annotations

import sys
from pathlib import Path

from absl import flags


def parse_flags(argv: list[str]) -> list[str]:
  """absl's parser, but a bad flag value exits 2 with one line, like every other bad input."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    print(f"{Path(argv[0]).stem}: {e}", file=sys.stderr)
    sys.exit(2)
