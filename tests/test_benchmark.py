"""The benchmark suite: the quick throughput suite end to end at test sizes, and the pieces the
suites compute their rows with."""

import argparse
import importlib
import json
import math
import statistics
import subprocess
import sys
import types
from pathlib import Path

import pytest

from tools import benchmark
from tools.bench_common import SuiteResult
from tools.suites import balance, convergence, lag_sweep, throughput

REPO = Path(__file__).resolve().parent.parent


def test_quick_throughput_suite_writes_its_files(tmp_path):
  from tools import report

  out = tmp_path / "throughput"
  done = subprocess.run(
      [sys.executable, "-m", "tools.benchmark", "throughput", "--quick", "--tiny", "--out",
       str(out)], cwd=REPO, capture_output=True, text=True, timeout=240)
  assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
  assert "[throughput 5/5" in done.stdout  # a progress line per step
  record = json.loads((out / "results.json").read_text())
  assert record["suite"] == "throughput"
  assert len(record["git_rev"]) == 40 or record["git_rev"] == "unknown"
  machine = record["machine"]
  assert machine["cores"] >= 1 and machine["cpu_model"] and machine["device_kinds"]
  assert record["versions"]["jax"] != "not installed"
  config = record["config"]
  assert config["tiny"] and config["tasks"]["cartpole"]
  layout = config["layouts"]["cartpole"]
  assert layout["mode"] == "auto" and layout["host"]["cores"] >= 1
  rows = record["rows"]
  assert [r["mode"] for r in rows] == list(throughput.MODES)
  for r in rows:
    assert r["task"] == "cartpole" and "error" not in r, r
    assert r["sps"] > 0 and r["num_actors"] == layout["values"]["num_actors"]
  by = {r["mode"]: r for r in rows}
  pipeline = by["pipeline_async"]
  assert pipeline["vs_bottleneck"] > 0 and pipeline["async_vs_sync"] > 0
  # The headline: the pipeline over EnvPool alone at the same sizes.
  assert pipeline["vs_limit"] == pytest.approx(pipeline["sps"] / by["env_only"]["sps"])
  assert config["headline"]["cartpole"]["pipeline_vs_limit"] == pipeline["vs_limit"]
  assert 0.0 <= pipeline["learner_idle_frac"] <= 1.0
  assert pipeline["policy_lag_mean"] <= 1.0 and pipeline["dropped_stale"] == 0
  assert by["pipeline_sync"]["env_batch_size"] == by["pipeline_sync"]["num_envs"]
  assert "sync EnvPool" in by["pipeline_sync"]["note"]
  md = (out / "results.md").read_text()
  assert "| cartpole | pipeline_async |" in md and "throughput.png" in md
  assert "## Pipeline / limit" in md and "## Layout" in md
  assert (out / "throughput.png").read_bytes()[:4] == b"\x89PNG"
  # The report over a run folder: the suite's tables under its heading, the machine line.
  text = report.report(tmp_path)
  assert "#### throughput\n" in text and "##### SPS by mode" in text
  assert "| cartpole | pipeline_async |" in text and "![" not in text
  assert f"{machine['cores']} cores" in text and "| throughput |" in text


def test_ratios_against_the_parts():
  rows = [{"task": "t", "mode": "actors_only", "sps": 100.0},
          {"task": "t", "mode": "learner_only", "sps": 400.0},
          {"task": "t", "mode": "pipeline_async", "sps": 80.0},
          {"task": "t", "mode": "pipeline_sync", "sps": 40.0},
          {"task": "u", "mode": "pipeline_async", "sps": None}]
  throughput.add_ratios(rows)
  assert rows[2]["vs_bottleneck"] == pytest.approx(0.8)
  assert rows[2]["vs_learner"] == pytest.approx(0.2)
  assert rows[2]["async_vs_sync"] == pytest.approx(2.0)
  assert rows[2]["vs_serial"] == pytest.approx(1.0)  # 1 / (1/100 + 1/400) = 80
  assert rows[3]["vs_bottleneck"] == pytest.approx(0.4) and "async_vs_sync" not in rows[3]
  assert rows[4]["vs_bottleneck"] is None and rows[4]["async_vs_sync"] is None
  assert rows[2]["vs_limit"] is None  # no env_only row for the task
  rows.insert(0, {"task": "t", "mode": "env_only", "sps": 160.0, "num_envs": 64})
  throughput.add_ratios(rows)
  assert rows[3]["vs_limit"] == pytest.approx(0.5) and rows[4]["vs_limit"] == pytest.approx(0.25)
  head = throughput.headline(rows)["t"]
  assert head["pipeline_vs_limit"] == pytest.approx(0.5) and head["num_envs"] == 64
  assert throughput.headline(rows)["u"]["pipeline_vs_limit"] is None


