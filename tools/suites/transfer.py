"""Transfer: how fast rollouts are placed on the learner devices, against a host memory copy.

For rollout-shaped payloads (a CartPole rollout, a Breakout rollout, a 64 MiB block), each a
pytree of fresh host arrays [T, B, ...] as an actor makes them:
- `put_batch`: `runtime.sharding.put_batch` (what actors call: `jax.device_put` with the
  learner's env-axis `NamedSharding`) until the arrays are ready on the devices, on host buffers
  made as actors make them (`host_buffer`: 64-byte aligned, which a CPU device aliases instead
  of copying when one device holds the whole batch); `put_batch_unaligned`: the same call on
  plain numpy arrays;
- `put_batch_direct` and `put_batch_staged`: `put_batch(staged=False)` (one `device_put`) and
  `put_batch(staged=True)` (through the sharding's `pinned_host` memory, then to the device);
  `put_batch` itself picks the staged path where `sharding.pinned_host_supported` (accelerators;
  its row's `staged` says which ran);
- `pinned_copy`: `jax.device_put` to the devices of the same tree already in `pinned_host`
  memory (placed there before the clock starts): the link's pinned bandwidth as JAX drives it;
- `memcpy`: `np.copyto` of the same bytes into preallocated host buffers (the hardware's copy
  bandwidth), and `memcpy_alloc`: `np.copy` (allocation included, as a fresh device buffer is).
The three pinned-memory rows are measured only where `pinned_host_supported` (not on the CPU
backend, whose `pinned_host` memory is the same RAM as its device memory); elsewhere each is a
row with no bandwidth and `skipped` saying why.
Bandwidths are medians over repetitions, in GB/s; the ratios that matter are put_batch / memcpy
(`vs_memcpy`) and, on an accelerator, put_batch / pinned_copy (`vs_pinned_copy`; issue 16's goal
is >= 0.5).
Each row also has the minor page faults per call: on the CPU backend a copy into freshly mapped
device memory faults once per 4 KiB page, which is what bounds it there.
The mesh spans this process's first device; on a CPU host a second process measures the split
placement over 2 forced CPU devices.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tools.bench_common import Progress, SuiteResult, md_table

_RESULT_PREFIX = "RESULT "

# name -> {leaf: (shape, dtype)}; T, B as the throughput suite's configs use them.
PAYLOADS: dict[str, dict[str, tuple[tuple[int, ...], str]]] = {
    "cartpole_rollout": {"obs": ((17, 16, 4), "float32"), "actions": ((16, 16), "int32"),
                         "rewards": ((16, 16), "float32"), "terminated": ((16, 16), "bool"),
                         "truncated": ((16, 16), "bool"), "valid": ((16, 16), "bool"),
                         "logp": ((16, 16), "float32")},
    "breakout_rollout": {"obs": ((21, 16, 4, 84, 84), "uint8"), "actions": ((20, 16), "int32"),
                         "rewards": ((20, 16), "float32"), "terminated": ((20, 16), "bool"),
                         "truncated": ((20, 16), "bool"), "valid": ((20, 16), "bool"),
                         "logp": ((20, 16), "float32")},
    "block_64mib": {"obs": ((64, 16, 256, 256), "uint8")},
}
TINY_PAYLOADS = {"cartpole_rollout": PAYLOADS["cartpole_rollout"],
                 "small_block": {"obs": ((8, 16, 64, 64), "uint8")}}


def make_tree(spec: dict[str, tuple[tuple[int, ...], str]], fill: int,
              aligned: bool = True) -> dict[str, Any]:
  """Fresh host arrays, allocated (`host_buffer`) and written as an actor's rollout buffers are;
  `aligned=False`: plain numpy allocations instead."""
  import numpy as np

  from jaxrl_async.runtime.sharding import host_buffer

  alloc = host_buffer if aligned else np.zeros
  tree = {k: alloc(shape, dtype) for k, (shape, dtype) in spec.items()}
  for x in tree.values():
    x[...] = fill % 2 if x.dtype == bool else fill % 100
  return tree


def nbytes(spec: dict[str, tuple[tuple[int, ...], str]]) -> int:
  import numpy as np

  return sum(int(np.prod(shape)) * np.dtype(dtype).itemsize for shape, dtype in spec.values())


def _reps(size: int, tiny: bool) -> int:
  """Enough repetitions for a stable median, about a second of copying per method."""
  if tiny:
    return 5
  return int(min(200, max(7, 2**28 // max(size, 1))))


def _minor_faults() -> int:
  return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def staging_skip_reason(mesh: Any) -> str | None:
  """None where the pinned-memory rows are measured on `mesh`, else why they are not."""
  from jaxrl_async.runtime.sharding import PINNED_HOST, memory_kinds, pinned_host_supported

  if pinned_host_supported(mesh):
    return None
  platform, kinds = mesh.devices.flat[0].platform, sorted(memory_kinds(mesh))
  if PINNED_HOST not in kinds:
    return f"{platform} devices have no {PINNED_HOST} memory (memory kinds: {', '.join(kinds)})"
  return f"{platform} backend: {PINNED_HOST} is the same RAM as device memory; staging is off"


_PINNED_METHODS = ("put_batch_direct", "put_batch_staged", "pinned_copy")


def measure_payload(name: str, spec: dict[str, Any], mesh: Any, tiny: bool,
                    pinned_rows: bool | None = None) -> list[dict]:
  """Each method on the same fresh host trees, methods interleaved within each repetition so
  that a change in the machine's load hits all of them alike. `pinned_rows`: measure the
  pinned-memory methods (default: where `pinned_host_supported`; True forces them, e.g. on a
  CPU device that reports a `pinned_host` memory, to test the code path)."""
  import jax
  import numpy as np

  from jaxrl_async.runtime.sharding import (
    PINNED_HOST,
    batch_sharding,
    pinned_host_supported,
    put_batch,
  )

  size, reps = nbytes(spec), _reps(nbytes(spec), tiny)
  skip = staging_skip_reason(mesh)
  if pinned_rows is None:
    pinned_rows = skip is None
  dst = make_tree(spec, 0)  # memcpy's preallocated (and already faulted-in) destination
  put = lambda t: jax.block_until_ready(put_batch(t, mesh))
  to_device, to_pinned = batch_sharding(mesh), batch_sharding(mesh).with_memory_kind(PINNED_HOST)
  # method -> (call, which tree it gets: aligned host, unaligned host, or already pinned)
  methods: dict[str, tuple[Any, str]] = {
      "put_batch": (put, "aligned"),
      "put_batch_unaligned": (put, "unaligned"),  # the same call on numpy's 16-byte alignment
      "memcpy": (lambda t: [np.copyto(dst[k], v) for k, v in t.items()], "aligned"),
      "memcpy_alloc": (lambda t: [np.copy(v) for v in t.values()], "aligned"),
  }
  if pinned_rows:
    methods.update({
        "put_batch_direct": (lambda t: jax.block_until_ready(put_batch(t, mesh, staged=False)),
                             "aligned"),
        "put_batch_staged": (lambda t: jax.block_until_ready(put_batch(t, mesh, staged=True)),
                             "aligned"),
        "pinned_copy": (lambda t: jax.block_until_ready(jax.device_put(t, to_device)), "pinned"),
    })
  times: dict[str, list[float]] = {m: [] for m in methods}
  faults: dict[str, list[int]] = {m: [] for m in methods}
  for rep in range(reps + 1):
    trees = {"aligned": make_tree(spec, rep + 1),
             "unaligned": make_tree(spec, rep + 1, aligned=False)}
    if pinned_rows:  # off the clock: the source pinned_copy starts from
      trees["pinned"] = jax.block_until_ready(jax.device_put(make_tree(spec, rep + 1), to_pinned))
    for method, (fn, source) in methods.items():
      f0, t0 = _minor_faults(), time.perf_counter()
      result = fn(trees[source])
      if rep:  # the first repetition pays for one-time set-up
        times[method].append(time.perf_counter() - t0)
        faults[method].append(_minor_faults() - f0)
      del result
  common = {"payload": name, "bytes": size, "devices": len(mesh.devices.flat),
            "platform": mesh.devices.flat[0].platform}
  out = []
  for method in ("put_batch", "put_batch_unaligned", *_PINNED_METHODS, "memcpy", "memcpy_alloc"):
    if method not in methods:
      out.append({**common, "method": method, "reps": 0, "gb_per_s": None, "skipped": skip})
      continue
    secs = statistics.median(times[method])
    row = {**common, "method": method, "reps": reps, "median_s": secs,
           "us_per_call": 1e6 * secs, "gb_per_s": size / secs / 1e9,
           "page_faults_per_call": statistics.median(faults[method])}
    if method.startswith("put_batch"):
      row["staged"] = {"put_batch_direct": False, "put_batch_staged": True}.get(
          method, pinned_host_supported(mesh))
    out.append(row)
  return out


def measure_all(num_devices: int, tiny: bool) -> list[dict[str, Any]]:
  import jax

  from jaxrl_async.runtime.sharding import learner_mesh

  mesh = learner_mesh(jax.local_devices()[:num_devices])
  rows = []
  for name, spec in (TINY_PAYLOADS if tiny else PAYLOADS).items():
    rows += measure_payload(name, spec, mesh, tiny)
  add_ratios(rows)
  return rows


def add_ratios(rows: list[dict[str, Any]]) -> None:
  """vs_memcpy and vs_pinned_copy on every row: its bandwidth over memcpy's and over
  pinned_copy's for the same payload and devices (None where either is missing)."""
  for ref_method in ("memcpy", "pinned_copy"):
    base = {(r["payload"], r["devices"]): r.get("gb_per_s") for r in rows
            if r["method"] == ref_method}
    for r in rows:
      ref, mine = base.get((r.get("payload"), r.get("devices"))), r.get("gb_per_s")
      r[f"vs_{ref_method}"] = mine / ref if ref and mine else None


