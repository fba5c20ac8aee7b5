"""The two references the asynchronous method is measured against.

* Synchronous push-pull: the same node update, in rounds. Every node reads the messages of the
  previous round, activates, and sends; the round ends when the slowest node has finished and
  every message of the round has arrived (`schedule.SyncSchedule`), so one straggler sets the
  pace of all. With no delays and equal data it is exactly the AB/push-pull recursion with SAG
  gradients, and node i's iterates equal a single node's when every node holds the same data.
* Centralised SAG: one node holding every node's rows, with one dual block per original node,
  so it solves the same saddle problem and reaches the same theta* (`node.centralized_const`).
  One event does one node activation's worth of work (one row, one dual step, a primal step of
  alpha_i / N along the average gradient), so its event count is comparable with the network's
  and its virtual time is that of a single machine doing all the work.
"""

from __future__ import annotations

from typing import Any

from jaxrl_async.decentralized import simulator
from jaxrl_async.decentralized.graphs import Graph
from jaxrl_async.decentralized.problem import Problem
from jaxrl_async.decentralized.schedule import Timing


def sync_push_pull(problem: Problem, graph: Graph, timing: Timing, alpha: float, beta: float,
                   sampling: str = "uniform", seed: int = 0, **run_kw: Any
                   ) -> simulator.RunResult:
  """Synchronous push-pull with SAG on the simulated network; `run_kw` go to `simulator.run`."""
  sim = simulator.build(problem, graph, "sync", timing, alpha, beta, sampling, seed)
  return simulator.run(sim, **run_kw)


def centralized_sag(problem: Problem, timing: Timing, alpha: float, beta: float,
                    sampling: str = "uniform", seed: int = 0, **run_kw: Any
                    ) -> simulator.RunResult:
  """The single-node reference on all the data; `run_kw` go to `simulator.run`."""
  sim = simulator.build(problem, None, "centralized", timing, alpha, beta, sampling, seed)
  return simulator.run(sim, **run_kw)