def test_throughput_env_only_runs_at_the_pipelines_sizes_on_a_gpu_host(monkeypatch):
  from jaxrl_async.layout import Host

  monkeypatch.setenv("JAXRL_BENCH_TASKS", "breakout,pong")
  tasks = throughput.laid_out(throughput.task_configs(), Host(16, "gpu", 1, "H200"))
  assert list(tasks) == ["breakout", "pong"]
  for task, (flat, layout) in tasks.items():
    assert flat["network"] == "nature_cnn" and layout.mode == "auto"
    env_only = throughput.sizes(throughput.mode_config("env_only", flat))
    pipeline = throughput.sizes(throughput.mode_config("pipeline_async", flat))
    assert env_only == pipeline, task
    # What the layout chose for a 1-GPU 16-core host: async EnvPool, batch < num_envs.
    assert pipeline["num_envs"] == layout.values["num_envs"] > pipeline["env_batch_size"] > 0
    assert pipeline["num_actors"] == layout.values["num_actors"]
    assert pipeline["env_threads"] == layout.values["env_threads"] > 0
    sync = throughput.sizes(throughput.mode_config("pipeline_sync", flat))
    assert sync == {**pipeline, "env_batch_size": pipeline["num_envs"]}


def test_throughput_budget_skips_modes_but_keeps_rows(monkeypatch, tmp_path):
  from jaxrl_async.layout import Host

  calls = []

  def fake_measure(mode, flat, window, run_dir, parts=None):
    calls.append(mode)
    return {"sps": 100.0, "update_ms": 1.0} if mode == "learner_only" else {"sps": 100.0}

  monkeypatch.setenv("JAXRL_BENCH_TASKS", "cartpole")
  monkeypatch.setenv("JAXRL_BENCH_BUDGET_S", "1e-9")  # spent before the first mode
  monkeypatch.setattr(throughput, "configure", lambda flat: None)
  monkeypatch.setattr(throughput, "measure", fake_measure)
  result = throughput.run(tmp_path, quick=True, tiny=True, host=Host(2, "cpu", 1))
  assert calls == [] and [r["mode"] for r in result.rows] == list(throughput.MODES)
  assert all(r["skipped"] and r["sps"] is None for r in result.rows)
  monkeypatch.delenv("JAXRL_BENCH_BUDGET_S")
  result = throughput.run(tmp_path, quick=True, tiny=True, host=Host(2, "cpu", 1))
  assert calls == list(throughput.RUN_ORDER)
  assert [r["mode"] for r in result.rows] == list(throughput.MODES)
  assert result.rows[3]["vs_limit"] == pytest.approx(1.0)


