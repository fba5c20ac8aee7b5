"""Train an agent: `python -m experiments.train [--preset=cartpole_impala] [--flag=value ...]`.

Every setting of the config is a flag (its help text comes from the config field); a preset
fills the values no flag sets. Bad input exits with status 2 and one line naming the flag,
before any thread starts.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

from absl import app, flags, logging

from experiments.cli import parse_flags
from experiments.presets import PRESETS, preset
from jaxrl_async.config import ConfigError, TrainConfig

_PRESET = flags.DEFINE_string("preset", "cartpole_impala",
                              f"Named preset: {', '.join(sorted(PRESETS))}.")
_LAYOUT = flags.DEFINE_string(
    "layout", "auto", "Sizes from the host: auto chooses actors, envs, env threads and rollouts "
    "per update from the cores and devices present (jaxrl_async/layout.py); preset keeps the "
    "preset's. Explicit flags win either way.")
_QUIET = flags.DEFINE_bool("quiet", False, "No progress lines on the console.")
_COMPILE_ONLY = flags.DEFINE_bool(
    "compile_only", False, "Compile the run's programs into the compilation cache (under "
    "--balance=auto also the update at every rollouts-per-update it may choose), print them and "
    "exit: later runs of this config, any seed, cap or balance mode, start warm.")
_DEFINERS = {bool: flags.DEFINE_bool, int: flags.DEFINE_integer, float: flags.DEFINE_float,
             str: flags.DEFINE_string}
# One flag per config field; default None means "the preset's value, else the field default".
_CONFIG_FLAGS = {
    name: _DEFINERS[type(field.default)](name, None, field.metadata["help"])
    for name, field in TrainConfig.flag_fields().items()
}


def explicit_values() -> dict:
  """The config flags given on the command line."""
  return {name: holder.value for name, holder in _CONFIG_FLAGS.items()
          if holder.value is not None}


def resolve_config(host=None) -> tuple[TrainConfig, Any]:
  """The preset, with the layout's sizes for `host` (none: the preset's), overridden by every
  flag given explicitly; and the Layout (None without a host)."""
  values = preset(_PRESET.value)
  values.update(explicit_values())
  chosen = None
  if host is not None:
    from jaxrl_async import layout

    values, chosen = layout.choose(_LAYOUT.value, values, set(explicit_values()), host)
  algo_fields = TrainConfig.flag_fields(values.get("algo", "impala"))
  stray = [n for n in values if n not in algo_fields]
  if stray:
    raise ConfigError(stray[0], values[stray[0]],
                      f"is not a setting of --algo={values.get('algo', 'impala')}")
  return TrainConfig.from_flat(values), chosen


def main(argv: list[str]) -> int:
  if len(argv) > 1:
    print(f"train: unexpected arguments {argv[1:]}", file=sys.stderr)
    return 2
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)  # orbax and absl chatter at INFO
  hand_over_stops = install_signal_handlers()  # first: a stop during start-up is honoured too
  try:
    from jaxrl_async.layout import LAYOUTS

    if _LAYOUT.value not in LAYOUTS:
      raise ConfigError("layout", _LAYOUT.value, f"must be one of {', '.join(LAYOUTS)}")
    config, _ = resolve_config()
    from jaxrl_async.runtime import jax_config  # imports JAX; after the cheap checks

    if _COMPILE_ONLY.value:
      check_compile_only(config)
    # --compile_only compiles with JAX's own cache off: a program that cache serves is not
    # stored as a whole executable (runtime/executables.py), and storing them is its point.
    jax_config.configure_jax(without_xla_cache(config) if _COMPILE_ONLY.value else config)
    if config.distributed.enabled:  # joins the cluster: before anything touches a device
      from jaxrl_async.runtime.cluster import hosts

      try:
        hosts.initialize(config.distributed)
      except hosts.ClusterError as e:
        print(f"train: {e}", file=sys.stderr)
        return 1
      from jaxrl_async.runtime.accelerator import warn_if_cpu_fallback

      warn_if_cpu_fallback()  # jax_config.configure_jax left it to after joining the cluster
    from jaxrl_async.layout import detect_host
    from jaxrl_async.metrics import wall_s

    # The sizes depend on the host's devices, which only JAX (after joining a cluster) can see.
    config, layout = resolve_config(detect_host())
    from jaxrl_async.runtime.build import build
    from jaxrl_async.runtime.trainer import Trainer, check_run_dir, validate

    timings = {"import_s": wall_s()}  # process start to every import done
    run_dir = Path(config.run.run_dir or default_run_dir(_PRESET.value, config))
    spec = validate(config, run_dir)
    check_run_dir(config, run_dir)
  except ConfigError as e:
    print(f"train: {e}", file=sys.stderr)
    _leave_cluster_now(2, "bad configuration")
    return 2
  if not config.run.run_dir:
    config = dataclasses.replace(config, run=dataclasses.replace(config.run, run_dir=str(run_dir)))
  if _COMPILE_ONLY.value:
    return compile_only(config, spec, layout)
  try:
    parts = build(config, spec, run_dir, layout.to_json())
    from jaxrl_async.metrics import PROCESS_START

    trainer = Trainer(parts, quiet=_QUIET.value, timings=timings, started_at=PROCESS_START)
    hand_over_stops(trainer)
    result = trainer.run()
  except BaseException as e:
    import traceback

    traceback.print_exc()
    if config.distributed.enabled:
      _leave_cluster_now(1, hosts.describe_failure(e, config.distributed))
    _exit_now(1)
  if config.distributed.enabled:
    hosts.mark_done()
  s = result.summary
  print(f"done: {s['stop_reason']} ({s['stop_phase']}) solved={s['solved']} "
        f"solved_wall_s={s['solved_wall_s']} solved_env_steps={s['solved_env_steps']} "
        f"return_mean={s['final_return_mean']} env_steps={s['env_steps']} "
        f"wall_s={s['wall_s']:.1f} -> {parts.run_dir}/summary.json")
  if not config.distributed.enabled:
    _exit_now(0)
  return 0  # several processes leave through JAX's shutdown barrier, which their peers wait at


def check_compile_only(config: TrainConfig) -> None:
  """--compile_only fills the cache of one process's programs: there must be one."""
  if not config.run.compilation_cache:
    raise ConfigError("compile_only", True, "needs --compilation_cache=true (it fills that cache)")
  if config.distributed.enabled:
    raise ConfigError("compile_only", True, "serves single-process runs (the executable cache "
                      "does not hold a program that spans several processes)")


