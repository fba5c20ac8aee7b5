"""The data path from envs to the learner: actors step EnvPool and run the policy, rollouts go
through the queue under the rate controller's tickets, params come back through the store, and
the balancer moves what the controller allows."""
