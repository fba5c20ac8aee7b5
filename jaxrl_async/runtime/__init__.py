"""Threads, queues and devices: moves data, never computes a loss."""
