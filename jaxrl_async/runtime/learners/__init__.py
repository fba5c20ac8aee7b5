"""The learner thread: one loop (loop.py) around a step (on-policy, replay or global) that
compiles, takes rollouts and advances the params' version."""