def without_xla_cache(config: TrainConfig) -> TrainConfig:
  return dataclasses.replace(config, run=dataclasses.replace(config.run, compilation_cache=False))


def compile_only(config: TrainConfig, spec: Any, layout: Any) -> int:
  """The programs a run of `config` compiles, compiled (or found) in the cache; no run dir,
  checkpoint or thread beyond the compiles. Prints one line of what and where."""
  from jaxrl_async.runtime import jax_config
  from jaxrl_async.runtime.build import build
  from jaxrl_async.runtime.executables import ExecutableCache
  from jaxrl_async.runtime.precompile import precompile
  from jaxrl_async.runtime.trainer import Trainer

  # Checkpointing is host-only: off, nothing is written beside the cache.
  quiet_ck = dataclasses.replace(config.checkpoint, checkpoint_every_s=0.0,
                                 checkpoint_every_updates=0, checkpoint_at_end=False)
  config = dataclasses.replace(config, checkpoint=quiet_ck)
  cache = Path(config.run.compilation_cache_dir or jax_config.default_cache_dir())
  parts = build(config, spec, None, layout.to_json())
  # JAX's persistent cache is off in this process (main), so every program not already stored
  # whole is compiled here, and stored: after a source change JAX's cache still held the
  # lowered programs, served them, and nothing was stored (BUILD_NOTES.md, "Warm programs").
  parts = dataclasses.replace(parts, executables=ExecutableCache(cache / "executables", config))
  done = precompile(Trainer(parts, quiet=True))
  print(f"compiled: {', '.join(done['programs'])} in {done['seconds']:.1f} s (served by the "
        f"executable cache: {', '.join(done['loaded']) or 'none'}) -> {cache}")
  _exit_now(0)
  return 0


def _exit_now(status: int) -> None:
  """Ends the process once the run has written everything: the summary, the metrics, every
  checkpoint (closed). Interpreter teardown would only free what the OS frees anyway, and it
  took 0.6-1.0 s after the summary; threads left in a C call (an env pool's construction, an
  XLA compile) could abort it ("terminate called without an active exception")."""
  import os

  sys.stdout.flush()
  sys.stderr.flush()
  logging.flush()
  os._exit(status)


def default_run_dir(preset_name: str, config: TrainConfig, root: Path = Path("runs")) -> Path:
  """ROOT/<preset>-<seed>, with -2, -3, ... appended while that folder is in use, so that the
  same command run again starts a new run (--resume continues the plain name's). A
  multi-process run keeps the plain name: its processes must agree on it."""
  base = root / f"{preset_name}-{config.run.seed}"
  if config.checkpoint.resume or config.distributed.enabled:
    return base
  path, n = base, 1
  while path.exists() and any(path.iterdir()):
    n += 1
    path = base.with_name(f"{base.name}-{n}")
  return path


def _leave_cluster_now(status: int, why: str) -> None:
  """In a multi-process run, exits at once: JAX's shutdown barrier would wait for peers that
  wait for this process in a collective. Does nothing before the cluster was joined."""
  hosts = sys.modules.get("jaxrl_async.runtime.cluster.hosts")
  if hosts is not None and hosts.joined():
    hosts.exit_now(status, why)


def install_signal_handlers():
  """SIGINT/SIGTERM end the run cleanly (summary written, exit 0); a second SIGINT exits now.
  Returns `hand_over(trainer)`: a stop that came before the trainer existed (while JAX imports,
  the config resolves, the components build) is handed to it, and it stops at once."""
  import os
  import signal

  held: dict[str, Any] = {"trainer": None, "reason": None}

  def handle(signum, frame):
    if held["reason"] is not None and signum == signal.SIGINT:
      print("train: second interrupt, exiting now", file=sys.stderr, flush=True)
      os._exit(130)
    held["reason"] = held["reason"] or (
        "interrupted" if signum == signal.SIGINT else "terminated")
    if held["trainer"] is not None:
      held["trainer"].request_stop(held["reason"])

  def hand_over(trainer) -> None:
    held["trainer"] = trainer
    if held["reason"] is not None:
      trainer.request_stop(held["reason"])

  signal.signal(signal.SIGINT, handle)
  signal.signal(signal.SIGTERM, handle)
  return hand_over


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