def _split_worker(num_devices: int, tiny: bool) -> list[dict[str, Any]]:
  """`measure_all` in a CPU process with `num_devices` forced devices."""
  env = {**os.environ, "JAX_PLATFORMS": "cpu",
         "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} "
                      f"--xla_force_host_platform_device_count={num_devices}".strip()}
  cmd = [sys.executable, "-m", "tools.suites.transfer", "--worker", str(num_devices)]
  if tiny:
    cmd.append("--tiny")
  done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600,
                        cwd=Path(__file__).resolve().parents[2])
  for line in reversed(done.stdout.splitlines()):
    if line.startswith(_RESULT_PREFIX):
      return json.loads(line[len(_RESULT_PREFIX):])
  tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
  return [{"payload": "all", "method": "split", "devices": num_devices, "gb_per_s": None,
           "error": f"exit {done.returncode}: {tail}"}]


def plot(rows: list[dict[str, Any]], path: Path) -> Path:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  groups = list(dict.fromkeys((r["payload"], r["devices"]) for r in rows if r.get("gb_per_s")))
  methods = list(dict.fromkeys(r["method"] for r in rows if r.get("gb_per_s")))
  fig, ax = plt.subplots(figsize=(2 + 1.8 * len(groups), 4))
  width = 0.8 / max(len(methods), 1)
  for i, method in enumerate(methods):
    ys = [next((r["gb_per_s"] for r in rows if (r["payload"], r["devices"]) == g
                and r["method"] == method and r.get("gb_per_s")), 0.0) for g in groups]
    ax.bar([k - 0.4 + width * (i + 0.5) for k in range(len(groups))], ys, width, label=method)
  ax.set_xticks(range(len(groups)), [f"{p}\n{d} dev" for p, d in groups], fontsize="small")
  ax.set(ylabel="GB/s", yscale="log", title="rollout placement against host memcpy")
  ax.legend(fontsize="small")
  ax.grid(alpha=0.3, axis="y")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path


