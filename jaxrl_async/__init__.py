"""jaxrl_async: asynchronous RL training on JAX with a lag-capping rate controller."""

__version__ = "0.1.0"
