"""tools/plot.py draws its three figures for one or several runs, also from the command line."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tools import plot

REPO = Path(__file__).resolve().parent.parent


def fake_run(run_dir: Path, scale: float = 1.0, with_summary: bool = True) -> Path:
  run_dir.mkdir(parents=True)
  with (run_dir / "metrics.jsonl").open("w") as f:
    for i in range(6):
      f.write(json.dumps({"env_steps": 1000 * i, "wall_s": 2.0 * i + 3, "sps": 500.0 * scale,
                          "return_mean": None if i == 0 else 20.0 * i * scale,
                          "learner_idle_frac": 0.1, "actor_blocked_frac": 0.2,
                          "lag_hist": {"0": 2, "1": i}}) + "\n")
    f.write('{"env_steps": 60')  # a torn last line, as while a run is still writing
  if with_summary:
    (run_dir / "summary.json").write_text(json.dumps({"lag_hist": {"0": 7, "1": 3}}))
  return run_dir


def test_lag_histogram_prefers_the_summary_and_falls_back_to_windows(tmp_path):
  a = plot.load_run(fake_run(tmp_path / "a"))
  b = plot.load_run(fake_run(tmp_path / "b", with_summary=False))
  assert len(a["records"]) == 6
  assert plot.lag_histogram(a) == {0: 7, 1: 3}
  assert plot.lag_histogram(b) == {0: 12, 1: 15}


def test_plots_several_runs(tmp_path):
  runs = [fake_run(tmp_path / "x" / "seed0"), fake_run(tmp_path / "y" / "seed0", scale=2.0)]
  assert plot.labels(runs) == ["x/seed0", "y/seed0"]
  paths = plot.plot_runs(runs, tmp_path / "out")
  assert [p.name for p in paths] == ["learning_curves.png", "lag_hist.png", "sps.png"]
  for p in paths:
    assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000


def test_cli_defaults_to_the_run_folder_and_rejects_empty_folders(tmp_path):
  run = fake_run(tmp_path / "run")
  done = subprocess.run([sys.executable, "tools/plot.py", str(run)], cwd=REPO,
                        capture_output=True, text=True, timeout=120)
  assert done.returncode == 0, done.stderr
  assert (run / "sps.png").exists() and (run / "learning_curves.png").exists()
  (tmp_path / "empty").mkdir()
  assert plot.main([str(tmp_path / "empty")]) == 2


def test_missing_folder_is_an_error(tmp_path):
  with pytest.raises(FileNotFoundError):
    plot.load_run(tmp_path / "missing")