def test_window_profile_takes_deltas_over_the_window():
  records = [
      {"wall_s": 10.0, "env_steps": 1000, "version": 5, "env_recv_s": 1.0, "inference_s": 2.0,
       "queue_get_s": 0.0, "learner_idle_frac": 0.9, "actor_blocked_frac": 0.0,
       "policy_lag_mean": 0.0, "dropped_stale": 1},
      {"wall_s": 12.0, "env_steps": 3000, "version": 15, "env_recv_s": 2.0, "inference_s": 4.0,
       "queue_get_s": 1.0, "learner_idle_frac": 0.5, "actor_blocked_frac": 0.2,
       "policy_lag_mean": 1.0, "dropped_stale": 1},
  ]
  p = throughput.window_profile(records, num_actors=2)
  assert p["sps"] == pytest.approx(1000.0) and p["updates_per_s"] == pytest.approx(5.0)
  assert p["env_recv_frac"] == pytest.approx(0.25) and p["inference_frac"] == pytest.approx(0.5)
  assert p["queue_get_frac"] == pytest.approx(0.5) and p["learner_idle_frac"] == 0.5
  assert p["dropped_stale"] == 0
  # Records from before the actor's full split: its counters are None, not zero.
  assert p["h2d_frac"] is None and p["blocked_frac"] is None and p["idle_env_steps"] is None
  assert p["untimed_frac"] is None
  split = dict(h2d_s=0.0, d2h_s=0.0, env_send_s=0.0, write_s=0.0, permit_s=0.0,
               queue_put_s=0.0, param_fetch_s=0.0, idle_env_steps=0)
  later = dict(h2d_s=0.2, d2h_s=0.2, env_send_s=0.2, write_s=0.2, permit_s=0.4,
               queue_put_s=0.2, param_fetch_s=0.2, idle_env_steps=32)
  p = throughput.window_profile([{**records[0], **split}, {**records[1], **later}], 2)
  assert p["h2d_frac"] == pytest.approx(0.05) and p["write_frac"] == pytest.approx(0.05)
  # Only the permit is a wait on another component: a queue put never waits.
  assert p["blocked_frac"] == pytest.approx(0.1) and p["idle_env_steps"] == 32
  # recv 0.25 + h2d 0.05 + inference 0.5 + d2h 0.05 + send 0.05 + write 0.05 + permit 0.1
  # + put 0.05 + params 0.05 = 1.15 > 1
  assert p["untimed_frac"] == pytest.approx(-0.15)
  assert throughput.window_profile(records[:1], 2) == {"sps": None}


