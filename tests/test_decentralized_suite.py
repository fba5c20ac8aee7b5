"""The decentralized benchmark suite's speed-up rows (tools/suites/decentralized.py), tiny size."""

import numpy as np

from tools.bench_common import Progress
from tools.suites import decentralized as suite


def test_fixed_shards_speedup_rows_share_one_problem():
  # Two node counts keep it short; the full suite runs N = 1 .. 16 the same way.
  size = {**suite.SIZES["tiny"], "nodes": (1, 2)}
  [k] = size["fixed_shards"]
  rows = suite.speedup_rows(size, Progress(99, "test"), shards=k)
  assert [r["nodes"] for r in rows] == [1, 2]
  for r in rows:
    assert r["table"] == "speedup_fixed_shards"
    assert r["shards"] == k and r["samples"] == size["speedup_samples"]
    assert r["rows_per_node"] * r["nodes"] == size["speedup_samples"]
    assert r["alpha_best"] in suite.ALPHAS and r["T_best"] > 0
    assert r["T_best"] == min(r[f"T_alpha{a:g}"] for a in suite.ALPHAS if r[f"T_alpha{a:g}"])
    assert r["speedup_best"] == rows[0]["T_best"] / r["T_best"]
    assert np.isclose(r["efficiency_best"], r["speedup_best"] / r["nodes"])
    for lag in suite.PULL_LAGS:
      assert f"T_lag{lag:g}" in r
  assert rows[0]["efficiency_best"] == 1.0 and rows[0]["T_lag2"] == rows[0]["T_alpha20"]
  # Why the table exists: with K fixed, theta* is the same for every N.
  stars = [suite._problem(size["speedup_samples"], n, shards=k).theta_star() for n in (1, 2, 4)]
  assert np.allclose(stars[0], stars[1], rtol=0, atol=1e-12)
  assert np.allclose(stars[0], stars[2], rtol=0, atol=1e-12)
  # One shard per node is a different problem for each N (the plain speed-up table).
  per_node = [suite._problem(size["speedup_samples"], n).theta_star() for n in (1, 2)]
  assert not np.allclose(per_node[0], per_node[1], rtol=0, atol=1e-6)
