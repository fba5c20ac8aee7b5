"""Fully asynchronous policy evaluation over a directed peer-to-peer network (PAPERS.md part 2).

Layers, each importable on its own (nothing here imports JAX or EnvPool eagerly):
  problem       the MSPBE in primal-dual form, theta*, random MDP data (numpy)
  mountain_car  EnvPool Mountain Car transitions with 300 tile-coding features
  graphs        directed ring / exponential / random strongly connected digraphs, weights
  node          the pure node update (const, state, inbox) -> (state, outbox)
  node_consts   what a node knows (NodeConst): per-node, pooled and centralised layouts
  schedule      the simulated network's clock: compute times, delays, drops, stragglers
  simulator     replays a schedule through the node update (lax.scan), deterministic
  results       RunResult, the record both runtimes return
  processes     one OS process per node over ZeroMQ, no locks and no barriers
  baselines     synchronous push-pull and centralised SAG
  config        PolicyEvalConfig, validated; experiment: config -> run -> files
"""