def fake_run(run_dir: Path) -> Path:
  run_dir.mkdir(parents=True)
  records = [{"wall_s": 4.0, "env_steps": 100, "version": 0, "learner_idle_frac": 1.0},
             {"wall_s": 5.0, "env_steps": 1000, "version": 2, "learner_idle_frac": 0.5},
             {"wall_s": 6.0, "env_steps": 3000, "version": 6, "learner_idle_frac": 0.2},
             {"wall_s": 8.0, "env_steps": 5000, "version": 9, "learner_idle_frac": 0.5}]
  (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
  summary = {"solved": True, "solved_wall_s": 7.5, "solved_env_steps": 4800, "env_steps": 5000,
             "wall_s": 8.0, "stop_reason": "solved", "final_return_mean": 480.0,
             "lag_hist": {"0": 3, "1": 1}, "max_policy_lag_seen": 1, "dropped_stale": 0,
             "timings": {"import_s": 1.5, "train_start_wall_s": 3.0,
                         "first_update_wall_s": 4.5}}
  (run_dir / "summary.json").write_text(json.dumps(summary))
  return run_dir


def test_read_run_has_the_lag_sweep_fields(tmp_path):
  row = convergence.read_run(fake_run(tmp_path / "run"))
  assert row["solved"] and row["solved_wall_s"] == 7.5 and row["solved_env_steps"] == 4800
  assert row["sps"] == pytest.approx(4000 / 3.0)  # from the first record after an update
  assert row["policy_lag_mean"] == pytest.approx(0.25) and row["policy_lag_max"] == 1
  assert row["dropped_stale"] == 0 and row["first_update_wall_s"] == 4.5
  # Weighted by interval, records after the first update only: (0.2 * 1 + 0.5 * 2) / 3.
  assert row["learner_idle_frac"] == pytest.approx(0.4)


def test_lag_sweep_settings_pass_only_flags_that_exist():
  from jaxrl_async.config import TrainConfig

  assert lag_sweep.setting_flags(None, "off") == {"free_running": True}
  assert lag_sweep.setting_flags(4, "off") == {"max_policy_lag": 4}
  has_balance = "balance" in TrainConfig.flag_fields()
  assert lag_sweep.balance_modes() == (("off", "auto") if has_balance else ("off",))
  if has_balance:
    for lag in (0, 1, 8, None):  # every auto setting must make a valid config
      flags = lag_sweep.setting_flags(lag, "auto")
      TrainConfig.from_flat({**flags, "num_envs": 16})


def test_lag_sweep_keeps_lag_weighting_rows_apart():
  assert lag_sweep.setting_flags(8, "off", "inverse") == {"max_policy_lag": 8,
                                                          "lag_weighting": "inverse"}
  row = lambda weighting, t: {"task": "CartPole-v1", "max_policy_lag": 8, "balance": "off",
                              "lag_weighting": weighting, "solved": True, "solved_wall_s": t,
                              "solved_env_steps": 1000}
  rows = [row("off", 10.0), row("inverse", 4.0),
          {**row("off", 6.0), "balance": "auto"}]
  table = {(r["balance"], r["lag_weighting"]): r for r in lag_sweep.aggregate(rows)}
  assert table["off", "off"]["time_to_solve_s"] == 10.0
  assert table["off", "inverse"]["time_to_solve_s"] == 4.0
  # balance=auto is judged against the unweighted fixed settings only.
  verdict, _best = lag_sweep.balance_verdict(rows)
  assert verdict["best_fixed_s"] == 10.0 and verdict["beats_median"]


def test_lag_sweep_runs_seeds_outermost_and_its_command_line_checks_its_flags(tmp_path,
                                                                              monkeypatch):
  seen = []
  monkeypatch.setattr(lag_sweep, "run_grid", lambda out, grid, *a: seen.extend(grid) or [])
  monkeypatch.setattr(lag_sweep, "plot_lag_returns", lambda rows, path: "")
  compiled = []
  monkeypatch.setattr(lag_sweep, "compile_programs",
                      lambda preset, flags, **kw: compiled.append(flags) or "compiled: ...")
  result = lag_sweep.run(tmp_path, False, weightings=("off", "inverse"), seeds=[3, 4],
                         tasks={"CartPole-v1": {}}, lags=(0, 4))
  balances = lag_sweep.balance_modes()
  # Every program first, once per task and lag weighting, with auto's U values (at a cap).
  assert [f.get("lag_weighting", "off") for f in compiled] == ["off", "inverse"]
  assert all(f["max_policy_lag"] == 1 and f.get("balance") == balances[-1] for f in compiled)
  assert len(result.config["compiled_first"]) == 2
  per_seed = 2 * len(balances) + 1  # K 0 and 4 per balance, and K = 4 weighted
  assert [g[4] for g in seen] == [3] * per_seed + [4] * per_seed
  assert ("CartPole-v1", 4, "off", "inverse", 3) in seen
  for argv in (["--lags=0,x"], ["--lags=-1"], ["--tasks=Pong"], ["--weightings=half"],
               ["--seeds=a"]):
    with pytest.raises(SystemExit) as e:
      lag_sweep.main([str(tmp_path), *argv])
    assert e.value.code == 2, argv


def test_process_rows_report_failures(tmp_path):
  row = convergence.run_train("cartpole_impala", 0, tmp_path / "bad", {"num_envs": 0},
                              timeout_s=120)
  assert "--num_envs=0" in row["error"]


def test_missing_suite_is_a_clear_error(monkeypatch):
  def missing(name):
    raise ModuleNotFoundError(f"No module named {name!r}", name=name)

  monkeypatch.setattr(importlib, "import_module", missing)
  with pytest.raises(SystemExit, match="decentralized.*tools/suites/decentralized.py"):
    benchmark.load_suite("decentralized")


def test_unknown_suite_exits_2():
  with pytest.raises(SystemExit) as e:
    benchmark.main(["nonsense"])
  assert e.value.code == 2


def test_seed_lists_read_ranges_and_refuse_bad_ones():
  from tools.bench_common import seed_list

  assert seed_list("0-3,7") == [0, 1, 2, 3, 7]
  assert seed_list("5") == [5]
  for bad in ("x", "3-1", ""):
    with pytest.raises(argparse.ArgumentTypeError, match=repr(bad)):
      seed_list(bad)


def test_seeds_reach_the_suites_that_run_seeds_and_are_refused_elsewhere(monkeypatch, tmp_path):
  got = {}

  def run(out_dir, quick, tiny=False, seeds=None):
    got.update(quick=quick, seeds=seeds)
    return SuiteResult([], "", {})

  def unseeded(out_dir, quick, tiny=False):
    raise AssertionError("a suite without seeds must not start")

  monkeypatch.setattr(benchmark, "load_suite", lambda name: types.SimpleNamespace(
      run=run if name == "balance" else unseeded))
  assert benchmark.main(["balance", "--seeds=10-12", "--out", str(tmp_path)]) == 0
  assert got == {"quick": False, "seeds": [10, 11, 12]}
  with pytest.raises(SystemExit) as e:
    benchmark.main(["startup", "--seeds=3"])
  assert e.value.code == 2


def test_balance_regimes_follow_the_task_variable(monkeypatch):
  monkeypatch.delenv("JAXRL_BENCH_TASKS", raising=False)
  assert list(balance.regimes()) == ["CartPole-v1 (hidden 512,512)"]
  monkeypatch.setenv("JAXRL_BENCH_TASKS", "breakout,8_actors")  # another suite's task: ignored
  assert balance.regimes() == {"CartPole-v1 (hidden 512,512, 8 actors)":
                               {"hidden_sizes": "512,512", "num_actors": 8}}


def test_balance_pools_results_of_several_runs(tmp_path, capsys):
  def row(lag, mode, t, seed):
    return {"task": "T", "max_policy_lag": lag, "balance": mode, "seed": seed, "solved": True,
            "solved_wall_s": t, "solved_env_steps": 1000}

  for i, base in enumerate((10.0, 20.0)):
    rows = [row(lag, mode, base + j + k, 3 * i + j) for j in range(3)
            for k, (lag, mode) in enumerate([(8, "off"), (1, "off"), (8, "auto")])]
    (tmp_path / str(i)).mkdir()
    (tmp_path / str(i) / "results.json").write_text(
        json.dumps({"config": {"max_wall_s": 90.0}, "rows": rows}))
  assert balance.main([str(tmp_path / "0"), str(tmp_path / "1")]) == 0
  out = capsys.readouterr().out
  assert "| T | 8 | off | off | 6/6 |" in out and "auto K=8: 6 seeds" in out
  # K=8 off took 10, 11, 12, 20, 21, 22 s: the spread of their logs sets the seeds needed.
  sd = statistics.stdev(math.log(t) for t in (10, 11, 12, 20, 21, 22))
  assert f"T, K=8 off: sd of log time {sd:.2f} over 6 seeds" in out
  assert balance.seeds_for({"auto_vs_best": 1.0, "auto_vs_best_90%": "0.8-1.2"}, 10) == 40
  with pytest.raises(SystemExit) as e:
    balance.main([str(tmp_path / "missing")])
  assert e.value.code == 2
  # An unsolved run counts as its budget, so runs of different budgets do not pool.
  (tmp_path / "2").mkdir()
  (tmp_path / "2" / "results.json").write_text(
      json.dumps({"config": {"max_wall_s": 120.0}, "rows": []}))
  with pytest.raises(SystemExit) as e:
    balance.main([str(tmp_path / "0"), str(tmp_path / "2")])
  assert e.value.code == 2


def test_balance_verdict_counts_unsolved_runs_as_the_budget():
  def row(lag, mode, t):
    return {"max_policy_lag": lag, "balance": mode, "solved": t is not None, "solved_wall_s": t}

  rows = ([row(0, "off", t) for t in (20.0, 22.0, 24.0)]
          + [row(8, "off", t) for t in (10.0, 11.0, 12.0)]
          + [row(None, "off", t) for t in (None, None, 30.0)]  # median: the 90 s budget
          + [row(8, "auto", t) for t in (10.5, 11.5, 12.5)])
  times = lag_sweep.times_by_setting(rows, 90.0)
  assert times[None, None, "off"] == [90.0, 90.0, 30.0]
  v, best = lag_sweep.balance_verdict(rows, 90.0, draws=200)
  assert best["K"] == "best auto (K=8)" and best["auto_vs_best"] == v["auto_vs_best"]
  assert v["best_fixed"] == "K=8" and v["best_fixed_s"] == 11.0 and v["median_fixed_s"] == 22.0
  assert v["auto_vs_best"] == 11.5 / 11.0 and v["within_10%_of_best"] and v["beats_median"]
  lo, hi = map(float, v["auto_vs_best_90%"].split("-"))
  assert lo <= v["auto_vs_best"] <= hi and lo < hi


def test_device_check_dry_run_lists_the_pong_training_and_the_throughput_step(tmp_path):
  done = subprocess.run(["bash", str(REPO / "tools" / "device_check.sh"), str(tmp_path / "out"),
                         "--dry-run"], cwd=REPO, capture_output=True, text=True, timeout=60)
  assert done.returncode == 0, done.stderr
  lines = done.stdout.splitlines()
  train = [line for line in lines if "experiments.train" in line]
  assert len(train) == 1 and "--preset=pong_impala" in train[0]
  assert "--max_wall_s=300" in train[0] and "--layout=auto" in train[0]
  assert "--num_envs" not in train[0] and "--num_actors" not in train[0]  # the layout's sizes
  bench = [line for line in lines if "tools.benchmark throughput" in line]
  assert len(bench) == 1 and "JAXRL_BENCH_TASKS=breakout,pong" in bench[0]
  assert "--quick" in bench[0]
  assert any("tools.benchmark transfer --quick" in line for line in lines)
  assert any("tools/plot.py" in line for line in lines)
  assert not (tmp_path / "out" / "steps.tsv").exists()  # nothing ran


def test_device_check_balance_dry_run_lists_the_breakout_grid_alone(tmp_path):
  done = subprocess.run(["bash", str(REPO / "tools" / "device_check.sh"), str(tmp_path / "out"),
                         "--dry-run", "--balance"], cwd=REPO, capture_output=True, text=True,
                        timeout=60)
  assert done.returncode == 0, done.stderr
  grid = [line for line in done.stdout.splitlines() if "tools.suites.balance_grid" in line]
  assert len(grid) == 1 and "--regimes breakout" in grid[0] and "auto:1:8" in grid[0]
  assert "--seeds 0" in grid[0] and "--max_wall_s 60" in grid[0]
  assert "experiments.train" not in done.stdout and "throughput" not in done.stdout
  bad = subprocess.run(["bash", str(REPO / "tools" / "device_check.sh"), str(tmp_path / "o2"),
                        "--balanced"], cwd=REPO, capture_output=True, text=True, timeout=60)
  assert bad.returncode == 2 and "usage" in bad.stderr


def test_the_gpu_balance_regime_runs_the_preset_and_auto_may_move_its_u():
  """The annealed learning rate counts env steps (algos/schedule.py), so the GPU regime runs the
  preset as a user would, annealing on, and --balance=auto may still move U there."""
  from types import SimpleNamespace as NS

  from experiments.presets import preset
  from jaxrl_async.config import TrainConfig
  from jaxrl_async.runtime.pipeline.balancer import make_bounds
  from tools.suites import balance_grid

  name, _, flags = balance_grid.REGIMES["breakout"]
  assert flags == {}
  config = TrainConfig.from_flat({**preset(name), "balance": "auto"})
  assert config.algo.anneal_lr and config.env.env_id == "Breakout-v5"
  u0 = config.rate.rollouts_per_update
  choices = make_bounds(config, NS(off_policy=False), multi_process=False).u_choices
  assert u0 in choices and len(choices) > 1, choices


def test_run_summary_counts_what_was_lost_and_who_waited(tmp_path):
  from tools import run_summary

  run = tmp_path / "run"
  run.mkdir()
  config = {"rollout_len": 8, "num_envs": 4, "rollouts_per_update": 2}
  (run / "summary.json").write_text(json.dumps({
      "config": config, "env_steps": 1000, "updates": 10, "dropped_stale": 2,
      "idle_env_steps": 36, "max_policy_lag_seen": 1, "lag_hist": {"0": 12, "1": 8},
      "wall_s": 12.0, "timings": {"train_start_wall_s": 2.0}}))
  # The first record (compile) and the last (partial) are left out of the means.
  records = [(0.9, 0.9), (0.2, 0.5), (0.4, 0.7), (0.9, 0.0)]
  (run / "metrics.jsonl").write_text("\n".join(
      json.dumps({"actor_blocked_frac": b, "learner_idle_frac": i}) for b, i in records))
  r = run_summary.summarize(run)
  assert r["lost_frac"] == pytest.approx((2 * 8 * 4 + 36) / 1000)
  assert r["sps"] == pytest.approx(100.0)
  assert r["actor_blocked"] == pytest.approx(0.3) and r["learner_idle"] == pytest.approx(0.6)
  assert r["rollouts_per_update"] == 2
  assert run_summary.decisions(run) == []
  summary = json.loads((run / "summary.json").read_text())
  summary["balance_decisions"] = [{
      "wall_s": 4.15, "lever": "rollouts_per_update+", "reason": "learner idle 71% > 20%",
      "rollouts_per_update": 2, "in_flight": 4, "active_actors": 2,
      "window": {"learner_idle": 0.708, "actors_blocked": 0.146, "lag_mean": 0.5}}]
  (run / "summary.json").write_text(json.dumps(summary))
  [line] = run_summary.decisions(run)
  assert line.split()[:5] == ["run", "4.15s", "rollouts_per_update+", "U2", "F4"]
  assert "N2" in line and "idle 0.71 blocked 0.15 lag 0.50" in line
  assert line.endswith("learner idle 71% > 20%")


def test_run_summary_windows_groups_a_setting_and_shows_both_throughputs(tmp_path):
  from tools import run_summary

  run = tmp_path / "run"
  run.mkdir()
  def w(t, n, consumed, learned, learned_s):
    return {"wall_s": t, "rollouts_per_update": 6, "in_flight": 12, "active_actors": n,
            "consumed": consumed, "seconds": 1.0, "learned": learned, "learned_s": learned_s,
            "learner_idle": 0.2, "actors_blocked": 0.1, "lag_mean": 0.5, "lag_max": 1,
            "actor_rate": 10.0, "learner_rate": consumed / 0.8}
  # Counted at the ticks: 36 then 24 (one update either side); timed: 30 each second.
  records = [{"balance_windows": [w(1.0, 6, 36, 30, 1.0), w(2.0, 6, 24, 30, 1.0)]},
             {"balance_windows": [w(3.0, 3, 30, 0, 0.0)]}, {}]
  (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records))
  first, second = run_summary.windows(run)
  assert "U6 F12 N6" in first and "2 windows" in first
  assert "timed   30.00/s (sd  0.0%, 2 timed)" in first
  assert "counted   30.00/s (sd 28.3%)" in first
  assert "U6 F12 N3" in second and "0 timed" in second


