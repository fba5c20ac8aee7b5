"""Multi-process runs: joining JAX's distributed runtime and each host's devices (hosts.py), and
the lockstep agreement on stops, checkpoints and counts that rides in the global step
(lockstep.py)."""
