"""The balance controller against a simulated plant (tools/balance_plant.py): the real rate
controller and the real BalanceController, actors and a learner in virtual time. It must reach
the operating point within a few windows, hold it (no oscillation), never let a rollout exceed
the cap K, and follow a learner that slows down and speeds up again."""

import dataclasses

from tools.balance_plant import (
  FAST,
  LEARNER_BOUND,
  SLOWS_AND_RECOVERS,
  Plant,
  best_fixed,
  moves,
  phase,
  simulate,
)


def test_fast_learner_auto_unblocks_the_actors_within_a_few_windows():
  """6 actors, K = 1, U = 1 (2 tickets): actors blocked ~70%, learner idle ~95% (the CPU
  regime of the issue). Auto raises U until the tickets cover the actors."""
  plant = FAST
  fixed = phase(simulate(plant, 200, auto=False), 50, 200)
  assert fixed["blocked"] > 0.6 and fixed["idle"] > 0.9
  best = best_fixed(plant, (1, 2, 3, 6, 12), 200, 2.0)
  for seed in range(4):
    out = simulate(dataclasses.replace(plant, seed=seed), 200)
    # There in at most 6 moves (U: 1 -> 3 covers the 6 actors at once; U = 6 for the wait on
    # new params; a probe of U = 12, kept where it gains; one probe of 3 actors, undone) and it
    # stays. Seeds 0-7 settle by 36 s (`python -m tools.balance_plant --seeds 0-7`); windows
    # of two updates each took until 66 s, and kept U = 3 on seeds 1 and 2.
    assert len(moves(out, 0)) <= 6 and not moves(out, 70), seed
    after = phase(out, 70, 200)
    assert after["blocked"] < 0.25 and after["idle"] > 0.5 and len(after["settings"]) == 1
    assert after["sps"] >= 0.95 * best, seed  # 0.973-1.014 over seeds 0-7
    assert out["max_lag"] <= 1 and out["dropped"] == 0


def test_learner_bound_auto_keeps_the_throughput_and_brings_the_lag_to_target():
  """2 fast actors, a slow learner, K = 1: the full pipeline has lag 1; auto lowers it to the
  target without costing more than 5% of the best fixed setting's throughput."""
  assert phase(simulate(LEARNER_BOUND, 600, 10.0, auto=False), 150, 600)["lag"] > 0.5
  best = best_fixed(LEARNER_BOUND, (1, 2, 4), 600, 10.0)
  for seed in range(4):
    out = simulate(dataclasses.replace(LEARNER_BOUND, seed=seed), 600, 10.0)
    after = phase(out, 300, 600)
    assert after["lag"] <= 0.5 + 1e-9 and after["sps"] >= 0.95 * best, seed
    # Windows of 10 s here: an undo reads three (seed 1's last lands at 300 s).
    assert not moves(out, 301) and out["max_lag"] <= 1 and out["dropped"] == 0, seed


def test_a_learner_that_slows_down_and_recovers_is_followed():
  """A second job on the device makes each rollout's update 25x dearer from t = 150 s to
  300 s. The controller must keep the cap and the targets in each phase, on every seed."""
  for seed in range(4):
    out = simulate(dataclasses.replace(SLOWS_AND_RECOVERS, seed=seed), 450)
    fast, slow, again = phase(out, 100, 150), phase(out, 250, 300), phase(out, 400, 450)
    assert fast["blocked"] < 0.25 and again["blocked"] < 0.25, seed
    # Slow: learner-bound at 1 / 0.5 = 2 rollouts per busy second at most. Bounds are
    # forgotten at the change (a replan), so the probes run again, and at this rate a window
    # lasts until one update of up to 6 s has finished, and an undo reads three of them: each
    # probe that costs is paid for 15-25 s (1.44-1.50 rollouts/s over 250-300 s on seeds 0-7;
    # windows of two updates, 10-15 s each, and undone on two, made 1.38-1.57).
    assert slow["sps"] >= 0.7 * 2.0 and slow["lag"] <= 1.0, seed
    assert again["sps"] >= 0.95 * fast["sps"], seed
    assert not moves(out, 400) and out["max_lag"] <= 1 and out["dropped"] == 0, seed


def test_the_cap_holds_for_every_k_and_plant():
  for k in (0, 1, 2):
    for actor_s, rollout_s in ((1.0, 0.02), (0.2, 1.0), (0.5, 0.1)):
      plant = Plant(actors=4, max_lag=k, actor_s=actor_s, rollout_s=rollout_s, seed=k)
      out = simulate(plant, 200, target_lag=min(0.5, k))
      assert out["max_lag"] <= k and out["dropped"] == 0, (k, actor_s, rollout_s)