def test_balance_grid_judges_auto_against_the_best_and_median_fixed_setting():
  from tools.suites import balance_grid

  assert balance_grid.settings(False, False)[-1] == ("auto", 1, 6)
  grid = balance_grid.GRID_U, balance_grid.GRID_ACTORS
  assert len(balance_grid.settings(False, False)) == len(grid[0]) * len(grid[1]) + 1
  assert 1 in grid[1] and ("off", 3, 1) in balance_grid.settings(True, False)
  row = lambda balance, u, n, sps: {
      "regime": "fast", "balance": balance, "U": u, "actors": n, "sps": sps,
      "actors_blocked": 0.1, "learner_idle": 0.8, "lag_mean": 0.5, "end_u": u, "end_active": n}
  rows = [row("off", 1, 6, 30.0), row("off", 6, 6, 20.0), row("off", 3, 2, 10.0),
          row("auto", 1, 6, 27.0), {"regime": "fast", "balance": "off", "error": "exit 1"}]
  [v] = balance_grid.verdicts(rows)
  assert v["best_fixed"] == "U=1 N=6" and v["auto_vs_best"] == pytest.approx(0.9)
  assert v["median_fixed_sps"] == 20.0 and v["settled_vs_best"] is None
  assert v["best_unblocked"] == "U=1 N=6" and v["unblocked_vs_best"] == 1.0
  # A second seed: each setting is judged by its mean, so U=6 N=6 (20, 36: 28) is not best.
  rows += [row("off", 1, 6, 34.0), row("off", 6, 6, 36.0), row("off", 3, 2, 10.0),
           row("auto", 1, 6, 29.0) | {"sps_settled": 31.0}]
  [v] = balance_grid.verdicts(rows)
  assert v["seeds"] == 2 and v["best_fixed"] == "U=1 N=6" and v["best_sps"] == 32.0
  assert v["auto_vs_best"] == pytest.approx(28 / 32)
  assert v["settled_vs_best"] == pytest.approx(31 / 32)
  # Where the best setting's actors mostly wait, the best under the blocked line is named.
  rows = [r | {"actors_blocked": 0.7} if r.get("U") == 1 and r["balance"] == "off" else r
          for r in rows]
  [v] = balance_grid.verdicts(rows)
  assert v["best_fixed"] == "U=1 N=6" and v["best_unblocked"] == "U=6 N=6"
  assert v["unblocked_vs_best"] == pytest.approx(28 / 32)
  assert "auto against the fixed settings" in balance_grid.tables(rows)


