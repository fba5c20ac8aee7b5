"""A policy-evaluation run never overwrites another's results: default names carry the runtime and
move past a name in use (-2, -3, ...); an explicit --run_dir holding results is refused (exit 2,
one line naming the flag) unless --overwrite."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jaxrl_async.decentralized import experiment
from jaxrl_async.decentralized.config import ConfigError, PolicyEvalConfig

ROOT = Path(__file__).resolve().parents[1]
SMALL = ("--nodes=2", "--samples=120", "--features=6", "--states=15", "--tol=1e-4", "--quiet")


def run_cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
  return subprocess.run([sys.executable, "-m", "experiments.policy_evaluation", *args], cwd=cwd,
                        capture_output=True, text=True, timeout=120, env=env)


def test_default_names_carry_the_runtime_and_move_past_a_name_in_use(tmp_path):
  sim = PolicyEvalConfig(nodes=4)
  first = experiment.claim_run_dir(sim, tmp_path)
  assert first.name == "policy_evaluation-random_mdp-simulated-async-N4-0" and first.is_dir()
  assert experiment.claim_run_dir(sim, tmp_path) == first  # still empty: nothing to protect
  (first / "metrics.jsonl").write_text("{}\n")
  second = experiment.claim_run_dir(sim, tmp_path)
  assert second.name == first.name + "-2"
  (second / "summary.json").write_text("{}")
  assert experiment.claim_run_dir(sim, tmp_path).name == first.name + "-3"
  procs = experiment.claim_run_dir(PolicyEvalConfig(nodes=4, runtime="processes"), tmp_path)
  assert procs.name == "policy_evaluation-random_mdp-processes-async-N4-0"


def test_an_explicit_run_dir_with_results_is_refused_unless_overwrite(tmp_path):
  config = PolicyEvalConfig(run_dir=str(tmp_path))
  experiment.check_run_dir(config)  # empty: fine
  (tmp_path / "summary.json").write_text("{}")
  with pytest.raises(ConfigError, match=r"^--run_dir=.*already holds a run's summary.json"):
    experiment.check_run_dir(config)
  experiment.check_run_dir(config, overwrite=True)
  experiment.check_run_dir(PolicyEvalConfig())  # default names are never refused


def test_cli_second_run_moves_past_and_refuses_an_explicit_dir(tmp_path):
  for _ in range(2):
    out = run_cli(*SMALL, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
  base = tmp_path / "runs" / "policy_evaluation-random_mdp-simulated-async-N2-0"
  for path in (base, base.with_name(base.name + "-2")):
    summary = json.loads((path / "summary.json").read_text())
    assert summary["config"]["run_dir"] == str(path.relative_to(tmp_path))
  explicit = tmp_path / "mine"
  assert run_cli(*SMALL, f"--run_dir={explicit}").returncode == 0
  before = (explicit / "summary.json").read_text()
  out = run_cli(*SMALL, f"--run_dir={explicit}")
  assert out.returncode == 2
  lines = [ln for ln in out.stderr.splitlines() if ln.strip() and "xla_bridge" not in ln]
  assert len(lines) == 1 and f"--run_dir='{explicit}': already holds" in lines[0], out.stderr
  assert "--overwrite" in lines[0]
  assert (explicit / "summary.json").read_text() == before  # untouched
  out = run_cli(*SMALL, f"--run_dir={explicit}", "--overwrite", "--seed=1")
  assert out.returncode == 0, out.stderr
  assert json.loads((explicit / "summary.json").read_text())["config"]["seed"] == 1
