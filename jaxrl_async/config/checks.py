"""How a config field is declared and checked: `_f` (a default with its flag's help text) and
the checks that raise `ConfigError`, one line naming the flag, the value and what is allowed."""

from __future__ import annotations

import dataclasses
from typing import Any


class ConfigError(ValueError):
  """A bad configuration value, reported as one line that names the flag."""

  def __init__(self, flag: str, value: Any, allowed: str):
    self.flag, self.value, self.allowed = flag, value, allowed
    super().__init__(f"--{flag}={value!r}: {allowed}")


def _f(default: Any, help: str) -> Any:  # noqa: A002 - mirrors absl's argument name
  if isinstance(default, list | dict):
    raise TypeError("mutable defaults are not allowed in frozen configs")
  return dataclasses.field(default=default, metadata={"help": help})


def _check(ok: bool, flag: str, value: Any, allowed: str) -> None:
  if not ok:
    raise ConfigError(flag, value, allowed)


def _positive(obj: Any, *names: str) -> None:
  for name in names:
    value = getattr(obj, name)
    _check(isinstance(value, int) and not isinstance(value, bool) and value >= 1,
           name, value, "must be an integer >= 1")


def _unit_interval(obj: Any, *names: str, closed_low: bool = True) -> None:
  for name in names:
    value = getattr(obj, name)
    ok = isinstance(value, int | float) and (0.0 <= value if closed_low else 0.0 < value)
    _check(ok and value <= 1.0, name, value,
           f"must be in {'[' if closed_low else '('}0, 1]")


def _non_negative(obj: Any, *names: str) -> None:
  for name in names:
    value = getattr(obj, name)
    _check(isinstance(value, int | float) and value >= 0, name, value, "must be >= 0")


def check_discrete_actions(algo: str, spec: Any) -> None:
  """`--algo`'s categorical policy or Q-values need an env with discrete actions (`spec`, an
  EnvSpec)."""
  _check(spec.discrete, "algo", algo, f"needs discrete actions, but {spec.env_id} has "
         "continuous ones (use --algo=ppo)")