def test_balance_verdict_reports_the_speed_up_over_synchronous_training():
  row = lambda lag, mode, t: {"task": "T", "max_policy_lag": lag, "balance": mode,
                              "solved": True, "solved_wall_s": t}
  rows = [row(0, "off", 10.0), row(0, "off", 10.0), row(1, "off", 5.0), row(1, "off", 5.0),
          row(1, "auto", 4.0), row(1, "auto", 4.0)]
  v, best = lag_sweep.balance_verdict(rows)
  assert v["speedup_vs_sync"] == pytest.approx(2.5) and v["speedup_vs_sync_90%"] == "2.50-2.50"
  assert best["speedup_vs_sync"] == v["speedup_vs_sync"]
  v, _ = lag_sweep.balance_verdict([r for r in rows if r["max_policy_lag"] != 0])
  assert math.isnan(v["speedup_vs_sync"])
  # The best auto is the fastest auto K, chosen again in every draw: here K = 1 (4 s; K = 0's
  # auto took 9 s), whose speed-up over sync is 2.5 whatever the draw.
  k1, k0, best = lag_sweep.balance_verdict(rows + [row(0, "auto", 9.0), row(0, "auto", 9.0)])
  assert (k1["K"], k0["K"], best["K"]) == (1, 0, "best auto (K=1)")
  assert best["auto_time_s"] == 4.0 and best["speedup_vs_sync_90%"] == "2.50-2.50"