def run(out_dir: Path, quick: bool, tiny: bool = False) -> SuiteResult:
  import jax

  from jaxrl_async.runtime.sharding import learner_mesh, memory_kinds, pinned_host_supported

  platform = jax.local_devices()[0].platform
  progress = Progress(2 if platform == "cpu" else 1, "transfer")
  rows = measure_all(1, tiny)
  progress.step(f"1 {platform} device: " + ", ".join(
      f"{r['payload']} {r['method']} {r['gb_per_s']:.2f} GB/s" for r in rows
      if r["method"] in ("put_batch", "put_batch_staged", "pinned_copy", "memcpy")
      and r.get("gb_per_s")))
  if platform == "cpu":
    split = _split_worker(2, tiny)
    rows += split
    progress.step("2 forced CPU devices: " + (split[0].get("error") or "done"))
  out_dir.mkdir(parents=True, exist_ok=True)
  mesh = learner_mesh(jax.local_devices()[:1])
  config = {"payloads": TINY_PAYLOADS if tiny else PAYLOADS,
            "memory_kinds": sorted(memory_kinds(mesh)),
            "put_batch_staged_by_default": pinned_host_supported(mesh)}
  return SuiteResult(rows, tables(rows), config, [plot(rows, out_dir / "transfer.png").name])


def tables(rows: list[dict[str, Any]]) -> str:
  goals = [r for r in rows if r["method"] == "put_batch"]
  return ("## Bandwidth (GB/s, median over repetitions)\n\n"
          + md_table(rows, ["payload", "devices", "platform", "method", "staged", "bytes",
                            "reps", "us_per_call", "gb_per_s", "vs_memcpy", "vs_pinned_copy",
                            "page_faults_per_call", "skipped", "error"])
          + "\n## put_batch against the goals (each >= 0.5)\n\n"
          "vs_memcpy: put_batch / memcpy. vs_pinned_copy: put_batch / pinned_copy, the link's "
          "pinned bandwidth (issue 16), empty where pinned_copy is skipped.\n\n"
          + md_table(goals, ["payload", "devices", "platform", "staged", "gb_per_s", "vs_memcpy",
                             "vs_pinned_copy", "error"]))


def _worker_main(argv: list[str]) -> int:
  p = argparse.ArgumentParser(prog="transfer-worker")
  p.add_argument("--worker", type=int, required=True, help="Devices in the mesh.")
  p.add_argument("--tiny", action="store_true")
  args = p.parse_args(argv)
  print(_RESULT_PREFIX + json.dumps(measure_all(args.worker, args.tiny)), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(_worker_main(sys.argv[1:]))
