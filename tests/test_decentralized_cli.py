"""`python -m experiments.policy_evaluation`: bad input exits 2 before anything starts; a small
run writes its files."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args: str, timeout: float = 120.0) -> subprocess.CompletedProcess:
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  return subprocess.run([sys.executable, "-m", "experiments.policy_evaluation", *args],
                        cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.parametrize("args, needle", [
    (["--nodes=0"], "--nodes=0: must be an integer >= 1"),
    (["--nodes=50", "--samples=20"], "--nodes=50: larger than the data"),
    (["--topology=custom", "--nodes=3", "--edges=0-1,1-2"], "not strongly connected"),
    (["--mode=fast"], "--mode='fast': must be one of async, sync, centralized"),
    (["--alpha=0"], "--alpha=0.0: must be a number > 0"),
    (["--stragglers=5", "--nodes=4"], "--stragglers=5: must be <= --nodes=4"),
    (["--nodes=two"], "--nodes"),
    (["--nodes=8", "--shards=4"], "--shards=4: must be -1, 0 or >= --nodes=8"),
    (["--shards=-2"], "--shards=-2: must be an integer >= -1"),
    (["--shards=2000", "--samples=1600"], "--shards=2000: larger than the data"),
    (["--split=multi_agent", "--allocation=speed"],
     "--allocation='speed': must be uniform or measured"),
    (["--weights=fast"], "--weights='fast': must be one of uniform, speed, measured"),
    (["--straggler_after=5", "--straggler_until=3"], "--straggler_until=3.0: must be 0 (never)"),
    (["--max_backoffs=-1"], "--max_backoffs=-1: must be an integer >= 0"),
    (["--link_delay_ms=2"], "--link_delay_ms=2.0: needs --runtime=processes"),
    (["--runtime=processes", "--link_delay_ms=-1"], "--link_delay_ms=-1.0: must be a number"),
])
def test_bad_input_exits_2_with_one_line_naming_the_flag(args, needle, tmp_path):
  out = run_cli(*args, f"--run_dir={tmp_path / 'run'}")
  assert out.returncode == 2, out.stderr
  lines = [ln for ln in out.stderr.splitlines() if "xla_bridge" not in ln and ln.strip()]
  assert len(lines) == 1 and needle in lines[0], out.stderr
  assert not (tmp_path / "run").exists()  # nothing started


def test_divergent_steps_exit_1_naming_the_step_flags(tmp_path):
  out = run_cli("--alpha=5000", "--samples=240", "--features=8", "--states=20", "--quiet",
                "--max_backoffs=0", f"--run_dir={tmp_path}")
  assert out.returncode == 1
  assert "--alpha and/or --beta" in out.stderr


def test_small_run_writes_metrics_summary_and_plots(tmp_path):
  out = run_cli("--nodes=3", "--samples=240", "--features=8", "--states=20", "--tol=1e-8",
                "--topology=ring", "--quiet", f"--run_dir={tmp_path}")
  assert out.returncode == 0, out.stderr
  summary = json.loads((tmp_path / "summary.json").read_text())
  assert summary["final_rel_error"] < 1e-8 and summary["stopped"] == "tol"
  for key in ("updates", "virtual_time", "rate_c", "consensus_error", "config"):
    assert key in summary
  assert 0 < summary["rate_c"] < 1 and summary["config"]["nodes"] == 3
  records = [json.loads(ln) for ln in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert records[0]["k"] == 0 and records[-1]["worst_rel_error"] < 1e-8
  assert (tmp_path / "errors_vs_k.png").stat().st_size > 1000
  assert (tmp_path / "errors_vs_time.png").stat().st_size > 1000