def test_balance_grid_names_a_bad_setting_before_running_anything(tmp_path, capsys):
  from tools.suites import balance_grid

  for argv in (["--settings", "auto:x:6"], ["--settings", "on:1:6"],
               ["--regimes", "gpu", "--settings", "auto:1:6"]):
    with pytest.raises(SystemExit) as e:
      balance_grid.main([str(tmp_path), *argv])
    assert e.value.code == 2
  assert "--settings=on:1:6" in capsys.readouterr().err
  assert not (tmp_path / "runs").exists()


def test_balance_grid_compiles_autos_programs_first_with_its_runs_flags(tmp_path, monkeypatch):
  from tools.suites import balance_grid

  calls = []
  monkeypatch.setattr(balance_grid, "compile_programs",
                      lambda preset, flags, **kw: calls.append(("compile", flags)) or "ok")
  monkeypatch.setattr(balance_grid, "run_train", lambda preset, seed, run_dir, flags, **kw:
                      calls.append(("run", flags)) or {"error": "not run here"})
  chosen = [("off", 1, 2), ("auto", 1, 6)]
  result = balance_grid.run_settings(tmp_path, ["fast"], chosen, 5.0, 1.0, [0, 1])
  assert [c[0] for c in calls] == ["compile", "run", "run", "run", "run"]
  # The same flags as auto's runs: only then does the cache key match theirs.
  same = lambda a, b: json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)  # nan
  assert same(calls[0][1], calls[2][1]) and calls[0][1]["balance"] == "auto"
  assert result.config["compiled_first"] == ["fast U=1 N=6: ok"]
